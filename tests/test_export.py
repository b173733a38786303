"""padfree.export end to end on the CPU: HF encoders with random weights -> ONNX -> rewrite onto
plugin nodes -> ONNX Runtime (plugin references) vs the plain export, on fresh random batches.

Each model is exported once per module (the slow step); rewrites and checks reuse it.
"""
from __future__ import annotations

import re
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


@pytest.mark.parametrize("io", ["packed", "padded"])
def test_head_dim_32_fuses_every_layer_and_matches_export(io, seed):
    """MiniLM-L6-H384's shape (6 layers, hidden 384, 12 heads of 32; bge-small's and e5-small's head
    size too): every layer fused onto the attention kernels' head_dim 32, against the plain export."""
    layers = 6
    reference = exported("tiny-bert", hidden_size=384, num_hidden_layers=layers, num_attention_heads=12,
                         intermediate_size=1536)
    rewritten, report = rewrite(reference, io=io)
    assert report.complete and report.fused == expected_counts(layers)
    for node in rewritten.graph.node:
        if node.op_type == "PadfreeAttention":
            fields = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert (fields["num_heads"], fields["head_dim"]) == (12, 32)
    assert_checks(rewritten, reference, seed)


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


@pytest.mark.parametrize("heads, problem", [(8, "head_dim 16 is not built"), (1, "head_dim 128")])
def test_attention_without_kernels_is_refused_then_left_unfused(heads, problem, seed):
    """head_dim 16 (128 / 8 heads) has no attention kernel: fusing it would build a graph that
    fails at its first run. The control (1 head of 128) fuses."""
    reference = exported("tiny-bert", num_attention_heads=heads)
    if heads == 1:
        assert rewrite(reference)[1].fused["PadfreeAttention"] == 2
        return
    with pytest.raises(PartialFusionError) as err:
        rewrite(reference)
    assert problem in str(err.value) and "built: 32, 64, 128" in str(err.value)
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


# ---- hostile and careless input -----------------------------------------------------------------
def _saved_hf(tmp_path, name="tiny-bert", **fields):
    config_cls, model_cls, base = models.BUILTIN[name]
    model = models.build(config_cls, model_cls, **{**base, **fields})
    model.save_pretrained(tmp_path)
    return model


def _edit_config(folder, **changes):
    import json
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("layers, message", [(3, "lacks 16 weights that config.json declares \\(encoder.layer.2"),
                                             (1, "holds 16 encoder weights that config.json does not declare")])
def test_every_declared_weight_must_come_from_the_checkpoint(tmp_path, layers, message):
    """transformers only logs weights it initialised at random or dropped; the export refuses them."""
    _saved_hf(tmp_path)
    models.load(str(tmp_path))  # as saved: loads
    _edit_config(tmp_path, num_hidden_layers=layers)
    with pytest.raises(ExportError, match=message):
        models.load(str(tmp_path))


def test_corrupt_model_folders_are_export_errors(tmp_path):
    _saved_hf(tmp_path)
    _edit_config(tmp_path, vocab_size=600)  # a table of another shape
    with pytest.raises(ExportError, match="cannot load a Hugging Face model"):
        models.load(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ExportError, match="cannot load a Hugging Face model .*config"):
        models.load(str(tmp_path))


def test_a_checkpoint_without_pooler_exports_without_one(tmp_path, caplog):
    """A checkpoint saved from a masked-LM head has no pooler: no random pooler_output is exported."""
    import logging

    import transformers
    config_cls, _, fields = models.BUILTIN["tiny-bert"]
    config = getattr(transformers, config_cls)(**fields)
    models.randomize(transformers.BertModel(config, add_pooling_layer=False)).save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="padfree.export"):
        model, _ = models.load(str(tmp_path))
    assert model.pooler is None and "no pooler weights" in caplog.text


