"""TensorRT plugins (plugins/trt): the C++ harness that calls their IPluginV3 methods directly (and,
on a GPU, compares enqueue with the C ABI), the creators against plugins/spec/plugins.json, loading
libpadfree_trt.so into TensorRT-RTX's registry, and engines built on the CPU from plugin graphs.

The harness and library exist only where the plugins were built with TensorRT headers
(cmake -DTensorRT_ROOT=...); set PADFREE_TRT_HARNESS / PADFREE_TRT_LIBRARY to point at them.
"""
from __future__ import annotations

import glob
import subprocess
import sys
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
    creators, io, aliases = {}, {}, {}
    for line in listing.splitlines():
        words = line.split()
        if words[0] == "alias":  # alias LABEL [OUTPUT:INPUT ...] (getAliasedInput of the case's plugin)
            aliases[words[1]] = {tuple(map(int, w.split(":"))) for w in words[2:]}
        elif words[0] == "io":  # io LABEL PLUGIN INPUTS OUTPUTS [FIELD=VALUE ...] (the case's int fields)
            io[words[1]] = (words[2], int(words[3]), int(words[4]),
                            {k: int(v) for k, v in (w.split("=") for w in words[5:])})
        else:  # PLUGIN VERSION NAMESPACE [FIELD:TYPE or FIELD:TYPE=DEFAULT ...]
            fields = dict(w.split(":") for w in words[3:])
            creators[words[0]] = (words[1], words[2], {k: v.split("=")[0] for k, v in fields.items()},
                                  {k: float(v.split("=")[1]) for k, v in fields.items() if "=" in v})
    assert set(creators) == set(SPEC.plugins)
    assert {name for name, *_ in io.values()} == set(SPEC.plugins)  # a harness case for every plugin
    for name, plugin in SPEC.plugins.items():
        version, namespace, fields, defaults = creators[name]
        assert (version, namespace) == (SPEC.version, SPEC.namespace)
        assert fields == plugin.fields, name
        assert defaults == plugin.defaults, name  # the same fields default, to the same values
    # Input/output counts of every harness case against the spec (inputs with `when` counted per case).
    for label, (name, nb_in, nb_out, case_fields) in io.items():
        assert nb_in == len(SPEC[name].input_names(case_fields)), label
        assert nb_out == len(SPEC[name].output_names(case_fields)), label
        # the outputs each plugin aliases to inputs are the spec's "aliases" (which builds need the preview
        # feature follows from them: engines/model_info.aliasing_plugins)
        inputs = SPEC[name].input_names(case_fields)
        outputs = [p for p in SPEC[name].outputs if p.present(case_fields)]
        assert aliases[label] == {(o, inputs.index(p.aliases)) for o, p in enumerate(outputs) if p.aliases}, label


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


