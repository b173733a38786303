"""padfree.export end to end on the CPU: HF encoders with random weights -> ONNX -> rewrite onto
plugin nodes -> ONNX Runtime (plugin references) vs the plain export, on fresh random batches.

Each model is exported once per module (the slow step); rewrites and checks reuse it.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx_graphsurgeon")
pytest.importorskip("onnxruntime")
pytest.importorskip("polygraphy")

from padfree.export import models, spec as spec_mod  # noqa: E402
from padfree.export.compare import compare  # noqa: E402
from padfree.export.errors import ExportError, PartialFusionError  # noqa: E402
from padfree.export.exporter import export_onnx  # noqa: E402
from padfree.export.rewrite import rewrite  # noqa: E402

_EXPORTS: dict[str, onnx.ModelProto] = {}


def _layers(name: str) -> int:
    fields = models.BUILTIN[name][2]
    return fields.get("num_hidden_layers", fields.get("n_layers"))


def exported(name: str, **build) -> onnx.ModelProto:
    key = name + repr(sorted(build.items()))
    if key not in _EXPORTS:
        config_cls, model_cls, fields = models.BUILTIN[name]
        model = models.build(config_cls, model_cls, **{**fields, **build})
        _EXPORTS[key] = export_onnx(model, key)
    return _EXPORTS[key]


def plugin_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in model.graph.node:
        if n.domain == "padfree":
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def expected_counts(layers: int) -> dict[str, int]:
    """What the architecture has: one embedding LayerNorm; per layer one attention, two residual
    LayerNorms and one feed-forward GELU."""
    return {"PadfreeEmbLayerNorm": 1, "PadfreeAttention": layers, "PadfreeSkipLayerNorm": 2 * layers,
            "PadfreeBiasGelu": layers}


def assert_nodes_follow_spec(model: onnx.ModelProto) -> None:
    """Every plugin node lists the spec's inputs and outputs (TensorRT's parser refuses a node that
    leaves out a plugin output), and every tensor of it has the int type and the rank the spec gives
    it (TensorRT plugins check ranks: a [1, S] max_seqlen is refused there, not by ONNX Runtime)."""
    spec = spec_mod.load()
    graph = model.graph
    typed = {vi.name: vi.type.tensor_type for vi in list(graph.input) + list(graph.value_info) + list(graph.output)}
    typed.update({t.name: onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)).tensor_type
                  for t in graph.initializer})
    for node in model.graph.node:
        if node.domain != spec.namespace:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        plugin = spec[node.op_type]
        assert len(node.input) == len(plugin.input_names(attrs)), node.name
        assert len(node.output) == len(plugin.output_names(attrs)), node.name
        ports = [p for p in plugin.inputs if p.present(attrs)] + list(plugin.outputs)
        for port, name in zip(ports, list(node.input) + list(node.output)):
            if port.dtype == "int32":
                assert typed[name].elem_type == onnx.TensorProto.INT32, (node.name, port.name)
            if "..." not in port.shape:
                assert len(typed[name].shape.dim) == len(port.shape), (node.name, port.name)


def assert_checks(rewritten, reference, seed, batch=6, max_seqlen=48):
    ok, results, data = compare(rewritten, reference, batch=batch, max_seqlen=max_seqlen, seed=seed)
    assert data.lengths.min() == 1 and data.lengths.max() == max_seqlen  # both edge lengths covered
    assert ok, [(r.name, r.max_abs, r.max_rel, r.padding_max) for r in results]
    return results


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-bert-hd128", "tiny-roberta", "tiny-distilbert"])
@pytest.mark.parametrize("io", ["packed", "padded"])
def test_rewrite_fuses_every_layer_and_matches_export(name, io, seed):
    reference = exported(name)
    rewritten, report = rewrite(reference, io=io)
    layers = _layers(name)
    counts = plugin_counts(rewritten)
    edges = {"PadfreeRemovePadding": 1, "PadfreeRebuildPadding": 1}  # ids and token types packed together
    assert counts == {**expected_counts(layers), **(edges if io == "padded" else {})}
    assert report.complete and report.fused == expected_counts(layers)
    onnx.checker.check_model(rewritten, full_check=True)
    assert_nodes_follow_spec(rewritten)
    # No trace of the padding mask or the [B, S] layout is left in the packed form.
    ops = {n.op_type for n in rewritten.graph.node}
    if io == "packed":
        assert not ops & {"Softmax", "Where", "GatherND", "Transpose", "Reshape", "Erf", "LayerNormalization"}
        names = [i.name for i in rewritten.graph.input]
        assert names == ["input_ids"] + (["token_type_ids"] if name != "tiny-distilbert" else []) + \
            ["cu_seqlens", "max_seqlen"]
    results = assert_checks(rewritten, reference, seed)
    if io == "padded":
        assert next(r for r in results if r.name == "last_hidden_state").padding_max == 0.0


def test_plugin_fields():
    rewritten, _ = rewrite(exported("tiny-roberta"))
    attrs = {n.op_type: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
             for n in rewritten.graph.node if n.domain == "padfree"}
    emb, att = attrs["PadfreeEmbLayerNorm"], attrs["PadfreeAttention"]
    assert emb["position_offset"] == 2 and emb["has_token_type"] == 1  # RoBERTa: padding_idx 1 + 1
    assert (att["num_heads"], att["head_dim"]) == (2, 64)
    assert att["softmax_scale"] == pytest.approx(64 ** -0.5, rel=1e-6)
    for a in attrs.values():
        assert a["plugin_version"] == b"1" or a["plugin_version"] == "1"
        assert a["plugin_namespace"] in (b"padfree", "padfree")
    bert, _ = rewrite(exported("tiny-bert"))
    emb = next(n for n in bert.graph.node if n.op_type == "PadfreeEmbLayerNorm")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in emb.attribute}["position_offset"] == 0


@pytest.mark.parametrize("variant", [{"attn_implementation": "eager"}, {"hidden_act": "gelu_pytorch_tanh"}])
def test_other_export_forms_fuse(variant, seed):
    reference = exported("tiny-bert", **variant)
    rewritten, report = rewrite(reference)
    assert report.complete and report.fused == expected_counts(2)
    gelu = [n for n in rewritten.graph.node if n.op_type == "PadfreeBiasGelu"]
    approximate = {onnx.helper.get_attribute_value(a) for n in gelu for a in n.attribute if a.name == "approximate"}
    assert approximate == {1 if "hidden_act" in variant else 0}
    assert_checks(rewritten, reference, seed)


@pytest.fixture(scope="module")
def softcapped_layer1():
    """tiny-bert whose second layer caps its attention scores with tanh: an attention padfree does
    not implement, which must not be fused."""
    import transformers.models.bert.modeling_bert as mb

    original = mb.eager_attention_forward

    def capped(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
        if module.layer_idx != 1:
            return original(module, q, k, v, mask, scaling, dropout, **kw)
        w = 5.0 * torch.tanh(torch.matmul(q, k.transpose(2, 3)) * scaling / 5.0) + mask
        return torch.matmul(torch.softmax(w, -1), v).transpose(1, 2).contiguous(), w

    mb.eager_attention_forward = capped
    try:
        return exported("tiny-bert", attn_implementation="eager", intermediate_size=192)
    finally:
        mb.eager_attention_forward = original


@pytest.mark.parametrize("io", ["packed", "padded"])
def test_modified_attention_refused_then_accepted_with_allow_partial(softcapped_layer1, io, seed):
    with pytest.raises(PartialFusionError) as err:
        rewrite(softcapped_layer1, io=io)
    message = str(err.value)
    assert "attention #1" in message and "no Q @ K^T operand" in message and "--allow-partial" in message
    rewritten, report = rewrite(softcapped_layer1, io=io, allow_partial=True)
    assert report.fused["PadfreeAttention"] == 1 and not report.complete
    counts = plugin_counts(rewritten)
    assert counts["PadfreeRebuildPadding"] >= 1  # the unfused layer runs on padded rows
    onnx.checker.check_model(rewritten, full_check=True)
    assert_nodes_follow_spec(rewritten)
    assert_checks(rewritten, softcapped_layer1, seed)


@pytest.mark.parametrize("heads, problem", [(4, "head_dim 32 is not built"), (1, "head_dim 128")])
def test_attention_without_kernels_is_refused_then_left_unfused(heads, problem, seed):
    """head_dim 32 (128 / 4 heads) has no attention kernel: fusing it would build a graph that
    fails at its first run. The control (1 head of 128) fuses."""
    reference = exported("tiny-bert", num_attention_heads=heads)
    if heads == 1:
        assert rewrite(reference)[1].fused["PadfreeAttention"] == 2
        return
    with pytest.raises(PartialFusionError) as err:
        rewrite(reference)
    assert problem in str(err.value) and "built: 64, 128" in str(err.value)
    rewritten, report = rewrite(reference, allow_partial=True)
    assert "PadfreeAttention" not in report.fused and report.fused["PadfreeSkipLayerNorm"] == 4
    assert sum(problem in m for m in report.unmatched) == 2
    assert_checks(rewritten, reference, seed)


def test_check_fails_on_a_wrong_rewrite(seed):
    """The comparison can fail: a rewrite whose QKV bias is off by 1e-3 is caught."""
    reference = exported("tiny-bert")
    rewritten, _ = rewrite(reference)
    bias = next(t for t in rewritten.graph.initializer if "qkv_bias" in t.name)
    value = onnx.numpy_helper.to_array(bias).copy()
    value[0] += 1e-3
    bias.CopyFrom(onnx.numpy_helper.from_array(value, bias.name))
    ok, results, _ = compare(rewritten, reference, batch=4, max_seqlen=16, seed=seed)
    assert not ok and results[0].max_rel > 1e-4


def test_bad_input_is_refused():
    with pytest.raises(ExportError, match="neither a built-in model"):
        models.load("no-such-model")
    with pytest.raises(ValueError, match="io must be"):
        rewrite(exported("tiny-bert"), io="ragged")
    old = onnx.ModelProto()
    old.CopyFrom(exported("tiny-bert"))
    for o in old.opset_import:
        if o.domain == "":
            o.version = 16
    with pytest.raises(ExportError, match="opset 16"):
        rewrite(old)


def test_cli_export_and_check_from_a_local_hf_directory(tmp_path, capsys, seed):
    from padfree.cli import main

    config_cls, model_cls, fields = models.BUILTIN["tiny-distilbert"]
    models.build(config_cls, model_cls, seed=seed, **fields).save_pretrained(tmp_path / "hf")
    assert main(["export", str(tmp_path / "hf"), "-o", str(tmp_path)]) == 0
    assert {"model.onnx", "model.padfree.onnx", "report.json"} <= {p.name for p in tmp_path.iterdir()}
    args = ["check", str(tmp_path / "model.padfree.onnx"), "--reference", str(tmp_path / "model.onnx"),
            "--batch", "3", "--max-seqlen", "20", "--seed", str(seed)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "last_hidden_state" in out and "PASS" in out


def test_check_hands_engines_over(monkeypatch, tmp_path, capsys):
    from padfree.cli import main

    seen = {}
    fake = types.ModuleType("padfree.engines.check")
    fake.main = lambda args: seen.setdefault("args", args) and 7
    monkeypatch.setitem(sys.modules, "padfree.engines.check", fake)
    assert main(["check", "--engine", "x.engine", "--reference", "m.onnx"]) == 7
    # no fp32 defaults forced on an engine: its sidecar's precision sets the tolerances
    assert seen["args"].engine == "x.engine" and seen["args"].rtol is None and seen["args"].atol is None
    seen.clear()
    assert main(["check", "--engine", "x.engine", "--reference", "m.onnx", "--rtol", "0.5"]) == 7
    assert seen["args"].rtol == 0.5
    monkeypatch.setitem(sys.modules, "padfree.engines.check", None)
    assert main(["check", "--engine", "x.engine", "--reference", "m.onnx"]) == 2
    assert "padfree check: error: --engine needs padfree.engines.check" in capsys.readouterr().err


def test_report_lists_fusions():
    _, report = rewrite(exported("tiny-distilbert"))
    text = report.format()
    assert "PadfreeAttention" in text and "packed I/O" in text
    assert report.to_dict()["complete"] is True
    assert np.sum(list(report.fused.values())) == 1 + 2 + 4 + 2
