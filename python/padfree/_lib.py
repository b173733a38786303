"""Loads libpadfree_kernels.so and calls its C ABI (plugins/capi/padfree.h) through ctypes.

ctypes rather than a compiled extension: the kernel library is independent of the Python and torch
versions, so one build serves every interpreter, and a CPU-only install needs no torch headers.
"""
from __future__ import annotations

import ctypes
import glob
from ctypes import c_char_p, c_float, c_int, c_int32, c_int64, c_uint32, c_void_p
from pathlib import Path

from . import env

ABI_VERSION = 15  # must match PADFREE_ABI_VERSION in plugins/capi/padfree.h

_p = c_void_p
_i32p = c_void_p  # device int32 pointers travel as plain addresses

# name -> argtypes (restype is the int status unless listed in _RESTYPES)
_SIGNATURES: dict[str, list] = {
    "padfree_abi_version": [],
    "padfree_version": [],
    "padfree_last_error": [],
    "padfree_status_string": [c_int],
    "padfree_stream_synchronize": [_p],
    "padfree_cu_seqlens_from_seqlens": [_i32p, c_int32, _i32p, _p],
    "padfree_cu_seqlens_from_mask": [_i32p, c_int32, c_int32, _i32p, _i32p, _p],
    "padfree_remove_padding": [_p, _i32p, c_int32, c_int64, c_int32, c_int64, _p, _p],
    "padfree_rebuild_padding": [_p, _i32p, c_int32, c_int64, c_int32, c_int64, _p, _p],
    "padfree_attention_varlen": [_p, _p, _i32p, c_int32, c_int64, c_int32, c_int32, c_int32, c_float,
                                 c_uint32, c_int, _p, _p],
    "padfree_layernorm": [_p, _p, _p, c_int64, c_int32, c_float, c_int, _p, _p],
    "padfree_skip_layernorm": [_p, _p, _p, _p, _p, c_int64, c_int32, c_float, _p, c_int64, c_int, _p, _p],
    "padfree_embedding_layernorm": [_i32p, _i32p, _i32p, c_int32, c_int64, _p, c_int32, _p, c_int32,
                                    c_int32, _p, c_int32, _p, _p, c_int32, c_float, _p, c_int64, c_int, _p, _p],
    "padfree_bias_gelu": [_p, _p, c_int64, c_int32, c_int32, c_int, _p, _p],
    "padfree_sequence_pool": [_p, _i32p, c_int32, c_int64, c_int32, c_int32, c_int32, c_int, _p, _p],
    "padfree_padded_input_stats": [_p, c_int32, _p, _p, c_int32, c_int32, c_int32, c_int64, c_int64, c_int64, _i32p,
                                   _i32p, _i32p, _p],
    "padfree_pack_padded_inputs": [_p, _p, c_int32, _i32p, c_int32, c_int32, c_int32, c_int32, _i32p, _i32p,
                                   _i32p, _p],
    "padfree_prepare_padded_inputs": [_p, c_int32, _p, _p, c_int32, c_int32, c_int32, c_int64, c_int64, c_int64, _i32p,
                                      _i32p, _i32p, c_int32, c_int32, _i32p, _i32p, _i32p, _p],
    "padfree_guarded_graph_create": [_p, _i32p, c_int32, c_int32, c_int32, c_int32, ctypes.POINTER(c_void_p)],
    "padfree_guarded_graph_launch": [_p, _p],
    "padfree_guarded_graph_destroy": [_p],
    "padfree_input_plan_create": [c_int32, c_int32, c_int32, c_int32, c_int32, c_int64, c_int64, c_int64, _i32p, _i32p,
                                  _i32p, c_int32, c_int32, _i32p, _i32p, _i32p, ctypes.POINTER(c_void_p)],
    "padfree_input_plan_launch": [_p, _p, _p, _p, _p, _p],
    "padfree_input_plan_destroy": [_p],
    "padfree_graph_consumers": [_p, _p, c_int32, ctypes.POINTER(c_int32)],
    "padfree_probe_delayed_copy": [_p, _p, c_int64, _p, _p],
    "padfree_graph_relax_edges": [_p, _p, c_int32, ctypes.POINTER(c_int32)],
    "padfree_graph_remove_zeroing_memsets": [_p, _p, c_int64, c_int64, ctypes.POINTER(c_int32)],
    "padfree_graph_exec_create": [_p, _p, c_int32, ctypes.POINTER(c_int32), ctypes.POINTER(c_void_p)],
    "padfree_graph_exec_launch": [_p, _p],
    "padfree_graph_exec_destroy": [_p],
    "padfree_decoder_self_attention_workspace_size": [c_int32, c_int32, c_int32, c_int32, ctypes.POINTER(c_int64)],
    "padfree_decoder_self_attention": [_p, _p, _p, _p, _i32p, _i32p, c_int32, c_int32, c_int32, c_int32, c_int32,
                                       c_float, _p, c_int64, c_int, _p, _p],
    "padfree_decoder_cross_attention_workspace_size": [c_int32, c_int32, c_int32, c_int32, ctypes.POINTER(c_int64)],
    "padfree_decoder_cross_attention": [_p, _p, _p, _i32p, c_int32, c_int32, c_int64, c_int32, c_int32, c_int32,
                                        c_float, _p, c_int64, c_int, _p, _p],
    "padfree_beam_reorder_cache_indir": [_i32p, _i32p, _i32p, c_int32, c_int32, _i32p, _p],
    "padfree_logits_topk_workspace_size": [c_int32, c_int32, c_int32, ctypes.POINTER(c_int64)],
    "padfree_decode_linear": [_p, _p, _p, _p, _p, _p, c_float, c_int32, c_int32, c_int32, c_int32, c_int, _p, _p,
                              _p],
    "padfree_decode_linear_fragments": [_p, _p, _p, _p, _p, _p, c_float, c_int32, c_int32, c_int32, c_int32, c_int,
                                        _p, _p, _p],
    "padfree_decode_gemm": [_p, _p, _p, _p, _p, c_float, c_int32, c_int32, c_int32, c_int32, c_int, _p, _p],
    "padfree_decode_linear_fragment_layout": [_p, c_int32, c_int32, c_int, _p, _p],
    "padfree_decode_linear_streams": [c_int32, c_int32, c_int32, c_int, ctypes.POINTER(c_int32)],
    "padfree_decoder_step_embedding": [_p, _i32p, _p, c_int32, c_float, _p, c_int32, c_int32, c_int32, c_int32, _p,
                                       _p, c_float, c_int32, c_int32, c_int, _p, _p],
    "padfree_beam_search_workspace_size": [c_int32, c_int32, c_int32, c_int32, ctypes.POINTER(c_int64),
                                           ctypes.POINTER(c_int64)],
    "padfree_beam_search_step": [_p, _i32p, c_int32, _i32p, c_int32, _p, _p, _p, _p, _p, _p, _p, c_int32, _p, _p,
                                 _i32p, _i32p, c_int32, _i32p, c_int32, c_int32, c_int32, c_float, c_int32, c_int32,
                                 _p, c_int64, _p],
    "padfree_greedy_step": [_i32p, _i32p, c_int32, _p, _p, _p, _p, c_int32, _p, _i32p, c_int32, c_int32, c_int64,
                            c_int32, _p],
    "padfree_logits_topk": [_p, _p, _p, _i32p, c_int32, c_float, _i32p, c_int32, _i32p, _i32p, c_int32, c_int32,
                            c_int32, c_int32, c_int32, _p, c_int64, c_int, _p, _i32p, _p],
}
_RESTYPES = {
    "padfree_abi_version": c_int,
    "padfree_version": c_char_p,
    "padfree_last_error": c_char_p,
    "padfree_status_string": c_char_p,
}

