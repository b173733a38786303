"""ONNX Runtime references of the plugin ops: each plugin node expanded into standard ONNX ops.

Used only on a copy of a rewritten model, to run it on the CPU (`padfree check`); the model
TensorRT parses keeps its plugin nodes. Each expansion computes the op's definition in the spec
directly on packed rows, independently of how the original graph computed it: token -> sequence
ids from cu_seqlens (a comparison with the sequence ends), positions t - cu_seqlens[seq], and
attention over all T tokens with a block-diagonal mask (same sequence id), in float32.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import spec as spec_mod

OPSET = 18


class _Builder:
    """Emits nodes for one plugin node; names are unique per node."""

    def __init__(self, node: onnx.NodeProto, index: int, fields: dict):
        self.prefix = f"padfree_ref/{index}/{node.op_type}"
        self.nodes: list[onnx.NodeProto] = []
        self.n = 0
        self.attrs = fields  # the node's fields, checked against the spec and its defaults filled in

    def op(self, op_type: str, *inputs: str, outputs: int = 1, out: list[str] | None = None,
           **attrs) -> str | list[str]:
        names = out or [f"{self.prefix}/{op_type}_{self.n}_{i}" for i in range(outputs)]
        self.n += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=f"{self.prefix}/{self.n}", **attrs))
        return names[0] if len(names) == 1 else names

    def const(self, value, dtype=np.int64) -> str:
        name = f"{self.prefix}/const_{self.n}"
        self.n += 1
        self.nodes.append(helper.make_node("Constant", [], [name], name=name,
                                           value=numpy_helper.from_array(np.asarray(value, dtype), name)))
        return name

    def token_coords(self, cu: str, total: str | None = None) -> tuple[str, str, str]:
        """For T packed rows: (sequence id [T], position in sequence [T], row index [T]) as int64.

        seq(t) = number of sequence ends cu[1:] that are <= t; pos(t) = t - cu[seq(t)].
        """
        cu64 = self.op("Cast", cu, to=TensorProto.INT64)
        if total is None:
            total = self.op("Gather", cu64, self.const(-1), axis=0)
        rows = self.op("Range", self.const(0), total, self.const(1))
        ends = self.op("Slice", cu64, self.const([1]), self.const([2**62]))
        after = self.op("GreaterOrEqual", self.op("Unsqueeze", rows, self.const([1])),
                        self.op("Unsqueeze", ends, self.const([0])))
        seq = self.op("ReduceSum", self.op("Cast", after, to=TensorProto.INT64), self.const([1]), keepdims=0)
        pos = self.op("Sub", rows, self.op("Gather", cu64, seq, axis=0))
        return seq, pos, rows

    def rows_total(self, x: str) -> str:
        return self.op("Gather", self.op("Shape", x), self.const(0), axis=0)

    def layernorm(self, x: str, gamma: str, beta: str, out: str) -> None:
        self.op("LayerNormalization", x, gamma, beta, out=[out], axis=-1, epsilon=float(self.attrs["epsilon"]))


def _emb_layernorm(b: _Builder, i: list[str], o: list[str]) -> None:
    has_type = int(b.attrs["has_token_type"])
    ids, types = i[0], (i[1] if has_type else None)
    cu, word, pos_table = i[1 + has_type:4 + has_type]
    type_table = i[4 + has_type] if has_type else None
    _, pos, _ = b.token_coords(cu, b.rows_total(ids))
    pos = b.op("Add", pos, b.const(int(b.attrs["position_offset"])))
    x = b.op("Add", b.op("Gather", word, ids, axis=0), b.op("Gather", pos_table, pos, axis=0))
    if has_type:
        x = b.op("Add", x, b.op("Gather", type_table, types, axis=0))
    if int(b.attrs["has_layernorm"]):
        b.layernorm(x, i[4 + 2 * has_type], i[5 + 2 * has_type], o[0])
    else:  # the sum itself (Marian, M2M100)
        b.op("Identity", x, out=[o[0]])


def _attention(b: _Builder, i: list[str], o: list[str]) -> None:
    qkv, bias, cu = i[0], i[1], i[2]
    heads, head_dim = int(b.attrs["num_heads"]), int(b.attrs["head_dim"])
    x = b.op("Reshape", b.op("Add", qkv, bias), b.const([0, 3, heads, head_dim]))  # [T, 3, N, D]
    q, k, v = (b.op("Transpose", b.op("Gather", x, b.const(j), axis=1), perm=[1, 0, 2]) for j in range(3))
    scores = b.op("Mul", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 2, 1])),
                  b.const(float(b.attrs["softmax_scale"]), np.float32))  # [N, T, T]
    seq, _, _ = b.token_coords(cu, b.rows_total(qkv))
    same = b.op("Equal", b.op("Unsqueeze", seq, b.const([1])), b.op("Unsqueeze", seq, b.const([0])))
    masked = b.op("Where", same, scores, b.const(-np.inf, np.float32))
    ctx = b.op("MatMul", b.op("Softmax", masked, axis=-1), v)  # [N, T, D]
    b.op("Reshape", b.op("Transpose", ctx, perm=[1, 0, 2]), b.const([0, heads * head_dim]), out=[o[0]])


def _skip_layernorm(b: _Builder, i: list[str], o: list[str]) -> None:
    b.layernorm(b.op("Add", b.op("Add", i[0], i[2]), i[1]), i[3], i[4], o[0])


def _layernorm(b: _Builder, i: list[str], o: list[str]) -> None:
    b.layernorm(i[0], i[1], i[2], o[0])


def _bias_gelu(b: _Builder, i: list[str], o: list[str]) -> None:
    x = b.op("Add", i[0], i[1])
    half_x = b.op("Mul", x, b.const(0.5, np.float32))
    if int(b.attrs["approximate"]):
        cube = b.op("Mul", b.op("Mul", x, x), x)
        inner = b.op("Mul", b.op("Add", x, b.op("Mul", cube, b.const(0.044715, np.float32))),
                     b.const(math.sqrt(2 / math.pi), np.float32))
        core = b.op("Tanh", inner)
    else:
        core = b.op("Erf", b.op("Mul", x, b.const(1 / math.sqrt(2), np.float32)))
    b.op("Mul", half_x, b.op("Add", core, b.const(1.0, np.float32)), out=[o[0]])


def _coords_2d(b: _Builder, seq: str, pos: str) -> str:
    """[T, 2] indices (sequence, position) for GatherND / ScatterND on [B, S, ...]."""
    return b.op("Concat", b.op("Unsqueeze", seq, b.const([1])), b.op("Unsqueeze", pos, b.const([1])), axis=1)


def _remove_padding(b: _Builder, i: list[str], o: list[str]) -> None:
    padded, mask = i
    lengths = b.op("ReduceSum", b.op("Cast", mask, to=TensorProto.INT64), b.const([1]), keepdims=0)
    cu = b.op("Concat", b.const([0]), b.op("CumSum", lengths, b.const(0)), axis=0)
    seq, pos, _ = b.token_coords(cu)
    b.op("GatherND", padded, _coords_2d(b, seq, pos), out=[o[0]])
    if len(o) > 1 and o[1]:
        b.op("Cast", cu, out=[o[1]], to=TensorProto.INT32)
    if len(o) > 2 and o[2]:  # the size tensor: cu_seqlens[B], 0-D
        b.op("Cast", b.op("Gather", cu, b.const(-1), axis=0), out=[o[2]], to=TensorProto.INT32)


def _rebuild_padding(b: _Builder, i: list[str], o: list[str]) -> None:
    packed, cu, mask = i
    seq, pos, _ = b.token_coords(cu, b.rows_total(packed))
    shape = b.op("Concat", b.op("Shape", mask), b.op("Slice", b.op("Shape", packed), b.const([1]), b.const([2**62])),
                 axis=0)
    zeros = b.op("CastLike", b.op("ConstantOfShape", shape), packed)
    b.op("ScatterND", zeros, _coords_2d(b, seq, pos), packed, out=[o[0]])


# ---- the decoder step -------------------------------------------------------------------------------
def _scalar(b: _Builder, x: str, index: int = 0) -> str:
    """Dimension `index` of x as a 0-D int64."""
    return b.op("Gather", b.op("Shape", x), b.const(index), axis=0)


def _decoder_self_attention(b: _Builder, i: list[str], o: list[str]) -> None:
    """K/V cache write with ScatterND at [r, :, step, :], then attention of each row over the positions
    0..step of its history, gathered through the cache indirection (own row at `step`)."""
    qkv, bias, k_cache, v_cache, indir, step = i
    heads, head_dim = int(b.attrs["num_heads"]), int(b.attrs["head_dim"])
    x = b.op("Reshape", b.op("Add", qkv, bias), b.const([0, 3, heads, head_dim]))  # [R, 3, H, D]
    q, k_new, v_new = (b.op("Gather", x, b.const(j), axis=1) for j in range(3))  # [R, H, D]
    rows = b.op("Range", b.const(0), _scalar(b, qkv), b.const(1))  # [R]
    step64 = b.op("Cast", step, to=TensorProto.INT64)  # [1]
    write_at = b.op("Concat", b.op("Unsqueeze", rows, b.const([1])),
                    b.op("Unsqueeze", b.op("Expand", step64, b.op("Shape", rows)), b.const([1])), axis=1)  # [R, 2]
    positions = b.op("Range", b.const(0), _scalar(b, k_cache, 2), b.const(1))  # [L]
    # source row of each (r, t): cache_indir[r, t] before step, r itself at step (later ones are masked)
    src = b.op("Where", b.op("Less", b.op("Unsqueeze", positions, b.const([0])), step64),
               b.op("Cast", indir, to=TensorProto.INT64), b.op("Unsqueeze", rows, b.const([1])))  # [R, L]
    at = b.op("Concat", b.op("Unsqueeze", src, b.const([2])),
              b.op("Unsqueeze", b.op("Expand", positions, b.op("Shape", src)), b.const([2])), axis=2)  # [R, L, 2]
    history = []
    for cache, new, out in ((k_cache, k_new, o[1]), (v_cache, v_new, o[2])):
        by_position = b.op("ScatterND", b.op("Transpose", cache, perm=[0, 2, 1, 3]), write_at, new)  # [R, L, H, D]
        b.op("Transpose", by_position, perm=[0, 2, 1, 3], out=[out])
        history.append(b.op("GatherND", by_position, at))  # [R, L, H, D]: row r's position t
    scores = b.op("Mul", b.op("MatMul", b.op("Unsqueeze", q, b.const([2])),
                              b.op("Transpose", history[0], perm=[0, 2, 3, 1])),
                  b.const(float(b.attrs["softmax_scale"]), np.float32))  # [R, H, 1, L]
    masked = b.op("Where", b.op("LessOrEqual", positions, step64), scores, b.const(-np.inf, np.float32))
    ctx = b.op("MatMul", b.op("Softmax", masked, axis=-1), b.op("Transpose", history[1], perm=[0, 2, 1, 3]))
    b.op("Reshape", ctx, b.const([0, heads * head_dim]), out=[o[0]])  # [R, H, 1, D] -> [R, H*D]


def _decoder_cross_attention(b: _Builder, i: list[str], o: list[str]) -> None:
    """Row r attends over the packed rows of source r // num_beams, each cut at max_seqlen positions;
    an empty source gives zeros (as the kernel)."""
    q, bias, kv_mem, cu, max_seqlen = i
    heads, head_dim, beams = int(b.attrs["num_heads"]), int(b.attrs["head_dim"]), int(b.attrs["num_beams"])
    q = b.op("Transpose", b.op("Reshape", b.op("Add", q, bias), b.const([0, heads, head_dim])), perm=[1, 0, 2])
    kv = b.op("Reshape", kv_mem, b.const([0, 2, heads, head_dim]))  # [T, 2, H, D]
    k, v = (b.op("Gather", kv, b.const(j), axis=1) for j in range(2))  # [T, H, D]
    scores = b.op("Mul", b.op("MatMul", q, b.op("Transpose", k, perm=[1, 2, 0])),
                  b.const(float(b.attrs["softmax_scale"]), np.float32))  # [H, R, T]
    seq, pos, _ = b.token_coords(cu, b.rows_total(kv_mem))
    source = b.op("Div", b.op("Range", b.const(0), _scalar(b, q, 1), b.const(1)), b.const(beams))  # [R]
    allowed = b.op("And", b.op("Equal", b.op("Unsqueeze", source, b.const([1])), b.op("Unsqueeze", seq, b.const([0]))),
                   b.op("Unsqueeze", b.op("Less", pos, _scalar(b, max_seqlen)), b.const([0])))  # [R, T]
    probs = b.op("Softmax", b.op("Where", allowed, scores, b.const(-np.inf, np.float32)), axis=-1)
    probs = b.op("Where", allowed, probs, b.const(0.0, np.float32))  # an empty source: NaN -> 0
    ctx = b.op("MatMul", probs, b.op("Transpose", v, perm=[1, 0, 2]))  # [H, R, D]
    b.op("Reshape", b.op("Transpose", ctx, perm=[1, 0, 2]), b.const([0, heads * head_dim]), out=[o[0]])


def _id_mask(b: _Builder, ids: str, vocab: str) -> str:
    """[R, V] bool: v is among row r's ids ([R, Q] int32; -1 and ids outside [0, V) match nothing)."""
    hit = b.op("Equal", b.op("Unsqueeze", b.op("Cast", ids, to=TensorProto.INT64), b.const([2])),
               b.op("Unsqueeze", vocab, b.const([0, 1])))  # [R, Q, V]
    return b.op("Cast", b.op("ReduceSum", b.op("Cast", hit, to=TensorProto.INT32), b.const([1]), keepdims=0),
                to=TensorProto.BOOL)


