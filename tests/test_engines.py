"""padfree.engines on the CPU: engines built with TensorRT-RTX (or TensorRT) from a plain export of a
tiny random BertModel, the sidecar round trip and every refusal the engine backend makes before
TensorRT sees the bytes, and `padfree check --engine`'s comparison against ONNX Runtime (run here
through a CPU backend double, as engines execute only on a GPU TensorRT supports)."""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from padfree.engines import profiles, sidecar, trt_api
from padfree.engines.errors import (
    BuildError,
    CorruptEngineError,
    EngineError,
    EngineFormatError,
    EngineVersionError,
    PluginLibraryError,
    PrecisionError,
)

needs_trt = pytest.mark.skipif(not trt_api.available(), reason="neither tensorrt nor TensorRT-RTX Python bindings"
                               " are importable (pip install 'padfree[trt-rtx]')")
VOCAB, TYPES, POSITIONS, HIDDEN = 120, 2, 64, 32


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory) -> Path:
    """A plain torch.onnx.export of a tiny random BertModel: padded int64 inputs, both outputs."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=POSITIONS, type_vocab_size=TYPES)
    model = transformers.BertModel(config).eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = (torch.randint(0, VOCAB, (2, 8)), torch.ones(2, 8, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long))
    path = tmp_path_factory.mktemp("bert") / "model.onnx"
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    torch.onnx.export(Encoder().eval(), example, str(path), input_names=names,
                      output_names=["last_hidden_state", "pooler_output"], opset_version=17, dynamo=False,
                      dynamic_axes={**axes, "last_hidden_state": {0: "batch", 1: "sequence"},
                                    "pooler_output": {0: "batch"}})
    return path


@pytest.fixture(scope="module")
def built(bert_onnx, tmp_path_factory):
    if not trt_api.available():
        pytest.skip("no TensorRT Python bindings")
    from padfree.engines.build import BuildOptions, build
    engine = tmp_path_factory.mktemp("engine") / "model.engine"
    metadata = build(BuildOptions(str(bert_onnx), str(engine), precision="fp32", max_tokens=256, max_batch=8,
                                  profiles=["32x2", "64x4x16"], progress=False))
    return engine, metadata


# ---- building -----------------------------------------------------------------------------------
@needs_trt
def test_build_plain_bert(built, bert_onnx):
    engine, metadata = built
    api = trt_api.load()
    assert metadata["backend"] == {"name": api.name, "version": api.version}
    assert metadata["model"]["io"] == "padded" and metadata["model"]["max_positions"] == POSITIONS
    assert metadata["model"]["sha256"] == sidecar.digest(bert_onnx.read_bytes())
    assert [t["name"] for t in metadata["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [t["name"] for t in metadata["outputs"]] == ["last_hidden_state", "pooler_output"]
    # Smallest profile first; max_seqlen defaults to the position table; each input spans 1..limits.
    assert [(p["max_tokens"], p["max_batch"], p["max_seqlen"]) for p in metadata["profiles"]] == [
        (32, 2, 32), (64, 4, 16), (256, 8, POSITIONS)]
    assert metadata["profiles"][-1]["shapes"]["input_ids"] == {"min": [1, 1], "opt": [4, 32], "max": [8, POSITIONS]}
    assert metadata["plugins"] == [] and metadata["plugin_library"] is None
    blob = engine.read_bytes()
    assert metadata["engine"] == {"bytes": len(blob), "sha256": sidecar.digest(blob)}
    assert sidecar.read(engine) == metadata  # round trip through the file


@needs_trt
def test_cli_build_with_timing_cache(bert_onnx, tmp_path):
    from padfree.cli import main
    api = trt_api.load()
    cache = tmp_path / "timing.cache"
    for attempt in range(2):  # the second build reads the cache the first wrote
        out = tmp_path / f"cli{attempt}.engine"
        assert main(["build", str(bert_onnx), "-o", str(out), "--precision", "fp32", "--max-tokens", "64",
                     "--max-batch", "4", "--max-seqlen", "16", "--timing-cache", str(cache), "--no-progress"]) == 0
        assert out.is_file() and sidecar.path_for(out).is_file()
        # TensorRT-RTX's timing cache is a no-op: it is reported unused, not faked.
        assert cache.is_file() == api.has_timing_cache
    recorded = json.loads(sidecar.path_for(out).read_text())["timing_cache"]
    assert recorded == (str(cache) if api.has_timing_cache else None)


@needs_trt
def test_precision_is_honest(bert_onnx, tmp_path):
    api = trt_api.load()
    from padfree.engines.build import BuildOptions, build
    options = BuildOptions(str(bert_onnx), str(tmp_path / "fp16.engine"), precision="fp16", max_tokens=64,
                           max_batch=4, progress=False)
    if api.strongly_typed_only:  # TensorRT-RTX: the ONNX dtype decides, no silent fp32 build
        with pytest.raises(PrecisionError, match="strongly typed"):
            build(options)
    else:
        assert "FP16" in build(options)["precision_mode"]


@needs_trt
def test_build_refusals(bert_onnx, tmp_path):
    from padfree.engines.build import BuildOptions, build
    out = str(tmp_path / "x.engine")
    with pytest.raises(BuildError, match="position table"):
        build(BuildOptions(str(bert_onnx), out, precision="fp32", max_tokens=512, max_seqlen=128, progress=False))
    with pytest.raises(BuildError, match="exceeds"):
        build(BuildOptions(str(bert_onnx), out, precision="fp32", max_tokens=64, max_batch=4, profiles=["128x2"],
                           progress=False))
    with pytest.raises(BuildError, match="does not exist"):
        build(BuildOptions(str(tmp_path / "missing.onnx"), out, progress=False))
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00not an onnx model")
    with pytest.raises(BuildError):
        build(BuildOptions(str(garbage), out, progress=False))


# ---- what model_info reads from an ONNX without padfree's metadata ---------------------------------
def test_model_info_sizes_of_a_plain_export(bert_onnx):
    """A plain torch export records no padfree.* metadata: the sizes come from the tables the ids index."""
    import onnx

    from padfree.engines import model_info
    assert not [p for p in onnx.load(str(bert_onnx), load_external_data=False).metadata_props
                if p.key.startswith("padfree.")]
    info = model_info.read(bert_onnx)
    assert (info.vocab_size, info.type_vocab_size, info.max_positions) == (VOCAB, TYPES, POSITIONS)


def _embedding_onnx(path: Path, with_types: bool, vocab: int, types: int, offset: int = 0) -> Path:
    """A packed graph of one PadfreeEmbLayerNorm node whose tables carry no HF names."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    table = lambda name, rows: numpy_helper.from_array(rng.standard_normal((rows, 8)).astype(np.float32), name)  # noqa: E731
    inits = [table("t0", vocab), table("t1", 16)] + ([table("t2", types)] if with_types else []) + [
        numpy_helper.from_array(np.ones(8, np.float32), "g"), numpy_helper.from_array(np.zeros(8, np.float32), "b")]
    ids = ["input_ids"] + (["token_type_ids"] if with_types else []) + ["cu_seqlens"]
    tables = ["t0", "t1"] + (["t2"] if with_types else [])
    node = helper.make_node("PadfreeEmbLayerNorm", ids + tables + ["g", "b"], ["y"], domain="padfree",
                            epsilon=1e-12, position_offset=offset, has_token_type=int(with_types))
    graph = helper.make_graph([node], "emb", [helper.make_tensor_value_info(n, TensorProto.INT32, ["T"]) for n in ids],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 8])], inits)
    model = helper.make_model(graph)
    # metadata that disagrees with the tables, as an edited file could: the tables must win
    helper.set_model_props(model, {"padfree.vocab_size": "100000", "padfree.type_vocab_size": "9",
                                   "padfree.max_position_embeddings": "4096"})
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("with_types", [True, False])
def test_model_info_sizes_from_plugin_tables(tmp_path, with_types):
    from padfree.engines import model_info
    info = model_info.read(_embedding_onnx(tmp_path / "emb.onnx", with_types, vocab=37, types=3))
    assert info.vocab_size == 37 and info.max_positions == 16
    assert info.type_vocab_size == (3 if with_types else 0)  # no token_type_ids input: the model takes none
    assert info.position_pad_id is None


