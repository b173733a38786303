"""TensorRT plugins (plugins/trt): the C++ harness that calls their IPluginV3 methods directly (and,
on a GPU, compares enqueue with the C ABI), the creators against plugins/spec/plugins.json, loading
libpadfree_trt.so into TensorRT-RTX's registry, and engines built on the CPU from plugin graphs.

The harness and library exist only where the plugins were built with TensorRT headers
(cmake -DTensorRT_ROOT=...); set PADFREE_TRT_HARNESS / PADFREE_TRT_LIBRARY to point at them.
"""
from __future__ import annotations

import glob
import subprocess
from pathlib import Path

import numpy as np
import pytest

from padfree import env
from padfree.export import spec as spec_mod

ROOT = Path(__file__).resolve().parent.parent
SPEC = spec_mod.load()


def _find(variable: str, pattern: str) -> Path | None:
    if env.is_set(variable):
        return env.path(variable)
    hits = sorted(glob.glob(str(ROOT / "build" / "**" / pattern), recursive=True))
    return Path(hits[0]) if hits else None


HARNESS = _find("PADFREE_TRT_HARNESS", "padfree_trt_harness")
needs_harness = pytest.mark.skipif(HARNESS is None or not HARNESS.is_file(),
                                   reason="the plugin harness was not built (needs TensorRT headers:"
                                          " cmake -DTensorRT_ROOT=...; or set PADFREE_TRT_HARNESS)")


def _library() -> Path | None:
    try:
        from padfree.engines import plugin_library
        return plugin_library.find(required=False)
    except Exception:  # noqa: BLE001 - padfree.engines not importable, or an explicit path that does not exist
        return None


def _rtx():
    from padfree.engines import trt_api
    try:
        api = trt_api.load()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no TensorRT Python bindings: {e}")
    return api


# ---- the C++ harness -----------------------------------------------------------------------------
@needs_harness
def test_harness(seed):
    environment = env.with_value("PADFREE_SEED", str(seed))
    done = subprocess.run([str(HARNESS)], capture_output=True, text=True, timeout=600, env=environment)
    print(done.stdout[-4000:], done.stderr[-2000:])
    lines = done.stdout.splitlines()
    failures = [line for line in lines if line.startswith("FAIL")]
    assert not failures and done.returncode == 0, "\n".join(failures) or done.stderr[-2000:]
    assert sum(line.startswith("PASS") for line in lines) >= 10
    skipped = [line for line in lines if line.startswith("SKIP")]
    try:
        import torch
        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if gpu:  # enqueue against the C ABI must have run here
        assert not skipped, skipped


@needs_harness
def test_creators_follow_the_spec():
    listing = subprocess.run([str(HARNESS), "--list"], capture_output=True, text=True, timeout=60, check=True).stdout
    creators, io = {}, {}
    for line in listing.splitlines():
        words = line.split()
        if words[0] == "io":
            io[words[1]] = (words[2], int(words[3]), int(words[4]))
        else:
            creators[words[0]] = (words[1], words[2], dict(w.split(":") for w in words[3:]))
    assert set(creators) == set(SPEC.plugins)
    for name, plugin in SPEC.plugins.items():
        version, namespace, fields = creators[name]
        assert (version, namespace) == (SPEC.version, SPEC.namespace)
        assert fields == plugin.fields, name
    # Input/output counts of every harness case against the spec (inputs with `when` counted per case).
    for label, (name, nb_in, nb_out) in io.items():
        case_fields = {"has_token_type": int("without_type" not in label)}
        assert nb_in == len(SPEC[name].input_names(case_fields)), label
        assert nb_out == len(SPEC[name].output_names(case_fields)), label


# ---- TensorRT-RTX on the CPU ----------------------------------------------------------------------
def _plugin_node(name: str, inputs: list[str], outputs: list[str], **fields):
    """A node as the exporter makes it; node_attributes refuses a missing or unknown field."""
    from onnx import helper
    return helper.make_node(name, inputs, outputs, domain=SPEC.namespace, **SPEC.node_attributes(name, fields))


