"""The encoder on packed source tokens, and the decoder's cross-attention K/V computed from it once.

No padded source row exists anywhere: tokens are packed [T] with cu_seqlens, every GEMM runs on [T,
hidden], and attention runs per sequence through attention_varlen (the padfree kernel on the GPU for
head_dim 32/64/128, the torch reference otherwise). The cross-attention K/V of every decoder layer are
computed here once per batch and kept packed: kv_mem[layer] [T, 2*hidden] (K | V, bias added), which
every beam of a source reads through cu_seqlens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .dispatch import DecoderOps
from .layers import embed, ensure_position_rows, ffn, layer_norm, position_rows, residual
from .weights import Seq2SeqWeights

__all__ = ["PackedSources", "encode", "cross_attention_memory"]


@dataclass
class PackedSources:
    """A batch of sources, packed: ids int64 [T], cu_seqlens int32 [batch+1], on the serving device."""
    ids: torch.Tensor
    cu_seqlens: torch.Tensor
    lengths: list[int]

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths)

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def total_tokens(self) -> int:
        return sum(self.lengths)

    @classmethod
    def from_lists(cls, sources: list[list[int]], device: torch.device) -> "PackedSources":
        lengths = [len(s) for s in sources]
        ids = torch.tensor([t for s in sources for t in s], dtype=torch.long)
        cu = torch.zeros(len(sources) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
        return cls(ids.to(device), cu.to(device), lengths)

    def positions(self) -> torch.Tensor:
        """int64 [T]: each token's 0-based position in its sequence."""
        starts = torch.repeat_interleave(self.cu_seqlens[:-1].long(),
                                         torch.tensor(self.lengths, device=self.ids.device))
        return torch.arange(self.total_tokens, device=self.ids.device) - starts


def _nonpad_rank(sources: PackedSources, pad: int) -> torch.Tensor:
    """int64 [T]: per sequence, the number of non-pad tokens before each token (M2M100's positions)."""
    nonpad = (sources.ids != pad).long()
    inclusive = torch.cumsum(nonpad, 0)
    before_sequence = torch.repeat_interleave(
        torch.cat([inclusive.new_zeros(1), inclusive])[sources.cu_seqlens[:-1].long()],
        torch.tensor(sources.lengths, device=sources.ids.device))
    return inclusive - before_sequence - 1


def encode(weights: Seq2SeqWeights, ops: DecoderOps, sources: PackedSources) -> torch.Tensor:
    """The encoder's last hidden state for every packed source token: [T, hidden] in the weights' dtype."""
    spec, stack, pad = weights.spec, weights.encoder, weights.pad_token_id
    positions = sources.positions()
    rank = _nonpad_rank(sources, pad) if spec.positions == "fairseq" else None
    ensure_position_rows(stack, spec, pad, pad + 2 + sources.max_seqlen)
    x = embed(stack, sources.ids, position_rows(spec, pad, positions, sources.ids, rank))
    heads = stack.num_heads
    for layer in stack.layers:
        attn = layer.self_attn

        def self_attention(h, attn=attn):
            qkv = F.linear(h, attn.qkv_weight)
            o = ops.attention_varlen(qkv, sources.cu_seqlens, sources.max_seqlen, heads,
                                     qkv_bias=attn.qkv_bias, softmax_scale=1.0)
            return F.linear(o, attn.out_weight, attn.out_bias)

        x = residual(x, self_attention, attn.ln, spec.pre_ln)
        x = residual(x, lambda h, w=layer.ffn: ffn(h, w, weights.activation), layer.ffn.ln, spec.pre_ln)
    if stack.final_layer_norm is not None:
        x = layer_norm(x, stack.final_layer_norm)
    return x


def cross_attention_memory(weights: Seq2SeqWeights, encoder_out: torch.Tensor) -> list[torch.Tensor]:
    """kv_mem per decoder layer: [T, 2*hidden] = encoder_out @ [Wk; Wv]^T + [bk; bv], packed."""
    return [F.linear(encoder_out, layer.cross_attn.kv_weight, layer.cross_attn.kv_bias).contiguous()
            for layer in weights.decoder.layers]
