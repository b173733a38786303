"""LayerNorm and skip LayerNorm on packed rows (fp32 statistics), on torch's current stream."""
from __future__ import annotations

import torch

from ._tensors import (
    call_kernel,
    check_eps,
    check_float,
    dtype_code,
    l2_prefetch,
    output,
    ptr,
    rows_and_width,
    stream_handle,
)


def layernorm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-12,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm over the last axis: x [..., H] (usually [T, H]) -> [..., H], x's dtype.

    gamma, beta: [H]. H a multiple of 8, at most 8192. float32/float16/bfloat16, one dtype for
    all. out may be x (in place).
    """
    rows, hidden = rows_and_width(x, "x")
    check_float(gamma, "gamma", shape=[hidden], like=x)
    check_float(beta, "beta", shape=[hidden], like=x)
    check_eps(eps)
    out = output(out, x.shape, x)
    if rows:
        call_kernel("padfree_layernorm", x.device, ptr(x), ptr(gamma), ptr(beta), rows, hidden, float(eps),
                    dtype_code(x, "x"), ptr(out), stream_handle(x.device))
    return out


def skip_layernorm(x: torch.Tensor, residual: torch.Tensor | None, gamma: torch.Tensor, beta: torch.Tensor,
                   bias: torch.Tensor | None = None, eps: float = 1e-12,
                   out: torch.Tensor | None = None, prefetch: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm(x + bias + residual) * gamma + beta: x, residual [..., H] -> [..., H].

    bias, gamma, beta: [H]. The sum is formed in fp32. residual None: LayerNorm(x + bias), for a
    caller whose GEMM already added the residual (one stream less to read). out may be x or residual.
    prefetch: a contiguous tensor (the next GEMMs' weights) the kernel starts moving into L2 before it
    waits on the kernel before it; no result depends on it.
    """
    rows, hidden = rows_and_width(x, "x")
    check_float(residual, "residual", shape=list(x.shape), like=x, optional=True)
    check_float(bias, "bias", shape=[hidden], like=x, optional=True)
    check_float(gamma, "gamma", shape=[hidden], like=x)
    check_float(beta, "beta", shape=[hidden], like=x)
    check_eps(eps)
    prefetch_at, prefetch_bytes = l2_prefetch(prefetch, x.device)
    out = output(out, x.shape, x)
    if rows:
        call_kernel("padfree_skip_layernorm", x.device, ptr(x), ptr(residual), ptr(bias), ptr(gamma), ptr(beta),
                    rows, hidden, float(eps), prefetch_at, prefetch_bytes, dtype_code(x, "x"), ptr(out),
                    stream_handle(x.device))
    return out
