"""Fused multi-head self-attention over packed variable-length sequences (kernels/attention/attention.cu)."""
from __future__ import annotations

import math

import torch

from ._tensors import InputError, call_kernel, check, check_int32, dtype_code, output, ptr, stream_handle

ATTENTION_CAUSAL = 1  # PADFREE_ATTENTION_CAUSAL in padfree.h


def attention_varlen(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, num_heads: int,
                     qkv_bias: torch.Tensor | None = None, softmax_scale: float | None = None,
                     out: torch.Tensor | None = None, *, causal: bool = False) -> torch.Tensor:
    """softmax(Q K^T * softmax_scale) V for every sequence and head, on packed tokens.

    qkv:        [total_tokens, 3 * num_heads * head_dim] float32/float16/bfloat16, the fused QKV
                projection output (Q | K | V blocks, each [num_heads, head_dim]).
    cu_seqlens: int32 [batch + 1], prefix sum of the lengths; every length must be in
                [0, max_seqlen] (0 = no work: bucket padding). Rows past cu_seqlens[-1] are not
                written.
    qkv_bias:   [3 * num_heads * head_dim] or None, added to Q, K and V as they are loaded.
    softmax_scale: defaults to 1 / sqrt(head_dim).
    causal:     each query sees only keys at or before it (decoders).
    Returns out: [total_tokens, num_heads * head_dim], the heads' outputs side by side.
    head_dim must be 32, 64 or 128 (KernelUnsupportedError otherwise).
    """
    check(qkv, "qkv", shape=(None, None))
    dtype = dtype_code(qkv, "qkv")
    total_tokens, width = qkv.shape
    num_heads = check_int32(num_heads, "num_heads", minimum=1)
    if width % (3 * num_heads) != 0:
        raise InputError(f"qkv: width {width} is not 3 * num_heads * head_dim for num_heads={num_heads}")
    head_dim = width // (3 * num_heads)
    hidden = num_heads * head_dim
    check(cu_seqlens, "cu_seqlens", dtype=torch.int32, shape=(None,), device=qkv.device)
    if cu_seqlens.numel() < 2:
        raise InputError(f"cu_seqlens: expected [batch + 1] with batch >= 1, got {list(cu_seqlens.shape)}")
    max_seqlen = check_int32(max_seqlen, "max_seqlen", minimum=1)
    check(qkv_bias, "qkv_bias", dtype=qkv.dtype, shape=(width,), device=qkv.device, optional=True)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise InputError(f"softmax_scale: expected a finite positive number, got {softmax_scale!r}")
    out = output(out, (total_tokens, hidden), qkv, aligned=False)
    if _overlaps(out, qkv):  # never true of a fresh tensor
        raise InputError("out: must not overlap qkv (other query tiles still read the rows it would write)")
    if total_tokens == 0:
        return out
    # with qkv's device current: the kernel launches on the caller's current device
    call_kernel("padfree_attention_varlen", qkv.device, ptr(qkv), ptr(qkv_bias), ptr(cu_seqlens),
                cu_seqlens.numel() - 1, total_tokens, max_seqlen, num_heads, head_dim, float(softmax_scale),
                ATTENTION_CAUSAL if causal else 0, dtype, ptr(out), stream_handle(qkv.device))
    return out


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()
