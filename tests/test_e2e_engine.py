"""Export -> rewrite -> engine, end to end on the CPU: the built-in tiny BERT exported by padfree,
rewritten in both I/O forms, and built by TensorRT(-RTX) from model.onnx (always, where the bindings
are installed) and from model.padfree.onnx with libpadfree_trt.so (where it was built: TensorRT
headers are needed, cmake -DTensorRT_ROOT=...; set PADFREE_TRT_LIBRARY to point at it).

TensorRT-RTX compiles engines ahead of time on the CPU; running them needs a GPU it supports, and so
does its engine inspector (it deserializes the engine). What the engine holds is checked through the
network TensorRT built it from (its plugin layers, recorded in the sidecar) and through the plugins'
serialized state inside the engine bytes.
"""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx_graphsurgeon")
onnx = pytest.importorskip("onnx")

from padfree.engines import plugin_library, sidecar, trt_api  # noqa: E402

LIMITS = ["--max-tokens", "256", "--max-batch", "8", "--max-seqlen", "64"]
LAYERS = 2  # tiny-bert
# What the architecture has: one embedding, per layer one attention, two skip-LayerNorms, one GELU;
# the padded form adds one RemovePadding (ids and token types together) and one RebuildPadding.
FUSED = {"PadfreeEmbLayerNorm": 1, "PadfreeAttention": LAYERS, "PadfreeSkipLayerNorm": 2 * LAYERS,
         "PadfreeBiasGelu": LAYERS}
EDGES = {"PadfreeRemovePadding": 1, "PadfreeRebuildPadding": 1}


def _library() -> Path | None:
    try:
        return plugin_library.find(required=False)
    except Exception:  # noqa: BLE001 - an explicit $PADFREE_TRT_LIBRARY that does not exist
        return None


needs_trt = pytest.mark.skipif(not trt_api.available(), reason="neither tensorrt nor TensorRT-RTX Python bindings"
                               " are importable (pip install 'padfree[trt-rtx]')")
needs_library = pytest.mark.skipif(_library() is None, reason="libpadfree_trt.so was not built (needs TensorRT"
                                   " headers: cmake -DTensorRT_ROOT=...; or set PADFREE_TRT_LIBRARY)")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """tiny-bert exported once (model.onnx + the packed rewrite), then rewritten in padded form."""
    from padfree.export import export
    from padfree.export.pipeline import REWRITTEN, save
    from padfree.export.rewrite import rewrite
    packed = tmp_path_factory.mktemp("packed")
    result = export("tiny-bert", packed, io="packed")
    padded = tmp_path_factory.mktemp("padded")
    rewritten, report = rewrite(onnx.load(str(result.model_path)), io="padded")
    assert report.complete
    save(rewritten, padded / REWRITTEN)
    return {"plain": result.model_path, "packed": result.padfree_path, "padded": padded / REWRITTEN}


def _build(onnx_path: Path, engine: Path, *extra: str) -> dict:
    from padfree.cli import main
    assert main(["build", str(onnx_path), "-o", str(engine), "--precision", "fp32", *LIMITS, "--no-progress",
                 *extra]) == 0
    metadata = sidecar.read(engine)
    blob = engine.read_bytes()
    assert metadata["engine"] == {"bytes": len(blob), "sha256": sidecar.digest(blob)}
    return metadata


@needs_trt
def test_plain_export_builds(exported, tmp_path):
    metadata = _build(exported["plain"], tmp_path / "plain.engine")
    assert metadata["model"]["io"] == "padded"
    assert metadata["plugins"] == [] and metadata["plugin_layers"] == [] and metadata["plugin_library"] is None
    assert [t["name"] for t in metadata["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]


def _serialized_plugins(blob: bytes) -> set[str]:
    """Names of the padfree plugins whose serialized state (docs/PLUGINS.md "Serialization": "PFTR",
    u32 format version 1, u32 name length, the name) is in the engine bytes. Names only: TensorRT
    compresses parts of the plan, so how often each occurs says nothing."""
    names, start = set(), 0
    while (at := blob.find(b"PFTR\x01\x00\x00\x00", start)) >= 0:
        (length,) = struct.unpack_from("<I", blob, at + 8)
        names.add(blob[at + 12: at + 12 + length].decode("ascii", "replace"))
        start = at + 1
    return names


@needs_trt
@needs_library
@pytest.mark.parametrize("io", ["packed", "padded"])
def test_rewritten_export_builds_with_the_plugins(exported, tmp_path, io):
    library = _library()
    onnx_path = exported[io]
    engine = tmp_path / f"{io}.engine"
    metadata = _build(onnx_path, engine, "--plugin-library", str(library))
    want = {**FUSED, **(EDGES if io == "padded" else {})}
    assert metadata["model"]["io"] == io
    assert metadata["plugins"] == sorted(want)
    assert metadata["plugin_library"] == {"path": str(library), "sha256": plugin_library.sha256(library)}
    # The network TensorRT built the engine from: one padfree plugin layer per plugin node, no other.
    layers = metadata["plugin_layers"]
    assert {(layer["namespace"], layer["version"]) for layer in layers} == {("padfree", "1")}
    assert {name: sum(layer["plugin"] == name for layer in layers) for name in want} == want
    assert len(layers) == sum(want.values())
    nodes = {n.name for n in onnx.load(str(onnx_path), load_external_data=False).graph.node if n.domain == "padfree"}
    assert {layer["layer"] for layer in layers} == nodes
    inputs = [t["name"] for t in metadata["inputs"]]
    if io == "packed":
        assert inputs == ["input_ids", "token_type_ids", "cu_seqlens", "max_seqlen"]
    else:
        assert inputs == ["input_ids", "attention_mask", "token_type_ids"]
        # One RemovePadding, so one size tensor gives T to everything downstream.
        (remove,) = [layer for layer in layers if layer["plugin"] == "PadfreeRemovePadding"]
        assert [(o["dtype"], o["shape"]) for o in remove["outputs"]] == [("INT32", [-1, 2]), ("INT32", [-1]),
                                                                         ("INT32", [])]
    # The plugins' own serialized state is in the engine: the plugin layers went into it.
    assert _serialized_plugins(engine.read_bytes()) == set(want)


@needs_trt
@needs_library
def test_engine_refuses_another_plugin_build_unless_allowed(exported, tmp_path, caplog):
    """The backend compares the plugin library it is to load with the one the sidecar recorded."""
    import json
    import logging

    from padfree.engines.errors import EngineError, PluginLibraryError
    from padfree.runtime.backends.engine import open_engine
    library = _library()
    engine = tmp_path / "packed.engine"
    _build(exported["packed"], engine, "--plugin-library", str(library))
    data = json.loads(sidecar.path_for(engine).read_text())
    data["plugin_library"]["sha256"] = "0" * 64  # as if built with another build of the plugins
    sidecar.path_for(engine).write_text(json.dumps(data))
    with pytest.raises(PluginLibraryError, match="allow-plugin-mismatch"):
        open_engine(engine, plugin_library_path=library)
    with caplog.at_level(logging.WARNING, logger="padfree.engines"):
        try:
            open_engine(engine, plugin_library_path=library, allow_plugin_mismatch=True)
        except EngineError as e:  # without a GPU: refused after the plugins were loaded
            assert "needs a CUDA device" in str(e)
    assert "0" * 64 in caplog.text and plugin_library.sha256(library) in caplog.text