STATUS_INVALID_ARGUMENT = 1
STATUS_UNSUPPORTED = 2
STATUS_CUDA = 3


class PadfreeError(RuntimeError):
    """Base class of padfree's errors."""


class LibraryNotFoundError(PadfreeError):
    """The kernel library was not built or not found."""


class KernelArgumentError(PadfreeError, ValueError):
    """The kernel library refused an argument (shape, size, pointer)."""


class KernelUnsupportedError(PadfreeError, NotImplementedError):
    """The kernel library has no kernel for this configuration."""


class CudaError(PadfreeError):
    """A CUDA call inside the kernel library failed."""


def library_candidates() -> list[Path]:
    """Where the kernel library is looked for, first match wins."""
    here = Path(__file__).resolve().parent
    found: list[Path] = []
    if env.is_set("PADFREE_LIBRARY"):
        found.append(env.path("PADFREE_LIBRARY"))
    found.append(here / "lib" / "libpadfree_kernels.so")
    # a source checkout: python/padfree -> repository root, built by CMake or pip into build/
    root = here.parent.parent
    found += [Path(p) for p in sorted(glob.glob(str(root / "build" / "**" / "libpadfree_kernels.so"),
                                                recursive=True))]
    return found


_LIB: ctypes.CDLL | None = None


