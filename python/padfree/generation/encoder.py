"""The encoder on packed source tokens, and the decoder's cross-attention K/V computed from it once.

No padded source row exists anywhere: tokens are packed [T] with cu_seqlens, every GEMM runs on [T,
hidden], and attention runs per sequence through attention_varlen (the padfree kernel on the GPU for
head_dim 32/64/128, the torch reference otherwise). The cross-attention K/V of every decoder layer are
computed here once per batch and kept packed: kv_mem[layer] [T, 2*hidden] (K | V, bias added), which
every beam of a source reads through cu_seqlens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .dispatch import DecoderOps
from .layers import embed, ensure_position_rows, ffn, layer_norm, position_rows, residual
from .weights import Seq2SeqWeights

__all__ = ["PackedSources", "encode", "encode_rows", "source_position_rows", "cross_attention_memory"]


@dataclass
class PackedSources:
    """A batch of sources, packed: ids int64 [T], cu_seqlens int32 [batch+1], on the host or the serving
    device (host: the same on the CPU, where from_lists made them; encoder_graph.py stages from it)."""
    ids: torch.Tensor
    cu_seqlens: torch.Tensor
    lengths: list[int]
    host: PackedSources | None = field(default=None, repr=False, compare=False)

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
        return cls(ids, cu, lengths).to(device)

    def to(self, device: torch.device | str) -> PackedSources:
        """These sources on `device`, the host's kept beside them (the host's themselves on the CPU)."""
        host = self.host or self
        if torch.device(device).type == "cpu":
            return host
        return PackedSources(self.ids.to(device), self.cu_seqlens.to(device), self.lengths, host)

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


def source_position_rows(weights: Seq2SeqWeights, sources: PackedSources) -> torch.Tensor:
    """int64 [T]: the encoder position-table row of every packed token (layers.position_rows), on the
    sources' device, the table grown where the family's is (fairseq)."""
    spec, pad = weights.spec, weights.pad_token_id
    rank = _nonpad_rank(sources, pad) if spec.positions == "fairseq" else None
    ensure_position_rows(weights.encoder, spec, pad, pad + 2 + sources.max_seqlen)
    return position_rows(spec, pad, sources.positions(), sources.ids, rank)


def encode(weights: Seq2SeqWeights, ops: DecoderOps, sources: PackedSources) -> torch.Tensor:
    """The encoder's last hidden state for every packed source token: [T, hidden] in the weights' dtype."""
    return encode_rows(weights, ops, sources.ids, source_position_rows(weights, sources), sources.cu_seqlens,
                       sources.max_seqlen)


def encode_rows(weights: Seq2SeqWeights, ops: DecoderOps, ids: torch.Tensor, rows: torch.Tensor,
                cu_seqlens: torch.Tensor, max_seqlen: int, positions: torch.Tensor | None = None) -> torch.Tensor:
    """encode() on device tensors only (no host read), as encoder_graph.py captures it: ids and position
    rows int64 [T], cu_seqlens int32 covering the sequences (rows past its end are not attended to or
    from), each length at most max_seqlen; positions: the table to read (default the stack's)."""
    stack = weights.encoder
    x = embed(stack, ids, rows, positions)
    heads = stack.num_heads
    for layer in stack.layers:
        attn = layer.self_attn

        def self_attention(h, attn=attn):
            qkv = F.linear(h, attn.qkv_weight)
            o = ops.attention_varlen(qkv, cu_seqlens, max_seqlen, heads, qkv_bias=attn.qkv_bias, softmax_scale=1.0)
            return F.linear(o, attn.out_weight, attn.out_bias)

        x = residual(x, self_attention, attn.ln, weights.spec.pre_ln)
        x = residual(x, lambda h, w=layer.ffn: ffn(h, w, weights.activation), layer.ffn.ln, weights.spec.pre_ln)
    if stack.final_layer_norm is not None:
        x = layer_norm(x, stack.final_layer_norm)
    return x


def cross_attention_memory(weights: Seq2SeqWeights, encoder_out: torch.Tensor) -> list[torch.Tensor]:
    """kv_mem per decoder layer: [T, 2*hidden] = encoder_out @ [Wk; Wv]^T + [bk; bv], packed."""
    return [F.linear(encoder_out, layer.cross_attn.kv_weight, layer.cross_attn.kv_bias).contiguous()
            for layer in weights.decoder.layers]
