"""cross_kv.onnx: the decoder's cross-attention memory, computed once per batch from the packed encoder output.

input   encoder_hidden_states float [T, hidden]   the encoder's valid rows, packed (cu_seqlens order)
outputs cross_kv.i float [T, 2*hidden]            per decoder layer: K | V with their biases added

decoder_step.onnx reads these every step (its cross-attention site); the beams of a source share
its rows, never a per-beam copy (docs/GENERATION.md).
"""
from __future__ import annotations

import onnx

from padfree.generation.weights import Seq2SeqWeights

from .builder import FLOAT, GraphBuilder
from .layers import linear

__all__ = ["build_cross_kv"]

T = "source_tokens"


def build_cross_kv(weights: Seq2SeqWeights, opset: int, metadata: dict[str, str]) -> onnx.ModelProto:
    """The graph of this module's docstring from the decoder layers' fused K | V weights."""
    stack = weights.decoder
    b = GraphBuilder("padfree_cross_kv")
    hidden_states = b.input("encoder_hidden_states", FLOAT, [T, stack.hidden])
    for i, layer in enumerate(stack.layers):
        with b.scope(f"decoder.layers.{i}"):
            kv = linear(b, hidden_states, layer.cross_attn.kv_weight, layer.cross_attn.kv_bias,
                        f"decoder.layers.{i}.encoder_attn.kv_proj")
        b.output(kv, f"cross_kv.{i}", FLOAT, [T, 2 * stack.hidden])
    return b.model(opset, metadata)