def test_model_info_reads_roberta_numbering_from_the_node(tmp_path):
    """position_offset 2 (RoBERTa, padding id 1): two rows fewer, and the padding id for the runtime."""
    from padfree.engines import model_info
    info = model_info.read(_embedding_onnx(tmp_path / "emb.onnx", False, vocab=37, types=0, offset=2))
    assert (info.max_positions, info.position_pad_id) == (14, 1)


@pytest.mark.parametrize("metadata", [None, "not json", '{"search": "greedy"}',
                                      '{"search": "sample", "max_new_tokens": 4}'])
def test_model_info_refuses_a_generation_graph_without_its_search(tmp_path, metadata):
    """A generation graph's engine records the search the graph runs (its padfree.generation metadata):
    a graph without a readable one is refused before anything is built."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from padfree.engines import model_info
    node = helper.make_node("Identity", ["input_ids"], ["sequences"])
    node2 = helper.make_node("Identity", ["cu_seqlens"], ["lengths"])
    graph = helper.make_graph([node, node2], "gen", [helper.make_tensor_value_info(n, TensorProto.INT32, ["T"])
                                                     for n in ("input_ids", "cu_seqlens")],
                              [helper.make_tensor_value_info(n, TensorProto.INT32, ["T"])
                               for n in ("sequences", "lengths")],
                              [numpy_helper.from_array(np.ones(4, np.float32), "w")])
    model = helper.make_model(graph)
    if metadata is not None:
        helper.set_model_props(model, {"padfree.generation": metadata})
    onnx.save(model, str(tmp_path / "g.onnx"))
    with pytest.raises(BuildError, match="without its padfree.generation metadata"):
        model_info.read(tmp_path / "g.onnx")
    helper.set_model_props(model, {"padfree.generation": '{"search": "beam", "max_new_tokens": 4, "num_beams": 2}'})
    onnx.save(model, str(tmp_path / "g.onnx"))
    assert model_info.read(tmp_path / "g.onnx").generation["num_beams"] == 2


def test_engine_check_never_draws_the_padding_id_inside_a_sequence():
    from padfree.engines.check import random_feeds
    feeds = random_feeds(["input_ids", "attention_mask"], np.int32, 3, 6, 40, vocab_size=5, type_vocab_size=0,
                         seed=0, pad_id=1)
    for feed in feeds:
        tokens = feed["input_ids"][feed["attention_mask"] == 1]
        assert 1 not in tokens and set(np.unique(tokens)) == {0, 2, 3, 4}  # every other id still drawn


@pytest.mark.parametrize("field, value, message", [
    ("max_batch", 0, "max_batch must be a positive integer, got 0"),
    ("max_tokens", -5, "max_tokens must be a positive integer"),
    ("max_seqlen", 0, "max_seqlen must be a positive integer, got 0"),  # 0 used to mean "the default"
    ("output", "TMP", "is a folder"),
    ("output", "TMP/m.engine.json", "sidecar's suffix"),
    ("timing_cache", "TMP", "is a folder"),
])
def test_build_refuses_bad_options_before_building(tmp_path, monkeypatch, field, value, message):
    from padfree.engines import build as build_module
    monkeypatch.setattr(build_module.trt_api, "load", lambda *a: pytest.fail("reached TensorRT"))
    path = _embedding_onnx(tmp_path / "emb.onnx", False, vocab=37, types=0)
    options = build_module.BuildOptions(str(path), str(tmp_path / "m.engine"), progress=False)
    setattr(options, field, value.replace("TMP", str(tmp_path)) if isinstance(value, str) else value)
    with pytest.raises(BuildError, match=message):
        build_module.build(options)


def _attention_onnx(path: Path, heads: int, head_dim: int) -> Path:
    """A packed graph of one PadfreeAttention node (fields as the exporter writes them)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    width = 3 * heads * head_dim
    node = helper.make_node("PadfreeAttention", ["qkv", "qkv_bias", "cu_seqlens", "max_seqlen"], ["context"],
                            domain="padfree", num_heads=heads, head_dim=head_dim, softmax_scale=head_dim ** -0.5)
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info("qkv", TensorProto.FLOAT16, ["T", width]),
         helper.make_tensor_value_info("cu_seqlens", TensorProto.INT32, ["B+1"]),
         helper.make_tensor_value_info("max_seqlen", TensorProto.INT32, ["S"])],
        [helper.make_tensor_value_info("context", TensorProto.FLOAT16, ["T", heads * head_dim])],
        [numpy_helper.from_array(np.zeros(width, np.float16), "qkv_bias")])
    onnx.save(helper.make_model(graph), str(path))
    return path


