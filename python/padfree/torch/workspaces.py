"""cuBLAS(Lt) workspaces in captured CUDA graphs.

The fastest cuBLASLt algorithms for BERT-base's larger GEMMs on the H100 ask for a few bytes of
workspace: their tile scheduler's counter, which cuBLASLt zeroes with a memset before each call. In a
captured forward those are 36-48 memset nodes, and each leaves the GPU idle for ~3.5 us before its
GEMM (64x512: the LayerNorm -> memset 1.2 us, the memset 0.7, memset -> GEMM 1.9; a kernel-to-kernel
edge costs ~0.2). CounterSlots gives each such call of a forward its own workspace, zeroes them all
at the forward's start, and removes cuBLASLt's memsets from the captured graph.
"""
from __future__ import annotations

import contextlib

import torch

from .. import env

SLOT_ALIGNMENT = 256  # cuBLASLt's alignment for workspace pointers


class CounterSlots:
    """`count` workspaces of `slot_bytes` each (rounded up to SLOT_ALIGNMENT) in one buffer, for a
    sequence of cuBLASLt calls that each take their own (take()) after start() zeroed them all.

    Captured as start() then at most `count` takes, the graph's own cuBLASLt memsets into the slots are
    redundant and drop_memsets removes them. Outside a graph, or where a graph cannot be edited, those
    memsets stay: the slots are then ordinary workspaces, and taking more than `count` reuses them."""

    def __init__(self, count: int, slot_bytes: int, device: torch.device):
        if count < 1:
            raise ValueError(f"count: expected >= 1, got {count}")
        self.count = count
        self.slot_bytes = -(-max(slot_bytes, 1) // SLOT_ALIGNMENT) * SLOT_ALIGNMENT
        # one slot more than handed out: start()'s zeroing then covers more than any one slot, so
        # that drop_memsets can never mistake it for one of cuBLASLt's
        self.buffer = torch.zeros((count + 1) * self.slot_bytes, dtype=torch.uint8, device=device)
        self.taken = 0

    def start(self) -> None:
        """Enqueue the zeroing of every slot; the next take() hands out the first."""
        self.buffer.zero_()
        self.taken = 0

    def take(self) -> torch.Tensor:
        k = self.taken % self.count
        self.taken += 1
        return self.buffer[k * self.slot_bytes:(k + 1) * self.slot_bytes]

    def drop_memsets(self, graph: torch.cuda.CUDAGraph) -> int:
        """Removes, from a graph captured as start() then at most `count` takes and not yet replayed
        (keep_graph), the memsets that zero parts of single slots. Returns how many; 0 where this
        torch cannot expose the graph, where more calls took slots than there are, or with
        PADFREE_COUNTER_MEMSETS=keep (for A/B runs): the graph then runs as captured."""
        if self.taken > self.count or env.get("PADFREE_COUNTER_MEMSETS") == "keep":
            return 0
        try:
            raw = graph.raw_cuda_graph()
        except (RuntimeError, AttributeError):
            return 0
        from ..ops import graph_edges
        return graph_edges.remove_zeroing_memsets(raw, self.buffer, self.slot_bytes)


def keeping_cuda_graph() -> torch.cuda.CUDAGraph:
    """A CUDAGraph that keeps its cudaGraph_t (editable until its first replay, kept afterwards for
    GuardedGraph's clone); a plain one where this torch cannot."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        return torch.cuda.CUDAGraph()


@contextlib.contextmanager
def cublas_workspaces_in_pool():
    """torch's GEMMs take a cuBLAS workspace that torch caches per (handle, stream) and that a captured
    graph references by address. Left as it is, a capture reuses the one its stream's warm-up made in
    the ordinary pool, and the next code that clears that cache (torch.compile's CUDA graphs clear it
    around every recording) frees memory the graph still writes: a later replay faulted with an
    illegal address on the H100 (BERT-base at 64x512, where torch's picks use a workspace, once a
    reduce-overhead model had recorded after the capture). Cleared before the capture, the workspace
    is allocated in the graph's own pool, which lives as long as the graphs; cleared after it, no
    eager GEMM runs on that pool memory. The same protocol as torch's cudagraph_trees."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    try:
        yield
    finally:
        if clear is not None:
            clear()