def test_a_failed_export_leaves_no_file_of_the_previous_one(tmp_path, monkeypatch):
    """model.onnx of a new export never sits beside the previous model.padfree.onnx / report.json."""
    from padfree.export import pipeline, rewrite as rewrite_module

    pipeline.export("tiny-distilbert", tmp_path)
    assert _names(tmp_path) == ["model.onnx", "model.padfree.onnx", "report.json"]

    def fails(*args, **kwargs):
        raise ExportError("the rewrite failed")

    monkeypatch.setattr(rewrite_module, "rewrite", fails)
    with pytest.raises(ExportError, match="the rewrite failed"):
        pipeline.export("tiny-bert", tmp_path)
    assert _names(tmp_path) == ["model.onnx"]  # the new plain export only, no partial or temporary file
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "model.onnx")).metadata_props}
    assert meta["padfree.source"] == "built-in tiny-bert"


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_export_refuses_bad_outputs_and_forms_before_exporting(tmp_path, monkeypatch):
    from padfree.export import exporter, pipeline
    from padfree.outputs import OutputError

    monkeypatch.setattr(exporter, "export_onnx", lambda *a, **k: pytest.fail("exported before the check"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        pipeline.export("tiny-bert", tmp_path / "file")
    with pytest.raises(ExportError, match="io must be"):
        pipeline.export("tiny-bert", tmp_path, io="ragged")


def _rewired(model: onnx.ModelProto, op_type: str, port: int, tensor_of) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    node = next(n for n in copy.graph.node if n.op_type == op_type)
    node.input[port] = tensor_of(copy.graph)
    return copy


def _first(graph, op_type, output=False, index=0):
    node = next(n for n in graph.node if n.op_type == op_type)
    return (node.output if output else node.input)[index]


_MISWIRINGS = [  # (plugin, input index, the tensor it gets, what the message names)
    ("PadfreeAttention", 2, lambda g: "input_ids", "B\\+1 = 'total_tokens'"),
    ("PadfreeAttention", 0, lambda g: _first(g, "PadfreeEmbLayerNorm", output=True), "3\\*num_heads\\*head_dim"),
    ("PadfreeAttention", 1, lambda g: "cu_seqlens", "qkv_bias .* is INT32"),
    ("PadfreeSkipLayerNorm", 2, lambda g: _first(g, "PadfreeAttention", index=1), "H = 384"),
    ("PadfreeEmbLayerNorm", 2, lambda g: "input_ids", "B\\+1"),
]


@pytest.mark.parametrize("op_type, port, tensor_of, message", _MISWIRINGS)
def test_plugin_inputs_wired_to_the_wrong_tensors_are_found(op_type, port, tensor_of, message, tmp_path):
    from padfree.export.wiring import problems
    rewritten, _ = rewrite(exported("tiny-bert"))
    assert problems(rewritten) == []
    bad = _rewired(rewritten, op_type, port, tensor_of)
    found = problems(bad)
    assert found and any(re.search(message, f) for f in found), found
    # and `padfree build` refuses it before TensorRT (which would build it)
    from padfree.engines.build import BuildOptions, build
    from padfree.engines.errors import BuildError
    onnx.save(bad, str(tmp_path / "bad.onnx"))
    with pytest.raises(BuildError, match="wired against the spec"):
        build(BuildOptions(str(tmp_path / "bad.onnx"), str(tmp_path / "bad.engine"), precision="fp32",
                           progress=False))
    assert not (tmp_path / "bad.engine").exists()


def test_check_exit_status_tells_a_difference_from_a_failure_to_run(tmp_path, capsys, seed):
    """0: within tolerance; 1: the check ran and found a difference; 2: it could not run."""
    from padfree.cli import main

    reference = exported("tiny-bert")
    rewritten, _ = rewrite(reference)
    onnx.save(reference, str(tmp_path / "model.onnx"))
    onnx.save(rewritten, str(tmp_path / "good.onnx"))
    bias = next(t for t in rewritten.graph.initializer if "qkv_bias" in t.name)
    value = onnx.numpy_helper.to_array(bias).copy()
    value[0] += 1e-2
    bias.CopyFrom(onnx.numpy_helper.from_array(value, bias.name))
    onnx.save(rewritten, str(tmp_path / "bad.onnx"))
    (tmp_path / "corrupt.onnx").write_bytes(b"\x08\x07garbage that is no model")
    common = ["--reference", str(tmp_path / "model.onnx"), "--batch", "3", "--max-seqlen", "16", "--seed", str(seed)]
    assert main(["check", str(tmp_path / "good.onnx"), *common]) == 0
    assert main(["check", str(tmp_path / "bad.onnx"), *common]) == 1
    assert "FAIL" in capsys.readouterr().out
    for model, reference_path, said in [
            ("corrupt.onnx", "model.onnx", "not a readable ONNX model"),
            ("missing.onnx", "model.onnx", "not found"),
            ("good.onnx", "good.onnx", "holds padfree plugin nodes"),  # the rewritten model as the reference
            ("model.onnx", "model.onnx", "no PadfreeEmbLayerNorm")]:
        args = ["check", str(tmp_path / model), "--reference", str(tmp_path / reference_path), "--batch", "2"]
        assert main(args) == 2, said
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err and err.startswith("padfree check: error:")
    for option, value in [("--rtol", "nan"), ("--atol", "nan"), ("--rtol", "-1"), ("--atol", "inf"),
                          ("--batch", "0"), ("--max-seqlen", "-4"), ("--seed", "-1")]:
        with pytest.raises(SystemExit) as usage:
            main(["check", str(tmp_path / "bad.onnx"), *common, option, value])
        assert usage.value.code == 2
        assert f"argument {option}" in capsys.readouterr().err


def test_cli_errors_are_one_line_with_exit_status_2(tmp_path, capsys):
    from padfree.cli import main

    (tmp_path / "file").write_text("x")
    assert main(["export", "tiny-bert", "-o", str(tmp_path / "file")]) == 2
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "is a file, not a folder" in err[0] and "neither a built-in model" in err[1]
    with pytest.raises(SystemExit) as usage:
        main(["export", "tiny-bert", "-o", str(tmp_path), "--opset", "0"])
    assert usage.value.code == 2