def decoder_step_graph(path: Path | None = None, hidden=128, heads=2, cache_len=16, vocab=100, beams=2, k=5):
    """One decoding step made of one node of each decoder plugin plus MatMuls: a per-step engine's
    I/O, with the K/V caches as inputs and as outputs (aliased to the inputs inside the plugin)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(2)
    head_dim = hidden // heads

    def weight(name, *shape):
        return numpy_helper.from_array((0.1 * rng.standard_normal(shape)).astype(np.float32), name)

    cache = ["R", heads, cache_len, head_dim]
    topk_fields = dict(k=k, normalize=1, repetition_penalty=1.0, has_bias=1, has_beam_scores=1, has_banned=0,
                       has_penalty=0, has_forced=1)
    nodes = [
        helper.make_node("MatMul", ["hidden", "w_qkv"], ["qkv"]),
        _plugin_node("PadfreeDecoderSelfAttention", ["qkv", "b_qkv", "k_cache", "v_cache", "cache_indir", "step"],
                     ["self_context", "k_cache_out", "v_cache_out"], num_heads=heads, head_dim=head_dim,
                     softmax_scale=float(head_dim ** -0.5)),
        _plugin_node("PadfreeDecoderCrossAttention", ["self_context", "b_q", "kv_mem", "cu_seqlens", "max_seqlen"],
                     ["cross_context"], num_beams=beams, num_heads=heads, head_dim=head_dim,
                     softmax_scale=float(head_dim ** -0.5)),
        helper.make_node("MatMul", ["cross_context", "w_vocab"], ["logits"]),
        _plugin_node("PadfreeLogitsTopK", ["logits", "b_vocab", "beam_scores", "forced_ids"], ["scores", "ids"],
                     **topk_fields),
        _plugin_node("PadfreeBeamReorder", ["cache_indir", "parents", "step"], ["cache_indir_out"]),
    ]
    inits = [weight("w_qkv", hidden, 3 * hidden), weight("b_qkv", 3 * hidden), weight("b_q", hidden),
             weight("w_vocab", hidden, vocab), weight("b_vocab", vocab)]
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    inputs = [helper.make_tensor_value_info("hidden", f32, ["R", hidden]),
              helper.make_tensor_value_info("k_cache", f32, cache),
              helper.make_tensor_value_info("v_cache", f32, cache),
              helper.make_tensor_value_info("cache_indir", i32, ["R", cache_len]),
              helper.make_tensor_value_info("step", i32, [1]),
              helper.make_tensor_value_info("kv_mem", f32, ["T", 2 * hidden]),
              helper.make_tensor_value_info("cu_seqlens", i32, ["B+1"]),
              helper.make_tensor_value_info("max_seqlen", i32, ["S"]),
              helper.make_tensor_value_info("beam_scores", f32, ["R"]),
              helper.make_tensor_value_info("forced_ids", i32, ["R"]),
              helper.make_tensor_value_info("parents", i32, ["R"])]
    outputs = [helper.make_tensor_value_info("k_cache_out", f32, cache),
               helper.make_tensor_value_info("v_cache_out", f32, cache),
               helper.make_tensor_value_info("scores", f32, ["R", k]),
               helper.make_tensor_value_info("ids", i32, ["R", k]),
               helper.make_tensor_value_info("cache_indir_out", i32, ["R", cache_len])]
    model = helper.make_model(helper.make_graph(nodes, "decoder_step", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(SPEC.namespace, 1)])
    if path is not None:
        onnx.save(model, str(path))
    return model


def decoder_loop_graph(path: Path, steps: int = 4):
    """decoder_step_graph's attentions, logits MatMul and top-k as the body of an ONNX Loop, the form of
    a whole-generation engine: the K/V caches and the step loop-carried (aliased by the self-attention
    inside the loop), each step's candidates a scan output, the other inputs loop-invariant. The
    plugins that take scratch hold their own (own_workspace 1): TensorRT-RTX gives none inside a loop."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    step = decoder_step_graph()
    g = step.graph
    carried = {"k_cache": "k_cache_out", "v_cache": "v_cache_out", "step": "step_next"}
    given = {v.name: v for v in g.input}
    nodes = [n for n in g.node if n.op_type != "PadfreeBeamReorder"]
    for n in nodes:
        if n.op_type in ("PadfreeDecoderSelfAttention", "PadfreeDecoderCrossAttention", "PadfreeLogitsTopK"):
            kept = [a for a in n.attribute if a.name != "own_workspace"]
            del n.attribute[:]
            n.attribute.extend(kept + [helper.make_attribute("own_workspace", 1)])
    nodes += [helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones([1], np.int32))),
              helper.make_node("Add", ["step", "one"], ["step_next"]),
              helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    produced = {v.name: v for v in g.output}
    body = helper.make_graph(
        nodes, "step",
        [helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])] + [given[c] for c in carried],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])]
        + [produced.get(out) or helper.make_tensor_value_info(out, TensorProto.INT32, [1]) for out in carried.values()]
        + [helper.make_tensor_value_info("ids", TensorProto.INT32, ["R", 5])])
    loop = helper.make_node("Loop", ["trip_count", "keep_going"] + list(carried),
                            [f"{c}_final" for c in carried] + ["all_ids"], body=body)
    outputs = [helper.make_tensor_value_info(f"{c}_final", given[c].type.tensor_type.elem_type, None) for c in carried]
    outputs.append(helper.make_tensor_value_info("all_ids", TensorProto.INT32, None))
    invariant = [v for v in g.input if v.name not in carried and v.name not in ("cache_indir", "parents")]
    inits = list(g.initializer) + [numpy_helper.from_array(np.array(steps, np.int64), "trip_count"),
                                   numpy_helper.from_array(np.array(True), "keep_going")]
    model = helper.make_model(helper.make_graph([loop], "decoder_loop", invariant + [given[c] for c in carried]
                                                + [given["cache_indir"]], outputs, inits),
                              opset_imports=list(step.opset_import))
    onnx.save(model, str(path))
    return model


