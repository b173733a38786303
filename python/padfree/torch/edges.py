"""Programmatic edges from padfree's kernels into the GEMMs of a captured forward.

padfree's kernels launch with PDL, so in a captured forward each of them launches while the GEMM
before it drains; the GEMMs (torch's or cuBLASLt's calls) do not, so every edge from a LayerNorm or
the attention into the next GEMM is a full dependency. At BERT-base 1x128 that gap, 37 times per
forward, cost up to 57 us of a 0.425 ms graph replay (H100, bench/NOTES-bert.md v12). An edge may be
programmatic only where the consumer's kernel waits on its producer before reading its input, and
no API reports that. On the H100 cuBLASLt's kernels for a few thousand rows and more do; some of its
small-row kernels do not, nor do torch's own elementwise and indexing kernels.

So each consumer function is checked before its edges are relaxed: the relaxed copy must reproduce
the captured graph bit for bit on two input batches, each run right after the other one. padfree's
producers let their consumers launch at their start (griddepcontrol.launch_dependents), so a
consumer that does not wait runs during its producer and reads the other batch's stale rows, which
the comparison sees; outputs are poisoned before every run.

Off by default (PadfreeEncoder(programmatic_edges=True) turns it on): the check is empirical. In
plain runs it rejected the same consumers every time and relaxed graphs matched captured ones on
every batch tried (H100: 90 calls and 90 replays at three shapes); but under compute-sanitizer
memcheck it accepted two more consumers at 93 tokens, and the encoder's HF-style calls (their
guarded graphs) then differed from the captured graph's. A proof per consumer needs a deterministic
probe instead: a padfree producer that triggers, then spins for milliseconds before it writes,
ahead of a copy of the consumer's node (not built yet).
"""
from __future__ import annotations

import os
from typing import Callable

import torch


def enabled() -> bool:
    """PADFREE_PDL=0 turns PDL off everywhere (the kernel library reads it too), for A/B runs."""
    return os.environ.get("PADFREE_PDL", "1") != "0"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def relax_captured(raw_graph: int, ops, device: torch.device, feed: Callable[[int], None],
                   outputs: list[torch.Tensor]) -> list[int]:
    """Relaxes, in raw_graph (a captured cudaGraph_t not yet instantiated), the edges into every
    consumer that passes the check. feed(k) writes input batch k (0: the one captured, left in place
    on return; 1: another with every value different) into the graph's static inputs; outputs: the
    tensors the graph writes. Returns the consumer functions whose edges were relaxed."""
    functions = ops.graph_edges.consumers(raw_graph, device)
    if not functions:
        return []

    def run(graph, batch):
        feed(batch)
        for out in outputs:
            out.fill_(float("nan"))
        graph.launch()
        return [_bits(out).clone() for out in outputs]

    def same(got, want):
        return all(torch.equal(g, w) for g, w in zip(got, want))

    waiting = []
    try:
        with ops.graph_edges.GraphExec(raw_graph, [], device) as captured:
            want = [run(captured, 0), run(captured, 1)]
            for f in functions:
                with ops.graph_edges.GraphExec(raw_graph, [f], device) as relaxed:
                    # each run follows one of the other batch, whose rows a non-waiting consumer would read
                    if all(same(run(relaxed, k), want[k]) for k in (0, 1)):
                        waiting.append(f)
    finally:
        feed(0)
    if waiting:
        ops.graph_edges.relax_edges(raw_graph, waiting, device)
    return waiting
