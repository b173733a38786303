"""Prefix-sum packing on torch tensors: cu_seqlens from lengths or masks, remove/rebuild padding.

Packed tokens are all sequences' rows end to end, `[total_tokens, ...]`, with `cu_seqlens` int32
`[batch + 1]` (exclusive prefix sum of the lengths). The kernel functions enqueue on torch's
current stream and never synchronize; `pack_from_mask` and `pack_from_seqlens` are the host-side
helpers that also return the host integers (total_tokens, max_seqlen) an encoder needs.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ._tensors import INT32_MAX, InputError, call_kernel, check, check_int32, output, ptr, stream_handle

_MASK_DTYPES = (torch.int32, torch.int64, torch.bool)


def cu_seqlens_from_seqlens(seqlens: torch.Tensor) -> torch.Tensor:
    """seqlens: int32 cuda [B] -> cu_seqlens: int32 [B+1], cu_seqlens[0] = 0.

    Negative lengths count as 0 (the kernel keeps cu_seqlens non-decreasing); no other validation,
    since the values are on the device: validate on the host first, or use `pack_from_seqlens`.
    """
    check(seqlens, "seqlens", dtype=torch.int32, shape=[None])
    batch = check_int32(seqlens.numel(), "seqlens: batch")
    cu_seqlens = torch.empty(batch + 1, dtype=torch.int32, device=seqlens.device)
    call_kernel("padfree_cu_seqlens_from_seqlens", seqlens.device, ptr(seqlens), batch,
                ptr(cu_seqlens), stream_handle(seqlens.device))
    return cu_seqlens


def _mask_int32(mask: torch.Tensor, name: str) -> torch.Tensor:
    check(mask, name, dtype=_MASK_DTYPES, shape=[None, None])
    return mask if mask.dtype == torch.int32 else mask.to(torch.int32)


def _launch_from_mask(mask: torch.Tensor, invalid_rows: torch.Tensor | None) -> torch.Tensor:
    batch, padded_seqlen = check_int32(mask.shape[0], "mask: batch"), check_int32(mask.shape[1], "mask: width")
    cu_seqlens = torch.empty(batch + 1, dtype=torch.int32, device=mask.device)
    call_kernel("padfree_cu_seqlens_from_mask", mask.device, ptr(mask), batch, padded_seqlen, ptr(cu_seqlens),
                ptr(invalid_rows), stream_handle(mask.device))
    return cu_seqlens


def cu_seqlens_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """mask: cuda [B, S] int32/int64/bool, left-aligned (ones, then zeros) -> cu_seqlens int32 [B+1].

    Lengths are the number of ones per row. Rows are not validated here (that needs a sync): use
    `pack_from_mask` to have a bad mask refused.
    """
    return _launch_from_mask(_mask_int32(mask, "mask"), None)


def _bad_mask_rows(mask: torch.Tensor) -> list[int]:
    """Rows that are not ones-then-zeros (error path only: it synchronizes)."""
    ones = (mask == 1).sum(dim=1, keepdim=True)
    positions = torch.arange(mask.shape[1], device=mask.device)
    expected = (positions < ones).to(mask.dtype)
    return torch.nonzero((mask != expected).any(dim=1)).flatten().tolist()


def _shown(rows: list[int], limit: int = 10) -> str:
    head = ", ".join(map(str, rows[:limit]))
    return head + (f", ... ({len(rows)} rows)" if len(rows) > limit else "")


def pack_from_mask(attention_mask: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """attention_mask: cuda [B, S] int32/int64/bool -> (cu_seqlens int32 cuda [B+1], total_tokens, max_seqlen).

    The mask must hold only 0/1 with each row left-aligned (ones then zeros, as HF tokenizers with
    right padding make it) and at least one token per row; otherwise InputError names the rows.
    One small device-to-host copy ([invalid_rows, total_tokens, max_seqlen, min_seqlen]) is the only
    synchronization.
    """
    mask = _mask_int32(attention_mask, "attention_mask")
    if mask.shape[0] == 0:
        raise InputError("attention_mask: expected at least one row, got shape "
                         f"{list(attention_mask.shape)}")
    invalid = torch.zeros(1, dtype=torch.int32, device=mask.device)
    cu_seqlens = _launch_from_mask(mask, invalid)
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    stats = torch.stack([invalid[0], cu_seqlens[-1], lengths.max(), lengths.min()]).cpu()
    invalid_rows, total_tokens, max_seqlen, min_seqlen = (int(v) for v in stats)
    if invalid_rows:
        raise InputError(
            f"attention_mask: {invalid_rows} row(s) are not left-aligned 0/1 masks (ones, then zeros): "
            f"rows {_shown(_bad_mask_rows(mask))}; pad on the right, or pass the sequences as a list")
    if min_seqlen == 0:
        empty = torch.nonzero(lengths == 0).flatten().tolist()
        raise InputError(f"attention_mask: rows {_shown(empty)} have no tokens; drop empty sequences first")
    return cu_seqlens, total_tokens, max_seqlen


def pack_from_seqlens(seqlens: Sequence[int], device: torch.device | str | int | None = None,
                      max_length: int | None = None) -> tuple[torch.Tensor, int, int]:
    """seqlens: host ints -> (cu_seqlens int32 cuda [B+1], total_tokens, max_seqlen).

    Refuses an empty batch, a length of 0 or below, and a length above max_length (when given),
    naming the offending sequences. device: the CUDA device (default: the current one). The
    lengths are validated on the host, then copied from pageable memory: torch makes that copy
    blocking, so the host waits for the current stream's earlier work.
    """
    lengths = [int(n) for n in seqlens]
    if not lengths:
        raise InputError("seqlens: expected at least one sequence, got none")
    short = [i for i, n in enumerate(lengths) if n < 1]
    if short:
        raise InputError(f"seqlens: sequences {_shown(short)} have length < 1 "
                         f"({lengths[short[0]]}); drop empty sequences first")
    if max_length is not None:
        long = [i for i, n in enumerate(lengths) if n > max_length]
        if long:
            raise InputError(f"seqlens: sequences {_shown(long)} are longer than the maximum {max_length} "
                             f"({lengths[long[0]]}); truncate or split them")
    total_tokens = sum(lengths)
    if total_tokens > INT32_MAX or len(lengths) > INT32_MAX - 1:
        raise InputError(f"seqlens: {total_tokens} tokens in {len(lengths)} sequences overflow int32 cu_seqlens")
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if device.type != "cuda":
        raise InputError(f"device: expected a CUDA device, got {device}")
    on_device = torch.tensor(lengths, dtype=torch.int32).to(device)
    return cu_seqlens_from_seqlens(on_device), total_tokens, max(lengths)


def _check_cu_seqlens(cu_seqlens: torch.Tensor, like: torch.Tensor) -> int:
    check(cu_seqlens, "cu_seqlens", dtype=torch.int32, shape=[None], device=like.device)
    if cu_seqlens.numel() < 1:
        raise InputError("cu_seqlens: expected [batch + 1] entries, got an empty tensor")
    return check_int32(cu_seqlens.numel() - 1, "cu_seqlens: batch")


def _row_bytes(t: torch.Tensor, leading: int) -> int:
    return math.prod(t.shape[leading:]) * t.element_size()


def remove_padding(padded: torch.Tensor, cu_seqlens: torch.Tensor, total_tokens: int,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """padded: cuda [B, S, ...] any dtype -> packed [total_tokens, ...], rows of each sequence end to end.

    cu_seqlens: int32 [B+1] on padded's device; total_tokens must equal cu_seqlens[-1] (as
    `pack_from_mask` returns it): it sizes the output, and the kernel writes at most its rows.
    A sequence longer than S is cut at S. out: an optional [total_tokens, ...] destination.
    """
    total_tokens = check_int32(total_tokens, "total_tokens")
    check(padded, "padded")
    if padded.dim() < 2:
        raise InputError(f"padded: expected [batch, padded_seqlen, ...], got shape {list(padded.shape)}")
    batch = _check_cu_seqlens(cu_seqlens, padded)
    if padded.shape[0] != batch:
        raise InputError(f"padded: batch {padded.shape[0]} does not match cu_seqlens ([{batch} + 1])")
    check_int32(padded.shape[1], "padded: padded_seqlen (dimension 1)")
    if total_tokens > padded.shape[0] * padded.shape[1]:
        raise InputError(f"total_tokens: expected 0..{padded.shape[0] * padded.shape[1]} (batch * padded_seqlen), "
                         f"got {total_tokens}")
    packed = output(out, (total_tokens, *padded.shape[2:]), padded, aligned=False)
    row_bytes = _row_bytes(padded, 2)
    if row_bytes == 0 or total_tokens == 0:
        return packed
    call_kernel("padfree_remove_padding", padded.device, ptr(padded), ptr(cu_seqlens), batch, packed.shape[0],
                padded.shape[1], row_bytes, ptr(packed), stream_handle(padded.device))
    return packed


def rebuild_padding(packed: torch.Tensor, cu_seqlens: torch.Tensor, padded_seqlen: int,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """packed: cuda [T, ...] any dtype -> padded [B, padded_seqlen, ...] with zeros in padded rows.

    cu_seqlens: int32 [B+1] on packed's device with cu_seqlens[-1] <= T and every length <=
    padded_seqlen (rows past padded_seqlen are dropped). out: an optional destination.
    """
    padded_seqlen = check_int32(padded_seqlen, "padded_seqlen")
    check(packed, "packed")
    if packed.dim() < 1:
        raise InputError("packed: expected [total_tokens, ...], got a scalar")
    batch = _check_cu_seqlens(cu_seqlens, packed)
    padded = output(out, (batch, padded_seqlen, *packed.shape[1:]), packed, aligned=False)
    row_bytes = _row_bytes(packed, 1)
    if row_bytes == 0 or padded.numel() == 0:
        return padded
    if packed.numel() == 0:  # no tokens at all (bucket padding): an empty tensor has no address
        return padded.zero_()
    call_kernel("padfree_rebuild_padding", packed.device, ptr(packed), ptr(cu_seqlens), batch, packed.shape[0],
                padded_seqlen, row_bytes, ptr(padded), stream_handle(packed.device))
    return padded
