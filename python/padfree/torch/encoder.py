"""PadfreeEncoder: a BERT-family encoder run on packed tokens with padfree's kernels.

Embeddings: x = LayerNorm(word + position + type) at the embedding size E, then where E is factorized
(ELECTRA, ALBERT) x = x @ Wproj^T + bproj to the hidden size H (one GEMM).
Per layer, on x [T, H]:  qkv = x @ Wqkv^T (no bias: the attention kernel adds it on load)
-> ctx = attention_varlen(qkv) -> x += ctx @ Wo^T (in the GEMM) -> x = LayerNorm(x + bo)
-> up = act(x @ Wi^T + bi) (cuBLASLt epilogue, see ffn.py) -> x += up @ Wd^T -> x = LayerNorm(x + bd),
all on one [T, H] buffer (the LayerNorms in place). Shared layers (ALBERT) run the same weights again.
Then the pooler (dense + tanh of each sequence's first row) where the model has one, or, for a sentence
model, its pooling per sequence over the packed rows (padfree.ops.sequence_pool, sentence.py), or a
task model's head (heads.py): dense layers over each sequence's first row (logits [B, num_labels]) or
over every row (token classification's logits, question answering's start / end logits [T]).
GEMMs are cuBLASLt's: torch's calls, or for a bucket's row count the cuBLASLt algorithm that
measured fastest (gemms.py, gemm_tuning.py). No layer synchronizes the host. With graphs on, the whole packed forward
is captured once per bucket (buckets.py) and replayed; all captures share one memory pool, so the
intermediates of every bucket live in the memory of the largest one. A replay does not synchronize,
but the first call that needs a bucket without a graph (or whose graph was evicted) captures one
(and times its GEMM candidates the first time a row count is seen), and capturing synchronizes the
whole device (torch.cuda.graph waits for all its work, then frees cached memory): warm the buckets
up before latency matters.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any

import torch

from .. import ops as _default_ops
from ..ops._tensors import INT32_MAX, InputError, current_device
from ..ops.pooling import POOLING_MODES
from ..runtime.backends.base import Limits, check_packed
from .buckets import LRU, Bucket, bucket_for
from .capture import GraphCapture, _Graph
from .ffn import FfnUp, epilogue_matches
from .gemm_tuning import GEMM_SEARCHES, load_tuning
from .gemms import EncoderGemms
from .heads import HeadWeights, activate
from .inputs import Batch, DeviceInputs, InputBuffer, from_host
from .sentence import OUTPUT as SENTENCE_EMBEDDING, sentence_output
from .speculation import GUESSES, Speculation, _Route
from .weights import EncoderWeights

INPUT_TOKENS, INPUT_BATCH = 65536, 1024  # the input buffer's first capacity
# Forwards of at most this many rows have each LayerNorm prefetch the next GEMMs' weights into L2
# (LayerWeights.attention_projections), where the GEMMs would read them from DRAM with few rows to
# spread the latency over. H100, BERT-base, same process, HF-style calls: 16x256
# (2624 rows) -0.02 ms per call in five comparisons (GEMMs -0.04, LayerNorms +0.02), 1x128 -0.001
# to -0.008, 4x128 level, 32x128 +0.019 / -0.025 / -0.028; 128x128 (9344 rows) level.
PREFETCH_MAX_ROWS = 4096
SIGHTINGS = 1024  # buckets whose eager calls are counted for capture_after (least recent forgotten)


class PadfreeEncoder(GraphCapture, Speculation):
    """A HF encoder's forward on packed tokens. Build it with padfree.torch.from_hf.

    Calls:
      encoder(input_ids, attention_mask=None, token_type_ids=None) -> HF-style output
          input_ids [B, S] (right-padded, with its attention mask) or a list of token sequences;
          last_hidden_state [B, S, H] with exact zeros in padded rows, pooler_output [B, H] where
          the model has a pooler; a sentence model (pooling set): sentence_embedding [B, H] alone; a
          task model (heads.py): its head's HF output (logits, or start_logits / end_logits [B, S]).
      encoder.forward_packed(input_ids [T], cu_seqlens [B + 1], max_seqlen, token_type_ids [T])
          -> {"last_hidden_state": [T, H], "pooler_output": [B, H]} (DESIGN.md), or for a sentence
          model {"sentence_embedding": [B, H]}.
    One encoder serves one stream at a time (graphs replay into shared static buffers).
    """

    def __init__(self, weights: EncoderWeights, config: Any = None, *, use_graphs: bool = True,
                 max_graphs: int = 8, use_epilogue: bool | None = None, gemm_search: str = "heuristic",
                 gemm_tuning: str | os.PathLike | None = None, programmatic_edges: bool = False,
                 prefetch_weights: bool | None = None, pooling: str | None = None, normalize: bool = False,
                 capture_after: int = 0, ops=None):
        """weights: from padfree.torch.weights.extract. config: the HF config, kept for callers
        (padfree.runtime reads it). use_epilogue: None probes whether the cuBLASLt epilogue computes
        the model's activation to the dtype's precision. gemm_search: how a bucket's capture tunes
        its GEMMs (gemms.EncoderGemms: "heuristic", or "exhaustive", seconds per new row count; "none":
        torch's calls untimed, so that a capture costs only its warm-up and recording).
        gemm_tuning: a JSON file of GEMM choices (gemm_tuning.save_tuning), read here where it exists and
        rewritten after each capture, so that a search runs once per machine.
        programmatic_edges (experimental, off by default): let each captured forward's GEMMs launch
        while the padfree kernel before them drains, where a check shows the GEMM waits for it
        (edges.py; PADFREE_PDL=0 also turns it off). prefetch_weights: whether the LayerNorms start
        moving the next GEMMs' weights into L2 (None: for buckets of at most PREFETCH_MAX_ROWS rows).
        pooling: None, or "cls" / "mean" / "max": the encoder is a sentence model whose one output is
        sentence_embedding [B, H], pooled per sequence (and L2-normalized where normalize); the
        model's pooler, if any, is not run. capture_after: how many calls of a bucket run eagerly (at
        their exact size) before its graph is captured (see _execute). ops: the kernel bindings
        (padfree.ops)."""
        if gemm_search not in GEMM_SEARCHES:
            raise InputError(f"gemm_search: expected one of {', '.join(GEMM_SEARCHES)}, got {gemm_search!r}")
        if not isinstance(capture_after, int) or isinstance(capture_after, bool) or capture_after < 0:
            raise InputError(f"capture_after: expected an int >= 0, got {capture_after!r}")
        self.capture_after = capture_after
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
        if pooling is not None and pooling not in POOLING_MODES:
            raise InputError(f"pooling: expected one of {', '.join(POOLING_MODES)} or None, got {pooling!r}")
        self.pooling, self.normalize = pooling, bool(normalize) and pooling is not None
        self.has_pooler = weights.pooler_weight is not None and pooling is None
        # a sentence model pools instead of running a head (from_hf refuses or drops it first)
        self.head: HeadWeights | None = weights.head if pooling is None else None
        if pooling is not None:
            self.output_names = [SENTENCE_EMBEDDING]
        elif self.head is not None:
            self.output_names = self.head.output_names
        else:
            self.output_names = ["last_hidden_state"] + (["pooler_output"] if self.has_pooler else [])
        # outputs with one row per sequence (the Runtime shapes them per sequence, the others per token)
        self.per_sequence_outputs = frozenset(
            name for name in self.output_names
            if name in ("pooler_output", SENTENCE_EMBEDDING) or (self.head is not None and self.head.per_sequence))
        self._graphs: LRU[Bucket, _Graph] = LRU(max_graphs)
        self._sightings: LRU[Bucket, int] = LRU(SIGHTINGS)  # eager calls per bucket without a graph
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
        search = "heuristic" if self.gemm_search == "none" else self.gemm_search
        return EncoderGemms(rows, w.hidden_size, w.intermediate_size, self.dtype, self.device, self.ffn_up,
                            tune=tune and self.gemm_search != "none", search=search, layers=len(w.layers),
                            weight_layers=len(w.distinct_layers), prefetched=self._prefetches(rows))

    def _prefetches(self, rows: int) -> bool:
        """Whether a forward of `rows` rows prefetches each GEMM's weights (see PREFETCH_MAX_ROWS)."""
        if self.device.type != "cuda" or self.weights.layers[0].attention_projections is None:
            return False
        return rows <= PREFETCH_MAX_ROWS if self.prefetch_weights is None else self.prefetch_weights

    def _run(self, input_ids, token_type_ids, cu_seqlens, max_seqlen: int, hidden: torch.Tensor,
             pooled: torch.Tensor | None, gemms: EncoderGemms, head_rows: torch.Tensor | None = None) -> None:
        """The whole forward on packed rows, into `hidden` [rows, H] and `pooled` [B, H]: the sentence
        embedding of a sentence model, else the pooler's dense output (every caller applies its tanh
        as it copies the output out, so that a graph has one latency-bound kernel fewer; H100 1x128:
        ~2 us of its ~0.4 ms); a sequence-classification head's logits [B, num_labels] go to
        `pooled`, a per-token head's [rows, width] to `head_rows`.

        Intermediates are allocated here, so that under capture they come from the shared pool.
        """
        w, ops = self.weights, self._ops
        rows, h = hidden.shape
        prefetching = self._prefetches(rows)

        def ahead(weights):  # a LayerNorm's prefetch: the weights of the GEMMs up to the next LayerNorm
            return {"prefetch": weights} if prefetching and weights is not None else {}
        next_weights = [lw.attention_projections for lw in w.layers[1:]] + \
            [w.pooler_weight if self.has_pooler else self.head.layers[0].weight if self.head is not None else None]
        gemms.start_forward()
        new = dict(dtype=self.dtype, device=self.device)
        projected = w.embedding_proj_weight is not None
        embedded = torch.empty(rows, w.embedding_size, **new) if projected else hidden
        # with a projection the GEMM after this kernel reads its small [H, E] weight; layer 0's
        # projections are still the larger share of what comes before the next LayerNorm
        ops.embedding_layernorm(input_ids, cu_seqlens, w.word_embeddings, w.position_embeddings,
                                w.emb_ln_weight, w.emb_ln_bias, eps=w.emb_ln_eps,
                                token_type_ids=token_type_ids, token_type_embeddings=w.token_type_embeddings,
                                position_offset=w.position_offset, out=embedded,
                                **ahead(w.layers[0].attention_projections))
        if projected:
            torch.addmm(w.embedding_proj_bias, embedded, w.embedding_proj_weight.t(), out=hidden)
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
        if pooled is not None and self.pooling is not None:
            ops.sequence_pool(hidden, cu_seqlens, self.pooling, self.normalize, out=pooled)
        elif self.has_pooler:
            torch.addmm(w.pooler_bias, self._first_rows(hidden, cu_seqlens, pooled.shape[0]), w.pooler_weight.t(),
                        out=pooled)
        if self.head is not None:
            self._run_head(hidden, cu_seqlens, pooled, head_rows)

    def _first_rows(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor, batch: int) -> torch.Tensor:
        """Each sequence's first row [batch, H] (zeros for bucket padding's empty sequences) in one kernel,
        where index_select needed a clamp of cu_seqlens first: two latency-bound launches. One
        sequence's is row 0, read in place (a bucket of batch 1 holds one sequence). H100,
        BERT-base, same process, calls alternating, us per call with the gather minus without:
        1x128 +3.7 to +6.2, where both gather (4x128, 16x256) +0.7 to +2.5."""
        if batch == 1:
            return hidden[:1]
        return self._ops.rebuild_padding(hidden, cu_seqlens, 1).view(-1, hidden.shape[1])

    def _run_head(self, hidden, cu_seqlens, pooled, head_rows) -> None:
        """The task head's dense layers on each sequence's first row (into pooled) or on every row
        (into head_rows): a few small GEMMs at the end of the same forward (and graph)."""
        head = self.head
        x, out = (self._first_rows(hidden, cu_seqlens, pooled.shape[0]), pooled) if head.per_sequence \
            else (hidden, head_rows)
        for dense in head.layers[:-1]:
            x = activate(torch.addmm(dense.bias, x, dense.weight.t()), dense.activation)
        last = head.layers[-1]
        torch.addmm(last.bias, x, last.weight.t(), out=out)
        if last.activation is not None:
            out.copy_(activate(out, last.activation))

    def forward_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: torch.Tensor | None = None, *, copy: bool = True
                       ) -> dict[str, torch.Tensor]:
        """The encoder on packed tokens (DESIGN.md "PyTorch path <-> runtime").

        input_ids, token_type_ids: int32 [T] on the encoder's device; cu_seqlens: int32 [B + 1];
        max_seqlen: the longest sequence (host int). Returns "last_hidden_state" [T, H] and, where the
        model has a pooler, "pooler_output" [B, H]; a sentence model returns "sentence_embedding" [B, H]
        alone; a task model its head's outputs alone: "logits" [B, num_labels] (sequence classification)
        or [T, num_labels] (token classification), "start_logits" and "end_logits" [T] (question
        answering). Ids and lengths are not range-checked here, as
        that would synchronize (the kernels clamp ids to stay memory-safe): validate first, as
        padfree.runtime and the HF-style call do. With graphs on, a call whose bucket has no graph yet
        captures one, which synchronizes the device; later calls in that bucket only enqueue.
        copy=False returns last_hidden_state (sentence_embedding, a head's outputs) as a view of a graph's
        static output, overwritten by the next call that uses the same bucket (pooler_output is always a
        tensor of its own).
        """
        self._check_packed(input_ids, cu_seqlens, max_seqlen, token_type_ids)
        tokens, batch = input_ids.shape[0], cu_seqlens.shape[0] - 1
        with self._device_guard():
            if not self.use_graphs:  # the caller's tensors are read in place
                hidden, pooled, head_rows = self._outputs(tokens, batch)
                self._run(input_ids, token_type_ids, cu_seqlens, max_seqlen, hidden, pooled,
                          self._gemms(tokens, tune=False), head_rows)
            else:
                def fill(buf: InputBuffer) -> None:
                    buf.input_ids[:tokens].copy_(input_ids)
                    if token_type_ids is not None:
                        buf.token_type_ids[:tokens].copy_(token_type_ids)
                    buf.cu_seqlens[:batch + 1].copy_(cu_seqlens)
                    buf.pad_batch(batch, tokens)
                hidden, pooled, head_rows, _ = self._execute(Batch(tokens, batch, max_seqlen, 0,
                                                                   token_type_ids is not None, fill))
                if copy:  # the outputs returned are a graph's static buffers (pooler_output: its tanh copies)
                    returned = pooled if self.pooling is not None or self.head is not None and self.head.per_sequence \
                        else head_rows if self.head is not None else hidden
                    copied = returned.clone()
                    hidden, pooled, head_rows = (copied if t is returned else t for t in (hidden, pooled, head_rows))
        if self.pooling is not None:
            return {SENTENCE_EMBEDDING: pooled}
        if self.head is not None:
            out = self._head_outputs(pooled if self.head.per_sequence else head_rows)
            return {k: v.contiguous() for k, v in out.items()} if copy else out
        out = {"last_hidden_state": hidden}
        if pooled is not None:
            out["pooler_output"] = torch.tanh(pooled)  # _run leaves the tanh to us
        return out

    def _head_outputs(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """The head's outputs by their HF names: question answering's two columns split (views)."""
        if self.head.output_names == ["logits"]:
            return {"logits": logits}
        return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}

    def _outputs(self, tokens: int, batch: int):
        """(hidden [T, H], per-sequence [B, H or num_labels] or None, per-token head [T, width] or None)."""
        new = dict(dtype=self.dtype, device=self.device)
        h, head = self.weights.hidden_size, self.head
        hidden = torch.empty(tokens, h, **new)
        if head is not None and head.per_sequence:
            return hidden, torch.empty(batch, head.width, **new), None
        head_rows = None if head is None else torch.empty(tokens, head.width, **new)
        per_sequence = self.has_pooler or self.pooling is not None
        return hidden, torch.empty(batch, h, **new) if per_sequence else None, head_rows

    def _execute(self, batch: Batch):
        """Fill the inputs and run: a bucket's graph, or eagerly at the batch's exact size.
        Returns (hidden [T, H], pooled [B, ...] or None, head rows [T, width] or None, cu_seqlens [B + 1])
        on the device."""
        tokens, size = batch.total_tokens, batch.batch
        if not self.use_graphs:
            return self._eager(batch)
        bucket = bucket_for(tokens, size, batch.max_seqlen, self.weights.max_seqlen, batch.token_types)
        g = self._graphs.get(bucket)
        if g is None:
            # A capture stalls its call (tuning, a warm-up, the recording: 0.2-1 s at BERT sizes, H100),
            # worth it for a bucket that recurs; serving traffic also brings one-off buckets, which
            # capture_after lets run eagerly (~2 ms for a 12-layer BERT) until they come again.
            seen = self._sightings.get(bucket) or 0
            if seen < self.capture_after:
                self._sightings.put(bucket, seen + 1)
                return self._eager(batch)
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

    def _eager(self, batch: Batch):
        """_execute without a graph: the forward enqueued op by op at the batch's exact size."""
        tokens, size = batch.total_tokens, batch.batch
        buf = self._input_buffer(tokens, size).view(tokens, size, batch.token_types)
        batch.fill(buf)
        hidden, pooled, head_rows = self._outputs(tokens, size)
        self._run(buf.input_ids, buf.token_type_ids, buf.cu_seqlens, batch.max_seqlen, hidden, pooled,
                  self._gemms(tokens, tune=False), head_rows)
        return hidden, pooled, head_rows, buf.cu_seqlens

    @staticmethod
    def _served(g: _Graph, batch: Batch):
        g.replays += 1
        return (g.hidden[:batch.total_tokens], None if g.pooled is None else g.pooled[:batch.batch],
                None if g.head_rows is None else g.head_rows[:batch.total_tokens],
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

    @property
    def max_graphs(self) -> int:
        """How many captured graphs are kept (from_hf's max_graphs; the least recently used go first).
        Traffic whose batches fall into more buckets than this recaptures graphs over and over: raise
        it to the number of buckets the batches use (padfree bench MODEL reports it)."""
        return self._graphs.capacity

    @max_graphs.setter
    def max_graphs(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"max_graphs: expected a positive int, got {value!r}")
        self._graphs.capacity = value

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
        KB), lists and arrays on the host. Measured on the H100, the GPU route was
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
        rows (S = the input's width, or the longest sequence of a list); for a sentence model a
        ModelOutput with sentence_embedding [B, H] alone. Waits where inputs are on
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
        hidden, pooled, head_rows, cu_seqlens = outputs
        if self.pooling is not None:
            return sentence_output(pooled.clone())  # a graph's static output: the next call overwrites it
        if self.head is not None:
            return self._head_call_output(pooled, head_rows, cu_seqlens, batch.padded_width)
        last = self._ops.rebuild_padding(hidden, cu_seqlens, batch.padded_width)
        pooled = None if pooled is None else torch.tanh(pooled)  # _run leaves the tanh to us
        from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPooling
        if self.has_pooler:
            return BaseModelOutputWithPooling(last_hidden_state=last, pooler_output=pooled)
        return BaseModelOutput(last_hidden_state=last)

    def _head_call_output(self, pooled, head_rows, cu_seqlens, padded_width: int):
        """A task head's HF-style output: SequenceClassifierOutput (logits [B, num_labels]),
        TokenClassifierOutput (logits [B, S, num_labels]) or QuestionAnsweringModelOutput (start_logits,
        end_logits [B, S]); per-token ones with exact zeros in padded positions (HF leaves values there)."""
        from transformers import modeling_outputs as mo
        if self.head.per_sequence:
            return mo.SequenceClassifierOutput(logits=pooled.clone())  # a graph's static output
        padded = self._ops.rebuild_padding(head_rows, cu_seqlens, padded_width)
        if self.head.output_names == ["logits"]:
            return mo.TokenClassifierOutput(logits=padded)
        return mo.QuestionAnsweringModelOutput(**{k: v.contiguous() for k, v in self._head_outputs(padded).items()})

    forward = __call__

    def __repr__(self) -> str:
        w = self.weights
        pooling = "" if self.pooling is None else \
            f", {self.pooling} pooling{' + L2 norm' if self.normalize else ''}"
        return (f"PadfreeEncoder({w.architecture}, layers={len(w.layers)}, hidden={w.hidden_size}, "
                f"heads={w.num_heads}, {self.dtype}, {self.device}, graphs={'on' if self.use_graphs else 'off'}, "
                f"{self.ffn_up}{pooling})")
