"""decoder_step.onnx: ONE decoder step with the caches as I/O, written from padfree.generation's weights.

Built directly (not traced): HF's cache classes do not export into a step with an indirected cache,
and the weights padfree.generation extracts are already in the step's layout (fused QKV with the
scale head_dim**-0.5 folded into Q, cross-attention K | V fused, computed once per batch by
cross_kv.onnx). The graph is generation/decoder.py's Decoder.logits in ONNX:

inputs   input_ids int32 [R]          the token at position `step` of every hypothesis (R = rows)
         step int32 [1]               0-based position of those tokens; the caches' column written
         cache_indir int32 [R, L]     row holding position t < step of row r's history (DECODER_OPS.md)
         cu_seqlens int32 [B+1]       the packed sources; row r belongs to source r // (R / B)
         past_key.i, past_value.i     float [R, H, L, D] per decoder layer i
         cross_kv.i                   float [T, 2*hidden] per layer (cross_kv.onnx's output)
outputs  logits float [R, V]          final_logits_bias added (Marian, BART, mBART)
         present_key.i, present_value.i   the caches with column `step` written

The two attentions are sites (ops.py) that a later pass swaps for the plugin nodes.
"""
from __future__ import annotations

import onnx

from padfree.generation.weights import Seq2SeqWeights

from .builder import FLOAT, INT32, GraphBuilder
from .layers import activation, layer_norm, linear, residual
from .ops import SITES_KEY, Site, decoder_cross_attention, decoder_self_attention, sites_metadata

__all__ = ["build_decoder_step", "io_names"]

R, L, B1, T = "rows", "capacity", "batch_plus_1", "source_tokens"


def io_names(layers: int) -> tuple[list[str], list[str]]:
    """The step's input and output names, in graph order."""
    inputs = ["input_ids", "step", "cache_indir", "cu_seqlens"]
    for i in range(layers):
        inputs += [f"past_key.{i}", f"past_value.{i}", f"cross_kv.{i}"]
    outputs = ["logits"] + [f"present_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
    return inputs, outputs


def _positions(b: GraphBuilder, weights: Seq2SeqWeights, ids: str, step: str) -> str:
    """The position-table rows of the step's tokens (generation.layers.position_rows): marian p,
    learned p + 2, fairseq padding_idx + 1 + p (the zero row padding_idx for a pad token)."""
    kind, pad = weights.spec.positions, weights.pad_token_id
    if kind == "marian":
        return step
    if kind == "learned":
        return b.op("Add", [step, b.const([2], "int32")])
    if kind == "fairseq":
        is_pad = b.op("Equal", [ids, b.const(pad, "int32")])
        return b.op("Where", [is_pad, b.const(pad, "int32"), b.op("Add", [step, b.const([pad + 1], "int32")])])
    raise ValueError(f"positions {kind!r}")


def build_decoder_step(weights: Seq2SeqWeights, opset: int, metadata: dict[str, str]) -> onnx.ModelProto:
    stack, spec = weights.decoder, weights.spec
    heads, head_dim, hidden = stack.num_heads, stack.head_dim, stack.hidden
    layers = len(stack.layers)
    b = GraphBuilder("padfree_decoder_step")
    ids = b.input("input_ids", INT32, [R])
    step = b.input("step", INT32, [1])
    indir = b.input("cache_indir", INT32, [R, L])
    cu = b.input("cu_seqlens", INT32, [B1])
    cache_shape = [R, heads, L, head_dim]
    past, memory = [], []
    for i in range(layers):
        past.append((b.input(f"past_key.{i}", FLOAT, cache_shape), b.input(f"past_value.{i}", FLOAT, cache_shape)))
        memory.append(b.input(f"cross_kv.{i}", FLOAT, [T, 2 * hidden]))

    with b.scope("embed"):
        x = b.op("Gather", [b.weight(stack.embed_tokens, "decoder.embed_tokens"), ids], axis=0)
        if stack.embed_scale != 1.0:
            x = b.op("Mul", [x, b.const(stack.embed_scale, "float32")])
        rows = _positions(b, weights, ids, step)
        x = b.op("Add", [x, b.op("Gather", [b.weight(stack.positions, "decoder.embed_positions"), rows], axis=0)])
        if stack.layernorm_embedding is not None:
            x = layer_norm(b, x, stack.layernorm_embedding, "decoder.layernorm_embedding")

    sites: list[Site] = []
    presents = []
    for i, layer in enumerate(stack.layers):
        where = f"decoder.layers.{i}"
        attn, cross = layer.self_attn, layer.cross_attn
        with b.scope(where):
            def self_attention(h, attn=attn, i=i, where=where):
                qkv = linear(b, h, attn.qkv_weight, None, f"{where}.self_attn.qkv")
                bias = b.weight(attn.qkv_bias, f"{where}.self_attn.qkv.bias")
                site = decoder_self_attention(b, "self_attn", qkv, bias, past[i][0], past[i][1], indir, step,
                                              heads, head_dim)
                sites.append(site)
                presents.append((site.outputs["k_cache_out"], site.outputs["v_cache_out"]))
                return linear(b, site.outputs["out"], attn.out_weight, attn.out_bias, f"{where}.self_attn.out_proj")

            def cross_attention(h, cross=cross, i=i, where=where):
                q = linear(b, h, cross.q_weight, None, f"{where}.encoder_attn.q_proj")
                bias = b.weight(cross.q_bias, f"{where}.encoder_attn.q_proj.bias")
                site = decoder_cross_attention(b, "encoder_attn", q, bias, memory[i], cu, heads, head_dim)
                sites.append(site)
                return linear(b, site.outputs["out"], cross.out_weight, cross.out_bias,
                              f"{where}.encoder_attn.out_proj")

            def feed_forward(h, f=layer.ffn, where=where):
                h = activation(b, linear(b, h, f.fc1_weight, f.fc1_bias, f"{where}.fc1"), weights.activation)
                return linear(b, h, f.fc2_weight, f.fc2_bias, f"{where}.fc2")

            x = residual(b, x, self_attention, attn.ln, spec.pre_ln, f"{where}.self_attn_layer_norm")
            x = residual(b, x, cross_attention, cross.ln, spec.pre_ln, f"{where}.encoder_attn_layer_norm")
            x = residual(b, x, feed_forward, layer.ffn.ln, spec.pre_ln, f"{where}.final_layer_norm")
    with b.scope("lm_head"):
        if stack.final_layer_norm is not None:
            x = layer_norm(b, x, stack.final_layer_norm, "decoder.layer_norm")
        logits = linear(b, x, weights.lm_head, weights.logits_bias, "lm_head")

    vocab = weights.target_vocab_size
    b.output(logits, "logits", FLOAT, [R, vocab])
    for i, (k, v) in enumerate(presents):
        b.output(k, f"present_key.{i}", FLOAT, cache_shape)
        b.output(v, f"present_value.{i}", FLOAT, cache_shape)
    # the sites name the graph outputs their caches feed (the Identity's input is the site's output)
    return b.model(opset, {**metadata, SITES_KEY: sites_metadata(sites)}, doc=__doc__)