def _logits_topk(b: _Builder, i: list[str], o: list[str]) -> None:
    """fp32 log_softmax (or raw logits), HF's processors in their order, beam scores, then TopK (ties
    to the lower index, as the kernel)."""
    a = {k: int(b.attrs[k]) for k in ("has_bias", "has_beam_scores", "has_banned", "has_penalty", "has_forced")}
    names = iter(i)
    logits = next(names)
    bias, beam, banned, penalty, forced = (next(names) if a[k] else None for k in a)
    s = b.op("Cast", logits, to=TensorProto.FLOAT)
    if bias:
        s = b.op("Add", s, b.op("Cast", bias, to=TensorProto.FLOAT))
    if int(b.attrs["normalize"]):
        s = b.op("LogSoftmax", s, axis=-1)
    vocab = b.op("Range", b.const(0), _scalar(b, logits, 1), b.const(1))  # [V]
    if penalty:
        p = b.const(float(b.attrs["repetition_penalty"]), np.float32)
        penalized = b.op("Where", b.op("Less", s, b.const(0.0, np.float32)), b.op("Mul", s, p), b.op("Div", s, p))
        s = b.op("Where", _id_mask(b, penalty, vocab), penalized, s)
    if banned:
        s = b.op("Where", _id_mask(b, banned, vocab), b.const(-np.inf, np.float32), s)
    if forced:
        f = b.op("Unsqueeze", b.op("Cast", forced, to=TensorProto.INT64), b.const([1]))  # [R, 1]
        valid = b.op("And", b.op("GreaterOrEqual", f, b.const(0)), b.op("Less", f, _scalar(b, logits, 1)))
        only = b.op("Where", b.op("Equal", f, vocab), b.const(0.0, np.float32), b.const(-np.inf, np.float32))
        s = b.op("Where", valid, only, s)
    if beam:
        s = b.op("Add", s, b.op("Unsqueeze", beam, b.const([1])))
    values, indices = b.op("TopK", s, b.const([int(b.attrs["k"])]), outputs=2, axis=-1, largest=1, sorted=1)
    b.op("Identity", values, out=[o[0]])
    b.op("Cast", indices, out=[o[1]], to=TensorProto.INT32)


