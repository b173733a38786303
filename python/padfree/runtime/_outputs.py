"""Collects the chunks' outputs into tensors the caller owns, and shapes them per sequence or padded.

Chunk outputs are always copied out: a backend may hand back buffers it reuses on the next call (a
CUDA-graph replay's static outputs, an engine's bound output tensors), and the copy is small next to
the encoder's work.
"""
from __future__ import annotations

import numpy as np
import torch

from ._inputs import HostBatch
from ._plan import Chunk
from .backends.base import PER_SEQUENCE_OUTPUTS


class OutputGather:
    """Packed outputs of a whole batch: per-token ones [T, ...], per-sequence ones [B, ...]."""

    def __init__(self, names: list[str], batch: HostBatch):
        self.names = list(names)
        self.tokens = int(batch.lengths.sum())
        self.batch = len(batch.lengths)
        self.outputs: dict[str, torch.Tensor] = {}

    def add(self, chunk: Chunk, result: dict[str, torch.Tensor], backend_name: str) -> None:
        for name in self.names:
            if name not in result:
                raise RuntimeError(f"{backend_name}.execute_packed returned no '{name}' (it returned"
                                   f" {sorted(result)}), though its output_names list it")
            t = result[name]
            per_seq = name in PER_SEQUENCE_OUTPUTS
            rows, start, stop, total = ((chunk.batch, chunk.first, chunk.stop, self.batch) if per_seq else
                                        (chunk.tokens, chunk.token_start, chunk.token_stop, self.tokens))
            if t.dim() < 1 or t.shape[0] != rows:
                raise RuntimeError(f"{backend_name}.execute_packed returned '{name}' of shape"
                                   f" {list(t.shape)} for {chunk.batch} sequences / {chunk.tokens}"
                                   f" tokens; expected {rows} rows")
            dest = self.outputs.get(name)
            if dest is None:
                dest = self.outputs[name] = torch.empty((total, *t.shape[1:]), dtype=t.dtype, device=t.device)
            dest[start:stop].copy_(t)


def padded_index(batch: HostBatch) -> np.ndarray:
    """Row of each packed token in the flattened [B * S] padded output."""
    mask = batch.mask
    if mask is None:
        mask = np.arange(batch.padded_width)[None, :] < batch.lengths[:, None]
    return np.flatnonzero(mask)


def to_host(outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Asynchronous copies into pinned host tensors (fresh ones: the caller keeps what it gets);
    the caller synchronizes the stream before reading them."""
    host = {}
    for name, t in outputs.items():
        if t.device.type == "cpu":
            host[name] = t
            continue
        h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        h.copy_(t, non_blocking=True)
        host[name] = h
    return host


def shape_outputs(packed: dict[str, torch.Tensor], batch: HostBatch, padded: bool,
                  index: torch.Tensor | None) -> dict[str, torch.Tensor | list[torch.Tensor]]:
    """Per-token outputs as a list of [len_i, ...] views, or [B, S, ...] with zeros in padding when
    `padded` (index: padded_index() on the outputs' device); per-sequence outputs stay [B, ...]."""
    lengths = batch.lengths.tolist()
    shaped: dict[str, torch.Tensor | list[torch.Tensor]] = {}
    for name, t in packed.items():
        if name in PER_SEQUENCE_OUTPUTS:
            shaped[name] = t
        elif padded:
            rows = len(lengths) * batch.padded_width
            out = torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
            out.index_copy_(0, index.to(torch.int64), t)
            shaped[name] = out.view(len(lengths), batch.padded_width, *t.shape[1:])
        else:
            shaped[name] = list(torch.split(t, lengths))
    return shaped


def to_numpy(shaped: dict[str, torch.Tensor | list[torch.Tensor]]) -> dict[str, np.ndarray | list[np.ndarray]]:
    """numpy views of host tensors; bfloat16, which numpy lacks, becomes float32."""
    def conv(t: torch.Tensor) -> np.ndarray:
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return {name: [conv(x) for x in v] if isinstance(v, list) else conv(v) for name, v in shaped.items()}
