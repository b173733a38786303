"""Programmatic edges from padfree's kernels into the GEMMs of a captured forward.

padfree's kernels launch with PDL, so in a captured forward each of them launches while the GEMM
before it drains; the GEMMs (torch's or cuBLASLt's calls) do not, so every edge from a LayerNorm or
the attention into the next GEMM is a full dependency. At BERT-base 1x128 that gap, 37 times per
forward, cost up to 57 us of a 0.425 ms graph replay (H100). An edge may be
programmatic only where the consumer's kernel waits on its producer before reading its input, and
no API reports that. On the H100 (CUDA 13.0, torch 2.11) none of cuBLASLt's GEMM kernels measured
does: behind a producer that spins 20 ms with the edge relaxed, the GEMM at 96, 2048 and 9344 rows
read the stale input every time, and even with no spin it read mostly stale rows (2% fresh at 2048
rows); torch's elementwise kernels do not wait either. So on that stack the probe relaxes nothing,
and edges that the second check below alone accepted were races that its runs happened to win.

So each consumer function is checked before its edges are relaxed, twice:
1. The probe (probe_consumer): the consumer as the forward calls it (same shapes, so the same
   kernel) is captured behind ops.graph_edges.delayed_copy, which writes the consumer's input but
   lets it launch at once and spins 20 ms first; with the edge relaxed, a consumer that does not
   wait reads the stale input, one that waits the fresh one. Deterministic where a consumer reads
   its input within 20 ms of launching.
2. The relaxed copy of the whole forward must reproduce the captured graph bit for bit on two input
   batches, each run right after the other one (a consumer that read before its wait would read
   the other batch's stale rows); outputs are poisoned before every run.
A function is relaxed where every probe that ran it found it waiting and the copy matched. The
second check alone accepted, under compute-sanitizer memcheck, two consumers at 93 tokens
that plain runs rejected, and the relaxed encoder then computed wrong rows there; so it was opt-in.
Timing stamps cannot replace the data probe: a kernel behind a programmatic edge completes, for the
nodes after it, only with its producer, and cuBLASLt's GEMMs trigger their own dependents early
(H100: a stamp behind the consumer came after the spin for every consumer through a full edge, and
before it for every one through a programmatic edge).

Off by default (PadfreeEncoder(programmatic_edges=True) turns it on): it finds nothing to relax on the
stack measured, and costs a few probes per captured bucket. It stays for consumers that do wait
(a cuBLASLt or a consumer of another library that takes PDL into account).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from .. import env

PROBE_SPIN_NS = 20_000_000


def enabled() -> bool:
    """PADFREE_PDL=0 turns PDL off everywhere (the kernel library reads it too), for A/B runs."""
    return env.flag("PADFREE_PDL")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@dataclass
class Probe:
    """A consumer as the forward calls it: consume(x) reads x (in the forward, a padfree kernel's
    output) and writes out; reset() puts out back where consume starts from (a GEMM that adds into
    its output needs it; else it poisons out)."""
    x: torch.Tensor
    consume: Callable[[torch.Tensor], None]
    out: torch.Tensor
    reset: Callable[[], None]


def probe_consumer(probe: Probe, ops, device: torch.device, stream: torch.cuda.Stream,
                   capturing: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                   spin_ns: int = PROBE_SPIN_NS) -> dict[int, bool]:
    """Whether the kernels probe.consume runs read x only once its producer has completed: {function:
    waits} for each consumer of the delayed copy in the probe's graph (its direct successor). Run
    and captured on `stream`, the capture inside capturing() (the caller's protocol for library
    workspaces); the replays run on the current stream, which this call waits for."""
    x, current = probe.x, torch.cuda.current_stream(device)
    fresh, stale = torch.randn_like(x), torch.randn_like(x)
    spin = torch.zeros(1, dtype=torch.int64, device=device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):  # the reference, and the stream's warm-up (library workspaces)
        x.copy_(fresh)
        probe.reset()
        probe.consume(x)
        want = probe.out.clone()
    current.wait_stream(stream)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with capturing(), torch.cuda.graph(graph, stream=stream):
        ops.graph_edges.delayed_copy(fresh, x, spin)
        probe.consume(x)
    raw = graph.raw_cuda_graph()
    functions = ops.graph_edges.consumers(raw, device)
    ops.graph_edges.relax_edges(raw, functions, device)
    matched = []
    for spin_value in (0, spin_ns):  # the first replay instantiates the graph and loads its kernels
        spin.fill_(spin_value)
        x.copy_(stale)
        probe.reset()
        graph.replay()
        matched.append(torch.equal(probe.out, want))
    # Where the probe's graph has another consumer too (an elementwise kernel that prepares the
    # output, say), the one that reads x is not known: none is found waiting.
    return {f: len(functions) == 1 and all(matched) for f in functions}


def relax_captured(raw_graph: int, ops, device: torch.device, feed: Callable[[int], None],
                   outputs: list[torch.Tensor], verdicts: dict[int, bool]) -> list[int]:
    """Relaxes, in raw_graph (a captured cudaGraph_t not yet instantiated), the edges into every
    consumer that the probes found waiting (verdicts, from probe_consumer) and whose relaxed copy
    reproduces the graph. feed(k) writes input batch k (0: the one captured, left in place on
    return; 1: another with every value different) into the graph's static inputs; outputs: the
    tensors the graph writes. Returns the consumer functions whose edges were relaxed."""
    functions = [f for f in ops.graph_edges.consumers(raw_graph, device) if verdicts.get(f, False)]
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
