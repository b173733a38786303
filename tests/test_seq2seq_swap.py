"""The decoder step on plugin nodes (export/seq2seq/swap.py: decoder_step.padfree.onnx) and engines of
a seq2seq export's three graphs.

The swapped step is proven on the CPU as the plain step is: generation with its plugin nodes expanded
by their ONNX Runtime references (export/reference.py) equals HF's generate in float32, greedy and
beam 4 (padfree.export.seq2seq.check). A wrong field or a crossed wire in the swapped graph must fail
that comparison, and a plugin input wired to a tensor of another role must fail the wiring check
`padfree build` runs. The engines are built with TensorRT-RTX on the CPU with padfree's plugin
library (skipped where either is missing); they cannot run here (no supported GPU).
"""
from __future__ import annotations

import json
import os
import sys
import warnings

import onnx
import pytest
from onnx import helper

from padfree import cli
from padfree.export import export, wiring
from padfree.export.errors import ExportError
from padfree.export.seq2seq import check as seq2seq_check
from padfree.export.seq2seq.ops import CROSS_ATTENTION, SELF_ATTENTION, sites_of
from padfree.export.seq2seq.swap import num_beams_of, set_num_beams, swap_sites

sys.path.insert(0, os.path.dirname(__file__))
from _seq2seq import build, engine_prerequisites  # noqa: E402

