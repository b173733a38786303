"""A seq2seq export's whole-generation graph (generation.padfree.onnx, `padfree export --io packed
--generation-graph N`) generating on ONNX Runtime (CPU), its plugin nodes on their references: one
session run per call, generate() around it as generation_graph.py does it for every executor.

    gen = Runtime("out/generation.padfree.onnx")
    out = gen.generate([[12, 7, 0], [5, 0]], return_dict_in_generate=True, output_scores=True)
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..._lib import PadfreeError
from ...ops._tensors import INT32_MAX
from .generation_graph import METADATA, GenerationGraph, is_generation_graph, packed_sources
from .onnxrt_seq2seq import MANIFEST

__all__ = ["OnnxrtGenerationGraph", "is_generation_graph", "generation_session", "run_generation_graph"]

def generation_session(path: Path, dtype: str = "fp32", threads: int | None = None):
    """A CPU session of the generation graph at `path` with its plugin nodes (the Loop body's too) on their
    ONNX Runtime references; an fp16 / bf16 graph cast back to float32."""
    import onnx
    import onnxruntime as ort

    from padfree.export.onnx_files import data_file, load_model
    from padfree.export.precision import cast
    from padfree.export.reference import with_references

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3
    if dtype == "fp32" and data_file(path).is_file():
        # past protobuf's 2 GB (NLLB-600M) the weights stay in the export's data file: the session gets the
        # graph alone, its plugin nodes expanded, as bytes, and reads the weights from the export's folder
        # (nothing is written there: it may be read-only)
        model = with_references(load_model(path, "the generation graph", load_external_data=False))
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         str(path.parent.resolve()))
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    model = load_model(path, "the generation graph")
    model = with_references(model if dtype == "fp32" else cast(model, "fp32"))
    with tempfile.TemporaryDirectory(prefix="padfree-generation-") as tmp:
        onnx.save_model(model, f"{tmp}/generation.onnx", save_as_external_data=True, location="weights.bin")
        del model
        return ort.InferenceSession(f"{tmp}/generation.onnx", options, providers=["CPUExecutionProvider"])


def run_generation_graph(session, sources: list[list[int]]) -> dict[str, np.ndarray]:
    """The graph's outputs by name for these sources (each a non-empty list of ids)."""
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, packed_sources(sources))))


class OnnxrtGenerationGraph(GenerationGraph):
    """generate() over a generation graph on ONNX Runtime (CPU); also a Runtime backend:
    padfree.Runtime("out/generation.padfree.onnx").generate(batch, **options)."""

    def __init__(self, path, *, threads: int | None = None):
        import onnx

        path = Path(path)
        if not is_generation_graph(path):
            raise PadfreeError(f"{os.fspath(path)} is not the generation graph of a seq2seq export (its folder's "
                               f"{MANIFEST} names none by that name): export with `padfree export MODEL --io packed "
                               f"--generation-graph N`")
        self.path = path
        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        if METADATA not in props:
            raise PadfreeError(f"{path}: no {METADATA} metadata (the options the graph was written with); "
                               f"export the model again")
        super().__init__(path.parent, json.loads(props[METADATA]), path.name)
        self.device = torch.device("cpu")
        self.session = generation_session(path, self.dtype, threads)

    def __repr__(self) -> str:
        return f"OnnxrtGenerationGraph({self.path}, {self.describe()}, ONNX Runtime CPU)"

    @property
    def limits(self):
        from .base import Limits
        return Limits(max_tokens=INT32_MAX, max_batch=INT32_MAX, max_seqlen=self.encoder_positions,
                      vocab_size=self.source_vocab_size, dtype=torch.float32)

    def execute(self, sources: list[list[int]]) -> dict[str, np.ndarray]:
        return run_generation_graph(self.session, sources)