def _beam_reorder(b: _Builder, i: list[str], o: list[str]) -> None:
    """out[r, t] = cache_indir[parents[r], t], and parents[r] at t = step. The plugin leaves positions
    past step unwritten (unspecified); here they hold the gathered row, so compare t <= step only."""
    indir, parents, step = i
    gathered = b.op("Gather", indir, parents, axis=0)  # [R, L]
    positions = b.op("Range", b.const(0), _scalar(b, indir, 1), b.const(1))
    at_step = b.op("Equal", b.op("Unsqueeze", positions, b.const([0])), b.op("Cast", step, to=TensorProto.INT64))
    b.op("Where", at_step, b.op("Unsqueeze", parents, b.const([1])), gathered, out=[o[0]])


NEG = -1.0e9  # HF's "very large negative", added to scores that must lose


def _extent(b: _Builder, x: str, index: int) -> str:
    """Dimension `index` of x as a [1] int64 (for Concat and broadcasting; _scalar gives it 0-D)."""
    return b.op("Slice", b.op("Shape", x), b.const([index]), b.const([index + 1]))


def _cur_len(b: _Builder, step: str, max_length: str) -> str:
    """The tokens so far, the start token included ([1] int64): step + 1, the step clamped to
    [0, M - 2] as the search kernels clamp it."""
    step64 = b.op("Min", b.op("Max", b.op("Cast", step, to=TensorProto.INT64), b.const([0])),
                  b.op("Sub", max_length, b.const([2])))
    return b.op("Add", step64, b.const([1]))


