"""PadfreeEncoder: a BERT-family encoder run on packed tokens with padfree's kernels.

Per layer, on x [T, H]:  qkv = x @ Wqkv^T (no bias: the attention kernel adds it on load)
-> ctx = attention_varlen(qkv) -> x += ctx @ Wo^T (in the GEMM) -> x = LayerNorm(x + bo)
-> up = act(x @ Wi^T + bi) (cuBLASLt epilogue, see ffn.py) -> x += up @ Wd^T -> x = LayerNorm(x + bd),
all on one [T, H] buffer (the LayerNorms in place).
GEMMs are cuBLASLt's: torch's calls, or for a bucket's row count the cuBLASLt algorithm that
measured fastest (gemms.py). No layer synchronizes the host. With graphs on, the whole packed forward
is captured once per bucket (buckets.py) and replayed; all captures share one memory pool, so the
intermediates of every bucket live in the memory of the largest one. A replay does not synchronize,
but the first call that needs a bucket without a graph (or whose graph was evicted) captures one
(and times its GEMM candidates the first time a row count is seen), and capturing synchronizes the
whole device (torch.cuda.graph waits for all its work, then frees cached memory): warm the buckets
up before latency matters.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .. import ops as _default_ops
from .._lib import PadfreeError
from ..ops._tensors import INT32_MAX, InputError, current_device
from ..ops.inputs import input_layout
from ..runtime.backends.base import Limits, check_packed
from . import edges
from .buckets import LRU, Bucket, bucket_for, round_seqlen, round_tokens
from .ffn import FfnUp, epilogue_matches
from .gemms import SEARCHES, EncoderGemms, load_tuning, save_tuning
from .inputs import Batch, DeviceInputs, InputBuffer, from_host
from .streams import side_stream
from .weights import EncoderWeights
from .workspaces import cublas_workspaces_in_pool, keeping_cuda_graph

log = logging.getLogger("padfree.encoder")

INPUT_TOKENS, INPUT_BATCH = 65536, 1024  # the input buffer's first capacity
# Forwards of at most this many rows have each LayerNorm prefetch the next GEMMs' weights into L2
# (LayerWeights.attention_projections), where the GEMMs would read them from DRAM with few rows to
# spread the latency over. H100, BERT-base, same process, HF-style calls (NOTES-bert.md v19): 16x256
# (2624 rows) -0.02 ms per call in five comparisons (GEMMs -0.04, LayerNorms +0.02), 1x128 -0.001
# to -0.008, 4x128 level, 32x128 +0.019 / -0.025 / -0.028; 128x128 (9344 rows) level.
PREFETCH_MAX_ROWS = 4096
# Small buckets' GEMMs whose tuning left a runner-up within gemms.RUNNER_UP_MARGIN are chosen by
# timing both inside the captured forward (IN_FORWARD_REPLAYS replays each, in turn): alone, two of
# BERT-base's out-projection kernels at 128 rows timed 0.1 us apart and were ranked at random, while
# inside the forward they ran 3-4 us per call apart (H100; gemms.SMALL_ROWS). Measured with it (one
# process, four encoders tuned in turn, calls alternating; bench/NOTES-bert.md v22): 4x128 460-478
# and 461-482 us per call against 462-482 and 466-485 for the isolated picks; at 1x128 all four
# tunings ended on the same kernels. About one second of capture per small bucket. Where
# gemms.RUNNER_UP_MAX_ROWS lets larger buckets choose too, each forward replays for at most
# IN_FORWARD_SECONDS in all.
CHOOSE_IN_FORWARD = True
IN_FORWARD_REPLAYS = 60
IN_FORWARD_SECONDS = 1.0
GUESSES = 64  # padded input shapes whose last graph is remembered for speculative launches


@dataclass
class _Graph:
    """One captured forward and the static buffers it reads and writes."""
    bucket: Bucket
    graph: torch.cuda.CUDAGraph
    inputs: InputBuffer                   # the encoder's input buffer, viewed at the bucket's sizes
    hidden: torch.Tensor                  # [tokens, H]: the output
    pooled: torch.Tensor | None           # [batch, H]
    gemms: EncoderGemms | None = None     # the projections' implementations at the bucket's rows
    replays: int = 0
    guarded: Any = None                   # its GuardedGraph (None: not made yet, False: cannot be)
    relaxed: tuple = ()                   # consumer kernels whose edges were made programmatic (edges.py)
    dropped_memsets: int = 0              # cuBLASLt's workspace memsets removed (workspaces.CounterSlots)


@dataclass
class _Route:
    """A speculative call's way from its inputs' layout to the packer's C call (_speculate). Valid
    while the encoder's input buffer is `inputs` (the plan packs into it) and its graph LRU holds
    `graph` for `bucket`. It holds the graph, so the encoder drops it wherever the LRU may evict one
    (a capture, clear_graphs): an evicted graph is released as ever."""
    layout: tuple                           # padfree.ops.inputs.input_layout of the inputs
    bucket: Bucket
    graph: _Graph
    launch: Callable                        # the packer's C call for the layout (DeviceInputs.enqueue)
    inputs: InputBuffer


def _median_error(samples: list[float]) -> float:
    """The standard error of a median, from the samples' median absolute deviation (robust to the
    odd slow replay). A runner-up replaces its pick only where it is faster by twice the error of
    the difference: at 64x512 the forward varies by tens of microseconds under the power cap, and
    one swap on a 9 us difference of medians ran 8-29 us per call slower (H100, NOTES-bert.md v23)."""
    mid = statistics.median(samples)
    mad = statistics.median(abs(x - mid) for x in samples)
    return 1.2533 * 1.4826 * mad / math.sqrt(len(samples))


def _preimage(rounding, rounded: int, high: int) -> tuple[int, int]:
    """The inclusive range [low, high] of n with rounding(n) == rounded, for a non-decreasing
    rounding with rounding(high) == rounded (binary search for low)."""
    low, top = 1, high
    while low < top:
        mid = (low + top) // 2
        if rounding(mid) < rounded:
            low = mid + 1
        else:
            top = mid
    return low, high


class PadfreeEncoder:
    """A HF encoder's forward on packed tokens. Build it with padfree.torch.from_hf.

    Calls:
      encoder(input_ids, attention_mask=None, token_type_ids=None) -> HF-style output
          input_ids [B, S] (right-padded, with its attention mask) or a list of token sequences;
          last_hidden_state [B, S, H] with exact zeros in padded rows, pooler_output [B, H] where
          the model has a pooler.
      encoder.forward_packed(input_ids [T], cu_seqlens [B + 1], max_seqlen, token_type_ids [T])
          -> {"last_hidden_state": [T, H], "pooler_output": [B, H]} (DESIGN.md).
    One encoder serves one stream at a time (graphs replay into shared static buffers).
    """

    def __init__(self, weights: EncoderWeights, config: Any = None, *, use_graphs: bool = True,
                 max_graphs: int = 8, use_epilogue: bool | None = None, gemm_search: str = "heuristic",
                 gemm_tuning: str | os.PathLike | None = None, programmatic_edges: bool = False,
                 prefetch_weights: bool | None = None, ops=None):
        """weights: from padfree.torch.weights.extract. config: the HF config, kept for callers
        (padfree.runtime reads it). use_epilogue: None probes whether the cuBLASLt epilogue computes
        the model's activation to the dtype's precision. gemm_search: how a bucket's capture tunes
        its GEMMs (gemms.EncoderGemms: "heuristic", or "exhaustive", seconds per new row count).
        gemm_tuning: a JSON file of GEMM choices (gemms.save_tuning), read here where it exists and
        rewritten after each capture, so that a search runs once per machine.
        programmatic_edges (experimental, off by default): let each captured forward's GEMMs launch
        while the padfree kernel before them drains, where a check shows the GEMM waits for it
        (edges.py; PADFREE_PDL=0 also turns it off). prefetch_weights: whether the LayerNorms start
        moving the next GEMMs' weights into L2 (None: for buckets of at most PREFETCH_MAX_ROWS rows).
        ops: the kernel bindings (padfree.ops)."""
        if gemm_search not in SEARCHES:
            raise InputError(f"gemm_search: expected one of {', '.join(SEARCHES)}, got {gemm_search!r}")
        self.gemm_search = gemm_search
        self.gemm_tuning = gemm_tuning
        self.programmatic_edges = programmatic_edges
        self.prefetch_weights = prefetch_weights
        self.weights = weights
        self.config = config
        self._ops = ops or _default_ops
        self.device = weights.word_embeddings.device
        self.dtype = weights.word_embeddings.dtype
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self._device_index = self.device.index if self.device.type == "cuda" else None
        self.softmax_scale = 1.0 / math.sqrt(weights.head_dim)
        if use_epilogue is None:
            use_epilogue = epilogue_matches(weights.activation, self.dtype, self.device,
                                            weights.hidden_size, weights.intermediate_size)
        self.ffn_up = FfnUp(weights.activation, use_epilogue, self._ops)
        self.limits = Limits(max_tokens=INT32_MAX, max_batch=INT32_MAX, max_seqlen=weights.max_seqlen,
                             vocab_size=weights.vocab_size, type_vocab_size=weights.type_vocab_size,
                             dtype=self.dtype,
                             # RoBERTa: HF numbers positions around padding_idx = position_offset - 1
                             position_pad_id=weights.position_offset - 1 if weights.position_offset else None)
        self._inputs: InputBuffer | None = None  # every graph's inputs: views of this one buffer
        self._device_inputs = DeviceInputs(self.limits, self.device, self._ops, lambda b: self._input_buffer(0, b))
        self.has_pooler = weights.pooler_weight is not None
        self.output_names = ["last_hidden_state"] + (["pooler_output"] if self.has_pooler else [])
        self._graphs: LRU[Bucket, _Graph] = LRU(max_graphs)
        # (padded shape, token types) of GPU inputs -> the bucket of the last such call (buckets, not
        # graphs: an evicted graph must free its memory, and a recaptured one serves as well)
        self._guesses: LRU[tuple, Bucket] = LRU(GUESSES)
        self._route: _Route | None = None  # the last speculative call's (_speculate)
        self._pool = None
        self._capture_stream = None
        if gemm_tuning is not None and self.device.type == "cuda" and os.path.exists(gemm_tuning):
            load_tuning(gemm_tuning, self.device)

    # ---- the packed forward ------------------------------------------------------------------

    def _gemms(self, rows: int, tune: bool) -> EncoderGemms:
        w = self.weights
        return EncoderGemms(rows, w.hidden_size, w.intermediate_size, self.dtype, self.device, self.ffn_up,
                            tune=tune, search=self.gemm_search, layers=len(w.layers),
                            prefetched=self._prefetches(rows))

    def _prefetches(self, rows: int) -> bool:
        """Whether a forward of `rows` rows prefetches each GEMM's weights (see PREFETCH_MAX_ROWS)."""
        if self.device.type != "cuda" or self.weights.layers[0].attention_projections is None:
            return False
        return rows <= PREFETCH_MAX_ROWS if self.prefetch_weights is None else self.prefetch_weights

    def _run(self, input_ids, token_type_ids, cu_seqlens, max_seqlen: int, hidden: torch.Tensor,
             pooled: torch.Tensor | None, gemms: EncoderGemms) -> None:
        """The whole forward on packed rows, into `hidden` [rows, H] and `pooled` [B, H] (the pooler's
        dense output: every caller applies its tanh as it copies the output out, so that a graph has
        one latency-bound kernel fewer; H100 1x128: ~2 us of its ~0.4 ms).

        Intermediates are allocated here, so that under capture they come from the shared pool.
        """
        w, ops = self.weights, self._ops
        rows, h = hidden.shape
        prefetching = self._prefetches(rows)

        def ahead(weights):  # a LayerNorm's prefetch: the weights of the GEMMs up to the next LayerNorm
            return {"prefetch": weights} if prefetching and weights is not None else {}
        next_weights = [lw.attention_projections for lw in w.layers[1:]] + [w.pooler_weight]
        gemms.start_forward()
        ops.embedding_layernorm(input_ids, cu_seqlens, w.word_embeddings, w.position_embeddings,
                                w.emb_ln_weight, w.emb_ln_bias, eps=w.emb_ln_eps,
                                token_type_ids=token_type_ids, token_type_embeddings=w.token_type_embeddings,
                                position_offset=w.position_offset, out=hidden,
                                **ahead(w.layers[0].attention_projections))
        new = dict(dtype=self.dtype, device=self.device)
        qkv = torch.empty(rows, 3 * h, **new)
        ctx = torch.empty(rows, h, **new)
        up = torch.empty(rows, w.intermediate_size, **new)
        for lw, after in zip(w.layers, next_weights):
            gemms.qkv(hidden, lw.qkv_weight, qkv)
            ops.attention_varlen(qkv, cu_seqlens, max_seqlen, w.num_heads, qkv_bias=lw.qkv_bias,
                                 softmax_scale=self.softmax_scale, out=ctx)
            # The residual rides in the GEMM (C += A @ B, cuBLAS beta = 1), which is compute-bound
            # and reads it almost for free; the LayerNorm then reads one stream instead of two.
            # Each LayerNorm writes over its input, so the rows the GEMM left in L2 are overwritten
            # there, where a second buffer's lines would evict them (dirty, dead) to DRAM. H100,
            # BERT-base, same process, calls alternating against the two-buffer forward: 64x512
            # -47 / -55 us per call, 16x256 -25 / -25, 128x128 -1 / -13, 1x128 level; bit-equal.
            gemms.out_residual(ctx, lw.out_weight, hidden)
            ops.skip_layernorm(hidden, None, lw.attn_ln_weight, lw.attn_ln_bias, bias=lw.out_bias,
                               eps=lw.attn_ln_eps, out=hidden, **ahead(lw.ffn_projections))
            gemms.up(hidden, lw.up_weight, lw.up_bias, up)
            gemms.down_residual(up, lw.down_weight, hidden)
            ops.skip_layernorm(hidden, None, lw.ffn_ln_weight, lw.ffn_ln_bias, bias=lw.down_bias,
                               eps=lw.ffn_ln_eps, out=hidden, **ahead(after))
        if pooled is not None:
            # each sequence's first token (zeros for bucket padding's empty sequences) in one kernel,
            # where index_select needed a clamp of cu_seqlens first: two latency-bound launches. One
            # sequence's is row 0, read in place (a bucket of batch 1 holds one sequence). H100,
            # BERT-base, same process, calls alternating, us per call with the gather minus without:
            # 1x128 +3.7 to +6.2, where both gather (4x128, 16x256) +0.7 to +2.5 (NOTES-bert.md v25).
            first = hidden[:1] if pooled.shape[0] == 1 else ops.rebuild_padding(hidden, cu_seqlens, 1).view(-1, h)
            torch.addmm(w.pooler_bias, first, w.pooler_weight.t(), out=pooled)

    def forward_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: torch.Tensor | None = None, *, copy: bool = True
                       ) -> dict[str, torch.Tensor]:
        """The encoder on packed tokens (DESIGN.md "PyTorch path <-> runtime").

        input_ids, token_type_ids: int32 [T] on the encoder's device; cu_seqlens: int32 [B + 1];
        max_seqlen: the longest sequence (host int). Returns "last_hidden_state" [T, H] and, where the
        model has a pooler, "pooler_output" [B, H]. Ids and lengths are not range-checked here, as
        that would synchronize (the kernels clamp ids to stay memory-safe): validate first, as
        padfree.runtime and the HF-style call do. With graphs on, a call whose bucket has no graph yet
        captures one, which synchronizes the device; later calls in that bucket only enqueue.
        copy=False returns last_hidden_state as a view of a graph's static output, overwritten by the
        next call that uses the same bucket (pooler_output is always a tensor of its own).
        """
        self._check_packed(input_ids, cu_seqlens, max_seqlen, token_type_ids)
        tokens, batch = input_ids.shape[0], cu_seqlens.shape[0] - 1
        with self._device_guard():
            if not self.use_graphs:  # the caller's tensors are read in place
                hidden, pooled = self._outputs(tokens, batch)
                self._run(input_ids, token_type_ids, cu_seqlens, max_seqlen, hidden, pooled,
                          self._gemms(tokens, tune=False))
            else:
                def fill(buf: InputBuffer) -> None:
                    buf.input_ids[:tokens].copy_(input_ids)
                    if token_type_ids is not None:
                        buf.token_type_ids[:tokens].copy_(token_type_ids)
                    buf.cu_seqlens[:batch + 1].copy_(cu_seqlens)
                    buf.pad_batch(batch, tokens)
                hidden, pooled, _ = self._execute(Batch(tokens, batch, max_seqlen, 0,
                                                        token_type_ids is not None, fill))
                if copy:
                    hidden = hidden.clone()
        out = {"last_hidden_state": hidden}
        if pooled is not None:
            out["pooler_output"] = torch.tanh(pooled)  # _run leaves the tanh to us
        return out

    def _outputs(self, tokens: int, batch: int):
        new = dict(dtype=self.dtype, device=self.device)
        hidden = torch.empty(tokens, self.weights.hidden_size, **new)
        return hidden, torch.empty(batch, self.weights.hidden_size, **new) if self.has_pooler else None

    def _execute(self, batch: Batch):
        """Fill the inputs and run: a bucket's graph, or eagerly at the batch's exact size.
        Returns (hidden [T, H], pooled [B, H] or None, cu_seqlens [B + 1]) on the device."""
        tokens, size = batch.total_tokens, batch.batch
        if not self.use_graphs:
            buf = self._input_buffer(tokens, size).view(tokens, size, batch.token_types)
            batch.fill(buf)
            hidden, pooled = self._outputs(tokens, size)
            self._run(buf.input_ids, buf.token_type_ids, buf.cu_seqlens, batch.max_seqlen, hidden, pooled,
                      self._gemms(tokens, tune=False))
            return hidden, pooled, buf.cu_seqlens
        bucket = bucket_for(tokens, size, batch.max_seqlen, self.weights.max_seqlen, batch.token_types)
        g = self._graphs.get(bucket)
        if g is None:
            buf = self._input_buffer(bucket.tokens, bucket.batch)  # may drop every graph
            inputs = buf.view(bucket.tokens, bucket.batch, bucket.token_types)
            batch.fill(inputs)
            g = self._capture(bucket, inputs)
            self._route = None  # it may hold the graph put() evicts
            self._graphs.put(bucket, g)  # an evicted graph frees its outputs once unreferenced
        else:
            batch.fill(g.inputs)  # rows past `tokens` are rows of no sequence: never read by a token
        g.graph.replay()
        return self._served(g, batch)

    @staticmethod
    def _served(g: _Graph, batch: Batch):
        g.replays += 1
        return (g.hidden[:batch.total_tokens], None if g.pooled is None else g.pooled[:batch.batch],
                g.inputs.cu_seqlens[:batch.batch + 1])

    def _input_buffer(self, tokens: int, batch: int) -> InputBuffer:
        """The encoder's input buffer, grown to hold `tokens` and `batch` where it does not. Growing drops
        every graph (they read the old buffer), so it starts large: 64K tokens and 1K sequences are
        512 KB."""
        buf = self._inputs
        if buf is None or tokens > buf.input_ids.shape[0] or batch >= buf.cu_seqlens.shape[0]:
            old_tokens, old_batch = (0, 0) if buf is None else (buf.input_ids.shape[0], buf.cu_seqlens.shape[0] - 1)
            self._graphs.clear()
            self._inputs = buf = InputBuffer.new(max(tokens, 2 * old_tokens, INPUT_TOKENS),
                                                 max(batch, 2 * old_batch, INPUT_BATCH), True, self.device)
        return buf

    def _check_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids) -> None:
        if token_type_ids is not None and self.weights.token_type_embeddings is None:
            raise InputError("token_type_ids given, but this model has no token type embeddings")
        check_packed(input_ids, cu_seqlens, max_seqlen, token_type_ids, self.device)
        if max_seqlen > self.weights.max_seqlen:
            raise InputError(f"max_seqlen: expected an int in [1, {self.weights.max_seqlen}] (the model's"
                             f" position table), got {max_seqlen!r}")

    # ---- CUDA graphs ---------------------------------------------------------------------------

    def _capture(self, bucket: Bucket, inputs: InputBuffer) -> _Graph:
        """inputs: the bucket's view of the input buffer, holding the batch that asked for the bucket
        (so the warm-up below computes a real forward, and no stale lengths beyond the bucket's)."""
        # static outputs live outside the pool: they must survive other captures
        hidden, pooled = self._outputs(bucket.tokens, bucket.batch)
        g = _Graph(bucket=bucket, graph=keeping_cuda_graph(), inputs=inputs, hidden=hidden, pooled=pooled)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
            self._capture_stream = side_stream(self.device)
        g.gemms = self._gemms(bucket.tokens, tune=True)  # times candidates: before any capture
        if self.gemm_tuning is not None:
            save_tuning(self.gemm_tuning, self.device)
        args = (g.inputs.input_ids, g.inputs.token_type_ids, g.inputs.cu_seqlens, bucket.max_seqlen,
                g.hidden, g.pooled, g.gemms)
        if CHOOSE_IN_FORWARD:
            current = None  # the forward as the choices so far left it, captured
            for name in g.gemms.alternatives():
                current = self._choose_in_forward(g.gemms, name, args, current)
            del current
        self._record(g.graph, args)
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
        outputs = [g.hidden] + ([] if g.pooled is None else [g.pooled])
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
        if g.pooled is not None:
            first, pooled = torch.randn(g.pooled.shape, **new), torch.empty(g.pooled.shape, **new)
            probes.append(edges.Probe(first, lambda t: torch.addmm(w.pooler_bias, t, w.pooler_weight.t(), out=pooled),
                                      pooled, poisoned(pooled)))
        return probes

    @property
    def graph_buckets(self) -> list[Bucket]:
        """The buckets with a captured graph, least recently used first."""
        return self._graphs.keys()

    def gemm_choices(self, bucket: Bucket) -> dict[str, str]:
        """Which GEMM implementation each projection of a captured bucket runs (for reports)."""
        graph = self._graphs.get(bucket)
        if graph is None or graph.gemms is None:
            raise KeyError(f"no captured graph for {bucket}")
        return graph.gemms.choices()

    def clear_graphs(self) -> None:
        self._graphs.clear()
        self._guesses.clear()
        self._route = None

    def _off_device(self) -> bool:
        """Whether the current CUDA device is not the encoder's (kernels launch on the current one)."""
        return self._device_index is not None and current_device() != self._device_index

    def _device_guard(self):
        return torch.cuda.device(self.device) if self._off_device() else contextlib.nullcontext()

    # ---- the HF-style call -----------------------------------------------------------------------

    def prepare(self, input_ids, attention_mask=None, token_type_ids=None) -> Batch:
        """Validate HF-style inputs (see __call__) and say how to pack them: padded tensors are checked
        and packed on the GPU (CPU tensors, as tokenizers return them, copied there as they are: a few
        KB), lists and arrays on the host. Measured on the H100 (NOTES-bert.md v7), the GPU route was
        0.1-0.28 ms faster per call than the host's numpy checks and packing."""
        if isinstance(input_ids, torch.Tensor) and input_ids.device.type != "cpu":
            return self._device_inputs(input_ids, attention_mask, token_type_ids)
        others = (attention_mask, token_type_ids)
        for name, t in zip(("attention_mask", "token_type_ids"), others):
            if isinstance(t, torch.Tensor) and t.device.type != "cpu":
                raise InputError(f"{name} is on {t.device} but input_ids on the CPU; pass them on one device")
        if self.device.type == "cuda" and isinstance(input_ids, torch.Tensor) and \
                all(t is None or isinstance(t, torch.Tensor) for t in others):
            return self._device_inputs(*(None if t is None else t.to(self.device, non_blocking=True)
                                         for t in (input_ids, *others)))
        return from_host(input_ids, attention_mask, token_type_ids, self.limits)

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None):
        """HF-style forward. input_ids: [B, S] int tensor (on the CPU or the encoder's device) with
        attention_mask [B, S] (right padding: ones then zeros), or a list of token sequences
        (token_type_ids then a list too). Returns a transformers BaseModelOutputWithPooling (or
        BaseModelOutput for models without a pooler): last_hidden_state [B, S, H] with zeros in padded
        rows (S = the input's width, or the longest sequence of a list). Waits where inputs are on
        the GPU (their token count must reach the host) and where a new bucket's graph is captured;
        GPU inputs shaped as an earlier call's launch that call's graph first, behind a device-side
        check that they fit it (_speculate), so the GPU need not idle through the wait."""
        if self._off_device():  # switch and call again: the usual path pays no context manager
            with torch.cuda.device(self.device):
                return self.__call__(input_ids, attention_mask, token_type_ids)
        batch, outputs = self._speculate(input_ids, attention_mask, token_type_ids)
        if outputs is None:
            if batch is None:
                batch = self.prepare(input_ids, attention_mask, token_type_ids)
            outputs = self._execute(batch)
            self._remember(input_ids, token_type_ids, batch)
        hidden, pooled, cu_seqlens = outputs
        last = self._ops.rebuild_padding(hidden, cu_seqlens, batch.padded_width)
        pooled = None if pooled is None else torch.tanh(pooled)  # _run leaves the tanh to us
        from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPooling
        if self.has_pooler:
            return BaseModelOutputWithPooling(last_hidden_state=last, pooler_output=pooled)
        return BaseModelOutput(last_hidden_state=last)

    # ---- speculative launches ------------------------------------------------------------------

    def _speculate(self, input_ids, attention_mask, token_type_ids):
        """For GPU inputs shaped as an earlier call's: enqueue the packing, then that call's graph
        behind a guard that runs it only if this batch fits its bucket (padfree.ops.GuardedGraph),
        then read the totals back. Returns (batch, outputs): outputs where the graph ran; batch alone
        where it was skipped (the inputs are validated and packed: the caller executes it); (None, None)
        where nothing was enqueued. Bad inputs raise InputError (their flags skipped the graph).

        The GPU idles through this Python until the packer's C call, so inputs laid out as the last
        speculative call's take its _Route there: one layout comparison and two identity checks
        instead of the guess, graph, buffer and plan lookups, then a launcher bound to the plan and
        the guarded graph (v26: ~2 us less than the lookups' way to the C call). H100 machines
        (NOTES-bert.md v22): the C call 9.9 us into the call with the route, 29 us through the
        lookups on a slower host; in one process, calls alternating with an encoder whose route is
        dropped, 1x128 392-393 us against 394-396, 16x256 1089-1098 against 1092-1104."""
        try:
            layout = input_layout(input_ids, attention_mask, token_type_ids)
        except AttributeError:  # not tensors: the ordinary call says what is wrong
            return None, None
        route = self._route
        if route is not None and layout == route.layout and route.inputs is self._inputs \
                and self._graphs.holds(route.bucket, route.graph):
            route.launch(input_ids, attention_mask, token_type_ids)
            return self._speculated(route.graph, route.graph.guarded)
        self._route = None
        bucket = self._guesses.get(self._guess_key(input_ids, token_type_ids))
        g = None if bucket is None else self._graphs.get(bucket)
        if g is None:  # no guess, or its graph was evicted since
            return None, None
        guarded = self._guarded(g)
        launch = None if guarded is None else \
            self._device_inputs.enqueue(input_ids, attention_mask, token_type_ids, guarded, layout)
        if launch is None:
            return None, None
        self._route = _Route(layout, bucket, g, launch, self._inputs)
        return self._speculated(g, guarded)

    def _speculated(self, g: _Graph, guarded):
        """_speculate's read-back, after its launch."""
        batch = self._device_inputs.finish()
        if guarded.fits(0, batch.total_tokens, batch.max_seqlen):
            return batch, self._served(g, batch)
        self._route = None  # the caller remembers the bucket this batch needed
        return batch, None

    def _guess_key(self, input_ids, token_type_ids):
        if not self.use_graphs or not isinstance(input_ids, torch.Tensor) or not input_ids.is_cuda:
            return None
        return input_ids.shape, token_type_ids is not None

    def _remember(self, input_ids, token_type_ids, batch: Batch) -> None:
        key = self._guess_key(input_ids, token_type_ids)
        if key is not None:
            self._guesses.put(key, bucket_for(batch.total_tokens, batch.batch, batch.max_seqlen,
                                              self.weights.max_seqlen, batch.token_types))

    def _guarded(self, g: _Graph):
        """g's GuardedGraph over the packer's totals, made on first use: it runs for exactly the
        batches (of the guessed shape) that bucket_for maps to g's bucket, so a speculative call runs
        the graph an ordinary call would. None where it cannot be made (a torch without keep_graph,
        a driver without conditional graph nodes)."""
        if g.guarded is None:
            totals, lim, b = self._device_inputs.totals, self.limits, g.bucket
            cap = self.weights.max_seqlen
            try:
                g.guarded = False if totals is None else self._ops.GuardedGraph(
                    g.graph, totals, _preimage(round_tokens, b.tokens, min(b.tokens, lim.max_tokens)),
                    _preimage(lambda n: round_seqlen(n, cap), b.max_seqlen,
                              min(b.max_seqlen, lim.max_seqlen, lim.max_tokens)))
            except (PadfreeError, RuntimeError, AttributeError):
                g.guarded = False
        return g.guarded or None

    forward = __call__

    def __repr__(self) -> str:
        w = self.weights
        return (f"PadfreeEncoder({w.architecture}, layers={len(w.layers)}, hidden={w.hidden_size}, "
                f"heads={w.num_heads}, {self.dtype}, {self.device}, graphs={'on' if self.use_graphs else 'off'}, "
                f"{self.ffn_up})")