@pytest.mark.parametrize("heads, head_dim, problem", [
    (4, 16, "head_dim 16 is not built"), (4, 96, "head_dim 96 is not built"),
    (129, 64, "hidden size 8256 exceeds 8192")])
def test_build_refuses_attention_without_kernels(tmp_path, heads, head_dim, problem):
    """Refused before TensorRT is even loaded: the engine would otherwise fail at its first run."""
    from padfree.engines.build import BuildOptions, build
    onnx_path = _attention_onnx(tmp_path / "att.onnx", heads, head_dim)
    with pytest.raises(BuildError, match=f"{heads} heads x {head_dim}: {problem}"):
        build(BuildOptions(str(onnx_path), str(tmp_path / "att.engine"), progress=False))


def test_build_reads_attention_sizes(tmp_path):
    from padfree.engines import build as build_mod, model_info
    path = _attention_onnx(tmp_path / "att.onnx", 12, 64)
    info = model_info.read(path)
    assert info.attention_sizes == [(12, 64)]
    build_mod._check_kernel_sizes(info, path)  # BERT-base's attention has kernels


def test_profile_parsing():
    assert profiles.parse("4096x64", max_seqlen=512) == profiles.Profile(4096, 64, 512)
    assert profiles.parse("256x8x128", max_seqlen=512) == profiles.Profile(256, 8, 128)
    assert profiles.parse("100x2", max_seqlen=512) == profiles.Profile(100, 2, 100)
    for bad in ("4096", "ax2", "0x4", "64x2x128"):
        with pytest.raises(ValueError):
            profiles.parse(bad, max_seqlen=512)


