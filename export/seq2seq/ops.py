"""The decoder ops of docs/DECODER_OPS.md as standard-ONNX subgraphs, each one a *site* a later pass
swaps for the plugin node (PadfreeDecoderSelfAttention, PadfreeDecoderCrossAttention).

Rules, and why:
- Each op is built inside its own builder scope, reads only its declared inputs (plus constant
  initializers) and produces exactly its declared outputs; the site records the op name, the tensor
  of each input and output role and the fields. Swapping is then mechanical: drop the nodes whose
  names start with `<scope>/`, insert one node `op(inputs) -> outputs` with the fields as attributes
  (`sites_of(model)` reads them back; tests/test_export_seq2seq.py checks every site is closed).
- The subgraphs compute the contract's definition, not HF's: the cache write at column `step`, the
  history read through `cache_indir`, attention over positions 0..step; cross-attention of row r
  over its source's packed rows (s = r // num_beams through cu_seqlens). The ONNX Runtime generation
  loop that proves them (padfree.runtime.backends.onnxrt_seq2seq) is driven by the same beam
  bookkeeping as the kernels, so the swap changes where the op runs, not what it computes.
- The plugins take the cache as input and write it in place; an ONNX graph cannot alias, so the
  subgraph returns the written cache (`k_cache_out`, `v_cache_out`), which a TensorRT build binds to
  the input's memory.
- `num_beams` is a field of the cross-attention plugin; the subgraph derives it as rows / batch
  (rows = batch * num_beams by definition), so one decoder_step.onnx serves greedy search and every
  beam width. The swap pass is given the num_beams of the engine it prepares; the site records
  `num_beams: 0` (= rows / batch) until then.
- Positions past `step` may hold anything (stale rows of an earlier call): they are read through the
  own row, never through cache_indir, and masked out of the softmax.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
import onnx

from .builder import GraphBuilder

__all__ = ["Site", "SELF_ATTENTION", "CROSS_ATTENTION", "decoder_self_attention", "decoder_cross_attention",
           "sites_of", "SITES_KEY", "site_nodes", "site_problems"]

SELF_ATTENTION = "PadfreeDecoderSelfAttention"
CROSS_ATTENTION = "PadfreeDecoderCrossAttention"
SITES_KEY = "padfree.sites"
_NEG_INF = np.float32(-np.inf)


@dataclass
class Site:
    op: str                      # the plugin that replaces the subgraph
    scope: str                   # the subgraph's nodes: names starting with scope + "/"
    inputs: dict[str, str]       # role (the contract's argument name) -> tensor
    outputs: dict[str, str]
    fields: dict[str, float | int]


def sites_of(model: onnx.ModelProto) -> list[Site]:
    meta = {p.key: p.value for p in model.metadata_props}
    return [Site(**s) for s in json.loads(meta.get(SITES_KEY, "[]"))]


def sites_metadata(sites: list[Site]) -> str:
    return json.dumps([asdict(s) for s in sites])


def _scalar(b: GraphBuilder, shape_of: str, axis: int) -> str:
    """Dimension `axis` of a tensor as an int64 scalar."""
    return b.op("Squeeze", [b.op("Shape", [shape_of], start=axis, end=axis + 1), b.const([0])])


def _range(b: GraphBuilder, count: str) -> str:
    return b.op("Range", [b.const(0), count, b.const(1)])


def decoder_self_attention(b: GraphBuilder, scope: str, qkv: str, qkv_bias: str, k_cache: str, v_cache: str,
                           cache_indir: str, step: str, num_heads: int, head_dim: int,
                           softmax_scale: float = 1.0) -> Site:
    """decoder_self_attention of DECODER_OPS.md: qkv [R, 3*hidden] (bias not added), caches [R, H, L, D],
    cache_indir int32 [R, L], step int32 [1] -> out [R, hidden], the caches with column `step` written."""
    with b.scope(scope) as name:
        x = b.op("Reshape", [b.op("Add", [qkv, qkv_bias]), b.const([0, 3, num_heads, head_dim])])   # [R, 3, H, D]
        q, k, v = b.op("Split", [x, b.const([1, 1, 1])], outputs=3, axis=1)                       # [R, 1, H, D]
        step64 = b.op("Cast", [step], to=onnx.TensorProto.INT64)                                  # [1]
        written = []
        for cache, new in ((k_cache, k), (v_cache, v)):
            update = b.op("Transpose", [new], perm=[0, 2, 1, 3])                                   # [R, H, 1, D]
            index = b.op("Expand", [b.op("Reshape", [step64, b.const([1, 1, 1, 1])]), b.op("Shape", [update])])
            written.append(b.op("ScatterElements", [cache, index, update], axis=2))
        k_out, v_out = written
        rows, length = _scalar(b, k_cache, 0), _scalar(b, k_cache, 2)
        t = _range(b, length)                                                                      # [L]
        r = _range(b, rows)                                                                        # [R]
        # the row whose slot holds position t of row r's history: cache_indir before the step, the own
        # row from the step on (the step's slot was just written; later ones are masked)
        before = b.op("Unsqueeze", [b.op("Less", [t, step64]), b.const([0])])                      # [1, L]
        indir = b.op("Cast", [cache_indir], to=onnx.TensorProto.INT64)
        src = b.op("Where", [before, indir, b.op("Unsqueeze", [r, b.const([1])])])               # [R, L]
        flat = b.op("Add", [b.op("Mul", [b.op("Unsqueeze", [t, b.const([0])]), rows]), src])      # t * R + src
        history = []
        for cache in (k_out, v_out):
            by_position = b.op("Reshape", [b.op("Transpose", [cache], perm=[2, 0, 1, 3]),
                                           b.const([-1, num_heads, head_dim])])                    # [L*R, H, D]
            history.append(b.op("Gather", [by_position, flat], axis=0))                            # [R, L, H, D]
        keys = b.op("Transpose", [history[0]], perm=[0, 2, 3, 1])                                  # [R, H, D, L]
        values = b.op("Transpose", [history[1]], perm=[0, 2, 1, 3])                                # [R, H, L, D]
        scores = b.op("MatMul", [b.op("Transpose", [q], perm=[0, 2, 1, 3]), keys])                  # [R, H, 1, L]
        if softmax_scale != 1.0:
            scores = b.op("Mul", [scores, b.const(softmax_scale, np.float32)])
        valid = b.op("LessOrEqual", [t, step64])                                                   # [L]
        scores = b.op("Where", [valid, scores, b.const(_NEG_INF, np.float32)])
        probs = b.op("Softmax", [scores], axis=-1)
        out = b.op("Reshape", [b.op("MatMul", [probs, values]), b.const([0, -1])])                 # [R, hidden]
    return Site(SELF_ATTENTION, name,
                {"qkv": qkv, "qkv_bias": qkv_bias, "k_cache": k_cache, "v_cache": v_cache,
                 "cache_indir": cache_indir, "step": step},
                {"out": out, "k_cache_out": k_out, "v_cache_out": v_out},
                {"num_heads": num_heads, "head_dim": head_dim, "softmax_scale": float(softmax_scale)})


def decoder_cross_attention(b: GraphBuilder, scope: str, q: str, q_bias: str, kv_mem: str, cu_seqlens: str,
                            num_heads: int, head_dim: int, softmax_scale: float = 1.0) -> Site:
    """cross_attention of DECODER_OPS.md: q [R, hidden] (bias not added), kv_mem [T, 2*hidden] (K | V,
    bias added, packed), cu_seqlens int32 [B+1]; row r attends over source r // (R / B)'s rows."""
    hidden = num_heads * head_dim
    with b.scope(scope) as name:
        x = b.op("Transpose", [b.op("Reshape", [b.op("Add", [q, q_bias]), b.const([0, num_heads, head_dim])])],
                 perm=[1, 0, 2])                                                                   # [H, R, D]
        k = b.op("Slice", [kv_mem, b.const([0]), b.const([hidden]), b.const([1])])
        v = b.op("Slice", [kv_mem, b.const([hidden]), b.const([2 * hidden]), b.const([1])])
        heads = b.const([0, num_heads, head_dim])
        keys = b.op("Transpose", [b.op("Reshape", [k, heads])], perm=[1, 2, 0])                    # [H, D, T]
        values = b.op("Transpose", [b.op("Reshape", [v, heads])], perm=[1, 0, 2])                  # [H, T, D]
        scores = b.op("MatMul", [x, keys])                                                         # [H, R, T]
        if softmax_scale != 1.0:
            scores = b.op("Mul", [scores, b.const(softmax_scale, np.float32)])
        # source of each packed row: the number of sequence ends at or before it (B for rows past the last)
        cu = b.op("Cast", [cu_seqlens], to=onnx.TensorProto.INT64)
        ends = b.op("Slice", [cu, b.const([1]), b.const([np.iinfo(np.int64).max]), b.const([0])])  # [B]
        tokens = _range(b, _scalar(b, kv_mem, 0))                                                  # [T]
        after = b.op("GreaterOrEqual", [b.op("Unsqueeze", [tokens, b.const([1])]),
                                        b.op("Unsqueeze", [ends, b.const([0])])])
        source_of_token = b.op("ReduceSum", [b.op("Cast", [after], to=onnx.TensorProto.INT64), b.const([1])],
                               keepdims=0)                                                         # [T]
        rows = _scalar(b, q, 0)
        beams = b.op("Div", [rows, b.op("Sub", [_scalar(b, cu_seqlens, 0), b.const(1)])])          # R / B
        source_of_row = b.op("Div", [_range(b, rows), beams])                                      # [R]
        mask = b.op("Equal", [b.op("Unsqueeze", [source_of_row, b.const([1])]),
                              b.op("Unsqueeze", [source_of_token, b.const([0])])])                 # [R, T]
        scores = b.op("Where", [mask, scores, b.const(_NEG_INF, np.float32)])
        probs = b.op("Softmax", [scores], axis=-1)
        out = b.op("Reshape", [b.op("Transpose", [b.op("MatMul", [probs, values])], perm=[1, 0, 2]),
                               b.const([0, -1])])                                                  # [R, hidden]
    return Site(CROSS_ATTENTION, name, {"q": q, "q_bias": q_bias, "kv_mem": kv_mem, "cu_seqlens": cu_seqlens},
                {"out": out}, {"num_heads": num_heads, "head_dim": head_dim, "softmax_scale": float(softmax_scale),
                               "num_beams": 0})


