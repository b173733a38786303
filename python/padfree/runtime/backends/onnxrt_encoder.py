"""An encoder export folder (padfree export's model.padfree.onnx and report.json) on ONNX Runtime (CPU).

    rt = padfree.Runtime("out/")          # the folder `padfree export` wrote
    rt.run([[101, 7592, 102]]); rt.encode(["a text"])

It runs the rewritten model, the graph an engine is built from, with each plugin node expanded into
its ONNX reference (padfree.export.reference: the op's definition on packed rows, float32), so a
machine without a GPU serves the same packed computation, heads and sentence pooling included, and
`padfree run OUT --text` / `Runtime(OUT).encode` run end to end on it. A proof and a convenience,
not a fast path: the reference attention scores every token against every token of the chunk
([heads, T, T] float32), hence the small default max_tokens. A fp16 / bf16 export runs cast to
float32. A padded-form export (--io padded) gets each chunk re-padded on the host and its per-token
outputs packed again.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..._lib import PadfreeError
from ...ops._tensors import INT32_MAX
from .base import Limits, check_chunk_limits, check_packed

__all__ = ["OnnxrtEncoderBackend", "is_encoder_export"]

REPORT = "report.json"
# [heads, T, T] float32 scores: at 2048 tokens and 12 heads, 200 MB (the softmax holds a second copy)
DEFAULT_MAX_TOKENS = 2048
DEFAULT_MAX_BATCH = 256


def is_encoder_export(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / REPORT).is_file()


class OnnxrtEncoderBackend:
    """limits / output_names / device / execute_packed over an encoder export folder, on the CPU."""

    device = torch.device("cpu")

    def __init__(self, folder: str | os.PathLike, max_tokens: int | None = None, max_batch: int | None = None,
                 threads: int | None = None):
        check_chunk_limits(max_tokens, max_batch)
        self.folder = Path(folder)
        try:
            import onnxruntime as ort

            from padfree.export.compare import model_facts, token_outputs
            from padfree.export.errors import ExportError
            from padfree.export.onnx_files import load_model
            from padfree.export.precision import cast, float_dtype
            from padfree.export.reference import with_references
        except ImportError as e:
            raise PadfreeError(f"{self.folder}: serving an export folder on the CPU needs padfree.export and"
                               f" onnxruntime ({e})") from e
        try:
            report = json.loads((self.folder / REPORT).read_text())
            # a file of this folder: report.json names it, and never a path elsewhere
            name = Path(str(report.get("rewritten") or "model.padfree.onnx")).name
            model = load_model(self.folder / name, "the rewritten model")
            facts = model_facts(model)
        except (OSError, ValueError, AttributeError, ExportError) as e:
            raise PadfreeError(f"{self.folder}: not a usable encoder export ({e}); export the model again with"
                               " `padfree export`") from e
        if float_dtype(model) != "fp32":
            model = cast(model, "fp32")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self.session = ort.InferenceSession(with_references(model).SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
        self.io = facts.io
        self.task = report.get("task")
        self.output_names = list(facts.outputs)
        self._inputs = {i.name for i in self.session.get_inputs()}
        self._token_outputs = token_outputs(model)     # padded form only: outputs with [B, S] leading axes
        # read from the graph's output shapes: text-classification's logits are per sequence, token-
        # classification's per token, under one name
        self.per_sequence_outputs = frozenset(_per_sequence(model, facts.io, self._token_outputs))
        self.limits = Limits(
            max_tokens=min(DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens), INT32_MAX),
            max_batch=min(DEFAULT_MAX_BATCH if max_batch is None else int(max_batch), INT32_MAX),
            max_seqlen=facts.max_seqlen, vocab_size=facts.vocab_size, type_vocab_size=facts.type_vocab_size,
            dtype=torch.float32, position_pad_id=facts.pad_token_id if facts.position_offset > 0 else None)

    def __repr__(self) -> str:
        return f"OnnxrtEncoderBackend({self.folder}, {self.task}, {self.io} I/O, ONNX Runtime CPU)"

    def execute_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: torch.Tensor | None, stream: Any = None) -> dict[str, torch.Tensor]:
        check_packed(input_ids, cu_seqlens, max_seqlen, token_type_ids, self.device)
        ids, cu = input_ids.numpy(), cu_seqlens.numpy()
        types = np.zeros_like(ids) if token_type_ids is None else token_type_ids.numpy()
        if self.io == "packed":
            feed = {"input_ids": ids, "cu_seqlens": cu, "max_seqlen": np.zeros(max_seqlen, np.int32)}
            if "token_type_ids" in self._inputs:
                feed["token_type_ids"] = types
            values = self.session.run(self.output_names, feed)
            return {name: torch.from_numpy(v) for name, v in zip(self.output_names, values)}
        lengths = np.diff(cu)
        mask = np.arange(max_seqlen)[None, :] < lengths[:, None]
        feed = {"input_ids": _padded(ids, mask), "attention_mask": mask.astype(np.int32)}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = _padded(types, mask)
        values = self.session.run(self.output_names, feed)
        return {name: torch.from_numpy(np.ascontiguousarray(v[mask] if name in self._token_outputs else v))
                for name, v in zip(self.output_names, values)}


def _per_sequence(model: Any, io: str, token_outputs: set[str]) -> list[str]:
    """Outputs with one row per sequence: packed, those whose first axis is not input_ids' (T); padded,
    those without input_ids' [B, S] leading axes."""
    if io == "padded":
        return [o.name for o in model.graph.output if o.name not in token_outputs]
    ids = next(i for i in model.graph.input if i.name == "input_ids")
    tokens = ids.type.tensor_type.shape.dim[0].dim_param
    return [o.name for o in model.graph.output
            if not o.type.tensor_type.shape.dim or o.type.tensor_type.shape.dim[0].dim_param != tokens]


def _padded(packed: np.ndarray, mask: np.ndarray) -> np.ndarray:
    out = np.zeros(mask.shape, np.int32)
    out[mask] = packed
    return out