def _beam_search_step(b: _Builder, i: list[str], o: list[str]) -> None:
    """HF's beam-search step (transformers 5 _beam_search; padfree.generation.beam_search's tensorised
    step) for every source: the source's NK best of its beams' candidates (TopK: ties to the lower
    index, torch's order), the running beams, the pool with its length penalty, the early-stop
    heuristic. A score is divided by cur_len ** length_penalty as HF does on the CPU; the kernel
    multiplies by the float32 reciprocal, as HF's CUDA division by a Python number does (the two may
    differ in the last bit)."""
    k, lp, early = int(b.attrs["num_beams"]), float(b.attrs["length_penalty"]), int(b.attrs["early_stopping"])
    (cand_scores, cand_ids, step, running, running_scores, pool, pool_scores, pool_lengths, pool_finished,
     improvable) = i[:10]
    eos = i[10] if int(b.attrs["has_eos"]) else None
    out_running, out_running_scores, out_pool, out_pool_scores, out_pool_lengths, out_pool_finished, \
        out_improvable, out_next_tokens, out_parents = o

    def times_neg(flag_i32: str) -> str:
        return b.op("Mul", b.op("Cast", flag_i32, to=TensorProto.FLOAT), b.const(np.float32(NEG), np.float32))

    def length_divisor(n: str) -> str:   # float32(n ** lp), the power in float64 as Python's
        return b.op("Cast", b.op("Pow", b.op("Cast", n, to=TensorProto.DOUBLE), b.const([lp], np.float64)),
                    to=TensorProto.FLOAT)

    batch, keep, m = _extent(b, running, 0), _extent(b, cand_scores, 1), _extent(b, running, 2)
    cur_len = _cur_len(b, step, m)

    def along(x: str, index: str, width: str) -> str:   # x [B, W, M] gathered by index [B, width] along 1
        shape = b.op("Concat", batch, width, m, axis=0)
        return b.op("GatherElements", x, b.op("Expand", b.op("Unsqueeze", index, b.const([2])), shape), axis=1)

    flat_shape = b.op("Concat", b.const([-1]), b.op("Mul", keep, b.const([k])), axis=0)
    top_scores, order = b.op("TopK", b.op("Reshape", cand_scores, flat_shape), keep, outputs=2, axis=1, largest=1,
                             sorted=1)
    top_parent = b.op("Div", order, keep)
    top_tokens = b.op("Cast", b.op("GatherElements", b.op("Reshape", cand_ids, flat_shape), order, axis=1),
                      to=TensorProto.INT64)   # [B, NK]
    positions = b.op("Range", b.const(0), _scalar(b, running, 2), b.const(1))
    at_len = b.op("Equal", b.op("Unsqueeze", positions, b.const([0, 1])), cur_len)   # [1, 1, M]
    top_sequences = b.op("Where", at_len, b.op("Unsqueeze", top_tokens, b.const([2])), along(running, top_parent, keep))
    ends = b.op("Cast", b.op("GreaterOrEqual", b.op("Add", cur_len, b.const([1])), m), to=TensorProto.INT32)   # [1]
    if eos is not None:
        is_eos = b.op("Equal", b.op("Unsqueeze", top_tokens, b.const([2])),
                      b.op("Unsqueeze", b.op("Cast", eos, to=TensorProto.INT64), b.const([0, 1])))
        any_eos = b.op("ReduceMax", b.op("Cast", is_eos, to=TensorProto.INT32), b.const([2]), keepdims=0)
        hits = b.op("Max", any_eos, ends)
    else:
        hits = b.op("Expand", ends, b.op("Shape", top_tokens))
    running_candidates = b.op("Add", top_scores, times_neg(hits))
    _, next_beams = b.op("TopK", running_candidates, b.const([k]), outputs=2, axis=1, largest=1, sorted=1)
    sources = b.op("Range", b.const(0), _scalar(b, running, 0), b.const(1))
    source_offset = b.op("Unsqueeze", b.op("Mul", sources, b.const(k)), b.const([1]))   # [B, 1]
    b.op("Cast", b.op("Reshape", b.op("Add", b.op("GatherElements", top_parent, next_beams, axis=1), source_offset),
                      b.const([-1])), to=TensorProto.INT32, out=[out_parents])
    candidates = b.op("Range", b.const(0), _scalar(b, cand_scores, 1), b.const(1))
    top_beams = b.op("Cast", b.op("Less", candidates, b.const(k)),
                     to=TensorProto.INT32)   # [NK]: only the top num_beams may enter the pool
    finished_now = b.op("Mul", hits, top_beams)
    penalised = b.op("Div", top_scores, length_divisor(cur_len))
    one = b.const(np.int32(1), np.int32)
    if early == 1:   # early_stopping=True: a full pool takes no more
        penalised = b.op("Add", penalised, times_neg(b.op("ReduceMin", pool_finished, b.const([1]), keepdims=1)))
    penalised = b.op("Add", penalised, times_neg(b.op("Sub", one, b.op("Unsqueeze", improvable, b.const([1])))))
    penalised = b.op("Add", penalised, times_neg(b.op("Sub", one, finished_now)))
    merged = b.op("Concat", pool_scores, penalised, axis=1)
    _, best = b.op("TopK", merged, b.const([k]), outputs=2, axis=1, largest=1, sorted=1)
    beams = b.const([k])
    b.op("Identity", along(b.op("Concat", pool, top_sequences, axis=1), best, beams), out=[out_pool])
    new_pool_scores = b.op("GatherElements", merged, best, axis=1, out=[out_pool_scores])
    lengths_now = b.op("Expand", cur_len, b.op("Concat", batch, keep, axis=0))
    b.op("GatherElements", b.op("Concat", pool_lengths, lengths_now, axis=1), best, axis=1, out=[out_pool_lengths])
    new_finished = b.op("GatherElements", b.op("Concat", pool_finished, finished_now, axis=1), best, axis=1,
                        out=[out_pool_finished])
    b.op("Identity", along(top_sequences, next_beams, beams), out=[out_running])
    new_running_scores = b.op("GatherElements", running_candidates, next_beams, axis=1, out=[out_running_scores])
    b.op("Reshape", b.op("GatherElements", top_tokens, next_beams, axis=1), b.const([-1]), out=[out_next_tokens])
    # HF's early-stop heuristic at the new length: can the best running beam still beat the pool's worst?
    best_now = b.op("Slice", new_running_scores, b.const([0]), b.const([1]), b.const([1]))   # [B, 1]
    at_length = b.op("Sub", m, b.const([1])) if early == 2 and lp > 0.0 else cur_len
    best_running = b.op("Div", best_now, length_divisor(at_length))
    worst_pool = b.op("Where", b.op("Cast", new_finished, to=TensorProto.BOOL),
                      b.op("ReduceMin", new_pool_scores, b.const([1]), keepdims=1),
                      b.const(np.float32(NEG), np.float32))
    better = b.op("ReduceMax", b.op("Cast", b.op("Greater", best_running, worst_pool), to=TensorProto.INT32),
                  b.const([1]), keepdims=0)   # [B]
    b.op("Mul", improvable, better, out=[out_improvable])