def load() -> ctypes.CDLL:
    """The loaded kernel library, with every function's signature set. Raises LibraryNotFoundError."""
    global _LIB
    if _LIB is not None:
        return _LIB
    candidates = library_candidates()
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise LibraryNotFoundError(
            "libpadfree_kernels.so was not found; looked in: "
            + ", ".join(str(p) for p in candidates[:3])
            + ". Install padfree with `pip install .` or set PADFREE_LIBRARY to the built library.")
    lib = ctypes.CDLL(str(path))
    for name in _RESTYPES:
        _bind(lib, name)
    if lib.padfree_abi_version() != ABI_VERSION:
        raise LibraryNotFoundError(
            f"{path} has ABI version {lib.padfree_abi_version()}, these bindings expect {ABI_VERSION};"
            " rebuild the library from this source tree.")
    lib._padfree_path = str(path)  # type: ignore[attr-defined]
    _LIB = lib
    return lib


def _bind(lib: ctypes.CDLL, name: str):
    try:
        fn = getattr(lib, name)
    except AttributeError:
        raise LibraryNotFoundError(f"{lib._name} has no symbol {name}: rebuild the kernel library") from None
    fn.argtypes = _SIGNATURES[name]
    fn.restype = _RESTYPES.get(name, c_int)
    return fn


_BOUND: dict[str, object] = {}


def available() -> bool:
    try:
        load()
        return True
    except (LibraryNotFoundError, OSError):
        return False


def function(name: str):
    """The ABI function `name`, its signature set: for a caller that makes the same call many times
    and checks the status itself (raise_for_status)."""
    fn = _BOUND.get(name)
    if fn is None:
        fn = _BOUND[name] = _bind(load(), name)
    return fn


def raise_for_status(name: str, status: int) -> None:
    """Raise the PadfreeError matching a non-zero status of the ABI function `name`."""
    message = (load().padfree_last_error() or b"").decode(errors="replace")
    error = {STATUS_INVALID_ARGUMENT: KernelArgumentError,
             STATUS_UNSUPPORTED: KernelUnsupportedError,
             STATUS_CUDA: CudaError}.get(status, PadfreeError)
    raise error(f"{name}: {message}")


def call(name: str, *args) -> None:
    """Call a status-returning ABI function; a non-zero status raises the matching PadfreeError."""
    status = function(name)(*args)
    if status != 0:
        raise_for_status(name, status)


class OwnedHandle:
    """A C object the library made (self._handle): close() or garbage collection destroys it once,
    with the ABI function named by _DESTROY."""
    _DESTROY = ""
    _handle = c_void_p()

    @property
    def handle(self) -> c_void_p:
        return self._handle

    def close(self) -> None:
        if self._handle:
            call(self._DESTROY, self._handle)
            self._handle = c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass
