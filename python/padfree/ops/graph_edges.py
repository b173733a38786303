"""Surgery on captured CUDA graphs (plugins/kernels/graphs/graph_edges.h). Programmatic edges from padfree's
kernels into other libraries' kernels: which consumers there are, the probe's delayed copy, an
executable relaxed copy to compare with the captured graph, and the in-place change once a caller has
decided. And the removal of memsets that a caller has made redundant."""
from __future__ import annotations

import ctypes

import torch

from .._lib import OwnedHandle
from ._tensors import InputError, call_kernel, check, check_aligned, stream_handle


def _graph_handle(graph: int) -> int:
    if not isinstance(graph, int) or graph == 0:
        raise InputError(f"graph: expected a cudaGraph_t address (CUDAGraph.raw_cuda_graph()), got {graph!r}")
    return graph


def _function_array(functions) -> tuple[ctypes.Array, int]:
    functions = list(functions)
    return (ctypes.c_void_p * max(1, len(functions)))(*functions), len(functions)


def consumers(graph: int, device: torch.device) -> list[int]:
    """The distinct kernel functions (opaque addresses) that a padfree kernel feeds through a full edge."""
    handle, count = _graph_handle(graph), ctypes.c_int32()
    call_kernel("padfree_graph_consumers", device, handle, None, 0, ctypes.byref(count))
    found = (ctypes.c_void_p * max(1, count.value))()
    call_kernel("padfree_graph_consumers", device, handle, found, count.value, ctypes.byref(count))
    return [f for f in found[:count.value]]


def delayed_copy(src: torch.Tensor, dst: torch.Tensor, spin_ns: torch.Tensor) -> None:
    """dst.copy_(src) on the current stream, by a padfree kernel that lets the kernels depending on it
    launch at once and spins spin_ns (an int64 device scalar, read when it runs) before it copies:
    the producer of a probe that tells whether a consumer waits (padfree.torch.edges)."""
    check(src, "src", device=dst.device if isinstance(dst, torch.Tensor) else None)
    check(dst, "dst", dtype=src.dtype, shape=list(src.shape))
    check(spin_ns, "spin_ns", dtype=torch.int64, shape=[1], device=dst.device)
    check_aligned(src, "src")
    check_aligned(dst, "dst")
    size = src.numel() * src.element_size()
    if size == 0 or size % 16:
        raise InputError(f"src: expected a positive multiple of 16 bytes, got {size}")
    call_kernel("padfree_probe_delayed_copy", dst.device, src.data_ptr(), dst.data_ptr(), size, spin_ns.data_ptr(),
                stream_handle(dst.device))


def relax_edges(graph: int, functions, device: torch.device) -> int:
    """Makes the full edges from padfree kernels into kernels running `functions` programmatic, in
    place (only for consumers known to wait on their producer). Returns how many edges changed."""
    array, count = _function_array(functions)
    relaxed = ctypes.c_int32()
    call_kernel("padfree_graph_relax_edges", device, _graph_handle(graph), array, count, ctypes.byref(relaxed))
    return relaxed.value


def remove_zeroing_memsets(graph: int, slots: torch.Tensor, slot_bytes: int) -> int:
    """Removes from `graph` (a captured cudaGraph_t not yet instantiated) each memset node that writes
    zeros inside one slot of `slots`' memory (slots of slot_bytes), joining its dependencies to its
    dependents; memsets over more than one slot stay. The caller's graph zeroes the slots before any
    of those memsets would have run. Returns how many were removed."""
    check(slots, "slots")
    size = slots.numel() * slots.element_size()
    if not isinstance(slot_bytes, int) or not 0 < slot_bytes <= size:
        raise InputError(f"slot_bytes: expected an int in [1, {size}], got {slot_bytes!r}")
    removed = ctypes.c_int32()
    call_kernel("padfree_graph_remove_zeroing_memsets", slots.device, _graph_handle(graph), slots.data_ptr(), size,
                slot_bytes, ctypes.byref(removed))
    return removed.value


class GraphExec(OwnedHandle):
    """An executable copy of `graph` with the edges into `functions` relaxed (the graph is unchanged).
    The memory the graph reads and writes must outlive it."""
    _DESTROY = "padfree_graph_exec_destroy"

    def __init__(self, graph: int, functions, device: torch.device):
        array, count = _function_array(functions)
        relaxed, handle = ctypes.c_int32(), ctypes.c_void_p()
        call_kernel("padfree_graph_exec_create", device, _graph_handle(graph), array, count, ctypes.byref(relaxed),
                    ctypes.byref(handle))
        self.device, self.relaxed, self._handle = device, relaxed.value, handle

    def launch(self) -> None:
        """Enqueue on the current stream of the graph's device."""
        call_kernel("padfree_graph_exec_launch", self.device, self._handle, stream_handle(self.device))