def _greedy_step(b: _Builder, i: list[str], o: list[str]) -> None:
    """HF's greedy step: the top-1 id, pad_token_id for a row that already finished, written at
    cur_len; a row emitting an eos id finishes at cur_len."""
    cand_ids, step, sequences, generated, unfinished = i[:5]
    eos = i[5] if int(b.attrs["has_eos"]) else None
    out_sequences, out_generated, out_unfinished, out_next_tokens = o
    cur_len = _cur_len(b, step, _extent(b, sequences, 1))
    token = b.op("Reshape", b.op("Cast", cand_ids, to=TensorProto.INT64), b.const([-1]))   # [R]
    if eos is not None:
        running = b.op("Cast", unfinished, to=TensorProto.BOOL)
        token = b.op("Where", running, token, b.const(int(b.attrs["pad_token_id"])))
        is_eos = b.op("Equal", b.op("Unsqueeze", token, b.const([1])),
                      b.op("Unsqueeze", b.op("Cast", eos, to=TensorProto.INT64), b.const([0])))   # [R, NE]
        any_eos = b.op("ReduceMax", b.op("Cast", is_eos, to=TensorProto.INT32), b.const([1]), keepdims=0)
        ended = b.op("And", b.op("Cast", any_eos, to=TensorProto.BOOL), running)
        b.op("Where", ended, b.op("Expand", cur_len, b.op("Shape", generated)), generated, out=[out_generated])
        b.op("Cast", b.op("And", running, b.op("Not", ended)), to=TensorProto.INT32, out=[out_unfinished])
    else:
        b.op("Identity", generated, out=[out_generated])
        b.op("Identity", unfinished, out=[out_unfinished])
    positions = b.op("Range", b.const(0), _scalar(b, sequences, 1), b.const(1))
    at_len = b.op("Equal", b.op("Unsqueeze", positions, b.const([0])), cur_len)   # [1, M]
    b.op("Where", at_len, b.op("Unsqueeze", token, b.const([1])), sequences, out=[out_sequences])
    b.op("Identity", token, out=[out_next_tokens])