def test_decoder_step_graph_shapes_in_one_pass():
    """export/shapes.py infers every tensor of a graph of the decoder plugins from the spec's port
    expressions (R, L, 3*num_heads*head_dim, [1], k, fp32 scores), and the wiring check passes it."""
    pytest.importorskip("onnx")
    from onnx import TensorProto

    from padfree.export import shapes, wiring
    model = shapes.infer(decoder_step_graph(), SPEC)
    found = {vi.name: (vi.type.tensor_type.elem_type,
                       [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim])
             for vi in list(model.graph.value_info) + list(model.graph.output)}
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    assert found["self_context"] == (f32, ["R", 128])
    assert found["k_cache_out"] == found["v_cache_out"] == (f32, ["R", 2, 16, 64])
    assert found["cross_context"] == (f32, ["R", 128])
    assert found["scores"] == (f32, ["R", 5]) and found["ids"] == (i32, ["R", 5])
    assert found["cache_indir_out"] == (i32, ["R", 16])
    assert wiring.problems(model) == []
    # A cache of the wrong head count, and fp16 beam scores, are refused against the spec.
    bad = decoder_step_graph()
    bad.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 3
    with pytest.raises(shapes.ShapeError, match="PadfreeDecoderSelfAttention.*k_cache"):
        shapes.infer(bad, SPEC)
    bad = decoder_step_graph()
    bad.graph.input[8].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(shapes.ShapeError, match="beam_scores.*FLOAT"):
        shapes.infer(bad, SPEC)


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


# How a host that never calls loadLibrary brings the plugins in (Triton's TensorRT backend dlopens
# --backend-config=tensorrt,plugins=... RTLD_LOCAL; LD_PRELOAD), each in a fresh process: the static
# registration must land in the registry of the runtime the process holds, however that was loaded.
_REGISTERED = """
import ctypes, os, sys
from padfree.engines import trt_api
trt = trt_api.load().trt                     # the bindings load their runtime RTLD_LOCAL
mode = sys.argv[2]
if mode != "preloaded":
    ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW | (os.RTLD_GLOBAL if mode == "global" else os.RTLD_LOCAL))
lib = ctypes.CDLL(sys.argv[1])               # the same object: its flag of the load-time registration
names = sys.argv[3].split(",")
creators = [trt.get_plugin_registry().get_creator(n, sys.argv[4], sys.argv[5]) for n in names]
print("statically", lib.padfree_trt_statically_registered(), "creators", sum(c is not None for c in creators))
if lib.padfree_trt_statically_registered():   # then loadLibrary still works: the creators move, not doubled
    trt.get_plugin_registry().load_library(sys.argv[1])
    again = [trt.get_plugin_registry().get_creator(n, sys.argv[4], sys.argv[5]) for n in names]
    print("after load_library", sum(c is not None for c in again))
"""


def _registration(mode: str, preload: list[str] | None = None) -> subprocess.CompletedProcess:
    environment = env.with_search_path("LD_PRELOAD", preload) if preload else None   # ':' separates, as ' ' does
    return subprocess.run([sys.executable, "-c", _REGISTERED, str(LIBRARY), mode, ",".join(SPEC.plugins),
                           SPEC.version, SPEC.namespace], capture_output=True, text=True, timeout=300, env=environment)


