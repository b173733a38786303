"""Capturing a PadfreeEncoder's forward as one CUDA graph per size bucket (padfree.torch.encoder).

A bucket's first call tunes its GEMMs (gemm_tuning), chooses between near-equal GEMM candidates
inside the captured forward where tuning could not tell them apart, records the graph in the
encoders' shared memory pool, drops cuBLASLt's workspace memsets from it and, where asked, makes
the edges from padfree's kernels into the GEMMs programmatic (edges.py).
"""
from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from .._lib import PadfreeError
from . import edges
from .buckets import Bucket
from .gemm_tuning import save_tuning
from .gemms import EncoderGemms
from .inputs import InputBuffer
from .streams import side_stream
from .workspaces import cublas_workspaces_in_pool, keeping_cuda_graph

log = logging.getLogger(__name__)

# Small buckets' GEMMs whose tuning left a runner-up within gemm_tuning.RUNNER_UP_MARGIN are chosen by
# timing both inside the captured forward (IN_FORWARD_REPLAYS replays each, in turn): alone, two of
# BERT-base's out-projection kernels at 128 rows timed 0.1 us apart and were ranked at random, while
# inside the forward they ran 3-4 us per call apart (H100; gemm_tuning.SMALL_ROWS). Measured with it
# (one process, four encoders tuned in turn, calls alternating): 4x128 460-478
# and 461-482 us per call against 462-482 and 466-485 for the isolated picks; at 1x128 all four
# tunings ended on the same kernels. About one second of capture per small bucket. Where
# gemm_tuning.RUNNER_UP_MAX_ROWS lets larger buckets choose too, each forward replays for at most
# IN_FORWARD_SECONDS in all.
CHOOSE_IN_FORWARD = True
IN_FORWARD_REPLAYS = 60
IN_FORWARD_SECONDS = 1.0

@dataclass
class _Graph:
    """One captured forward and the static buffers it reads and writes."""
    bucket: Bucket
    graph: torch.cuda.CUDAGraph
    inputs: InputBuffer                   # the encoder's input buffer, viewed at the bucket's sizes
    hidden: torch.Tensor                  # [tokens, H]: the output
    pooled: torch.Tensor | None           # [batch, H], or a sequence-classification head's [batch, num_labels]
    head_rows: torch.Tensor | None = None  # [tokens, width]: a per-token head's output
    gemms: EncoderGemms | None = None     # the projections' implementations at the bucket's rows
    replays: int = 0
    guarded: Any = None                   # its GuardedGraph (None: not made yet, False: cannot be)
    relaxed: tuple = ()                   # consumer kernels whose edges were made programmatic (edges.py)
    dropped_memsets: int = 0              # cuBLASLt's workspace memsets removed (workspaces.CounterSlots)


def _median_error(samples: list[float]) -> float:
    """The standard error of a median, from the samples' median absolute deviation (robust to the
    odd slow replay). A runner-up replaces its pick only where it is faster by twice the error of
    the difference: at 64x512 the forward varies by tens of microseconds under the power cap, and
    one swap on a 9 us difference of medians ran 8-29 us per call slower (H100)."""
    mid = statistics.median(samples)
    mad = statistics.median(abs(x - mid) for x in samples)
    return 1.2533 * 1.4826 * mad / math.sqrt(len(samples))




