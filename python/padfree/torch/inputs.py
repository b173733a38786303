"""HF-style inputs -> packed device inputs for PadfreeEncoder, validated.

Two routes, one set of rules and messages (padfree.runtime's host validation):
- host inputs (CPU tensors, numpy, lists, a list of sequences): validated and packed on the host,
  then one asynchronous copy from pinned memory; no synchronization.
- inputs already on the GPU: the checks reduce to a few scalars on the device, read back in one
  small copy (the only host synchronization: packing needs the token count on the host). Only when
  a check fails are the inputs copied to the host, to name the offending row in the error.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from ..ops._tensors import InputError
from ..runtime._inputs import to_host_batch, validate
from ..runtime.backend import Limits

_INDEX_DTYPES = (torch.int32, torch.int64)
_MASK_DTYPES = (torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
_ALIGN = 64  # int32 elements: 256 bytes


class PackedInputs(NamedTuple):
    input_ids: torch.Tensor              # int32 [T] on the encoder's device
    token_type_ids: torch.Tensor | None  # int32 [T]
    cu_seqlens: torch.Tensor             # int32 [B + 1]
    max_seqlen: int
    padded_width: int                    # S of the padded outputs


def pack_host(input_ids: Any, attention_mask: Any, token_type_ids: Any, limits: Limits,
              device: torch.device) -> PackedInputs:
    host = to_host_batch(input_ids, attention_mask, token_type_ids)
    validate(host, limits)
    parts = [host.input_ids, host.cu_seqlens] + ([] if host.token_type_ids is None else [host.token_type_ids])
    # each part starts on a 256-byte boundary, as a fresh allocation would
    starts = np.cumsum([0] + [-(-len(p) // _ALIGN) * _ALIGN for p in parts])
    flat = torch.empty(int(starts[-1]), dtype=torch.int32, pin_memory=device.type == "cuda")
    for part, start in zip(parts, starts):
        flat.numpy()[start:start + len(part)] = part  # int64 -> int32: range-checked by validate
    flat = flat.to(device, non_blocking=True)
    ids, cu, *types = (flat[s:s + len(p)] for p, s in zip(parts, starts))
    types = types[0] if types else None
    return PackedInputs(ids, types, cu, int(host.lengths.max()), host.padded_width)


def _check_padded(t: torch.Tensor | None, name: str, dtypes, shape, device: torch.device,
                  optional: bool = True) -> None:
    if t is None:
        if optional:
            return
        raise InputError(f"{name}: expected a tensor, got None")
    if t.device != device:
        raise InputError(f"{name}: expected a tensor on {device} (or on the CPU), got one on {t.device}")
    if t.dtype not in dtypes:
        raise InputError(f"{name}: expected dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise InputError(f"{name}: expected shape {list(shape)} like input_ids, got {list(t.shape)}")


def pack_device(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                token_type_ids: torch.Tensor | None, limits: Limits, device: torch.device,
                ops) -> PackedInputs:
    """Pack a padded batch that is already on `device` ([B, S] ids, optional mask and types)."""
    _check_padded(input_ids, "input_ids", _INDEX_DTYPES, None, device, optional=False)
    if input_ids.dim() != 2 or input_ids.numel() == 0:
        raise InputError(f"input_ids: a padded batch is a non-empty [batch, seq], got shape "
                         f"{list(input_ids.shape)}; a list of sequences is passed as a Python list")
    batch, width = input_ids.shape
    _check_padded(attention_mask, "attention_mask", _MASK_DTYPES, input_ids.shape, device)
    _check_padded(token_type_ids, "token_type_ids", _INDEX_DTYPES, input_ids.shape, device)
    if token_type_ids is not None and limits.type_vocab_size == 0:
        raise InputError("token_type_ids given, but this model has no token type embeddings")

    if attention_mask is None:
        lengths = torch.full((batch,), width, dtype=torch.int32, device=device)
        misplaced = torch.zeros((), dtype=torch.int64, device=device)
        valid = None
    else:
        lengths = (attention_mask != 0).sum(1, dtype=torch.int32)
        # a 0/1 mask is left-aligned iff it equals `position < length` everywhere
        valid = torch.arange(width, device=device)[None, :] < lengths[:, None]
        misplaced = (attention_mask != valid).sum()

    def range_of(t: torch.Tensor):
        # only the tokens are checked (and embedded): padded positions may hold any id
        return torch.aminmax(t if valid is None else t.masked_fill(~valid, 0))

    id_range = range_of(input_ids)
    stats = [lengths.sum(), lengths.max(), lengths.min(), misplaced, id_range.min, id_range.max]
    if token_type_ids is not None:
        type_range = range_of(token_type_ids)
        stats += [type_range.min, type_range.max]
    cu_seqlens = ops.cu_seqlens_from_seqlens(lengths)  # enqueued before the read-back: overlaps it
    values = torch.stack([s.to(torch.int64) for s in stats]).tolist()
    total, longest, shortest, misplaced_count, id_min, id_max = values[:6]
    bad = (misplaced_count or shortest < 1 or longest > limits.max_seqlen
           or id_min < 0 or id_max >= limits.vocab_size)
    if token_type_ids is not None:
        bad = bad or values[6] < 0 or values[7] >= limits.type_vocab_size
    if bad:
        _raise_on_host(input_ids, attention_mask, token_type_ids, limits)

    def packed(t: torch.Tensor) -> torch.Tensor:
        return ops.remove_padding(t.to(torch.int32).contiguous(), cu_seqlens, total)

    return PackedInputs(packed(input_ids), None if token_type_ids is None else packed(token_type_ids),
                        cu_seqlens, longest, width)


def _raise_on_host(input_ids, attention_mask, token_type_ids, limits: Limits):
    """The device checks found a problem: let the host validation say exactly which and where."""
    cpu = [None if t is None else t.cpu() for t in (input_ids, attention_mask, token_type_ids)]
    validate(to_host_batch(cpu[0], cpu[1], cpu[2]), limits)
    raise AssertionError("padfree.torch: the device checks refused a batch the host checks accept")
