"""A whole-generation engine (`padfree build OUT/generation.padfree.onnx`) generating on the GPU:
padfree.Runtime("OUT/generation.engine").generate(batch, **options).

generate() is generation_graph.py's, as for the graph on ONNX Runtime: the options resolved as HF's
generate resolves them and checked against the search the engine was built with (the sidecar's
model.generation, from the graph's metadata), the sources checked; here also against the engine's
profiles (batch, source tokens, longest source), all before anything reaches the GPU (the engine is
deserialized at the first run, so these refusals need none). One enqueued engine run per call on the
graph's I/O, synchronized to read the lengths.

The export folder (config.json, generation_config.json, seq2seq.json: HF's option resolution and the
vocabulary and position limits) is the engine's own folder, where `padfree build` writes it by default,
or the one given as export_dir; its seq2seq.json must name a generation graph.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from padfree.engines.errors import EngineError

from .base import on_stream
from .engine import EngineFile
from .generation_graph import GenerationGraph, packed_sources
from .onnxrt_seq2seq import MANIFEST, is_seq2seq_export

__all__ = ["EngineGeneration"]


def _generation_io(engine: EngineFile) -> None:
    if engine.io != "generation":
        raise EngineError(f"{engine.path}: an engine of {engine.io} I/O, not a whole-generation engine: serve it"
                          " with Runtime.run (encoders)")
    facts = engine.metadata["model"].get("generation")
    if not isinstance(facts, dict):
        raise EngineError(f"{engine.path}: its sidecar records no model.generation (the search the engine runs):"
                          " rebuild it with `padfree build` from the export's generation.padfree.onnx")


def export_folder(engine_path: Path, export_dir: str | os.PathLike | None) -> Path:
    """The export whose generation graph the engine was built from: export_dir, or the engine's folder."""
    folder = Path(export_dir) if export_dir is not None else engine_path.parent
    if not is_seq2seq_export(folder):
        where = "export_dir" if export_dir is not None else "the engine's folder"
        raise EngineError(f"{engine_path}: {where} {os.fspath(folder)} holds no seq2seq export ({MANIFEST},"
                          f" config.json, generation_config.json): generate() resolves HF's options from them;"
                          f" pass export_dir= the `padfree export` folder the engine was built from")
    files = json.loads((folder / MANIFEST).read_text()).get("files", {})
    if not files.get("generation"):
        raise EngineError(f"{engine_path}: the export in {os.fspath(folder)} has no generation graph (export with"
                          f" --io packed --generation-graph N): it is not the one the engine was built from")
    return folder


class EngineGeneration(GenerationGraph):
    """generate() over a whole-generation engine on the GPU; a Runtime backend."""

    def __init__(self, path: str | os.PathLike, plugin_library_path: str | os.PathLike | None = None,
                 backend: str | None = None, device: Any = None, allow_plugin_mismatch: bool = False,
                 export_dir: str | os.PathLike | None = None):
        path = Path(path)
        # the GPU is opened at the first run: options, sources and profiles are refused without one
        self.engine = EngineFile(path, plugin_library_path, backend, device, allow_plugin_mismatch,
                                 check=_generation_io, defer_device=True)
        self.path = path
        super().__init__(export_folder(path, export_dir), self.engine.metadata["model"]["generation"], path.name)
        # where it will run; on a machine without a GPU a placeholder (nothing runs there: execute refuses)
        self.device = torch.device(device) if device is not None else torch.device(
            "cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)

    def __repr__(self) -> str:
        api = self.engine.api
        return f"EngineGeneration({str(self.path)!r}, {self.describe()}, {api.name} {api.version})"

    @property
    def limits(self):
        from .base import Limits
        largest = self.engine.profiles[-1]
        return Limits(max_tokens=largest.max_tokens, max_batch=largest.max_batch,
                      max_seqlen=min(largest.max_seqlen, self.encoder_positions), vocab_size=self.source_vocab_size,
                      dtype=torch.float32)

    def execute(self, sources: list[list[int]]) -> dict[str, np.ndarray]:
        host = packed_sources(sources)
        # a batch outside every profile is refused (an EngineError naming it) before the GPU is opened
        index = self.engine.profile_for(len(host["input_ids"]), len(sources), len(host["max_seqlen"]))
        self.engine.open_on_device()
        self.device = self.engine.device
        stream = torch.cuda.current_stream(self.device)
        with on_stream(stream):
            feeds = {name: self.engine.typed(name, torch.from_numpy(value).to(self.device, non_blocking=False))
                     for name, value in host.items()}
            outputs = self.engine.run(index, feeds, stream)
            found = {name: value.cpu().numpy() for name, value in outputs.items()}   # synchronizes the stream
        return found
