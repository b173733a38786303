"""The exporter at real depths and sizes (random weights, CPU): 6, 12 and 24 layers of every encoder
family, both I/O forms, fp16 / bf16 rewrites, and one true BERT-base shape through the CLI.

Two-layer models hid a failure from 4 layers up (the shape pass stopped after a fixed number of
plugin nodes), so depth is what these tests vary; width stays small where only depth matters.
"""
from __future__ import annotations

import json

import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx_graphsurgeon")
pytest.importorskip("onnxruntime")
pytest.importorskip("polygraphy")

from padfree.export import models, shapes, spec as spec_mod  # noqa: E402
from padfree.export.compare import compare  # noqa: E402
from padfree.export.errors import ExportError  # noqa: E402
from padfree.export.exporter import export_onnx  # noqa: E402
from padfree.export.precision import float_dtype  # noqa: E402
from padfree.export.rewrite import rewrite  # noqa: E402

NARROW = dict(hidden_size=128, num_attention_heads=2, intermediate_size=256, max_position_embeddings=130)
# name -> (config class, model class, fields, layers): families at the depth of their base models
FAMILIES = {
    "bert-12": ("BertConfig", "BertModel", dict(NARROW, vocab_size=512, num_hidden_layers=12), 12),
    "bert-24": ("BertConfig", "BertModel", dict(NARROW, vocab_size=512, num_hidden_layers=24), 24),
    "roberta-12": ("RobertaConfig", "RobertaModel",
                   dict(NARROW, vocab_size=512, num_hidden_layers=12, type_vocab_size=1, pad_token_id=1), 12),
    "xlm-roberta-12": ("XLMRobertaConfig", "XLMRobertaModel",
                       dict(NARROW, vocab_size=700, num_hidden_layers=12, type_vocab_size=1, pad_token_id=1), 12),
    "distilbert-6": ("DistilBertConfig", "DistilBertModel",
                     dict(vocab_size=512, max_position_embeddings=128, dim=128, n_layers=6, n_heads=2,
                          hidden_dim=256), 6),
    "electra-12": ("ElectraConfig", "ElectraModel",
                   dict(NARROW, vocab_size=512, num_hidden_layers=12, embedding_size=128), 12),
    # embeddings at 64, projected to the hidden size (embeddings_project, left as a MatMul)
    "electra-proj-12": ("ElectraConfig", "ElectraModel",
                        dict(NARROW, vocab_size=512, num_hidden_layers=12, embedding_size=64), 12),
    # factorized embeddings; one layer run 12 times, then 2 groups of 2 layers over 12 passes (24 layers
    # run): torch exports each shared weight transposed once (export/passes/shared_weights.py)
    "albert-12": ("AlbertConfig", "AlbertModel",
                  dict(NARROW, vocab_size=512, num_hidden_layers=12, embedding_size=64), 12),
    "albert-12-2x2": ("AlbertConfig", "AlbertModel",
                      dict(NARROW, vocab_size=512, num_hidden_layers=12, embedding_size=64, num_hidden_groups=2,
                           inner_group_num=2), 24),
}
_EXPORTS: dict[str, onnx.ModelProto] = {}


def exported(name: str) -> onnx.ModelProto:
    if name not in _EXPORTS:
        config_cls, model_cls, fields, _ = FAMILIES[name]
        _EXPORTS[name] = export_onnx(models.build(config_cls, model_cls, **fields), name)
    return _EXPORTS[name]


def fused(layers: int) -> dict[str, int]:
    return {"PadfreeEmbLayerNorm": 1, "PadfreeAttention": layers, "PadfreeSkipLayerNorm": 2 * layers,
            "PadfreeBiasGelu": layers}


def assert_every_tensor_typed(model: onnx.ModelProto) -> None:
    g = model.graph
    typed = {vi.name for vi in list(g.value_info) + list(g.output) if vi.type.tensor_type.HasField("shape")}
    typed |= {i.name for i in g.input} | {t.name for t in g.initializer}
    missing = [o for n in g.node for o in n.output if o and o not in typed]
    assert not missing, missing[:5]


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("io", ["packed", "padded"])
def test_real_depth_fuses_every_layer_and_checks(name, io, seed):
    reference = exported(name)
    rewritten, report = rewrite(reference, io=io)
    layers = FAMILIES[name][3]
    assert report.complete and report.fused == fused(layers)
    assert_every_tensor_typed(rewritten)
    ok, results, data = compare(rewritten, reference, batch=6, max_seqlen=48, seed=seed)
    assert data.lengths.min() == 1 and data.lengths.max() == 48
    assert ok, [(r.name, r.max_abs, r.max_rel, r.padding_max) for r in results]