class GraphCapture:
    """PadfreeEncoder's capture of a bucket's forward (its _run) into a _Graph."""

    def _capture(self, bucket: Bucket, inputs: InputBuffer) -> _Graph:
        """inputs: the bucket's view of the input buffer, holding the batch that asked for the bucket
        (so the warm-up below computes a real forward, and no stale lengths beyond the bucket's)."""
        # static outputs live outside the pool: they must survive other captures
        hidden, pooled, head_rows = self._outputs(bucket.tokens, bucket.batch)
        g = _Graph(bucket=bucket, graph=keeping_cuda_graph(), inputs=inputs, hidden=hidden, pooled=pooled,
                   head_rows=head_rows)
        # One pool for the encoder's graphs, but a fresh one whenever none is kept: a pool handle
        # outlives its pool, and once every graph captured into it is gone (clear_graphs(), a grown
        # input buffer) torch's allocator asserts on a capture into the old handle.
        if not len(self._graphs):  # (none before the first capture)
            self._pool = torch.cuda.graph_pool_handle()
        if self._capture_stream is None:
            self._capture_stream = side_stream(self.device)
        g.gemms = self._gemms(bucket.tokens, tune=True)  # times candidates: before any capture
        if self.gemm_tuning is not None:
            save_tuning(self.gemm_tuning, self.device)
        args = (g.inputs.input_ids, g.inputs.token_type_ids, g.inputs.cu_seqlens, bucket.max_seqlen,
                g.hidden, g.pooled, g.gemms, g.head_rows)
        current = None  # the forward as the choices so far left it, captured
        if CHOOSE_IN_FORWARD:
            for name in g.gemms.alternatives():
                current = self._choose_in_forward(g.gemms, name, args, current)
        self._record(g.graph, args)
        del current  # after the recording: the pool must not lose its last graph between captures
        g.dropped_memsets = g.gemms.drop_memsets(g.graph)
        if self.programmatic_edges and edges.enabled():
            self._relax_edges(g)
        return g

    def _record(self, graph: torch.cuda.CUDAGraph, args: tuple) -> torch.cuda.CUDAGraph:
        """Captures _run(*args) into `graph` (in the encoders' pool), after a warm-up run outside the
        capture (library handles, workspaces)."""
        self._capture_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._capture_stream):
            self._run(*args)
        torch.cuda.current_stream(self.device).wait_stream(self._capture_stream)
        with cublas_workspaces_in_pool(), torch.cuda.graph(graph, pool=self._pool, stream=self._capture_stream):
            self._run(*args)
        return graph

    def _choose_in_forward(self, gemms: EncoderGemms, name: str, args: tuple,
                           current: torch.cuda.CUDAGraph | None) -> torch.cuda.CUDAGraph:
        """Projection `name` takes its runner-up where that forward ran faster than the pick's by more
        than the noise (_median_error): both replayed in turn. current: the forward with the pick,
        captured by the previous choice (None: captured here). Returns the graph of the forward as
        chosen, for the next choice (the caller drops the last)."""
        graphs = [current if current is not None else self._record(torch.cuda.CUDAGraph(), args)]
        gemms.swap(name)
        graphs.append(self._record(torch.cuda.CUDAGraph(), args))
        gemms.swap(name)  # back to the pick

        def replay_us(graph: torch.cuda.CUDAGraph) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3
        us = [[replay_us(graphs[0])], [replay_us(graphs[1])]]
        # IN_FORWARD_SECONDS bounds a large bucket's choice
        pairs = max(5, min(IN_FORWARD_REPLAYS, int(IN_FORWARD_SECONDS * 1e6 / (us[0][0] + us[1][0]))))
        for _ in range(pairs - 1):
            for k in range(2):
                us[k].append(replay_us(graphs[k]))
        margin = 2 * math.hypot(_median_error(us[0]), _median_error(us[1]))
        hidden = args[4]  # _run's arguments
        log.debug("%s at %d rows: forward %.1f us with the pick, %.1f with the runner-up (+-%.1f)", name,
                  hidden.shape[0], statistics.median(us[0]), statistics.median(us[1]), margin)
        if statistics.median(us[1]) < statistics.median(us[0]) - margin:
            gemms.swap(name)
            return graphs[1]
        return graphs[0]

    def _relax_edges(self, g: _Graph) -> None:
        """Before the graph's first replay instantiates it (keep_graph): nothing to do where torch
        cannot keep it, or where a probe or a graph call fails (the graph then runs as captured)."""
        try:
            raw = g.graph.raw_cuda_graph()
        except (RuntimeError, AttributeError):
            return
        ids = g.inputs.input_ids
        batches = [ids.clone()]
        batches.append((batches[0] + 1) % self.weights.vocab_size)  # every token differs, same lengths
        outputs = [t for t in (g.hidden, g.pooled, g.head_rows) if t is not None]
        try:
            verdicts: dict[int, bool] = {}
            for probe in self._consumer_probes(g):
                found = edges.probe_consumer(probe, self._ops, self.device, self._capture_stream,
                                             cublas_workspaces_in_pool)
                for function, waits in found.items():
                    verdicts[function] = verdicts.get(function, True) and waits
            g.relaxed = tuple(edges.relax_captured(raw, self._ops, self.device, lambda k: ids.copy_(batches[k]),
                                                   outputs, verdicts))
        except (PadfreeError, RuntimeError):  # a probe that cannot be captured relaxes nothing
            g.relaxed = ()

    def _consumer_probes(self, g: _Graph) -> list[edges.Probe]:
        """The forward's consumers of padfree kernels' outputs, called as _run calls them (layer 0's
        weights: every layer's projections have the same shapes, so the same kernels): the QKV and
        FFN-up projections of a LayerNorm, the attention output's projection (which adds into the
        residual), and the pooler of each sequence's first token."""
        w, lw = self.weights, self.weights.layers[0]
        rows, h = g.hidden.shape
        new = dict(dtype=self.dtype, device=self.device)

        def poisoned(out):
            return lambda: out.fill_(float("nan"))

        x, acc, acc0 = (torch.randn(rows, h, **new) for _ in range(3))
        qkv, up = torch.empty(rows, 3 * h, **new), torch.empty(rows, w.intermediate_size, **new)
        probes = [edges.Probe(x, lambda t: g.gemms.qkv(t, lw.qkv_weight, qkv), qkv, poisoned(qkv)),
                  edges.Probe(x, lambda t: g.gemms.up(t, lw.up_weight, lw.up_bias, up), up, poisoned(up)),
                  edges.Probe(x, lambda t: g.gemms.out_residual(t, lw.out_weight, acc), acc, lambda: acc.copy_(acc0))]
        if g.pooled is not None and self.has_pooler:  # (a sentence model's pooling is padfree's kernel)
            first, pooled = torch.randn(g.pooled.shape, **new), torch.empty(g.pooled.shape, **new)
            probes.append(edges.Probe(first, lambda t: torch.addmm(w.pooler_bias, t, w.pooler_weight.t(), out=pooled),
                                      pooled, poisoned(pooled)))
        return probes
