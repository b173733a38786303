"""The decoder's static state for one shape bucket and its step, with the K/V cache and its beam indirection.

Caches: per layer k_cache, v_cache [rows, H, L, D] (rows = sources * rows_per_source, L = max_length)
written once per step at column `step` and never copied. A hypothesis' history is found through
cache_indir [rows, L] int32: position t of row r lives in row cache_indir[r, t]'s slot t. Beam search
reorders the indirection (beam_reorder_cache_indir, O(rows * L) int32 per step) instead of gathering
every layer's caches (O(layers * rows * hidden * L) per step). Greedy and sampling keep the identity
indirection and never reorder.

Every tensor a step reads or writes is allocated here once and updated in place, and the step index
lives in a device int32 tensor [1] that the step itself advances: the step is a function of device
state only, so one captured CUDA graph replays every step (runner.py) and the eager path runs the
same code. The per-call inputs (the sources' cross-attention K/V and cu_seqlens) are written into
fixed-size buffers by load(); their sizes are bucketed (token_bucket, seqlen_bucket) so calls with
other sources of the same batch reuse the state and its graph. Rows past the call's tokens are never
read (cu_seqlens bounds every source).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import DecoderOps
from .encoder import PackedSources
from .layers import (
    embed,
    ensure_position_rows,
    ffn_up,
    layer_norm,
    linear_activation,
    position_rows,
    step_position_args,
)
from .weights import Seq2SeqWeights

__all__ = ["Decoder", "cache_bytes", "token_bucket", "seqlen_bucket"]


def cache_bytes(weights: Seq2SeqWeights, rows: int, capacity: int) -> int:
    """Bytes of the K/V caches and the two indirection buffers for `rows` hypotheses of `capacity` steps."""
    stack = weights.decoder
    element = torch.empty((), dtype=weights.dtype).element_size()
    return 2 * len(stack.layers) * rows * stack.hidden * capacity * element + 2 * rows * capacity * 4


def token_bucket(tokens: int) -> int:
    """Packed source tokens rounded up to 4/4, 5/4, 6/4 or 7/4 of a power of two (at least 64): the
    cross-attention buffers of a bucket serve every call whose sources fit, wasting under 25 %."""
    if tokens <= 64:
        return 64
    power = 1 << (tokens.bit_length() - 3)      # a quarter of the power of two below tokens
    return -(-tokens // power) * power


def seqlen_bucket(longest: int) -> int:
    """The longest source rounded up to a power of two (at least 16): cross_attention's max_seqlen."""
    return max(16, 1 << (longest - 1).bit_length())


def folded_bias_sums(stack, dtype: torch.dtype) -> list[torch.Tensor | None]:
    """Pre-LN with its output biases folded: the residual stream carries x minus the sum of the output
    biases so far, so that each sublayer's output projection is one GEMM accumulating into the residual
    (no bias-and-residual kernel after it) and the next LayerNorm adds the sum back (skip_layernorm's
    bias). sums[s]: the output biases of sublayers before s (3 per layer: self-attention,
    cross-attention, FFN), summed in float32; None where there are none."""
    sums, total = [None], None
    for layer in stack.layers:
        for bias in (layer.self_attn.out_bias, layer.cross_attn.out_bias, layer.ffn.fc2_bias):
            if bias is not None:
                total = bias.float() if total is None else total + bias.float()
            sums.append(None if total is None else total.to(dtype))
    return sums