def _runtime_library() -> Path:
    """The shared library of the TensorRT runtime the bindings load (TensorRT-RTX's or TensorRT's)."""
    import importlib.util
    for package, pattern in (("tensorrt_rtx_libs", "libtensorrt_rtx.so.*"), ("tensorrt_libs", "libnvinfer.so.*")):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            hits = sorted(Path(next(iter(spec.submodule_search_locations))).glob(pattern))
            if hits:
                return hits[0]
    pytest.skip("no TensorRT runtime library from a pip package (tensorrt_rtx_libs, tensorrt_libs)")


@needs_library
@pytest.mark.parametrize("mode", ["local", "global"])
def test_library_loaded_by_dlopen_registers_in_the_loaded_runtime(mode):
    _rtx()
    done = _registration(mode)
    count = len(SPEC.plugins)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"statically 1 creators {count}" in done.stdout and f"after load_library {count}" in done.stdout, \
        done.stdout + done.stderr[-2000:]


@needs_library
def test_library_preloaded_registers_with_its_runtime_and_says_so_without():
    _rtx()
    runtime = _runtime_library()
    count = len(SPEC.plugins)
    for order in ([str(LIBRARY), str(runtime)], [str(runtime), str(LIBRARY)]):
        done = _registration("preloaded", order)
        assert done.returncode == 0 and f"statically 1 creators {count}" in done.stdout, done.stdout + done.stderr
        assert "no TensorRT runtime" not in done.stderr
    alone = _registration("preloaded", [str(LIBRARY)])
    assert alone.returncode == 0 and "statically 0 creators 0" in alone.stdout, alone.stdout + alone.stderr
    assert "no TensorRT runtime (libnvinfer / libtensorrt_rtx) is loaded" in alone.stderr


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


_DECODER_STEP_BUILD = r"""
import json, sys
from padfree.engines import plugin_library, trt_api
onnx_path, engine_path, library, aliasing = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
api = trt_api.load()
trt = api.trt
plugin_library.load_into(trt, plugin_library.find(library))
logger = trt.Logger(trt.Logger.WARNING)
builder = trt.Builder(logger)
network = api.create_network(builder, strongly_typed=True)
parser = trt.OnnxParser(network, logger)
if not parser.parse_from_file(onnx_path):
    sys.exit("parse: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
config = builder.create_builder_config()
config.set_preview_feature(trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03, aliasing)
profile = builder.create_optimization_profile()
rows, batch, tokens, seqlen = (2, 8, 16), (2, 5, 9), (1, 64, 256), (1, 32, 64)  # R = 2 beams x B
for k in range(network.num_inputs):
    t = network.get_input(k)
    extents = {"R": rows, "B+1": batch, "T": tokens, "S": seqlen}
    dims = [extents.get(d) if isinstance(d, str) else None for d in _ONNX_DIMS[t.name]]
    shape = [[fixed if dim is None else dim[j] for dim, fixed in zip(dims, t.shape)] for j in range(3)]
    profile.set_shape(t.name, *shape)
config.add_optimization_profile(profile)
plan = builder.build_serialized_network(network, config)
if plan is None:
    sys.exit("the build failed (messages above)")
open(engine_path, "wb").write(bytes(plan))
print(json.dumps(api.plugin_layers(network)))
"""


