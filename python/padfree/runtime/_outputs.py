"""Collects the chunks' outputs into tensors the caller owns, in their final layout, and shapes them
per sequence or padded.

Chunk outputs are always copied out: a backend may hand back buffers it reuses on the next call (a
CUDA-graph replay's static outputs, an engine's bound output tensors), and the copy is small next to
the encoder's work. Each chunk is copied once, straight to where the caller's output lives: packed
[T, ...] (per-sequence views later), scattered into padded [B * S, ...] on the device, or, for numpy
output, into pinned host memory (asynchronously; the caller waits on an event before reading).
"""
from __future__ import annotations

import numpy as np
import torch

from ._inputs import HostBatch
from ._plan import Chunk


class OutputGather:
    """Outputs of a whole batch: per-token ones packed [T, ...] or, with `index` (padded_index() on
    the backend's device, int32), padded [B * S, ...] with zeros in padding; per-sequence ones [B, ...].
    to_host: put them in pinned host memory (padded ones are scattered on the device first).
    per_sequence: the names of the per-sequence outputs (the backend's, base.per_sequence_outputs_of).
    """

    def __init__(self, names: list[str], batch: HostBatch, index: torch.Tensor | None = None,
                 to_host: bool = False, per_sequence: frozenset[str] = frozenset()):
        self.names = list(names)
        self.per_sequence = per_sequence
        self.tokens = int(batch.cu_seqlens[-1])
        self.batch = len(batch.lengths)
        self.rows = self.batch * batch.padded_width
        self.index = index
        self.to_host = to_host
        self.outputs: dict[str, torch.Tensor] = {}

    def add(self, chunk: Chunk, result: dict[str, torch.Tensor], backend_name: str) -> None:
        for name in self.names:
            if name not in result:
                raise RuntimeError(f"{backend_name}.execute_packed returned no '{name}' (it returned"
                                   f" {sorted(result)}), though its output_names list it")
            t = result[name]
            per_seq = name in self.per_sequence
            rows, start, stop = ((chunk.batch, chunk.first, chunk.stop) if per_seq else
                                 (chunk.tokens, chunk.token_start, chunk.token_stop))
            if t.dim() < 1 or t.shape[0] != rows:
                raise RuntimeError(f"{backend_name}.execute_packed returned '{name}' of shape"
                                   f" {list(t.shape)} for {chunk.batch} sequences / {chunk.tokens}"
                                   f" tokens; expected {rows} rows")
            total = self.batch if per_seq else self.tokens
            scatter = not per_seq and self.index is not None
            dest = self.outputs.get(name)
            if scatter:
                if dest is None:  # padding rows stay zero
                    dest = self.outputs[name] = torch.zeros((self.rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
                # index_copy_ takes int64 indices; converted here, after the chunk's launch, not before
                dest.index_copy_(0, self.index[start:stop].long(), t)
                continue
            pinned = self.to_host and t.device.type == "cuda"
            if dest is None and rows == total and not pinned:  # the whole batch in one chunk: one call
                self.outputs[name] = t.clone(memory_format=torch.contiguous_format)
                continue
            if dest is None:
                dest = self.outputs[name] = torch.empty((total, *t.shape[1:]), dtype=t.dtype,
                                                        device="cpu" if pinned else t.device, pin_memory=pinned)
            # asynchronous only into pinned memory; the caller waits on an event before reading it
            (dest if rows == total else dest[start:stop]).copy_(t, non_blocking=True)

    def finish(self) -> dict[str, torch.Tensor]:
        """The outputs; with to_host, the padded ones' asynchronous copies to pinned memory enqueued."""
        if not self.to_host:
            return self.outputs
        return {name: t if t.device.type == "cpu" else _to_pinned(t) for name, t in self.outputs.items()}


def _to_pinned(t: torch.Tensor) -> torch.Tensor:
    h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    h.copy_(t, non_blocking=True)
    return h


def padded_index(batch: HostBatch) -> np.ndarray:
    """Row of each packed token in the flattened [B * S] padded output."""
    mask = batch.mask
    if mask is None:
        mask = np.arange(batch.padded_width)[None, :] < batch.lengths[:, None]
    return np.flatnonzero(mask)


def shape_outputs(outputs: dict[str, torch.Tensor], batch: HostBatch, padded: bool,
                  numpy: bool = False, per_sequence: frozenset[str] = frozenset(), packed: bool = False
                  ) -> dict[str, torch.Tensor | np.ndarray | list]:
    """OutputGather's outputs as the caller gets them: per-token ones as a list of [len_i, ...] views,
    padded [B, S, ...], or packed [T, ...] with the batch's `cu_seqlens` (int32 [B + 1], on the host)
    beside them; per-sequence ones [B, ...]. numpy: as numpy arrays (views of the host tensors;
    bfloat16, which numpy lacks, becomes float32, which reads the data: wait for it first)."""
    shaped: dict[str, torch.Tensor | np.ndarray | list] = {}
    for name, t in outputs.items():
        if numpy:
            t = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        if name in per_sequence or packed:
            shaped[name] = t
        elif padded:
            shaped[name] = t.reshape(len(batch.lengths), batch.padded_width, *t.shape[1:])
        elif numpy:  # slicing numpy is ~0.13 us a view, torch.split ~0.4, and .numpy() on each ~0.7 more
            cu = batch.cu_seqlens.tolist()
            shaped[name] = [t[i:j] for i, j in zip(cu, cu[1:])]
        else:
            shaped[name] = list(t.split_with_sizes(batch.lengths.tolist()))
    if packed:
        cu_seqlens = batch.cu_seqlens.astype(np.int32)
        shaped["cu_seqlens"] = cu_seqlens if numpy else torch.from_numpy(cu_seqlens)
    return shaped


def needs_data(outputs: dict[str, torch.Tensor], numpy: bool) -> bool:
    """Whether shape_outputs reads the values (and so must wait for the GPU)."""
    return numpy and any(t.dtype == torch.bfloat16 for t in outputs.values())
