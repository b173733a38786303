"""A linear layer's weight in mma.sync A-fragment order, for decode_linear's few-row tensor-core kernel
(padfree.h: padfree_decode_linear_fragment_layout, padfree_decode_linear_fragments).

At a few rows a decode step's linear layer streams its weights with little arithmetic per byte; in
nn.Linear's layout a lane's tensor-core fragment is four pieces of two weight rows, in fragment order it
is one 16-byte load (kernels/decoder/decode_linear_fragments.cu says why and what it measured). The
layout is made once, at load, beside the nn.Linear weight (which the GEMMs of larger steps still read).
"""
from __future__ import annotations

import torch

from ._tensors import (
    InputError,
    call_kernel,
    check,
    check_aligned,
    device_capability,
    device_properties,
    dtype_code,
    ptr,
    stream_handle,
)

FRAGMENTS_MAX_ROWS = 64                     # kernels/decoder/decode_linear.h: kDecodeLinearFragmentsMaxRows
FRAGMENTS_IN_MULTIPLE = 128                 # kDecodeLinearFragmentsInMultiple (the layout)
FRAGMENTS_IN_FEATURES = (512, 768, 1024, 1536, 2048, 3072, 4096)  # decode_linear_fragments_takes (the kernel)
FRAGMENTS_OUT_MULTIPLE = 16                 # kDecodeLinearFragmentsOutMultiple
_DTYPES = (torch.float16, torch.bfloat16)


class FragmentWeight:
    """A [out_features, in_features] weight in fragment order: data [out / 16, in / 16, 32, 8], the same
    elements. Pass it to decode_linear in place of the weight."""

    __slots__ = ("data",)

    def __init__(self, data: torch.Tensor):
        self.data = data

    @property
    def shape(self) -> tuple[int, int]:
        return self.data.shape[0] * 16, self.data.shape[1] * 16

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    def __repr__(self) -> str:
        return f"FragmentWeight(shape={list(self.shape)}, dtype={self.dtype}, device={self.device})"


def fragments_shared_bytes(rows: int, in_features: int, ln: bool) -> int:
    """decode_linear.h's decode_linear_fragments_shared_bytes: up to 16 rows the staged rows (padded by 8
    elements) and the warps' partial sums; past 16 a cluster's 32 or 64 rows, whose space the partial
    sums reuse; and the LayerNorm's parameters."""
    norm = 4 * in_features if ln else 0
    if rows > 16:
        cluster = 2 if rows <= 32 else 4
        return max(16 * cluster * (in_features + 8) * 2, 8 * 32 * (16 * cluster + 4) * 4) + norm
    return rows * (in_features + 8) * 2 + norm + 8 * 32 * 4 * 4 * (2 if rows > 8 else 1)


def fragments_fit(rows: int, in_features: int, out_features: int, dtype: torch.dtype,
                  device: torch.device | None = None, ln: bool = True) -> bool:
    """Whether the fragment kernel takes this layer on `device` (the current CUDA device when None): its
    shared memory (with a LayerNorm where `ln`) within what a block may opt into there."""
    if not (1 <= rows <= FRAGMENTS_MAX_ROWS and dtype in _DTYPES and in_features in FRAGMENTS_IN_FEATURES
            and out_features % FRAGMENTS_OUT_MULTIPLE == 0 and torch.cuda.is_available()):
        return False
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    # mma.sync's 16-bit m16n8k16; past 16 rows thread-block clusters
    return (device_capability(index) >= ((9, 0) if rows > 16 else (8, 0))
            and fragments_shared_bytes(rows, in_features, ln) <= device_properties(index).shared_memory_per_block_optin)


def fragment_layout(weight: torch.Tensor) -> FragmentWeight:
    """weight [out_features, in_features] (float16 / bfloat16, CUDA, contiguous) in fragment order, a new
    tensor (enqueued on torch's current stream)."""
    check(weight, "weight", dtype=_DTYPES, shape=(None, None))
    check_aligned(weight, "weight")
    out_features, in_features = weight.shape
    if in_features % FRAGMENTS_IN_MULTIPLE or in_features == 0 or out_features % FRAGMENTS_OUT_MULTIPLE:
        raise InputError(f"weight: the fragment order takes in_features a positive multiple of "
                         f"{FRAGMENTS_IN_MULTIPLE} and out_features of {FRAGMENTS_OUT_MULTIPLE}, got "
                         f"{list(weight.shape)}")
    data = torch.empty(out_features // 16, in_features // 16, 32, 8, dtype=weight.dtype, device=weight.device)
    call_kernel("padfree_decode_linear_fragment_layout", weight.device, ptr(weight), out_features, in_features,
                dtype_code(weight, "weight"), ptr(data), stream_handle(weight.device))
    return FragmentWeight(data)