def _build_decoder_graph(model, path: Path, engine: Path, aliasing: bool) -> subprocess.CompletedProcess:
    """_DECODER_STEP_BUILD on the graph saved at `path`, in a child process whose LD_LIBRARY_PATH holds
    the unversioned link the RTX parser dlopens (docs/PLUGINS.md); skips where the bindings lack the
    aliasing preview feature."""
    import os
    import sys
    import tempfile

    api = _rtx()
    if not hasattr(api.trt, "PreviewFeature") or not hasattr(api.trt.PreviewFeature, "ALIASED_PLUGIN_IO_10_03"):
        pytest.skip(f"{api.name} {api.version} has no ALIASED_PLUGIN_IO_10_03 preview feature")
    onnx_dims = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
                 for vi in model.graph.input}
    script = f"_ONNX_DIMS = {onnx_dims!r}\n" + _DECODER_STEP_BUILD
    environment = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="padfree-trt-") as links:
        versioned = api.needs_parser_link()
        if versioned is not None:
            (Path(links) / "libtensorrt_rtx.so").symlink_to(versioned)
            environment["LD_LIBRARY_PATH"] = links + os.pathsep + environment.get("LD_LIBRARY_PATH", "")
        return subprocess.run([sys.executable, "-c", script, str(path), str(engine), str(LIBRARY),
                               "1" if aliasing else "0"], capture_output=True, text=True, timeout=600, env=environment)


@needs_library
def test_decoder_plugins_inside_a_loop_build(tmp_path):
    """The whole-generation engine's form: the decoder's attention plugins (the caches aliased and
    loop-carried), a MatMul and the top-k (own_workspace 1) inside an ONNX Loop parse and build with
    TensorRT-RTX on the CPU (docs/PLUGINS.md, "Inside a Loop")."""
    import json

    engine = tmp_path / "loop.engine"
    done = _build_decoder_graph(decoder_loop_graph(tmp_path / "loop.onnx"), tmp_path / "loop.onnx", engine, True)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert engine.stat().st_size > 0
    layers = json.loads(done.stdout.strip().splitlines()[-1])
    assert [layer["plugin"] for layer in layers] == ["PadfreeDecoderSelfAttention", "PadfreeDecoderCrossAttention",
                                                     "PadfreeLogitsTopK"]


@needs_library
@pytest.mark.parametrize("aliasing", [True, False])
def test_engine_from_decoder_step_graph(tmp_path, aliasing):
    """A per-step decoder network (one node of each decoder plugin plus MatMuls, the K/V caches as
    inputs and outputs) parses and builds with TensorRT-RTX on the CPU with the plugin I/O aliasing
    preview feature on. Without it the builder refuses the self-attention's aliased cache outputs
    ("Aliased I/O used by plugin ... but PreviewFeature::kALIASED_PLUGIN_IO_10_03 not enabled"): a
    decoder engine must be built with it (docs/PLUGINS.md)."""
    import json

    engine = tmp_path / "step.engine"
    done = _build_decoder_graph(decoder_step_graph(tmp_path / "step.onnx"), tmp_path / "step.onnx", engine, aliasing)
    if not aliasing:
        assert done.returncode != 0 and "ALIASED_PLUGIN_IO_10_03 not enabled" in done.stdout + done.stderr, \
            done.stderr[-3000:] + done.stdout[-2000:]
        return
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert engine.stat().st_size > 0
    layers = json.loads(done.stdout.strip().splitlines()[-1])
    assert [layer["plugin"] for layer in layers] == ["PadfreeDecoderSelfAttention", "PadfreeDecoderCrossAttention",
                                                     "PadfreeLogitsTopK", "PadfreeBeamReorder"]
    self_attention, _, topk, reorder = layers
    assert [(o["dtype"], o["shape"]) for o in self_attention["outputs"]] == [
        ("FLOAT", [-1, 128]), ("FLOAT", [-1, 2, 16, 64]), ("FLOAT", [-1, 2, 16, 64])]
    assert [(o["dtype"], o["shape"]) for o in topk["outputs"]] == [("FLOAT", [-1, 5]), ("INT32", [-1, 5])]
    assert [(o["dtype"], o["shape"]) for o in reorder["outputs"]] == [("INT32", [-1, 16])]
    blob = engine.read_bytes()
    for name in ("PadfreeDecoderSelfAttention", "PadfreeDecoderCrossAttention", "PadfreeLogitsTopK",
                 "PadfreeBeamReorder"):
        assert name.encode() in blob, name  # each plugin's serialized state is in the engine
