"""Bias + GELU (erf or tanh form) where the GEMM epilogue does not take it."""
from __future__ import annotations

import torch

from ._tensors import (
    InputError,
    call_kernel,
    check_float,
    check_int32,
    dtype_code,
    output,
    ptr,
    rows_and_width,
    stream_handle,
)

_APPROXIMATE = {"none": 0, "tanh": 1}  # PADFREE_GELU_ERF, PADFREE_GELU_TANH; names as torch's gelu


def bias_gelu(x: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "none",
              out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(x + bias): x [..., N] (usually [T, N]) -> [..., N]; bias [N] or None.

    approximate: "none" (erf form) or "tanh", as torch.nn.functional.gelu. N a multiple of 8.
    Computed in fp32. out may be x (in place).
    """
    if approximate not in _APPROXIMATE:
        raise InputError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    rows, cols = rows_and_width(x, "x", width_name="cols", max_width=None)
    check_int32(cols, "x: cols (last dimension)")
    check_float(bias, "bias", shape=[cols], like=x, optional=True)
    out = output(out, x.shape, x)
    if rows:
        call_kernel("padfree_bias_gelu", x.device, ptr(x), ptr(bias), rows, cols, _APPROXIMATE[approximate],
                    dtype_code(x, "x"), ptr(out), stream_handle(x.device))
    return out
