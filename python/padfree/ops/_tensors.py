"""Checks that turn bad torch tensors into clear exceptions before they reach a kernel."""
from __future__ import annotations

from typing import Sequence

import torch

from .._lib import PadfreeError

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class InputError(PadfreeError, ValueError):
    """A tensor handed to padfree has the wrong dtype, device, layout or shape."""


def dtype_code(t: torch.Tensor, name: str) -> int:
    if t.dtype not in DTYPE_CODES:
        raise InputError(f"{name}: expected float32, float16 or bfloat16, got {t.dtype}")
    return DTYPE_CODES[t.dtype]


def check(t: torch.Tensor | None, name: str, *, dtype: torch.dtype | Sequence[torch.dtype] | None = None,
          shape: Sequence[int | None] | None = None, device: torch.device | None = None,
          optional: bool = False) -> None:
    """Raise InputError unless t is a contiguous CUDA tensor of the given dtype and shape.

    shape entries of None match any size; device, when given, must be t's device.
    """
    if t is None:
        if optional:
            return
        raise InputError(f"{name}: expected a tensor, got None")
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda:
        raise InputError(f"{name}: expected a CUDA tensor, got one on {t.device}; move it with .cuda()")
    if device is not None and t.device != device:
        raise InputError(f"{name}: expected a tensor on {device}, got {t.device}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in allowed:
            raise InputError(f"{name}: expected dtype {' or '.join(map(str, allowed))}, got {t.dtype}")
    if not t.is_contiguous():
        raise InputError(f"{name}: expected a contiguous tensor (strides {t.stride()}); call .contiguous()")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise InputError(f"{name}: expected shape {want}, got {list(t.shape)}")


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def stream_handle(device: torch.device) -> int:
    """The current torch CUDA stream of `device`, as the raw cudaStream_t the ABI takes."""
    return torch.cuda.current_stream(device).cuda_stream
