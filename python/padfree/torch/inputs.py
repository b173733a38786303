"""HF-style inputs -> validated packed inputs for PadfreeEncoder, written straight into the int32
buffer the forward reads (a graph's static inputs, or a fresh one when running eagerly).

Two routes, one set of rules and messages (padfree.runtime's host validation):
- host inputs (CPU tensors, numpy, lists, a list of sequences): validated and packed on the host,
  then one asynchronous copy from pinned memory; no synchronization.
- inputs already on the GPU: the checks reduce to a few scalars on the device, read back in one
  small copy (the only host synchronization: the token count picks the graph), then the kernels
  pack on the device. Only when a device check fails are the inputs copied to the host, to name the
  offending row in the error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..ops._tensors import InputError
from ..runtime._inputs import to_host_batch, validate
from ..runtime.backend import Limits

_INDEX_DTYPES = (torch.int32, torch.int64)
_MASK_DTYPES = (torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
_ALIGN = 64  # int32 elements: every part of an input buffer starts 256-byte aligned


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


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
        types_at = _aligned(tokens) if token_types else -1
        cu_at = _aligned(tokens) * (2 if token_types else 1)
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


def _check_padded(t: torch.Tensor | None, name: str, dtypes, shape, device: torch.device) -> None:
    if t is None:
        return
    if t.device != device:
        raise InputError(f"{name}: expected a tensor on {device} (or on the CPU), got one on {t.device}")
    if t.dtype not in dtypes:
        raise InputError(f"{name}: expected dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise InputError(f"{name}: expected shape {list(shape)} like input_ids, got {list(t.shape)}")


_POSITIONS: dict[torch.device, torch.Tensor] = {}


def _positions(width: int, device: torch.device) -> torch.Tensor:
    cached = _POSITIONS.get(device)
    if cached is None or cached.shape[0] < width:
        cached = _POSITIONS[device] = torch.arange(max(width, 512), device=device)
    return cached[:width]


def from_device(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                token_type_ids: torch.Tensor | None, limits: Limits, device: torch.device, ops) -> Batch:
    """A right-padded batch already on `device`: input_ids [B, S] int32/int64, optional mask, types."""
    if not isinstance(input_ids, torch.Tensor):
        raise InputError(f"input_ids: expected a tensor, got {type(input_ids).__name__}")
    _check_padded(input_ids, "input_ids", _INDEX_DTYPES, None, device)
    if input_ids.dim() != 2 or input_ids.numel() == 0:
        raise InputError(f"input_ids: a padded batch is a non-empty [batch, seq], got shape "
                         f"{list(input_ids.shape)}; a list of sequences is passed as a Python list")
    batch, width = input_ids.shape
    _check_padded(attention_mask, "attention_mask", _MASK_DTYPES, input_ids.shape, device)
    _check_padded(token_type_ids, "token_type_ids", _INDEX_DTYPES, input_ids.shape, device)
    if token_type_ids is not None and limits.type_vocab_size == 0:
        raise InputError("token_type_ids given, but this model has no token type embeddings")

    # all ids are range-checked here, padded positions too (one reduction instead of a masked one);
    # only if that fails does the host check decide, on the tokens alone
    id_range = torch.aminmax(input_ids)
    stats = [id_range.min, id_range.max]
    if token_type_ids is not None:
        type_range = torch.aminmax(token_type_ids)
        stats += [type_range.min, type_range.max]
    if attention_mask is None:
        cu_seqlens = torch.arange(0, batch * width + 1, width, dtype=torch.int32, device=device)
    else:
        lengths = attention_mask.sum(1)
        # a 0/1 mask is left-aligned iff it equals `position < length` everywhere
        misplaced = (attention_mask != (_positions(width, device) < lengths[:, None])).sum()
        length_range = torch.aminmax(lengths)
        stats += [lengths.sum(), length_range.min, length_range.max, misplaced]
        cu_seqlens = ops.cu_seqlens_from_seqlens(lengths.to(torch.int32))  # overlaps the read-back
    values = torch.stack([s.to(torch.int64) for s in stats]).tolist()
    id_min, id_max = values[:2]
    bad = id_min < 0 or id_max >= limits.vocab_size
    if token_type_ids is not None:
        bad = bad or values[2] < 0 or values[3] >= limits.type_vocab_size
    if attention_mask is None:
        total, shortest, longest, misplaced_count = batch * width, width, width, 0
    else:
        total, shortest, longest, misplaced_count = values[-4:]
    if bad or misplaced_count or shortest < 1 or longest > limits.max_seqlen:
        # raises with the row and position, unless the only out-of-range ids sit at padded positions
        cpu = [None if t is None else t.cpu() for t in (input_ids, attention_mask, token_type_ids)]
        validate(to_host_batch(*cpu), limits)

    def fill(buf: InputBuffer) -> None:
        for src, dst in ((input_ids, buf.input_ids), (token_type_ids, buf.token_type_ids)):
            if src is None:
                continue
            if attention_mask is None:  # no padding: packing is a reshape (and the int32 cast)
                dst[:total].copy_(src.reshape(-1))
            else:
                ops.remove_padding(src.to(torch.int32).contiguous(), cu_seqlens, total, out=dst[:total])
        buf.cu_seqlens[:batch + 1].copy_(cu_seqlens)
        buf.pad_batch(batch, total)

    return Batch(total, batch, longest, width, token_type_ids is not None, fill)