def packed_plugin_graph(path: Path, hidden=128, heads=2, vocab=100, positions=64):
    """A one-layer packed encoder made of padfree plugin nodes (plus one MatMul), per plugins.json;
    head_dim 64, one the attention kernels are built for (the engine builder refuses others)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array((0.1 * rng.standard_normal(shape)).astype(np.float32), name)

    emb_inputs = dict(zip(SPEC["PadfreeEmbLayerNorm"].input_names({"has_token_type": 1}),
                          ["input_ids", "token_type_ids", "cu_seqlens", "word", "position", "type", "gamma", "beta"]))
    nodes = [
        _plugin_node("PadfreeEmbLayerNorm", list(emb_inputs.values()), ["emb"], epsilon=1e-12, position_offset=0,
                     has_token_type=1),
        helper.make_node("MatMul", ["emb", "w_qkv"], ["qkv"]),
        _plugin_node("PadfreeAttention", ["qkv", "b_qkv", "cu_seqlens", "max_seqlen"], ["context"], num_heads=heads,
                     head_dim=hidden // heads, softmax_scale=float((hidden // heads) ** -0.5)),
        _plugin_node("PadfreeSkipLayerNorm", ["context", "emb", "bias", "gamma", "beta"], ["attn_out"], epsilon=1e-12),
        helper.make_node("MatMul", ["attn_out", "w_up"], ["up"]),
        _plugin_node("PadfreeBiasGelu", ["up", "b_up"], ["act"], approximate=0),
        helper.make_node("MatMul", ["act", "w_down"], ["down"]),
        _plugin_node("PadfreeLayerNorm", ["down", "gamma", "beta"], ["last_hidden_state"], epsilon=1e-12),
    ]
    inits = [weight("word", vocab, hidden), weight("position", positions, hidden), weight("type", 2, hidden),
             weight("gamma", hidden), weight("beta", hidden), weight("bias", hidden),
             weight("w_qkv", hidden, 3 * hidden),
             weight("b_qkv", 3 * hidden), weight("w_up", hidden, 4 * hidden), weight("b_up", 4 * hidden),
             weight("w_down", 4 * hidden, hidden)]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["T"]),
              helper.make_tensor_value_info("token_type_ids", TensorProto.INT32, ["T"]),
              helper.make_tensor_value_info("cu_seqlens", TensorProto.INT32, ["B+1"]),
              helper.make_tensor_value_info("max_seqlen", TensorProto.INT32, ["S"])]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["T", hidden])]
    model = helper.make_model(helper.make_graph(nodes, "packed", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(SPEC.namespace, 1)])
    onnx.save(model, str(path))
    return path


def padded_plugin_graph(path: Path, hidden=64, vocab=100, positions=64):
    """input_ids / attention_mask [B, S] -> remove padding -> embeddings -> rebuild padding; the
    RemovePadding node lists the spec's outputs (packed ids, cu_seqlens, the total_tokens size tensor)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("word", (vocab, hidden)), ("position", (positions, hidden)), ("gamma", (hidden,)),
                                 ("beta", (hidden,)))]
    remove_outputs = ["ids"] + SPEC["PadfreeRemovePadding"].output_names({})[1:]
    nodes = [
        _plugin_node("PadfreeRemovePadding", ["input_ids", "attention_mask"], remove_outputs),
        _plugin_node("PadfreeEmbLayerNorm", ["ids", "cu_seqlens", "word", "position", "gamma", "beta"], ["hidden"],
                     epsilon=1e-12, position_offset=0, has_token_type=0),
        _plugin_node("PadfreeRebuildPadding", ["hidden", "cu_seqlens", "attention_mask"], ["last_hidden_state"]),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, ["B", "S"]) for n in ("input_ids", "attention_mask")]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["B", "S", hidden])]
    model = helper.make_model(helper.make_graph(nodes, "padded", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(SPEC.namespace, 1)])
    onnx.save(model, str(path))
    return path


LIBRARY = _library()
needs_library = pytest.mark.skipif(LIBRARY is None, reason="libpadfree_trt.so was not built (needs TensorRT"
                                   " headers: cmake -DTensorRT_ROOT=...; or set PADFREE_TRT_LIBRARY)")


@needs_library
def test_library_registers_in_tensorrt():
    api = _rtx()
    from padfree.engines import plugin_library
    plugin_library.load_into(api.trt, LIBRARY)
    registry = api.trt.get_plugin_registry()
    for name, plugin in SPEC.plugins.items():
        creator = registry.get_creator(name, SPEC.version, SPEC.namespace)
        assert creator is not None, name
        assert [f.name for f in creator.field_names] == list(plugin.fields), name


@needs_library
@pytest.mark.parametrize("form", ["packed", "padded"])
def test_engine_from_plugin_graph(tmp_path, form):
    """Parses and builds on the CPU (TensorRT-RTX compiles ahead of time; running needs a GPU)."""
    api = _rtx()
    from padfree.engines import sidecar
    from padfree.engines.build import BuildOptions, build
    make = packed_plugin_graph if form == "packed" else padded_plugin_graph
    onnx_path = make(tmp_path / f"{form}.onnx")
    engine = tmp_path / f"{form}.engine"
    metadata = build(BuildOptions(str(onnx_path), str(engine), precision="fp32", max_tokens=256, max_batch=8,
                                  max_seqlen=64, profiles=["64x4"], progress=False))
    assert engine.stat().st_size == metadata["engine"]["bytes"] > 0
    assert sidecar.read(engine) == metadata
    assert metadata["backend"]["name"] == api.name and metadata["model"]["io"] == form
    expected = {"PadfreeEmbLayerNorm"} | ({"PadfreeAttention", "PadfreeSkipLayerNorm", "PadfreeBiasGelu",
                                           "PadfreeLayerNorm"} if form == "packed" else
                                          {"PadfreeRemovePadding", "PadfreeRebuildPadding"})
    assert set(metadata["plugins"]) == expected
    assert metadata["plugin_library"]["path"] == str(LIBRARY)


@needs_library
def test_remove_padding_node_with_its_size_tensor_is_accepted(tmp_path):
    """TensorRT's parser wants every plugin output on the node: the spec lists RemovePadding's size
    tensor (a node without it was refused: "Node has more output tensors than TRT expected, expected
    output size is 3, actual output size is 2"), and a node that follows the spec builds."""
    _rtx()
    from padfree.engines.build import BuildOptions, build
    total_tokens = SPEC["PadfreeRemovePadding"].outputs[-1]
    assert (total_tokens.name, total_tokens.dtype, total_tokens.shape) == ("total_tokens", "int32", ())
    onnx_path = padded_plugin_graph(tmp_path / "remove_padding.onnx")
    metadata = build(BuildOptions(str(onnx_path), str(tmp_path / "x.engine"), precision="fp32", max_tokens=64,
                                  max_batch=4, max_seqlen=16, progress=False))
    assert [layer["plugin"] for layer in metadata["plugin_layers"]] == [
        "PadfreeRemovePadding", "PadfreeEmbLayerNorm", "PadfreeRebuildPadding"]
    # As TensorRT sees the node: packed rows of a runtime length, and the 0-D int32 size tensor.
    assert metadata["plugin_layers"][0]["outputs"] == [
        {"name": "ids", "dtype": "INT32", "shape": [-1]}, {"name": "cu_seqlens", "dtype": "INT32", "shape": [-1]},
        {"name": "total_tokens", "dtype": "INT32", "shape": []}]