def test_shared_layers_keep_one_copy_of_their_weights():
    """ALBERT's 24 layer runs read 4 layers' weights: the rewrite merges each layer's Q/K/V once."""
    reference = exported("albert-12-2x2")
    rewritten, report = rewrite(reference)
    assert any("shared weight" in note for p in report.passes for note in p["notes"])
    attention = [n for n in rewritten.graph.node if n.op_type == "PadfreeAttention"]
    assert len(attention) == 24 and len({n.input[1] for n in attention}) == 4

    def initializer_bytes(model):
        return sum(t.ByteSize() for t in model.graph.initializer)
    # the merged QKV weights replace the separate ones: the total stays the exported model's
    assert initializer_bytes(rewritten) <= 1.01 * initializer_bytes(reference)


def test_interface_keeps_its_axis_names():
    rewritten, _ = rewrite(exported("bert-12"))
    dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in rewritten.graph.output}
    assert dims == {"last_hidden_state": ["total_tokens", 128], "pooler_output": ["batch", 128]}
    padded, _ = rewrite(exported("bert-12"), io="padded")
    dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in padded.graph.output}
    assert dims == {"last_hidden_state": ["batch", "seqlen", 128], "pooler_output": ["batch", 128]}


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_rewrite_checks_at_float32_tolerance(dtype, seed):
    """Every float tensor of the rewritten model is in `dtype`; against the plain export with the
    same rounded weights it matches at float32 tolerances, and a wrong bias is still caught."""
    reference = exported("bert-12")
    rewritten, _ = rewrite(reference, dtype=dtype)
    want = onnx.TensorProto.FLOAT16 if dtype == "fp16" else onnx.TensorProto.BFLOAT16
    floats = {t.data_type for t in rewritten.graph.initializer} - {onnx.TensorProto.INT64, onnx.TensorProto.INT32}
    assert floats == {want} and float_dtype(rewritten) == dtype
    assert {o.type.tensor_type.elem_type for o in rewritten.graph.output} == {want}
    onnx.checker.check_model(rewritten, full_check=True)
    ok, results, _ = compare(rewritten, reference, batch=4, max_seqlen=32, seed=seed)
    assert ok, [(r.name, r.max_rel) for r in results]
    bias = next(t for t in rewritten.graph.initializer if "qkv_bias" in t.name)
    value = onnx.numpy_helper.to_array(bias).astype("float32")
    value[0] += 0.25  # representable in both dtypes
    bias.CopyFrom(onnx.numpy_helper.from_array(value.astype(onnx.numpy_helper.to_array(bias).dtype), bias.name))
    ok, _, _ = compare(rewritten, reference, batch=4, max_seqlen=32, seed=seed)
    assert not ok


def test_plugin_wired_to_a_wrong_tensor_is_refused():
    """The shape pass checks each plugin input against the spec: a SkipLayerNorm whose gamma is an
    attention's [3 H] QKV bias fails the export with the node named."""
    rewritten, _ = rewrite(exported("bert-12"))
    nodes = [n for n in rewritten.graph.node if n.op_type == "PadfreeSkipLayerNorm"]
    qkv_bias = next(n for n in rewritten.graph.node if n.op_type == "PadfreeAttention").input[1]
    nodes[3].input[3] = qkv_bias
    with pytest.raises(shapes.ShapeError, match=rf"PadfreeSkipLayerNorm node '{nodes[3].name}' input gamma"):
        shapes.infer(rewritten, spec_mod.load())


def test_every_plugin_output_shape_is_defined_by_the_spec():
    """Each output dim of every plugin is a name bound by its inputs or int fields, "T", "...", or
    an expression over those: the one-pass shape inference needs nothing else."""
    spec = spec_mod.load()
    for plugin in spec.plugins.values():
        names = {n for p in plugin.inputs for e in p.shape for n in e.replace("+", "*").split("*")}
        names |= {k for k, kind in plugin.fields.items() if kind == "int32"} | {"T", "..."}
        for port in plugin.outputs:
            for expr in port.shape:
                parts = [p for p in expr.replace("+", "*").split("*") if not p.isdigit()]
                assert set(parts) <= names, (plugin.name, port.name, expr)


def test_bert_base_exports_and_checks_from_the_cli(tmp_path, capsys, caplog):
    """The README's first step on a true BERT-base (12 layers, hidden 768): export, rewrite and
    check through the CLI, each stage logging its progress."""
    import logging

    from padfree.cli import main

    models.build("BertConfig", "BertModel").save_pretrained(tmp_path / "bert-base")
    caplog.set_level(logging.INFO, logger="padfree")
    assert main(["export", str(tmp_path / "bert-base"), "-o", str(tmp_path / "out")]) == 0
    stages = [r.getMessage() for r in caplog.records if r.name.startswith("padfree.export.")]
    for stage in ("loading", "exporting", "wrote", "rewriting", "inferring shapes", "fused"):
        assert any(stage in m for m in stages), (stage, stages)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["complete"] and report["fused"] == fused(12)
    assert main(["check", str(tmp_path / "out" / "model.padfree.onnx"), "--reference",
                 str(tmp_path / "out" / "model.onnx"), "--batch", "4", "--max-seqlen", "128"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_unknown_dtype_is_refused():
    with pytest.raises(ExportError, match="dtype must be one of fp32, fp16, bf16"):
        rewrite(exported("distilbert-6"), dtype="fp8")