def site_nodes(model: onnx.ModelProto, site: Site) -> list[onnx.NodeProto]:
    """The nodes a swap replaces: those named inside the site's scope."""
    return [n for n in model.graph.node if n.name.startswith(site.scope + "/")]


def site_problems(model: onnx.ModelProto, site: Site) -> list[str]:
    """Why swapping `site` for one node would not be mechanical (empty: it is): a node inside reading a
    tensor that is neither a declared input, an initializer nor made inside; a declared output not made
    inside; a tensor made inside and read outside that is not a declared output."""
    inside = site_nodes(model, site)
    made = {o for n in inside for o in n.output}
    allowed = set(site.inputs.values()) | {t.name for t in model.graph.initializer} | made
    problems = [f"{n.name} reads {i}" for n in inside for i in n.input if i and i not in allowed]
    problems += [f"output {role} ({name}) is not made inside" for role, name in site.outputs.items()
                 if name not in made]
    declared = set(site.outputs.values())
    outside = [n for n in model.graph.node if not n.name.startswith(site.scope + "/")]
    problems += [f"{n.name} reads {i}, internal to {site.scope}" for n in outside for i in n.input
                 if i in made and i not in declared]
    problems += [f"graph output {o.name} is internal to {site.scope}" for o in model.graph.output
                 if o.name in made and o.name not in declared]
    return problems
