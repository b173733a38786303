"""A captured CUDA graph behind a device-side guard (plugins/kernels/graphs/graph_guard.h): launched right
after PaddedInputPacker.enqueue, it runs only where the totals that call measured fit the sizes the
graph was captured for, so the host need not wait for them before launching."""
from __future__ import annotations

import ctypes

import torch

from .._lib import OwnedHandle
from ._tensors import InputError, call_kernel, check, check_int32, stream_handle


class GuardedGraph(OwnedHandle):
    """graph: a torch.cuda.CUDAGraph captured with keep_graph=True (its cudaGraph_t is cloned; the
    memory it reads and writes must outlive this object, so it is kept referenced). stats: int32 [3]
    on the graph's device (flags, total, longest; PaddedInputPacker.totals). total and longest:
    inclusive (min, max) ranges. The graph runs iff fits(flags, total, longest) holds for the stats
    when the stream reaches it. handle: the padfree_guarded_graph* (PaddedInputPacker.enqueue
    launches it in its own C call)."""
    _DESTROY = "padfree_guarded_graph_destroy"

    def __init__(self, graph: torch.cuda.CUDAGraph, stats: torch.Tensor, total: tuple[int, int],
                 longest: tuple[int, int]):
        check(stats, "stats", dtype=torch.int32, shape=[3])
        if stats.device.type != "cuda":
            raise InputError(f"stats: expected a CUDA tensor, got one on {stats.device}")
        self.total = tuple(check_int32(n, "total range", minimum=1) for n in total)
        self.longest = tuple(check_int32(n, "longest range", minimum=1) for n in longest)
        for name, (low, high) in (("total", self.total), ("longest", self.longest)):
            if low > high:
                raise InputError(f"{name}: expected a range (min, max) with min <= max, got ({low}, {high})")
        self.device = stats.device
        self._graph, self._stats = graph, stats
        handle = ctypes.c_void_p()
        call_kernel("padfree_guarded_graph_create", self.device, graph.raw_cuda_graph(), stats.data_ptr(),
                    *self.total, *self.longest, ctypes.byref(handle))
        self._handle = handle

    def fits(self, flags: int, total: int, longest: int) -> bool:
        """The device's predicate, for the host to tell afterwards whether the graph ran."""
        return flags == 0 and self.total[0] <= total <= self.total[1] and self.longest[0] <= longest <= self.longest[1]

    def launch(self) -> None:
        """Enqueue on the current stream of the graph's device."""
        call_kernel("padfree_guarded_graph_launch", self.device, self._handle, stream_handle(self.device))