# ---- the sidecar and the backend's refusals ---------------------------------------------------------
@pytest.fixture
def engine_copy(built, tmp_path):
    engine, _ = built
    copy = tmp_path / "copy.engine"
    shutil.copy(engine, copy)
    shutil.copy(sidecar.path_for(engine), sidecar.path_for(copy))
    return copy


def _edit(engine: Path, change) -> None:
    data = json.loads(sidecar.path_for(engine).read_text())
    change(data)
    sidecar.path_for(engine).write_text(json.dumps(data))


def _open(engine: Path, **kwargs):
    from padfree.runtime.backends.engine import open_engine
    return open_engine(engine, **kwargs)


@needs_trt
def test_refuses_missing_or_foreign_sidecar(engine_copy):
    sidecar.path_for(engine_copy).unlink()
    with pytest.raises(EngineFormatError, match="no sidecar"):
        _open(engine_copy)
    sidecar.path_for(engine_copy).write_text("{not json")
    with pytest.raises(EngineFormatError, match="JSON"):
        _open(engine_copy)
    sidecar.path_for(engine_copy).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(EngineFormatError, match="unknown format"):
        _open(engine_copy)


@needs_trt
@pytest.mark.parametrize("change, error, message", [
    (lambda d: d.update(format_version=sidecar.FORMAT_VERSION + 1), EngineVersionError, "format version"),
    (lambda d: d["backend"].update(version="0.0.1"), EngineVersionError, "only load into the version"),
    (lambda d: d["backend"].update(name="tensorrt" if d["backend"]["name"] != "tensorrt" else "tensorrt_rtx"),
     EngineVersionError, "was built with"),
    (lambda d: d.pop("profiles"), EngineFormatError, "lacks profiles"),
])
def test_refuses_version_mismatch(engine_copy, change, error, message):
    _edit(engine_copy, change)
    with pytest.raises(error, match=message):
        _open(engine_copy)


