"""Self-attention -> one MatMul by the merged [H, 3H] QKV weight + PadfreeAttention.

Anchored on each Softmax: scores = (Q-path) @ (K-path) [* or / scalars] [+ additive mask]; context =
softmax @ (V-path), then Transpose + Reshape back to [B, S, H]. Each path must lead, through
scalings, Reshapes and Transposes only, to a projection Add(MatMul(x, W), b) of one shared x, with
axes that really are [B,N,S,D] for Q and V and [B,N,D,S] for K (padfree.export.passes._axes). The
additive mask must be a key-padding mask: it is evaluated on probe inputs and must be 0 on valid
keys and very negative on padded ones, the same for every query (so causal or learned biases are
refused). The softmax scale is the product of the scalings found on the three paths.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from padfree import kernel_sizes

from ..context import CU_SEQLENS, DIM_T, MAX_SEQLEN, Context, PassReport, log
from ..graph import const_value, describe, only_consumer, producer, producer_op, split_const
from ..probe import evaluate
from . import _axes, _probe_inputs

NAME = "attention"
# Below this an additive mask entry counts as "masked out" (HF uses the dtype's min or -1e4).
_MASKED = -1e4


class NoMatch(Exception):
    pass


@dataclass
class Projection:
    x: gs.Tensor
    weight: np.ndarray  # [H, N*D]
    bias: np.ndarray | None
    out: gs.Tensor
    sources: tuple = ()  # the constant tensors of weight and bias: layers sharing them share the fused ones


def _projection(t: gs.Tensor) -> Projection | None:
    """t = Add(MatMul(x, W), b) or MatMul(x, W) with constant W [in, out] and b [out]."""
    bias, mm_out, bias_source = None, t, None
    add = producer_op(t, "Add")
    if add is not None:
        found = split_const(add)
        if found is None:
            return None
        mm_out, bias = found
        bias = bias.reshape(-1)
        bias_source = next(x for x in add.inputs if x is not mm_out)
    mm = producer_op(mm_out, "MatMul")
    weight = const_value(mm.inputs[1]) if mm is not None else None
    if weight is None or weight.ndim != 2 or (bias is not None and bias.shape != (weight.shape[1],)):
        return None
    return Projection(mm.inputs[0], weight, bias, t, (id(mm.inputs[1]), id(bias_source)))


@dataclass
class Path:
    projection: Projection
    nodes: list[gs.Node]  # Reshape / Transpose / scaling nodes from the projection on
    scale: float


def _path(t: gs.Tensor, what: str) -> Path:
    """Walk back from an attention operand to its projection."""
    nodes, scale = [], 1.0
    while (proj := _projection(t)) is None:
        node = producer(t)
        if node is None:
            raise NoMatch(f"{what}: reached {t.name!r} without finding a projection MatMul")
        if node.op in ("Mul", "Div"):
            scaled = _scaled(node, scale)
            if scaled is None:
                raise NoMatch(f"{what}: {describe(node)} is not a scaling by a constant")
            t, scale = scaled
        elif node.op in ("Reshape", "Transpose"):
            t = node.inputs[0]
        else:
            raise NoMatch(f"{what}: found {describe(node)} where Reshape/Transpose/scaling was expected")
        nodes.append(node)
    return Path(proj, nodes[::-1], scale)


def _scaled(node: gs.Node, scale: float) -> tuple[gs.Tensor, float] | None:
    """For node = Mul(t, c), Mul(c, t) or Div(t, c) with a one-element constant c: (t, scale * c or
    scale / c), else None."""
    found = split_const(node)
    if found is None or found[1].size != 1 or (node.op == "Div" and node.inputs[0] is not found[0]):
        return None
    value = float(found[1].reshape(-1)[0])
    return found[0], (scale / value if node.op == "Div" else scale * value)


def _strip_scaling(t: gs.Tensor) -> tuple[gs.Tensor, float]:
    scale = 1.0
    while (node := producer_op(t, "Mul", "Div")) is not None and (scaled := _scaled(node, scale)) is not None:
        t, scale = scaled
    return t, scale


@dataclass
class Attention:
    q: Path
    k: Path
    v: Path
    heads: int
    head_dim: int
    scale: float
    context: gs.Tensor  # [B, S, H] before the output projection
    mask: gs.Tensor | None


def _match(ctx: Context, softmax: gs.Node, mask_ok: dict[int, str | None]) -> Attention:
    if softmax.attrs.get("axis", -1) not in (-1, 3):
        raise NoMatch(f"softmax over axis {softmax.attrs.get('axis')}, not the key axis")
    # scores [+ mask]
    scores, mask = softmax.inputs[0], None
    add = producer_op(scores, "Add")
    if add is not None:
        for i in (0, 1):
            inner, _ = _strip_scaling(add.inputs[i])
            if producer_op(inner, "MatMul") is not None:
                scores, mask = add.inputs[i], add.inputs[1 - i]
                break
        else:
            raise NoMatch(f"scores come from {describe(add)} with no Q @ K^T operand")
    scores, scale = _strip_scaling(scores)
    qk = producer_op(scores, "MatMul")
    if qk is None:
        raise NoMatch(f"softmax input comes from {describe(producer(scores))}, expected Q @ K^T")
    # probabilities [-> Where(IsNaN(p), 0, p)] -> @ V
    probs = softmax.outputs[0]
    users = {n.op: n for n in probs.outputs}
    if set(users) == {"IsNaN", "Where"} and len(probs.outputs) == 2:
        where = users["Where"]
        if where.inputs[0] is not users["IsNaN"].outputs[0] or where.inputs[2] is not probs:
            raise NoMatch(f"{describe(where)} after the softmax is not the NaN guard")
        probs = where.outputs[0]
    pv = only_consumer(probs)
    if pv is None or pv.op != "MatMul" or pv.inputs[0] is not probs:
        raise NoMatch(f"softmax output feeds {[describe(n) for n in probs.outputs]}, expected one MatMul @ V")
    q, k, v = _path(qk.inputs[0], "Q"), _path(qk.inputs[1], "K"), _path(pv.inputs[1], "V")
    x = q.projection.x
    if k.projection.x is not x or v.projection.x is not x:
        raise NoMatch("Q, K and V projections do not share one input")
    first = next((n for n in q.nodes if n.op == "Reshape"), None)
    if first is None:
        raise NoMatch("Q path has no head-splitting Reshape")
    known: dict[int, _axes.Layout] = {id(t): (("B",), ("S",)) for t in ctx.original_inputs.values()}
    try:
        entries = _axes._entries(first.inputs[1], known)
    except _axes.AxesError as e:
        raise NoMatch(f"Q head split: {e}") from e
    head_dim = entries[-1] if entries and isinstance(entries[-1], int) else 0
    width = q.projection.weight.shape[1]
    if head_dim <= 0 or width % head_dim or any(p.projection.weight.shape[1] != width for p in (k, v)):
        raise NoMatch(f"head split {entries} does not divide projections of width {width}")
    heads = width // head_dim
    sizes = _axes.sizes_for(heads, head_dim)
    want = {"Q": (("B",), ("N",), ("S",), ("D",)), "K": (("B",), ("N",), ("D",), ("S",)),
            "V": (("B",), ("N",), ("S",), ("D",))}
    for what, path in (("Q", q), ("K", k), ("V", v)):
        known[id(path.projection.out)] = _axes.BSH
        try:
            got = _axes.follow(_axes.BSH, path.nodes, known, sizes)
        except _axes.AxesError as e:
            raise NoMatch(f"{what} path: {e}") from e
        if got != want[what]:
            raise NoMatch(f"{what} reaches the attention with axes {_axes.show(got)}, "
                          f"expected {_axes.show(want[what])}")
    known[id(pv.outputs[0])] = want["V"]
    context, tail = pv.outputs[0], []
    while len(tail) < 4 and (node := only_consumer(context)) is not None and node.op in ("Transpose", "Reshape"):
        tail.append(node)
        context = node.outputs[0]
    try:
        got = _axes.follow(want["V"], tail, known, sizes)
    except _axes.AxesError as e:
        raise NoMatch(f"context: {e}") from e
    if got != _axes.BSH:
        raise NoMatch(f"context leaves with axes {_axes.show(got)}, expected {_axes.show(_axes.BSH)}")
    if mask is not None:
        if id(mask) not in mask_ok:
            mask_ok[id(mask)] = _check_padding_mask(ctx, mask)
        if mask_ok[id(mask)] is not None:
            raise NoMatch(f"additive mask: {mask_ok[id(mask)]}")
    # A real attention, but one the kernels were not built for: fused, it would fail at its first run.
    problem = kernel_sizes.attention_problem(heads, head_dim)
    if problem is not None:
        raise NoMatch(f"{heads} heads x {head_dim}: {problem}")
    return Attention(q, k, v, heads, head_dim, scale * q.scale * k.scale * v.scale, context, mask)


def _check_padding_mask(ctx: Context, mask: gs.Tensor) -> str | None:
    """None when `mask` is 0 on valid keys and very negative on padded ones for every query."""
    try:
        (value,) = evaluate(ctx.graph, [mask], _probe_inputs.feeds(ctx, [mask]))
    except Exception as e:  # noqa: BLE001 - reported as a non-match
        return f"could not evaluate it ({type(e).__name__}: {e})"
    keys = _probe_inputs.PROBE_MASK
    b, s = keys.shape
    if value.ndim < 2 or value.shape[0] not in (1, b) or value.shape[-1] != s:
        return f"shape {list(value.shape)} is not [batch, ..., keys] for the probe batch {b}x{s}"
    full = np.broadcast_to(value, (b,) + value.shape[1:]).reshape(b, -1, s)
    valid = np.broadcast_to(keys[:, None, :] == 1, full.shape)
    if not (np.all(full[valid] == 0) and np.all(full[~valid] <= _MASKED)):
        return "it is not 0 on valid keys and <= -1e4 on padded ones (not a key-padding mask)"
    return None


def _merged(ctx: Context, att: Attention, merged: dict) -> tuple[gs.Constant, gs.Constant]:
    """The [H, 3H] QKV weight and [3H] bias, made once per set of Q/K/V constants (layers that share
    their weights, as ALBERT's, share these too)."""
    q, k, v = att.q.projection, att.k.projection, att.v.projection
    key = (q.sources, k.sources, v.sources)
    if key not in merged:
        weight = np.concatenate([q.weight, k.weight, v.weight], axis=1)
        zeros = np.zeros(q.weight.shape[1], q.weight.dtype)
        bias = np.concatenate([p.bias if p.bias is not None else zeros for p in (q, k, v)])
        merged[key] = ctx.const("qkv_weight", weight), ctx.const("qkv_bias", bias)
    return merged[key]


def _fuse(ctx: Context, att: Attention, merged: dict) -> None:
    q = att.q.projection
    weight, bias = _merged(ctx, att, merged)
    hidden = att.heads * att.head_dim
    qkv = ctx.variable("qkv", weight.values.dtype, [DIM_T, 3 * hidden])
    ctx.node("MatMul", [q.x, weight], [qkv])
    out = att.context
    producer(out).outputs.clear()
    out.shape, out.dtype = [DIM_T, hidden], weight.values.dtype
    ctx.plugin("PadfreeAttention",
               [qkv, bias, ctx.packed(CU_SEQLENS), ctx.packed(MAX_SEQLEN)], [out],
               {"num_heads": att.heads, "head_dim": att.head_dim, "softmax_scale": att.scale})


def run(graph: gs.Graph, ctx: Context) -> gs.Graph:
    report = PassReport(NAME)
    ctx.reports.append(report)
    mask_ok: dict[int, str | None] = {}
    softmaxes = [n for n in graph.nodes if n.op == "Softmax"]
    matches = []
    for i, node in enumerate(softmaxes):
        try:
            matches.append(_match(ctx, node, mask_ok))
        except NoMatch as e:
            report.miss(f"attention #{i} (at Softmax '{node.name}'): {e}")
    merged: dict = {}
    for i, att in enumerate(matches):
        _fuse(ctx, att, merged)
        report.add("PadfreeAttention")
        log.debug("attention: fused #%d: %d heads x %d, scale %.6g, mask %s", i, att.heads, att.head_dim,
                  att.scale, "key-padding" if att.mask is not None else "none")
    return graph.cleanup()
