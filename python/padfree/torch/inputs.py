"""HF-style inputs -> validated packed inputs for PadfreeEncoder, written straight into the int32
buffer the forward reads (a graph's static inputs, or a fresh one when running eagerly).

Two routes, one set of rules and messages (padfree.runtime's host validation):
- host inputs (CPU tensors, numpy, lists, a list of sequences): validated and packed on the host,
  then one asynchronous copy from pinned memory; no synchronization.
- inputs already on the GPU: copied to pinned host memory first (the one synchronization: the
  token count must reach the host to pick the graph), then as above.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..ops._tensors import InputError
from ..runtime._inputs import to_host_batch, validate
from ..runtime._staging import aligned
from ..runtime.backend import Limits


@dataclass
class InputBuffer:
    """One int32 device buffer [ids | token types | cu_seqlens] and its views, so that host-packed
    inputs arrive in one copy. tokens/batch are its capacity (a bucket's, or a batch's exact size)."""
    flat: torch.Tensor
    input_ids: torch.Tensor               # [tokens]
    token_type_ids: torch.Tensor | None   # [tokens]
    cu_seqlens: torch.Tensor              # [batch + 1]

    @staticmethod
    def layout(tokens: int, batch: int, token_types: bool) -> tuple[int, int, int]:
        """(types offset or -1, cu_seqlens offset, total size) in elements; ids start at 0."""
        # every part starts 256-byte aligned, as TensorRT and the vectorized kernels want
        types_at = aligned(tokens) if token_types else -1
        cu_at = aligned(tokens) * (2 if token_types else 1)
        return types_at, cu_at, cu_at + batch + 1

    @classmethod
    def new(cls, tokens: int, batch: int, token_types: bool, device: torch.device) -> "InputBuffer":
        types_at, cu_at, size = cls.layout(tokens, batch, token_types)
        flat = torch.zeros(size, dtype=torch.int32, device=device)
        return cls(flat, flat[:tokens], flat[types_at:types_at + tokens] if token_types else None,
                   flat[cu_at:cu_at + batch + 1])

    def pad_batch(self, batch: int, tokens: int) -> None:
        """Sequences past `batch` (bucket padding) get length 0: cu_seqlens repeats its last value."""
        if self.cu_seqlens.shape[0] > batch + 1:
            self.cu_seqlens[batch + 1:].fill_(tokens)


@dataclass
class Batch:
    """A validated batch: its sizes, and fill(buffer) writing it into an InputBuffer."""
    total_tokens: int
    batch: int
    max_seqlen: int
    padded_width: int                   # S of the padded outputs
    token_types: bool
    fill: Callable[[InputBuffer], None]


def from_host(input_ids: Any, attention_mask: Any, token_type_ids: Any, limits: Limits) -> Batch:
    host = to_host_batch(input_ids, attention_mask, token_type_ids)
    validate(host, limits)
    total, batch = len(host.input_ids), len(host.lengths)
    types = host.token_type_ids

    def fill(buf: InputBuffer) -> None:
        tokens, cap = buf.input_ids.shape[0], buf.cu_seqlens.shape[0] - 1
        types_at, cu_at, size = InputBuffer.layout(tokens, cap, types is not None)
        pinned = buf.flat.device.type == "cuda"
        stage = torch.empty(size, dtype=torch.int32, pin_memory=pinned)
        a = stage.numpy()
        a[:total] = host.input_ids  # int64 -> int32: validate() range-checked the ids
        a[total:tokens] = 0         # rows of no sequence (bucket padding)
        if types is not None:
            a[types_at:types_at + total] = types
            a[types_at + total:types_at + tokens] = 0
        a[cu_at:cu_at + batch + 1] = host.cu_seqlens
        a[cu_at + batch + 1:size] = total
        buf.flat.copy_(stage, non_blocking=pinned)

    return Batch(total, batch, int(host.lengths.max()), host.padded_width, types is not None, fill)


def from_device(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                token_type_ids: torch.Tensor | None, limits: Limits, device: torch.device) -> Batch:
    """A padded batch already on `device`: copied to pinned host memory (one synchronization, as
    the token count must reach the host anyway), then validated and packed as host inputs.

    Measured on the H100 (NOTES-bert.md v2): checking on the GPU instead took ~10 small launches
    before the read-back and cost more host time than this copy and numpy's checks.
    """
    staged = []
    for name, t in (("input_ids", input_ids), ("attention_mask", attention_mask),
                    ("token_type_ids", token_type_ids)):
        if t is None:
            staged.append(None)
            continue
        if not isinstance(t, torch.Tensor) or t.device != device:
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            raise InputError(f"{name}: expected a tensor on {device} (or on the CPU), got {where}")
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        staged.append(host)
    torch.cuda.current_stream(device).synchronize()
    return from_host(*staged, limits)