def _synthetic_sidecar(blob: bytes) -> dict:
    """A complete sidecar of a packed engine, as build() writes one (no TensorRT needed)."""
    return {"format": sidecar.FORMAT, "format_version": sidecar.FORMAT_VERSION, "padfree_version": "0.1.0",
            "backend": {"name": "tensorrt_rtx", "version": "1.7.0"},
            "model": {"io": "packed", "vocab_size": VOCAB, "type_vocab_size": TYPES, "max_positions": POSITIONS},
            "precision": "fp16", "profiles": [{"max_tokens": 32, "max_batch": 2, "max_seqlen": 32},
                                              {"max_tokens": 256, "max_batch": 8, "max_seqlen": 64}],
            "inputs": [{"name": n, "dtype": "int32", "shape": ["T"]}
                       for n in ("input_ids", "cu_seqlens", "max_seqlen")],
            "outputs": [{"name": "last_hidden_state", "dtype": "float16", "shape": ["T", HIDDEN]}],
            "plugins": ["PadfreeAttention"], "plugin_library": {"path": "/x/libpadfree_trt.so", "sha256": "ab" * 32},
            "engine": {"bytes": len(blob), "sha256": sidecar.digest(blob)}}


@pytest.fixture
def synthetic_engine(tmp_path) -> Path:
    engine = tmp_path / "synthetic.engine"
    engine.write_bytes(b"not a plan, never deserialized here")
    sidecar.write(engine, _synthetic_sidecar(engine.read_bytes()))
    return engine


def test_sidecar_accepts_a_complete_one(synthetic_engine):
    want = _synthetic_sidecar(synthetic_engine.read_bytes())
    assert sidecar.read(synthetic_engine) == want
    _edit(synthetic_engine, lambda d: d["model"].update(vocab_size=None, type_vocab_size=0, max_positions=None))
    assert sidecar.read(synthetic_engine)["model"]["vocab_size"] is None


_CORRUPTIONS = [
    (lambda d: d.update(profiles=[]), r"profiles is \[\]"),
    (lambda d: d.update(profiles=[[32, 2, 32]]), "profiles is"),
    (lambda d: d["profiles"][1].update(max_batch="8"), r"profiles\[1\]\.max_batch is '8'"),
    (lambda d: d["profiles"][0].update(max_tokens=True), r"profiles\[0\]\.max_tokens is True"),
    (lambda d: d["profiles"][0].update(max_seqlen=0), r"profiles\[0\]\.max_seqlen is 0"),
    (lambda d: d["profiles"][0].pop("max_seqlen"), r"profiles\[0\]\.max_seqlen is missing"),
    (lambda d: d.update(backend="tensorrt"), "backend is 'tensorrt'"),
    (lambda d: d["backend"].update(version=10), r"backend\.version is 10"),
    (lambda d: d.update(engine=[1, 2]), "engine is"),
    (lambda d: d["engine"].update(bytes="35"), r"engine\.bytes is '35'"),
    (lambda d: d["engine"].update(sha256=None), r"engine\.sha256 is None"),
    (lambda d: d.update(model=None), "model is None"),
    (lambda d: d["model"].update(io="ragged"), r"model\.io is 'ragged'"),
    (lambda d: d["model"].update(vocab_size=-1), r"model\.vocab_size is -1"),
    (lambda d: d["model"].update(type_vocab_size=1.5), r"model\.type_vocab_size is 1\.5"),
    (lambda d: d.update(precision="int8"), "precision is 'int8'"),
    (lambda d: d.update(inputs={"input_ids": "int32"}), "inputs is"),
    (lambda d: d["inputs"][0].update(dtype="float64"), r"inputs\[0\]\.dtype is 'float64'"),
    (lambda d: d["inputs"][2].pop("name"), r"inputs\[2\]\.name is missing"),
    (lambda d: d["inputs"].pop(), "packed engine lists inputs .* max_seqlen"),
    (lambda d: d.update(outputs=[{"dtype": "float16"}]), r"outputs\[0\]\.name is missing"),
    (lambda d: d.update(plugins="PadfreeAttention"), "plugins is"),
    (lambda d: d["plugin_library"].update(path=3), r"plugin_library\.path is 3"),
    (lambda d: d["model"].update(position_pad_id=-1), r"model\.position_pad_id is -1"),
    (lambda d: d["model"].update(io="generation", generation={"search": "sampling", "max_new_tokens": 8}),
     r"model\.generation\.search is 'sampling'"),
    (lambda d: d["model"].update(io="generation", generation={"search": "beam", "max_new_tokens": 8, "num_beams": 1,
                                                              "num_return_sequences": 1}),
     r"model\.generation\.num_beams is 1"),
    (lambda d: d["model"].update(io="generation", generation={"search": "greedy", "max_new_tokens": 0}),
     r"model\.generation\.max_new_tokens is 0"),
]


