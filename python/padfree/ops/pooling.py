"""Sentence pooling on packed rows: one vector per sequence, as sentence-transformers' Pooling
(+ Normalize) computes it, with no padded tensor in between."""
from __future__ import annotations

import torch

from ._tensors import (
    InputError,
    call_kernel,
    check,
    check_float,
    check_int32,
    dtype_code,
    output,
    ptr,
    rows_and_width,
    stream_handle,
)

# pooling name (sentence-transformers' pooling_mode) -> the C ABI's mode code
POOLING_MODES = {"cls": 0, "mean": 1, "max": 2}


def sequence_pool(x: torch.Tensor, cu_seqlens: torch.Tensor, mode: str = "mean", normalize: bool = False,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [T, H] packed rows -> [B, H]: each sequence's first row ("cls"), mean ("mean") or elementwise
    max ("max") over its rows [cu_seqlens[b], cu_seqlens[b + 1]); normalize: then divided by
    max(||row||_2, 1e-12) (torch.nn.functional.normalize). cu_seqlens: int32 [B + 1] on x's device.

    H a multiple of 8, at most 8192; x's dtype out, computed in fp32. A sequence with no rows gives
    zeros. Asynchronous: the contents of cu_seqlens are not checked (rows are clamped to [0, T]).
    """
    if mode not in POOLING_MODES:
        raise InputError(f"mode: expected one of {', '.join(POOLING_MODES)}, got {mode!r}")
    check_float(x, "x")
    if x.dim() != 2:
        raise InputError(f"x: expected packed rows [total_tokens, hidden], got shape {list(x.shape)}")
    _, hidden = rows_and_width(x, "x")
    check(cu_seqlens, "cu_seqlens", dtype=torch.int32, shape=[None], device=x.device)
    if cu_seqlens.numel() < 1:
        raise InputError("cu_seqlens: expected [batch + 1] entries, got an empty tensor")
    batch = check_int32(cu_seqlens.numel() - 1, "cu_seqlens: batch")
    check_int32(x.shape[0], "x: total_tokens")
    out = output(out, (batch, hidden), x)
    if batch == 0:
        return out
    if x.shape[0] == 0:  # no rows at all (an empty tensor has no address): every sequence is empty
        return out.zero_()
    call_kernel("padfree_sequence_pool", x.device, ptr(x), ptr(cu_seqlens), batch, x.shape[0], hidden,
                POOLING_MODES[mode], int(bool(normalize)), dtype_code(x, "x"), ptr(out), stream_handle(x.device))
    return out
