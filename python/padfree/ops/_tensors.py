"""Checks that turn bad torch tensors into clear exceptions before they reach a kernel."""
from __future__ import annotations

import functools
import operator
from typing import Sequence

import torch

from .._lib import PadfreeError
from ..kernel_sizes import HIDDEN_MULTIPLE, MAX_HIDDEN

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# The precision names of the CLI and the engine sidecar.
PRECISION_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
INT32_MAX = 2**31 - 1


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


def check_int32(value, name: str, minimum: int = 0) -> int:
    """value as a Python int in [minimum, 2**31 - 1], else InputError: ctypes passes a host int to an
    int32_t parameter modulo 2**32 (2**32 + 5 would arrive as 5), so the range is checked here."""
    if isinstance(value, bool):
        raise InputError(f"{name}: expected an int, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise InputError(f"{name}: expected an int, got {type(value).__name__} {value!r}") from None
    if not minimum <= value <= INT32_MAX:
        raise InputError(f"{name}: expected an int in [{minimum}, 2**31 - 1] (int32), got {value}")
    return value


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def l2_prefetch(t: torch.Tensor | None, device: torch.device) -> tuple[int | None, int]:
    """A kernel's l2_prefetch and l2_prefetch_bytes (C ABI 9): a contiguous tensor on `device` whose
    bytes the kernel starts moving into L2 (any dtype: a hint that changes no result), or None."""
    if t is None:
        return None, 0
    check(t, "prefetch", device=device)
    return t.data_ptr(), t.numel() * t.element_size()


# torch's raw-stream getter (what its compiled code calls): ~0.5 us where building a Stream object
# and reading .cuda_stream took 8.6 us per kernel call on the H100 machine's CPU.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# torch's device getter without current_device()'s lazy-init check: 0.2 us against 0.35-1.3 on the
# H100 machine's CPU, on the HF-style call's path to its first launch (callers hold CUDA tensors, so
# CUDA is initialized).
_get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def current_device() -> int:
    """The current CUDA device's index."""
    return _get_device()


@functools.lru_cache(maxsize=None)
def device_properties(device_index: int):
    """The GPU's properties (torch.cuda.get_device_properties), queried once per device: kernel choices read
    its compute capability and shared memory on the call path."""
    return torch.cuda.get_device_properties(device_index)


def device_capability(device_index: int) -> tuple[int, int]:
    """The GPU's compute capability (major, minor)."""
    props = device_properties(device_index)
    return props.major, props.minor


def stream_handle(device: torch.device) -> int:
    """The current torch CUDA stream of `device`, as the raw cudaStream_t the ABI takes."""
    if _raw_stream is not None and device.index is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


# ---- shared by the row-wise kernel bindings (padding, layernorm, embedding, activation) ----------

FLOAT_DTYPES = tuple(DTYPE_CODES)
VECTOR_BYTES = 16


def check_width(width: int, name: str = "hidden", max_width: int | None = MAX_HIDDEN) -> None:
    """Raise InputError unless width is a positive multiple of 8 (and at most max_width)."""
    if width <= 0 or width % HIDDEN_MULTIPLE:
        raise InputError(f"{name}: expected a positive multiple of {HIDDEN_MULTIPLE}, got {width}")
    if max_width is not None and width > max_width:
        raise InputError(f"{name}: expected at most {max_width}, got {width}")


def check_aligned(t: torch.Tensor | None, name: str) -> None:
    """The kernels load 16-byte vectors: a view starting mid-allocation may not be aligned."""
    if t is not None and t.data_ptr() % VECTOR_BYTES:
        raise InputError(f"{name}: expected a 16-byte aligned tensor (a view at an odd offset?); "
                         "call .clone() to get an aligned copy")


def check_float(t: torch.Tensor | None, name: str, *, shape: Sequence[int | None] | None = None,
                like: torch.Tensor | None = None, optional: bool = False) -> None:
    """check() for a float tensor a vectorized kernel reads: float32/float16/bfloat16 (like's dtype
    and device when given), contiguous, 16-byte aligned."""
    check(t, name, dtype=like.dtype if like is not None else FLOAT_DTYPES, shape=shape,
          device=like.device if like is not None else None, optional=optional)
    check_aligned(t, name)


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def check_eps(eps: float) -> None:
    """The one epsilon rule (the C ABI and the plugins check the same): finite and >= 0, as the
    float32 the kernels get (a larger Python float would arrive as inf)."""
    if not (0.0 <= eps <= _FLOAT32_MAX):
        raise InputError(f"eps: expected a finite float32 value >= 0, got {eps}")


def rows_and_width(x: torch.Tensor, name: str, width_name: str = "hidden",
                   max_width: int | None = MAX_HIDDEN) -> tuple[int, int]:
    """A float [..., width] tensor as (rows, width), width checked by check_width."""
    check_float(x, name)
    if x.dim() < 1:
        raise InputError(f"{name}: expected [..., {width_name}], got a scalar")
    width = x.shape[-1]
    check_width(width, f"{name}: {width_name} (last dimension)", max_width)
    return x.numel() // width, width


def output(out: torch.Tensor | None, shape: Sequence[int], like: torch.Tensor, *,
           aligned: bool = True) -> torch.Tensor:
    """`out`, checked to be like's dtype and device with `shape` (and 16-byte aligned when
    `aligned`: a vectorized kernel writes it), or a new tensor when None."""
    if out is None:
        return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
    check(out, "out", dtype=like.dtype, shape=list(shape), device=like.device)
    if aligned:
        check_aligned(out, "out")
    return out


def call_kernel(name: str, device: torch.device, *args) -> None:
    """Call a C ABI function with `device` current (kernels launch on the caller's current device)."""
    from .. import _lib

    if device.index == torch.cuda.current_device():  # the usual case: no device switch to pay for
        _lib.call(name, *args)
        return
    with torch.cuda.device(device):
        _lib.call(name, *args)