@pytest.mark.parametrize("change, message", _CORRUPTIONS)
def test_sidecar_refuses_corrupt_structure(synthetic_engine, change, message):
    """A sidecar with the right keys but unusable values is refused by name, not left to raise
    IndexError / TypeError / KeyError in the backend."""
    _edit(synthetic_engine, change)
    with pytest.raises(EngineFormatError, match=message):
        sidecar.read(synthetic_engine)


@needs_trt
@pytest.mark.parametrize("change, message", [_CORRUPTIONS[0], _CORRUPTIONS[2], _CORRUPTIONS[12], _CORRUPTIONS[17]])
def test_backend_refuses_corrupt_sidecar(engine_copy, change, message):
    _edit(engine_copy, change)
    with pytest.raises(EngineFormatError, match=message):
        _open(engine_copy)


@needs_trt
def test_refuses_corrupt_bytes(engine_copy):
    blob = bytearray(engine_copy.read_bytes())
    engine_copy.write_bytes(bytes(blob[: len(blob) // 2]))
    with pytest.raises(CorruptEngineError, match="truncated, corrupt or replaced"):
        _open(engine_copy)
    blob[len(blob) // 3] ^= 0xFF
    engine_copy.write_bytes(bytes(blob))
    with pytest.raises(CorruptEngineError):
        _open(engine_copy)


@needs_trt
def test_refuses_missing_plugin_library(engine_copy, monkeypatch):
    from padfree.engines import plugin_library
    monkeypatch.setattr(plugin_library, "candidates", lambda: [])
    _edit(engine_copy, lambda d: d.update(plugins=["PadfreeAttention"],
                                          plugin_library={"path": "/nonexistent/libpadfree_trt.so",
                                                                          "sha256": "0" * 64}))
    with pytest.raises(PluginLibraryError, match="uses padfree plugins"):
        _open(engine_copy)
    with pytest.raises(PluginLibraryError, match="does not exist"):
        _open(engine_copy, plugin_library_path="/nonexistent/libpadfree_trt.so")


def test_plugin_library_other_than_the_built_one_is_refused(tmp_path, caplog):
    """The sidecar records the plugin library's SHA-256 at build; another build is refused unless the
    caller allows it, and then loaded with a warning naming both."""
    import logging

    from padfree.engines import plugin_library
    built, loaded = tmp_path / "built" / plugin_library.LIBRARY_NAME, tmp_path / "loaded" / plugin_library.LIBRARY_NAME
    for path, content in ((built, b"plugins, first build"), (loaded, b"plugins, second build")):
        path.parent.mkdir()
        path.write_bytes(content)
    recorded = {"path": str(built), "sha256": plugin_library.sha256(built)}
    assert not plugin_library.check_recorded(built, recorded, "m.engine")
    for record in (recorded, None):  # None: a sidecar of plugins that records no library cannot vouch for one
        with pytest.raises(PluginLibraryError, match="--allow-plugin-mismatch") as refused:
            plugin_library.check_recorded(loaded, record, "m.engine")
        assert plugin_library.sha256(loaded) in str(refused.value)
    with caplog.at_level(logging.WARNING, logger="padfree.engines"):
        assert plugin_library.check_recorded(loaded, recorded, "m.engine", allow_mismatch=True)
    (record,) = caplog.records
    for part in ("m.engine", str(built), recorded["sha256"], str(loaded), plugin_library.sha256(loaded)):
        assert part in record.getMessage()


@pytest.fixture
def plugin_engine(tmp_path, monkeypatch):
    """A synthetic engine using plugins, recorded as built by the installed TensorRT with the
    library `recorded.so`; the library actually loaded is spied on (nothing is dlopened)."""
    from padfree.engines import plugin_library
    api = trt_api.load()
    recorded = tmp_path / "recorded" / plugin_library.LIBRARY_NAME
    recorded.parent.mkdir()
    recorded.write_bytes(b"the plugins the engine was built with")
    engine = tmp_path / "plugins.engine"
    engine.write_bytes(b"not a plan")
    data = _synthetic_sidecar(engine.read_bytes())
    data["backend"] = {"name": api.name, "version": api.version}
    data["plugin_library"] = {"path": str(recorded), "sha256": plugin_library.sha256(recorded)}
    sidecar.write(engine, data)
    loads = []
    monkeypatch.setattr(plugin_library, "load_into", lambda trt, path: loads.append(path))
    from padfree import env  # no installed library: only $PADFREE_TRT_LIBRARY, where a test sets it
    monkeypatch.setattr(plugin_library, "candidates",
                        lambda: [env.path(plugin_library.ENV_VAR)] if env.is_set(plugin_library.ENV_VAR) else [])
    monkeypatch.delenv(plugin_library.ENV_VAR, raising=False)
    return engine, recorded, loads


@needs_trt
def test_a_sidecar_never_chooses_the_library_to_load(plugin_engine, monkeypatch, tmp_path):
    """The recorded path exists and has the recorded hash, yet it is not loaded: only the caller,
    $PADFREE_TRT_LIBRARY or the installation choose code to run."""
    import torch

    from padfree.engines import plugin_library
    engine, recorded, loads = plugin_engine
    with pytest.raises(PluginLibraryError, match="was not found"):
        _open(engine)
    assert loads == []
    other = tmp_path / "other.so"
    other.write_bytes(b"some other code")
    monkeypatch.setenv(plugin_library.ENV_VAR, str(other))
    with pytest.raises(PluginLibraryError, match="allow-plugin-mismatch"):
        _open(engine)
    with pytest.raises(PluginLibraryError, match="allow-plugin-mismatch"):
        _open(engine, plugin_library_path=other)
    assert loads == []  # refused before loading: a library's constructors run when it loads
    monkeypatch.setenv(plugin_library.ENV_VAR, str(tmp_path / "missing.so"))  # a typo is not skipped over
    with pytest.raises(PluginLibraryError, match="PADFREE_TRT_LIBRARY\\) does not exist"):
        _open(engine)
    monkeypatch.setenv(plugin_library.ENV_VAR, str(other))
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: past the plugins, TensorRT would deserialize the fake plan")
    for kwargs in ({"plugin_library_path": recorded}, {"plugin_library_path": other, "allow_plugin_mismatch": True}):
        with pytest.raises(EngineError, match="needs a CUDA device"):
            _open(engine, **kwargs)
    assert loads == [recorded.resolve(), other.resolve()]


@needs_trt
def test_valid_engine_gets_past_every_check(built):
    """What remains is TensorRT's own deserialization, which needs a GPU it supports."""
    import torch
    engine, _ = built
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this checks the CPU-only refusal")
    with pytest.raises(EngineError, match="needs a CUDA device"):
        _open(engine)


def test_execute_packed_refuses_host_tensors_before_tensorrt():
    """execute_packed checks its inputs before any CUDA call (so this runs without a GPU): the
    backend object is bare, as nothing past the check may be reached."""
    import torch

    from padfree.ops._tensors import InputError
    from padfree.runtime.backends.engine import EngineBackend
    backend = EngineBackend.__new__(EngineBackend)
    backend.device = torch.device("cuda", 0)
    ids, cu = torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(InputError, match="input_ids: expected a tensor on device cuda:0, got one on cpu"):
        backend.execute_packed(ids, cu, 3, None, None)
    backend.device = torch.device("cpu")
    with pytest.raises(InputError, match="cu_seqlens: expected dtype torch.int32"):
        backend.execute_packed(ids, cu.long(), 3, None, None)


# ---- padfree check --engine ---------------------------------------------------------------------
class OrtPackedBackend:
    """A CPU Runtime backend running the plain ONNX on ONNX Runtime: rebuilds padding from the
    packed batch, runs, removes padding. Stands in for an engine where none can execute."""

    def __init__(self, onnx_path: Path, perturb: float = 0.0):
        import onnxruntime
        import torch

        from padfree.runtime import Limits
        self.session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        self.limits = Limits(max_tokens=256, max_batch=8, max_seqlen=POSITIONS, vocab_size=VOCAB,
                             type_vocab_size=TYPES, dtype=torch.float32)
        self.output_names = ["last_hidden_state", "pooler_output"]
        self.device = torch.device("cpu")
        self.perturb = perturb

    def execute_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, stream):
        import torch
        cu = cu_seqlens.numpy()
        batch = len(cu) - 1
        ids = np.zeros((batch, max_seqlen), np.int64)
        types = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for b in range(batch):
            n = cu[b + 1] - cu[b]
            ids[b, :n] = input_ids.numpy()[cu[b]:cu[b + 1]]
            if token_type_ids is not None:
                types[b, :n] = token_type_ids.numpy()[cu[b]:cu[b + 1]]
            mask[b, :n] = 1
        hidden, pooled = self.session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        packed = np.concatenate([hidden[b, : cu[b + 1] - cu[b]] for b in range(batch)])
        return {"last_hidden_state": torch.from_numpy(packed + self.perturb), "pooler_output": torch.from_numpy(pooled)}


@pytest.mark.parametrize("perturb, passes", [(0.0, True), (1e-2, False)])
def test_check_compares_against_onnxruntime(bert_onnx, perturb, passes):
    pytest.importorskip("polygraphy")
    pytest.importorskip("onnxruntime")
    from padfree.engines import check
    from padfree.polygraphy_runners import RuntimeRunner
    from padfree.runtime import Runtime
    names = ["input_ids", "attention_mask", "token_type_ids"]
    feeds = check.random_feeds(names, np.dtype(np.int64), iterations=2, batch=5, max_seqlen=24, vocab_size=VOCAB,
                               type_vocab_size=TYPES, seed=3)
    assert feeds[0]["attention_mask"][0].sum() == 24 and feeds[0]["attention_mask"][1].sum() == 1  # edge lengths
    runner = RuntimeRunner(lambda: Runtime(OrtPackedBackend(bert_onnx, perturb)), input_names=names,
                           index_dtype=np.int64)
    errors = check.compare(runner, str(bert_onnx), feeds, *check.TOLERANCES["fp32"])
    by_name = {e.name: e for e in errors}
    assert set(by_name) == {"last_hidden_state", "pooler_output"}
    assert by_name["pooler_output"].passed
    assert by_name["last_hidden_state"].passed is passes
    if passes:
        assert by_name["last_hidden_state"].max_abs < 1e-5
    else:
        assert by_name["last_hidden_state"].max_abs == pytest.approx(perturb, rel=1e-3)
    assert "FAIL" in check.report(errors, 1e-4, 1e-4) or passes


@needs_trt
def test_check_main_refuses_without_sidecar(bert_onnx, tmp_path):
    from padfree.engines import check
    args = argparse.Namespace(engine=str(tmp_path / "none.engine"), reference=str(bert_onnx))
    assert check.main(args) == 2
