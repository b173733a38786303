"""One decoder step over all live hypotheses, with the K/V cache and its beam indirection.

Caches: per layer k_cache, v_cache [rows, H, L, D] (rows = sources * rows_per_source, L = max_length)
written once per step at column `step` and never copied. A hypothesis' history is found through
cache_indir [rows, L] int32: position t of row r lives in row cache_indir[r, t]'s slot t. Beam search
reorders the indirection (beam_reorder_cache_indir, O(rows * L) int32 per step, into the other of two
ping-pong buffers) instead of gathering every layer's caches (O(layers * rows * hidden * L) per
step). Greedy and sampling keep the identity indirection and never reorder.

The step index lives in a device int32 tensor [1] (the kernels read it there, so one captured CUDA
graph could replay every step); the host loop counter is passed alongside for the position lookup.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import DecoderOps
from .encoder import PackedSources
from .layers import embed, ensure_position_rows, ffn, layer_norm, position_rows, residual
from .weights import Seq2SeqWeights

__all__ = ["Decoder", "cache_bytes"]


def cache_bytes(weights: Seq2SeqWeights, rows: int, capacity: int) -> int:
    """Bytes of the K/V caches and the two indirection buffers for `rows` hypotheses of `capacity` steps."""
    stack = weights.decoder
    element = torch.empty((), dtype=weights.dtype).element_size()
    return 2 * len(stack.layers) * rows * stack.hidden * capacity * element + 2 * rows * capacity * 4


class Decoder:
    """The decoder state of one generate() call and its step.

    rows_per_source hypotheses per source (beams, or samples), the sources' packed cross-attention
    memory kv_mem (encoder.cross_attention_memory), capacity L = the longest decoder sequence.
    """

    def __init__(self, weights: Seq2SeqWeights, ops: DecoderOps, sources: PackedSources,
                 kv_mem: list[torch.Tensor], rows_per_source: int, capacity: int):
        self.weights, self.ops, self.sources, self.kv_mem = weights, ops, sources, kv_mem
        self.rows_per_source = rows_per_source
        self.rows = sources.batch * rows_per_source
        self.capacity = capacity
        stack = weights.decoder
        device, dtype = weights.device, weights.dtype
        shape = (self.rows, stack.num_heads, capacity, stack.head_dim)
        self.k_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in stack.layers]
        self.v_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in stack.layers]
        identity = torch.arange(self.rows, dtype=torch.int32, device=device)[:, None].expand(self.rows, capacity)
        self.indir = [identity.contiguous(), identity.contiguous()]   # ping-pong
        self.current = 0
        self.step = torch.zeros(1, dtype=torch.int32, device=device)
        ensure_position_rows(stack, weights.spec, weights.pad_token_id, weights.pad_token_id + 2 + capacity)

    def logits(self, tokens: torch.Tensor, step: int) -> torch.Tensor:
        """Logits [rows, V] (weights' dtype, bias not added) for the next token after `tokens` (int64
        [rows], the token at position `step` of every hypothesis)."""
        w, spec = self.weights, self.weights.spec
        stack = w.decoder
        heads = stack.num_heads
        self.step.fill_(step)
        positions = self.step.long().expand(self.rows)
        x = embed(stack, tokens, position_rows(spec, w.pad_token_id, positions, tokens))
        indir = self.indir[self.current]
        for i, layer in enumerate(stack.layers):
            attn, cross = layer.self_attn, layer.cross_attn

            def self_attention(h, attn=attn, i=i):
                qkv = F.linear(h, attn.qkv_weight)
                o = self.ops.decoder_self_attention(qkv, self.k_cache[i], self.v_cache[i], indir, self.step, heads,
                                                    qkv_bias=attn.qkv_bias, softmax_scale=1.0)
                return F.linear(o, attn.out_weight, attn.out_bias)

            def cross_attention(h, cross=cross, i=i):
                q = F.linear(h, cross.q_weight)
                o = self.ops.cross_attention(q, self.kv_mem[i], self.sources.cu_seqlens, self.sources.max_seqlen,
                                             self.rows_per_source, heads, q_bias=cross.q_bias, softmax_scale=1.0)
                return F.linear(o, cross.out_weight, cross.out_bias)

            x = residual(x, self_attention, attn.ln, spec.pre_ln)
            x = residual(x, cross_attention, cross.ln, spec.pre_ln)
            x = residual(x, lambda h, f=layer.ffn: ffn(h, f, w.activation), layer.ffn.ln, spec.pre_ln)
        if stack.final_layer_norm is not None:
            x = layer_norm(x, stack.final_layer_norm)
        return F.linear(x, w.lm_head)

    def reorder(self, parents: torch.Tensor, step: int) -> None:
        """Hypothesis r continues row parents[r] (int32 [rows]) from step + 1 on."""
        self.step.fill_(step)
        out = self.indir[1 - self.current]
        self.ops.beam_reorder_cache_indir(self.indir[self.current], parents, self.step, out=out)
        self.current = 1 - self.current