class Decoder:
    """The decoder state of one shape bucket and its step.

    batch sources, rows_per_source hypotheses per source (beams, or samples), capacity L = the longest
    decoder sequence, cross-attention buffers of `tokens` packed rows for sources up to `max_seqlen`.
    """

    def __init__(self, weights: Seq2SeqWeights, ops: DecoderOps, batch: int, rows_per_source: int, capacity: int,
                 tokens: int, max_seqlen: int, *, gemm_search: str = "heuristic"):
        """gemm_search: how the output projection's GEMM is chosen where a GEMM runs it (_output_gemm):
        "heuristic" or "exhaustive" (padfree.torch.gemm_tuning), "none" (torch's call)."""
        self.weights, self.ops = weights, ops
        self.gemm_search = gemm_search
        self.output_gemm = None     # padfree.torch.gemms.TunedGemm of the step's rows, made by _output_gemm
        self.batch, self.rows_per_source = batch, rows_per_source
        self.rows = batch * rows_per_source
        self.capacity, self.tokens, self.max_seqlen = capacity, tokens, max_seqlen
        stack = weights.decoder
        device, dtype = weights.device, weights.dtype
        shape = (self.rows, stack.num_heads, capacity, stack.head_dim)
        # zeroed once: slots past a row's step are never used, but the torch reference reads them under a
        # mask, and a NaN there would survive a zero probability
        self.k_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in stack.layers]
        self.v_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in stack.layers]
        self.kv_mem = [torch.zeros(tokens, 2 * stack.hidden, dtype=dtype, device=device) for _ in stack.layers]
        self.cu_seqlens = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        # identity for greedy and sampling; beam search overwrites every column before a step reads it
        identity = torch.arange(self.rows, dtype=torch.int32, device=device)[:, None].expand(self.rows, capacity)
        self.indir = identity.contiguous()
        self.indir_next = identity.contiguous()   # the reorder's output (it must not alias its input)
        self.step = torch.zeros(1, dtype=torch.int32, device=device)
        ensure_position_rows(stack, weights.spec, weights.pad_token_id, weights.pad_token_id + 2 + capacity)
        self.positions = stack.positions          # kept: a captured step reads this tensor, even if the table grows
        heads, head_dim = stack.num_heads, stack.head_dim
        self.ws_self = ops.workspace("decoder_self_attention", self.rows, heads, head_dim, capacity)
        self.ws_cross = ops.workspace("cross_attention", self.rows, heads, head_dim, max_seqlen)
        # few rows (1x4, 4x4; DecoderOps.decode_linear_fits): each linear layer with its LayerNorm, bias,
        # activation and residual as one decode_linear kernel (logits_few_rows) where that is the faster
        # kernel
        # steps of 17-256 rows (16x4, 64x1; past 64 where its grids fit, DecoderOps.decode_gemm_layers): each
        # linear layer one decode_gemm, pre-LN with the LayerNorm before it folded in, else None
        self.gemm_layers = ops.decode_gemm_layers(weights, self.rows)
        self.few_rows = self.gemm_layers is None and ops.decode_linear_fits(self.rows, stack, weights.spec)
        # up to DecoderOps.fragment_step_rows rows in float16 / bfloat16: the layers' weights in fragment
        # order (decode_linear's tensor-core kernel for few rows; ops.fragments), made once per weights
        self.fragments = ops.weight_fragments(weights, self.rows) if self.few_rows else {}
        self._kernel_weights: dict[tuple, object] = {}  # (id(weight), LayerNorm) -> what decode_linear reads
        self._lm_head_kernel: bool | None = None        # _lm_head: a decode_linear kernel takes the head
        fold = weights.spec.pre_ln and ops.skip_layernorm is not None and self.gemm_layers is None
        self.bias_sums = folded_bias_sums(stack, dtype) if fold else None

    @property
    def device(self) -> torch.device:
        return self.weights.device

    @property
    def vocab_size(self) -> int:
        """Columns of the step's logits (the padded LM head's rows, weights.pad_output_projection)."""
        return self.weights.step_lm_head.shape[0]

    def load(self, sources: PackedSources, encoder_out: torch.Tensor) -> None:
        """This call's sources: cross-attention K/V (encoder_out @ [Wk; Wv]^T + [bk; bv]) into the packed
        buffers, cu_seqlens, and the step back to 0."""
        if sources.batch != self.batch or sources.total_tokens > self.tokens or sources.max_seqlen > self.max_seqlen:
            raise ValueError("Decoder.load: the sources do not fit this state's bucket")
        self.load_memory(encoder_out, sources.cu_seqlens)

    def load_memory(self, encoder_out: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
        """load() on device tensors only, as encoder_graph.py captures it: the K/V of encoder_out's rows
        (up to the bucket's), this batch's cu_seqlens int32 [batch + 1], the step back to 0."""
        total = encoder_out.shape[0]
        for layer, buffer in zip(self.weights.decoder.layers, self.kv_mem):
            torch.addmm(layer.cross_attn.kv_bias, encoder_out, layer.cross_attn.kv_weight.t(), out=buffer[:total])
        self.cu_seqlens.copy_(cu_seqlens)
        self.step.zero_()

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The step's input rows: the tokens' embeddings at position `step` (one kernel where it runs)."""
        w = self.weights
        stack = w.decoder
        if self.ops.decoder_step_embedding is not None:
            ln = stack.layernorm_embedding
            ln_args = None if ln is None else (ln.weight, ln.bias, ln.eps)
            return self.ops.decoder_step_embedding(tokens, self.step, stack.embed_tokens, self.positions,
                                                   stack.embed_scale, ln=ln_args,
                                                   **step_position_args(w.spec, w.pad_token_id))
        positions = self.step.long().expand(self.rows)
        return embed(stack, tokens, position_rows(w.spec, w.pad_token_id, positions, tokens), self.positions)

    def _self_attention(self, i: int, qkv: torch.Tensor, biased: bool = False) -> torch.Tensor:
        """Layer i's masked self-attention over its cache for this step's fused QKV (its bias added here,
        unless `biased`: the projection added it).

        Captured into a step's graph, it reads the step, the indirection and the cache before its PDL wait
        (state_ready): a graph holds one decode step, and the previous replay, which wrote them, has
        ended before a replay starts. Run eagerly, the previous step's search kernel may still be running."""
        attn = self.weights.decoder.layers[i].self_attn
        return self.ops.decoder_self_attention(qkv, self.k_cache[i], self.v_cache[i], self.indir, self.step,
                                               self.weights.decoder.num_heads,
                                               qkv_bias=None if biased else attn.qkv_bias,
                                               softmax_scale=1.0, workspace=self.ws_self,
                                               state_ready=qkv.is_cuda and torch.cuda.is_current_stream_capturing())

    def _cross_attention(self, i: int, q: torch.Tensor, biased: bool = False) -> torch.Tensor:
        """Layer i's cross-attention over the packed sources' K/V for this step's Q (its bias added here,
        unless `biased`: the projection added it)."""
        cross = self.weights.decoder.layers[i].cross_attn
        return self.ops.cross_attention(q, self.kv_mem[i], self.cu_seqlens, self.max_seqlen, self.rows_per_source,
                                        self.weights.decoder.num_heads, q_bias=None if biased else cross.q_bias,
                                        softmax_scale=1.0, workspace=self.ws_cross)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [rows, V'] (weights' dtype, bias not added; V' = weights.step_lm_head's rows, the padded
        ids get -inf from weights.step_logits_bias) for the next token after `tokens` (int64 [rows], the
        token at position `step` of every hypothesis)."""
        if self.few_rows:
            return self.logits_few_rows(tokens)
        if self.gemm_layers is not None:
            return self.logits_decode_gemm(tokens)
        w, spec = self.weights, self.weights.spec
        stack = w.decoder
        x = self._embed(tokens)
        skip_ln = self.ops.skip_layernorm
        sums = self.bias_sums

        def norm(x, ln, s):
            """The pre-LN input of sublayer s; with folded biases, LN(x + the biases x does not hold yet)."""
            if sums is None:
                return layer_norm(x, ln)
            return skip_ln(x, None, ln.weight, ln.bias, bias=sums[s], eps=ln.eps)

        def close(x, h, weight, bias, ln):
            """The sublayer's output projection of h and the residual around it: x + (h W^T + b) (pre-LN),
            LN(x + h W^T + b) (post-LN, one kernel for bias, residual and LayerNorm where it runs). With
            folded biases (pre-LN) the GEMM accumulates into the residual, in place (an out-of-place addmm
            copies x first: a memcpy node in the step's graph between two kernels, 36 a step for NLLB),
            and b waits in bias_sums. x is this step's own activation, never a weight's view."""
            if sums is not None:
                return x.addmm_(h, weight.t())
            if not spec.pre_ln and skip_ln is not None:
                return skip_ln(F.linear(h, weight), x, ln.weight, ln.bias, bias=bias, eps=ln.eps)
            y = x + F.linear(h, weight, bias)
            return y if spec.pre_ln else layer_norm(y, ln)

        for i, layer in enumerate(stack.layers):
            attn, cross, f = layer.self_attn, layer.cross_attn, layer.ffn
            h = norm(x, attn.ln, 3 * i) if spec.pre_ln else x
            o = self._self_attention(i, F.linear(h, attn.qkv_weight))
            x = close(x, o, attn.out_weight, attn.out_bias, attn.ln)
            h = norm(x, cross.ln, 3 * i + 1) if spec.pre_ln else x
            o = self._cross_attention(i, F.linear(h, cross.q_weight))
            x = close(x, o, cross.out_weight, cross.out_bias, cross.ln)
            h = norm(x, f.ln, 3 * i + 2) if spec.pre_ln else x
            x = close(x, ffn_up(h, f, w.activation), f.fc2_weight, f.fc2_bias, f.ln)
        last = 3 * len(stack.layers)
        if stack.final_layer_norm is not None:
            x = norm(x, stack.final_layer_norm, last)
        elif sums is not None:
            x = x + sums[last]
        return self._output_gemm(x)      # [rows, V'] (weights.pad_output_projection)

    def logits_decode_gemm(self, tokens: torch.Tensor) -> torch.Tensor:
        """logits() for a pre-LN step as 8 kernels a layer: each linear layer one decode_gemm with the
        LayerNorm before it folded in (its statistics taken beside the products: no LayerNorm kernel) and
        the bias, activation and residual in its epilogue, the residual accumulated in place (x is this
        step's own activation); the two attentions between, their biases already added; the final
        LayerNorm and the output projection by _lm_head. Post-LN: _logits_decode_gemm_post_ln."""
        w = self.weights
        stack = w.decoder
        gemm = self.ops.decode_gemm
        x = self._embed(tokens)
        if not w.spec.pre_ln:
            return self._logits_decode_gemm_post_ln(x)
        for i, g in enumerate(self.gemm_layers):
            o = self._self_attention(i, gemm(x, g.qkv), biased=True)
            x = gemm(o, g.out, residual=x, out=x)
            o = self._cross_attention(i, gemm(x, g.q), biased=True)
            x = gemm(o, g.cross_out, residual=x, out=x)
            x = gemm(gemm(x, g.fc1, activation=w.activation), g.fc2, residual=x, out=x)
        return self._lm_head(x, stack.final_layer_norm)

    def _logits_decode_gemm_post_ln(self, x: torch.Tensor) -> torch.Tensor:
        """logits_decode_gemm for a post-LN step (no final LayerNorm): the linear layers as decode_gemm's
        (bias and activation in its epilogue), each sublayer closed by one skip_layernorm kernel of the
        projection's output and the residual, whose output is the next sublayer's input and residual."""
        w = self.weights
        gemm, skip_ln = self.ops.decode_gemm, self.ops.skip_layernorm
        for i, (g, layer) in enumerate(zip(self.gemm_layers, w.decoder.layers)):
            attn, cross, f = layer.self_attn, layer.cross_attn, layer.ffn
            o = self._self_attention(i, gemm(x, g.qkv), biased=True)
            x = skip_ln(gemm(o, g.out), x, attn.ln.weight, attn.ln.bias, eps=attn.ln.eps)
            o = self._cross_attention(i, gemm(x, g.q), biased=True)
            x = skip_ln(gemm(o, g.cross_out), x, cross.ln.weight, cross.ln.bias, eps=cross.ln.eps)
            h = gemm(x, g.fc1, activation=w.activation)
            x = skip_ln(gemm(h, g.fc2), x, f.ln.weight, f.ln.bias, eps=f.ln.eps)
        return self._lm_head(x, None)

    def _lm_head(self, x: torch.Tensor, ln) -> torch.Tensor:
        """The output projection of LN(x) (of x where ln is None), for every path of the step: one
        decode_linear where a decode_linear kernel takes the head, else the LayerNorm and a GEMM
        (_output_gemm). Which, decided once: on the few-row step the rule of its other layers
        (_decode_linear_pays: the stream kernels for vocabulary-sized heads, the CUDA-core kernel for
        small ones where it beats the GEMM); past it only the stream kernels
        (ops.decoder.decode_linear_streams, up to 16 rows)."""
        w = self.weights.step_lm_head
        if self._lm_head_kernel is None:
            if self.few_rows:
                self._lm_head_kernel = self._decode_linear_pays(x, w, ln=ln is not None)
            else:
                from ..ops.decoder import decode_linear_streams
                self._lm_head_kernel = self.ops.decode_linear is not None and decode_linear_streams(
                    self.rows, x.shape[1], w.shape[0], x.dtype, x.device)
        if self._lm_head_kernel:
            return self.ops.decode_linear(x, w, ln=None if ln is None else (ln.weight, ln.bias, ln.eps))
        if ln is not None:  # padfree's LayerNorm waits under PDL, launched while the last layer runs; torch's does not
            skip_ln = self.ops.skip_layernorm
            x = layer_norm(x, ln) if skip_ln is None else skip_ln(x, None, ln.weight, ln.bias, eps=ln.eps)
        return self._output_gemm(x)

    def _output_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """x @ step_lm_head^T as one GEMM: where the head is over twice the L2, the cuBLASLt configuration
        measured fastest for the problem with its weights cold, if one beats torch's call (gemm_search;
        chosen once, in the step's eager warm-up before its capture); else torch's call.
        Such a head streams from DRAM at every step as it does in the timing, and there torch's pick was
        4-12 % slower than the best of cuBLASLt's heuristic list (NLLB's 256k vocabulary at 16-256 rows;
        steps 1-3 % faster, H200, docs/KERNELS.md). A head near the L2's size is partly served from it in
        the step, where the cold ranking did not hold (Marian's 59 MB head: picks 1-8 % faster alone, the
        steps ~1 % slower)."""
        w = self.weights.step_lm_head
        if self.output_gemm is None:
            if not x.is_cuda or torch.cuda.is_current_stream_capturing():
                return F.linear(x, w)   # no timing inside a capture (the warm-up step chose already)
            from ..torch.gemms import TunedGemm
            streamed = w.numel() * w.element_size() > 2 * torch.cuda.get_device_properties(x.device).L2_cache_size
            self.output_gemm = TunedGemm(self.rows, x.shape[1], w.shape[0], x.dtype, x.device,
                                         search=self.gemm_search if streamed else "none", cold_weights=True,
                                         weight=w)
        return self.output_gemm(x, w)

    def logits_few_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """logits() as 8 kernels per layer: each linear layer one decode_linear with the LayerNorm before
        it (the input's; post-LN: the previous sublayer's, whose output it also writes as the residual),
        its bias, activation and residual; the two attentions between. Past 8 rows the layers the
        tensor-core decode_linear is not the faster kernel for are GEMMs (_linear); the output
        projection is _lm_head's."""
        w, spec = self.weights, self.weights.spec
        stack = w.decoder
        linear = self._linear
        x = self._embed(tokens)
        pending = None      # post-LN: x is a sublayer's sum, awaiting this LayerNorm

        def enter(x, ln, weight, **kwargs):
            """(the sublayer's first linear layer on its normalized input, the residual around it)."""
            if spec.pre_ln:
                return linear(x, weight, ln=(ln.weight, ln.bias, ln.eps), **kwargs), x
            if pending is None:
                return linear(x, weight, **kwargs), x
            if not self._decode_linear_pays(x, weight, ln=True):
                normed = layer_norm(x, pending)     # the residual too: no copy of it (a kernel in the step)
                return linear(normed, weight, **kwargs), normed
            normed = torch.empty_like(x)
            out = linear(x, weight, ln=(pending.weight, pending.bias, pending.eps), x_norm_out=normed, **kwargs)
            return out, normed

        for i, layer in enumerate(stack.layers):
            attn, cross, f = layer.self_attn, layer.cross_attn, layer.ffn
            qkv, res = enter(x, attn.ln, attn.qkv_weight)
            o = self._self_attention(i, qkv)
            x = linear(o, attn.out_weight, attn.out_bias, residual=res)
            pending = attn.ln
            q, res = enter(x, cross.ln, cross.q_weight)
            o = self._cross_attention(i, q)
            x = linear(o, cross.out_weight, cross.out_bias, residual=res)
            pending = cross.ln
            h, res = enter(x, f.ln, f.fc1_weight, bias=f.fc1_bias, activation=w.activation)
            x = linear(h, f.fc2_weight, f.fc2_bias, residual=res)
            pending = f.ln
        return self._lm_head(x, stack.final_layer_norm if spec.pre_ln else pending)

    def _decode_linear_pays(self, x: torch.Tensor, weight: torch.Tensor, ln: bool) -> bool:
        """Whether a decode_linear kernel is the faster one for this layer (_kernel_weight)."""
        return self._kernel_weight(x, weight, ln) is not None

    def _kernel_weight(self, x: torch.Tensor, weight: torch.Tensor, ln: bool):
        """What decode_linear reads for this layer: its fragment-order copy where the fragment kernel takes
        the step's rows, else the nn.Linear weight where decode_linear is the faster kernel
        (DecoderOps.step_linear_choice), else None (a GEMM); decided once per layer."""
        key = (id(weight), ln)
        if key not in self._kernel_weights:
            fragments = self.fragments.get(id(weight))
            choice = self.ops.step_linear_choice(self.rows, x.shape[1], weight.shape[0], x.dtype, ln=ln,
                                                 fragments=fragments is not None)
            self._kernel_weights[key] = {"fragments": fragments, "decode_linear": weight}.get(choice)
        return self._kernel_weights[key]

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, ln: tuple | None = None, activation: str | None = None,
                x_norm_out: torch.Tensor | None = None) -> torch.Tensor:
        """act(LN(x) W^T + bias) + residual: one decode_linear where it is the faster kernel for this
        layer (on the weight's fragment-order copy where the fragment kernel takes the step's rows), else
        the GEMM with torch's ops around it (past the fragment rows the layers the cluster kernel does not
        pay for).
        x_norm_out (LN(x), written by the kernel) only where it pays: the caller normalizes first
        otherwise."""
        kernel_weight = self._kernel_weight(x, weight, ln=ln is not None)
        if kernel_weight is not None:
            return self.ops.decode_linear(x, kernel_weight, bias, residual, ln=ln, activation=activation,
                                          x_norm_out=x_norm_out)
        assert x_norm_out is None, "x_norm_out is decode_linear's: normalize before a GEMM instead"
        if ln is not None:
            x = F.layer_norm(x, (x.shape[-1],), ln[0], ln[1], ln[2])
        y = F.linear(x, weight, bias) if activation is None else linear_activation(x, weight, bias, activation)
        return y if residual is None else y.add_(residual)

    def reorder(self, parents: torch.Tensor) -> None:
        """Hypothesis r continues row parents[r] (int32 [rows]) from the next step on.

        The kernel writes into a second buffer, copied back: the indirection keeps one address, so one
        captured graph serves every step (two graphs alternating would save a [rows, L] int32 copy)."""
        self.ops.beam_reorder_cache_indir(self.indir, parents, self.step, out=self.indir_next)
        self.indir.copy_(self.indir_next)

    def advance(self) -> None:
        """The step counter moves on the device, at the end of the step."""
        self.step.add_(1)
