"""A decode step's linear layer for up to 256 rows on Hopper's wgmma, with the input's LayerNorm folded into
the weight (padfree.h: padfree_decode_gemm; kernels/decoder/decode_gemm.cu says why).

    out = act(LN(x) W^T + b) + residual  =  act(rstd * (x W'^T - mean * colsum) + b') + residual

with W' = W diag(gamma), colsum = W' 1 and b' = b + W beta made once (fold_layernorm): the kernel takes the
rows' statistics beside the products, so no LayerNorm kernel and no normalized copy of x precede it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ._tensors import (
    InputError,
    call_kernel,
    check,
    check_float,
    device_capability,
    dtype_code,
    output,
    ptr,
    stream_handle,
)
from .decoder import ACTIVATIONS

MAX_ROWS = 256           # kernels/decoder/decode_gemm.h: kDecodeGemmMaxRows
TILE_ROWS, TILE_FEATURES, MAX_SLICE = 64, 32, 512   # kDecodeGemmTileM, kDecodeGemmTileN, kDecodeGemmMaxSlice
BLOCKS_PER_SM = 3        # kDecodeGemmBlocksPerSm
_DTYPES = (torch.float16, torch.bfloat16)


def grid_blocks(rows: int, in_features: int, out_features: int) -> int:
    """The blocks a call launches: a block per 32 features, 64 rows and slice of in_features (decode_gemm.h:
    the fewest of 1, 2, 4 or 8 slices of whole 64-wide chunks, at most 512 each)."""
    split = next((s for s in (1, 2, 4, 8) if in_features % (64 * s) == 0 and in_features // s <= MAX_SLICE), 8)
    return out_features // TILE_FEATURES * split * -(-rows // TILE_ROWS)


@functools.cache
def refusal(in_features: int, out_features: int, dtype: torch.dtype, device_index: int) -> str:
    """Why the library's decode_gemm does not take [in_features] -> [out_features] in `dtype` on this CUDA
    device, or "" where it does: a call with no rows, which checks the shapes, the compute capability and
    the library's sm_90a code, and launches nothing. The rules live in the C ABI alone (decode_gemm.h)."""
    from .._lib import KernelArgumentError, KernelUnsupportedError
    device = torch.device("cuda", device_index)
    try:
        call_kernel("padfree_decode_gemm", device, None, None, None, None, None, 0.0, 0, 0, in_features,
                    out_features, dtype_code(torch.empty(0, dtype=dtype), "x"), None, stream_handle(device))
    except (KernelArgumentError, KernelUnsupportedError) as e:
        return str(e)
    return ""


def decode_gemm_fits(rows: int, in_features: int, out_features: int, dtype: torch.dtype,
                     device: torch.device) -> bool:
    """Whether decode_gemm takes this layer on `device` (refusal: the shapes, compute capability 9.0 and the
    library's sm_90a code)."""
    device = torch.device(device)
    if not (1 <= rows <= MAX_ROWS and dtype in _DTYPES and device.type == "cuda"):
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return device_capability(index) == (9, 0) and not refusal(in_features, out_features, dtype, index)


@dataclass(frozen=True)
class FoldedLinear:
    """A linear layer with the LayerNorm before it folded in (fold_layernorm), or a plain one (colsum None)."""
    weight: torch.Tensor                # [out, in]: W diag(gamma)
    bias: torch.Tensor | None           # [out]: b + W beta
    colsum: torch.Tensor | None         # [out] float32: the rows of `weight` (as stored) summed
    eps: float = 0.0


def fold_layernorm(weight: torch.Tensor, bias: torch.Tensor | None, ln: tuple | None) -> FoldedLinear:
    """The linear layer (weight [out, in], bias [out] or None) behind LayerNorm ln = (gamma, beta, eps), folded
    for decode_gemm (float32 products, rounded once to the weight's dtype); ln None: the layer as it is."""
    if ln is None:
        return FoldedLinear(weight, bias, None)
    gamma, beta, eps = ln
    w32 = weight.float()
    folded = (w32 * gamma.float()[None, :]).to(weight.dtype).contiguous()
    b32 = w32 @ beta.float()
    if bias is not None:
        b32 = b32 + bias.float()
    return FoldedLinear(folded, b32.to(weight.dtype).contiguous(), folded.float().sum(dim=1).contiguous(), float(eps))


def decode_gemm(x: torch.Tensor, layer: FoldedLinear, residual: torch.Tensor | None = None,
                activation: str | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = act(LN(x) W^T + b) + residual for the layer fold_layernorm made (without its LayerNorm where
    layer.colsum is None). x [rows, in] float16 / bfloat16 (decode_gemm_fits), residual [rows, out] (may be
    `out`), activation None / "relu" / "gelu" / "gelu_tanh" / "silu". The layer's tensors are read before
    the kernel waits on the previous one (PDL): no kernel still running may write them (fold_layernorm's
    copies are made once, before)."""
    check_float(x, "x")
    if x.dim() != 2:
        raise InputError(f"x: expected [rows, in_features], got shape {list(x.shape)}")
    rows, in_features = x.shape
    check_float(layer.weight, "weight", like=x, shape=(None, in_features))
    out_features = layer.weight.shape[0]
    if not decode_gemm_fits(rows, in_features, out_features, x.dtype, x.device):
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        why = (refusal(in_features, out_features, x.dtype, index) if x.dtype in _DTYPES and 1 <= rows <= MAX_ROWS
               else "")
        raise InputError(f"x: decode_gemm takes 1 to {MAX_ROWS} rows of float16 / bfloat16 on compute capability 9.0, "
                         f"got {rows} x {in_features} -> {out_features} {x.dtype}" + (f" ({why})" if why else "")
                         + "; use a GEMM")
    check(layer.bias, "bias", dtype=x.dtype, shape=(out_features,), device=x.device, optional=True)
    check(layer.colsum, "colsum", dtype=torch.float32, shape=(out_features,), device=x.device, optional=True)
    check(residual, "residual", dtype=x.dtype, shape=(rows, out_features), device=x.device, optional=True)
    if activation not in ACTIVATIONS:
        raise InputError(f"activation: expected one of none, relu, gelu, gelu_tanh, silu, got {activation!r}")
    out = output(out, (rows, out_features), x)
    call_kernel("padfree_decode_gemm", x.device, ptr(x), ptr(layer.weight), ptr(layer.bias), ptr(residual),
                ptr(layer.colsum), float(layer.eps), ACTIVATIONS[activation], rows, in_features, out_features,
                dtype_code(x, "x"), ptr(out), stream_handle(x.device))
    return out