CHECK = dict(batch=8, max_seqlen=12, max_new_tokens=12, num_beams=4, seed=3)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, export folder): Marian 2+2 exported with --num-beams 4."""
    model = build("marian", layers=(2, 2))
    root = tmp_path_factory.mktemp("swap")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(root / "hf")
    export(root / "hf", root / "out", num_beams=4)
    return model, root / "out"


def _plugins(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == "padfree"]


def test_the_swapped_step_has_one_plugin_node_per_site(exported):
    _, out = exported
    manifest = json.loads((out / "seq2seq.json").read_text())
    plain = onnx.load(out / "decoder_step.onnx")
    swapped = onnx.load(out / "decoder_step.padfree.onnx")
    onnx.checker.check_model(swapped, full_check=True)
    assert manifest["files"]["decoder_step_plugins"] == "decoder_step.padfree.onnx"
    assert manifest["decoder_plugins"]["num_beams"] == 4
    assert manifest["decoder_plugins"]["plugins"] == {SELF_ATTENTION: 2, CROSS_ATTENTION: 2}
    assert [i.name for i in swapped.graph.input] == manifest["decoder_plugins"]["inputs"]
    assert [o.name for o in swapped.graph.output] == manifest["decoder"]["outputs"]
    # the plain step's inputs, with the cross-attention's max_seqlen shape input after cu_seqlens
    expected = list(manifest["decoder"]["inputs"])
    expected.insert(expected.index("cu_seqlens") + 1, "max_seqlen")
    assert manifest["decoder_plugins"]["inputs"] == expected
    nodes = _plugins(swapped)
    assert [n.op_type for n in nodes] == [SELF_ATTENTION, CROSS_ATTENTION] * 2
    assert [n.name for n in nodes] == [s.scope for s in sites_of(plain)]
    assert not any(n.name.startswith(s.scope + "/") for s in sites_of(plain) for n in swapped.graph.node)
    fields = {a.name: helper.get_attribute_value(a) for a in nodes[1].attribute}
    assert fields["num_beams"] == 4 and fields["softmax_scale"] == 1.0 and fields["plugin_namespace"] == b"padfree"
    assert num_beams_of(swapped) == 4 and num_beams_of(set_num_beams(swapped, 1)) == 1
    assert wiring.problems(swapped) == []
    with pytest.raises(ExportError, match="num_beams"):
        swap_sites(plain, 0)


def test_generation_with_the_swapped_step_equals_hf(exported):
    model, out = exported
    result = seq2seq_check.check(out, model, steps=("plugins",), **CHECK)
    print("\n".join(result.lines))
    assert result.ok, "\n".join(result.lines)
    assert all("decoder_step.padfree.onnx" in line for line in result.lines if not line.startswith(" "))


def _perturbed(out, tmp_path, change) -> "os.PathLike":
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    step = onnx.load(bad / "decoder_step.padfree.onnx")
    change(_plugins(step))
    onnx.save(step, bad / "decoder_step.padfree.onnx")
    return bad


def _set_field(node: onnx.NodeProto, name: str, value) -> None:
    for a in node.attribute:
        if a.name == name:
            a.CopyFrom(helper.make_attribute(name, value))


@pytest.mark.parametrize("perturbation", ["softmax_scale", "crossed_caches"])
def test_a_wrong_field_or_wire_is_caught(exported, tmp_path, perturbation):
    model, out = exported

    def change(nodes):
        attention = nodes[2]                           # layer 1's self-attention
        if perturbation == "softmax_scale":
            _set_field(attention, "softmax_scale", 0.5)
        else:                                          # k_cache and v_cache swapped: same shapes, wrong data
            attention.input[2], attention.input[3] = attention.input[3], attention.input[2]

    bad = _perturbed(out, tmp_path, change)
    assert wiring.problems(onnx.load(bad / "decoder_step.padfree.onnx")) == []   # shapes cannot tell
    result = seq2seq_check.check(bad, model, steps=("plugins",), **CHECK)
    print("\n".join(result.lines))
    assert not result.ok


def test_a_num_beams_field_unlike_the_export_is_refused(exported, tmp_path):
    from padfree._lib import PadfreeError

    model, out = exported
    bad = _perturbed(out, tmp_path, lambda nodes: [_set_field(n, "num_beams", 2) for n in nodes[1::2]])
    with pytest.raises(PadfreeError, match="num_beams 2"):
        seq2seq_check.check(bad, model, steps=("plugins",), **CHECK)


def test_a_plugin_input_of_another_role_fails_the_wiring_check(exported):
    _, out = exported
    step = onnx.load(out / "decoder_step.padfree.onnx", load_external_data=False)
    cross = [n for n in _plugins(step) if n.op_type == CROSS_ATTENTION][1]
    cross.input[3] = "step"                            # cu_seqlens [B+1] fed the step [1]
    found = wiring.problems(step)
    assert found and any("cu_seqlens" in p or "B+1" in p for p in found), found


def test_cli_export_num_beams_and_its_refusal_for_encoders(tmp_path, capsys):
    model = build("bart", layers=(1, 1), seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path / "hf")
    assert cli.main(["export", str(tmp_path / "hf"), "-o", str(tmp_path / "out"), "--num-beams", "2"]) == 0
    assert "decoder_step.padfree.onnx with them as plugin nodes (num_beams 2)" in capsys.readouterr().out
    assert num_beams_of(onnx.load(tmp_path / "out" / "decoder_step.padfree.onnx")) == 2
    with pytest.raises(ExportError, match="num_beams"):
        export("tiny-bert", tmp_path / "enc", num_beams=2)


# ---- engines (TensorRT-RTX on the CPU) ---------------------------------------------------------------
@pytest.mark.parametrize("graph", ["encoder.onnx", "cross_kv.onnx", "decoder_step.padfree.onnx"])
def test_engines_of_the_three_graphs(exported, tmp_path, graph):
    from padfree.engines import sidecar
    from padfree.engines.build import BuildOptions, build as build_engine

    _, library = engine_prerequisites()
    _, out = exported
    step = graph.startswith("decoder_step")
    options = BuildOptions(onnx=str(out / graph), output=str(tmp_path / "g.engine"), max_tokens=64, max_batch=4,
                           max_seqlen=16, max_cache=24 if step else None, plugin_library=str(library),
                           backend="tensorrt_rtx", progress=False)
    metadata = build_engine(options)
    assert metadata == sidecar.read(tmp_path / "g.engine")
    assert (tmp_path / "g.engine").stat().st_size > 0
    shapes = metadata["profiles"][0]["shapes"]
    if graph == "encoder.onnx":
        assert metadata["model"]["io"] == "padded" and metadata["preview_features"] == []
        assert shapes["input_ids"] == {"min": [1, 1], "opt": [2, 8], "max": [4, 16]}
    elif graph == "cross_kv.onnx":
        assert metadata["model"]["io"] == "cross_kv"
        assert shapes["encoder_hidden_states"] == {"min": [1, 32], "opt": [32, 32], "max": [64, 32]}
    else:
        assert metadata["model"]["io"] == "decoder_step"
        assert metadata["preview_features"] == ["ALIASED_PLUGIN_IO_10_03"]
        assert metadata["profiles"][0]["num_beams"] == 4 and metadata["profiles"][0]["max_cache"] == 24
        # rows = batch x num_beams; the caches [rows, heads, L, head_dim]; the source tokens T
        assert shapes["input_ids"] == {"min": [4], "opt": [8], "max": [16]}
        assert shapes["past_key.0"] == {"min": [4, 4, 1, 8], "opt": [8, 4, 12, 8], "max": [16, 4, 24, 8]}
        assert shapes["cross_kv.1"]["max"] == [64, 64] and shapes["max_seqlen"]["max"] == [16]
        assert [layer["plugin"] for layer in metadata["plugin_layers"]] == [SELF_ATTENTION, CROSS_ATTENTION] * 2


def test_a_step_engine_of_another_width_is_refused(exported, tmp_path):
    from padfree.engines.build import BuildOptions, build as build_engine
    from padfree.engines.errors import BuildError

    _, out = exported
    with pytest.raises(BuildError, match="num_beams 4"):
        build_engine(BuildOptions(onnx=str(out / "decoder_step.padfree.onnx"), output=str(tmp_path / "s.engine"),
                                  num_beams=2, progress=False))


# ---- fp16 / bf16 engine graphs ------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["fp16", "bf16"])
def exported_dtype(request, tmp_path_factory):
    """(model, export folder, dtype): Marian 2+2 exported with --dtype fp16 / bf16 and --num-beams 4."""
    model = build("marian", layers=(2, 2))
    root = tmp_path_factory.mktemp(f"swap_{request.param}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(root / "hf")
    export(root / "hf", root / "out", num_beams=4, dtype=request.param)
    return model, root / "out", request.param


def _float_types(model: onnx.ModelProto) -> set[int]:
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    found = {t.data_type for t in model.graph.initializer if t.data_type in floats}
    found |= {v.type.tensor_type.elem_type for v in list(model.graph.input) + list(model.graph.output)
              if v.type.tensor_type.elem_type in floats}
    return found


def test_the_dtype_export_writes_engine_graphs_in_it_beside_the_float32_ones(exported_dtype):
    import numpy as np
    from onnx import numpy_helper

    _, out, dtype = exported_dtype
    want = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}[dtype]
    manifest = json.loads((out / "seq2seq.json").read_text())
    assert manifest["dtype"] == dtype
    assert manifest["engine_graphs"] == {"encoder": f"encoder.{dtype}.onnx", "cross_kv": f"cross_kv.{dtype}.onnx",
                                         "decoder_step": "decoder_step.padfree.onnx"}
    for name in manifest["engine_graphs"].values():
        proto = onnx.load(out / name)
        onnx.checker.check_model(proto, full_check=True)
        assert _float_types(proto) == {want}, name
        assert {p.key: p.value for p in proto.metadata_props}["padfree.dtype"] == dtype
        # the traced encoder's mask constant (float32's minimum) saturates to the dtype's finite minimum
        for t in proto.graph.initializer:
            if t.data_type == want:
                assert np.isfinite(numpy_helper.to_array(t).astype(np.float32)).all(), (name, t.name)
    for name in ("encoder.onnx", "cross_kv.onnx", "decoder_step.onnx"):   # the references stay float32
        assert _float_types(onnx.load(out / name)) == {onnx.TensorProto.FLOAT}, name


def test_the_dtype_graphs_generate_as_the_float32_graphs_rounded_to_it(exported_dtype):
    model, out, dtype = exported_dtype
    result = seq2seq_check.check(out, model, **CHECK)
    print("\n".join(result.lines))
    assert result.ok
    rounded = [line for line in result.lines if f"rounded to {dtype}" in line]
    assert len(rounded) == 2 and all(f"encoder.{dtype}.onnx + cross_kv.{dtype}.onnx" in line for line in rounded)


def test_a_wrong_weight_in_a_dtype_graph_is_caught(exported_dtype, tmp_path):
    import shutil

    import numpy as np
    from onnx import numpy_helper

    model, out, dtype = exported_dtype
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    cross = onnx.load(bad / f"cross_kv.{dtype}.onnx")
    weight = max(cross.graph.initializer, key=lambda t: int(np.prod(t.dims)))   # a layer's K | V projection
    value = numpy_helper.to_array(weight).astype(np.float32)
    value[0] *= 1.5
    weight.CopyFrom(numpy_helper.from_array(value.astype(numpy_helper.to_array(weight).dtype), weight.name))
    onnx.save(cross, bad / f"cross_kv.{dtype}.onnx")
    result = seq2seq_check.check(bad, model, steps=("plugins",), **CHECK)
    print("\n".join(result.lines))
    assert not result.ok


@pytest.mark.parametrize("graph", ["encoder", "cross_kv", "decoder_step"])
def test_engines_of_the_dtype_graphs(exported_dtype, tmp_path, graph):
    from padfree.engines.build import BuildOptions, build as build_engine

    _, library = engine_prerequisites()
    _, out, dtype = exported_dtype
    name = json.loads((out / "seq2seq.json").read_text())["engine_graphs"][graph]
    step = graph == "decoder_step"
    metadata = build_engine(BuildOptions(onnx=str(out / name), output=str(tmp_path / "g.engine"), max_tokens=64,
                                         max_batch=4, max_seqlen=16, max_cache=24 if step else None,
                                         plugin_library=str(library), backend="tensorrt_rtx", progress=False))
    assert metadata["precision"] == dtype
    ios = {"encoder": "padded", "cross_kv": "cross_kv", "decoder_step": "decoder_step"}
    assert metadata["model"]["io"] == ios[graph]


# ---- --io packed: the encoder on plugin nodes over packed tokens -----------------------------------------
# BART: post-LN; mBART: pre-LN (LayerNorms kept as ONNX's on the residual stream) with a scaled word
# embedding (its scale folded into the table); Marian (post-LN, SiLU) and M2M100 (pre-LN, ReLU, positions
# from padding_idx + 1): a scaled word embedding plus sinusoidal positions and no LayerNorm after them
# (the embedding plugin with has_layernorm 0)
PACKED_FUSED = {"bart": {"PadfreeEmbLayerNorm": 1, "PadfreeAttention": 2, "PadfreeSkipLayerNorm": 4,
                         "PadfreeBiasGelu": 2},
                "mbart": {"PadfreeEmbLayerNorm": 1, "PadfreeAttention": 2, "PadfreeSkipLayerNorm": 1,
                          "PadfreeBiasGelu": 2},
                "marian": {"PadfreeEmbLayerNorm": 1, "PadfreeAttention": 2, "PadfreeSkipLayerNorm": 4},
                "m2m100": {"PadfreeEmbLayerNorm": 1, "PadfreeAttention": 2, "PadfreeSkipLayerNorm": 1}}
# (has_layernorm, position_offset) of each family's embedding node
PACKED_EMBEDDING = {"bart": (1, 2), "mbart": (1, 2), "marian": (0, 0), "m2m100": (0, 2)}
# the ONNX ops a packed encoder keeps around its plugin nodes: row-wise on packed rows (GEMMs, pre-LN
# residual Adds and LayerNorms, the activations the bias + GELU plugin does not take: SiLU, ReLU)
ROW_WISE = {"MatMul", "Add", "LayerNormalization", "Sigmoid", "Mul", "Relu"}


@pytest.fixture(scope="module", params=[(family, dtype) for family in ("bart", "mbart", "marian", "m2m100")
                                        for dtype in ("fp32", "fp16")],
                ids=lambda p: "-".join(p))
def exported_packed(request, tmp_path_factory):
    """(model, export folder, dtype, family): 2+2 layers at head_dim 64 (a size padfree's attention is
    built for) exported with --io packed."""
    family, dtype = request.param
    model = build(family, layers=(2, 2), d_model=128, heads=2, ffn=256)
    root = tmp_path_factory.mktemp(f"packed_{family}_{dtype}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(root / "hf")
    export(root / "hf", root / "out", num_beams=4, dtype=dtype, io="packed")
    return model, root / "out", dtype, family


def test_the_packed_encoder_is_plugin_nodes_on_packed_tokens(exported_packed):
    _, out, dtype, family = exported_packed
    manifest = json.loads((out / "seq2seq.json").read_text())
    assert manifest["files"]["encoder_plugins"] == manifest["engine_graphs"]["encoder"] == "encoder.padfree.onnx"
    assert manifest["encoder_plugins"]["inputs"] == ["input_ids", "cu_seqlens", "max_seqlen"]
    assert manifest["encoder_plugins"]["fused"] == PACKED_FUSED[family]
    encoder = onnx.load(out / "encoder.padfree.onnx")
    onnx.checker.check_model(encoder, full_check=True)
    assert [i.name for i in encoder.graph.input] == ["input_ids", "cu_seqlens", "max_seqlen"]
    assert len(_plugins(encoder)) == sum(PACKED_FUSED[family].values())
    assert {n.op_type for n in encoder.graph.node if n.domain != "padfree"} <= ROW_WISE
    (embedding,) = [n for n in encoder.graph.node if n.op_type == "PadfreeEmbLayerNorm"]
    fields = {a.name: helper.get_attribute_value(a) for a in embedding.attribute}
    assert (fields["has_layernorm"], fields["position_offset"]) == PACKED_EMBEDDING[family]
    assert len(embedding.input) == 4 + 2 * fields["has_layernorm"]  # no token types; gamma, beta with the LayerNorm
    want = {"fp32": onnx.TensorProto.FLOAT, "fp16": onnx.TensorProto.FLOAT16}[dtype]
    assert _float_types(encoder) == {want}
    assert not (out / f"encoder.{dtype}.onnx").exists()     # the packed encoder is the engines' encoder


def test_generation_through_the_packed_encoder(exported_packed):
    model, out, dtype, _ = exported_packed
    result = seq2seq_check.check(out, model, **CHECK)
    print("\n".join(result.lines))
    assert result.ok
    packed = [line for line in result.lines if line.startswith("encoder.padfree.onnx + ")]
    assert len(packed) == 2 and all(("rounded to fp16" in line) == (dtype == "fp16") for line in packed)


def test_inspect_shows_the_engine_graphs(exported_packed, capsys):
    _, out, dtype, family = exported_packed
    assert cli.main(["inspect", str(out), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    manifest = json.loads((out / "seq2seq.json").read_text())
    assert facts["kind"] == "seq2seq export" and facts["family"] == family and facts["dtype"] == dtype
    assert facts["engine_graphs"] == manifest["engine_graphs"]
    assert facts["encoder_plugins"] == {"io": "packed", "fused": PACKED_FUSED[family]}
    assert facts["decoder_plugins"]["num_beams"] == 4


def test_the_packed_encoder_refuses_m2m100s_padding_id_inside_a_source(exported_packed):
    """M2M100 numbers positions by counting non-padding tokens, the plugin by order (offset + t): a source
    holding the padding id would be encoded otherwise than by HF, so the packed encoder refuses it."""
    from padfree.ops import InputError
    from padfree.runtime.backends.onnxrt_seq2seq import OnnxrtSeq2SeqGenerator

    model, out, _, family = exported_packed
    pad = model.config.pad_token_id if family == "m2m100" else None
    assert json.loads((out / "seq2seq.json").read_text())["encoder_plugins"]["position_pad_id"] == pad
    if pad is None:
        return
    generator = OnnxrtSeq2SeqGenerator(out, step="plugins")
    with pytest.raises(InputError, match=f"source 1 holds the padding id {pad} at position 2"):
        generator.generate([[5, 6, 7], [8, 9, pad, 10]], max_new_tokens=2)


def test_a_wrong_weight_in_the_packed_encoder_is_caught(exported_packed, tmp_path):
    import shutil

    import numpy as np
    from onnx import numpy_helper

    model, out, _, _ = exported_packed
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    encoder = onnx.load(bad / "encoder.padfree.onnx")
    weight = next(t for t in encoder.graph.initializer if t.name.startswith("padfree/qkv_weight"))  # layer 0's
    value = numpy_helper.to_array(weight)
    scaled = value.astype(np.float32)
    scaled[0] *= 1.5
    weight.CopyFrom(numpy_helper.from_array(scaled.astype(value.dtype), weight.name))
    onnx.save(encoder, bad / "encoder.padfree.onnx")
    result = seq2seq_check.check(bad, model, steps=("plugins",), **CHECK)
    print("\n".join(result.lines))
    assert not result.ok


def test_an_engine_of_the_packed_encoder(exported_packed, tmp_path):
    from padfree.engines.build import BuildOptions, build as build_engine

    _, library = engine_prerequisites()
    _, out, dtype, _ = exported_packed
    metadata = build_engine(BuildOptions(onnx=str(out / "encoder.padfree.onnx"), output=str(tmp_path / "e.engine"),
                                         max_tokens=64, max_batch=4, max_seqlen=16, plugin_library=str(library),
                                         backend="tensorrt_rtx", progress=False))
    assert metadata["model"]["io"] == "packed" and metadata["precision"] == dtype


def test_io_packed_is_refused_where_the_encoder_does_not_fuse_whole(tmp_path):
    marian = build("marian", layers=(1, 1), d_model=96, heads=4, ffn=128)   # head_dim 24: no attention kernel
    with pytest.raises(ExportError, match="(?s)--io packed: the encoder does not fuse whole.*head_dim 24"):
        export(marian, tmp_path / "out", io="packed")
    assert not (tmp_path / "out" / "encoder.onnx").exists()