EXPANSIONS: dict[str, Callable[[_Builder, list[str], list[str]], None]] = {
    "PadfreeEmbLayerNorm": _emb_layernorm,
    "PadfreeAttention": _attention,
    "PadfreeSkipLayerNorm": _skip_layernorm,
    "PadfreeLayerNorm": _layernorm,
    "PadfreeBiasGelu": _bias_gelu,
    "PadfreeRemovePadding": _remove_padding,
    "PadfreeRebuildPadding": _rebuild_padding,
    "PadfreeDecoderSelfAttention": _decoder_self_attention,
    "PadfreeDecoderCrossAttention": _decoder_cross_attention,
    "PadfreeLogitsTopK": _logits_topk,
    "PadfreeBeamReorder": _beam_reorder,
    "PadfreeBeamSearchStep": _beam_search_step,
    "PadfreeGreedyStep": _greedy_step,
}


def _expand_graph(graph: onnx.GraphProto, spec: spec_mod.Spec, counter: list[int]) -> None:
    """Replaces `graph`'s plugin nodes in place, and those of its subgraphs (a Loop's body: the
    generation graph's step); counter numbers the expanded nodes across all of them, so that the
    names the expansions make stay unique in every scope."""
    nodes = []
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _expand_graph(attribute.g, spec, counter)
                del attribute.g.value_info[:]
        if node.domain != spec.namespace:
            nodes.append(node)
            continue
        if node.op_type not in spec.plugins:
            raise ValueError(f"node '{node.name}': {node.op_type} is not in the plugin spec")
        fields = spec.plugins[node.op_type].check_fields(
            {a.name: helper.get_attribute_value(a) for a in node.attribute
             if a.name not in ("plugin_version", "plugin_namespace")})
        builder = _Builder(node, counter[0], fields)
        counter[0] += 1
        EXPANSIONS[node.op_type](builder, list(node.input), list(node.output))
        nodes.extend(builder.nodes)
    copies = [onnx.NodeProto() for _ in nodes]
    for copy, node in zip(copies, nodes):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)


def with_references(model: onnx.ModelProto, spec: spec_mod.Spec | None = None) -> onnx.ModelProto:
    """A copy of `model` in which every plugin node is replaced by its standard-ONNX reference."""
    spec = spec or spec_mod.load()
    missing = set(spec.plugins) - set(EXPANSIONS)
    if missing:
        raise NotImplementedError(f"no ONNX Runtime reference for plugin(s) {sorted(missing)}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _expand_graph(out.graph, spec, [0])
    del out.graph.value_info[:]
    keep = [o for o in out.opset_import if o.domain != spec.namespace]
    del out.opset_import[:]
    out.opset_import.extend(keep)
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx") and o.version < OPSET:
            o.version = OPSET
    return out
