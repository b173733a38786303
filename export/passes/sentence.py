"""Sentence pooling (task sentence-similarity) on packed rows: replaces the exported pooling.

The plain export pools in torch on the padded batch (mask products, sums over the sequence axis);
here each sequence is a segment of the encoder's packed rows [T, H], bounded by cu_seqlens:
  cls   Gather(hidden, cu_seqlens[:-1])                                  (as the pooler pass)
  mean  ScatterElements(zeros[B, H], segment, hidden, reduction="add") / lengths
  max   ScatterElements(finfo.min[B, H], segment, hidden, reduction="max")   (opset >= 18)
with segment[t] the sequence of row t: ones scattered at cu_seqlens[1:-1] into zeros[T], then a
CumSum. Then x / max(||x||_2, 1e-12) where the model normalizes. Nothing is [B, T] or [B, S, H]:
the work and memory are O(T * H), like the encoder's, and each sequence's rows are summed on their
own (a prefix-sum difference over all T rows would lose precision to the rows before the sequence).
Sequences must be non-empty (as everywhere in padfree's packed form).
The metadata padfree.pooling / padfree.normalize (export.exporter) say which; the encoder's output is
the last PadfreeSkipLayerNorm's.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..context import CU_SEQLENS, Context, PassReport, log

NAME = "sentence"
OUTPUT = "sentence_embedding"


def run(graph: gs.Graph, ctx: Context) -> gs.Graph:
    mode = ctx.metadata.get("padfree.pooling")
    if mode is None:
        return graph
    report = PassReport(NAME)
    ctx.reports.append(report)
    last = [n for n in graph.toposort().nodes if n.op == "PadfreeSkipLayerNorm" and n.domain == ctx.spec.namespace]
    if not last:
        report.miss("sentence pooling: no PadfreeSkipLayerNorm gives the encoder's packed output")
        return graph
    hidden = last[-1].outputs[0]
    pooled = _pool(ctx, hidden, mode)
    if ctx.metadata.get("padfree.normalize") == "1":
        pooled = _normalize(ctx, pooled)
    old = next((t for t in graph.outputs if t.name == OUTPUT), None)
    if old is not None:
        old.name = ctx.unique("exported_sentence_embedding")
    out = ctx.variable(OUTPUT, hidden.dtype)
    ctx.node("Identity", [pooled], [out])
    out.name = OUTPUT
    graph.outputs = [out]
    graph.cleanup(remove_unused_graph_inputs=False)
    report.notes.append(f"{mode} pooling per sequence on packed rows"
                        + (", L2-normalized" if ctx.metadata.get("padfree.normalize") == "1" else ""))
    log.debug("sentence: %s pooling of %s", mode, hidden.name)
    return graph


def _rows(ctx: Context, op: str, inputs: list, **attrs) -> gs.Variable:
    """A node reading packed rows whose output is not token rows (the layout pass leaves it)."""
    out = ctx.variable(op.lower())
    node = ctx.node(op, inputs, [out], **attrs)
    ctx.batch_rows.add(id(node))
    return out


def _op(ctx: Context, op: str, inputs: list, **attrs) -> gs.Variable:
    out = ctx.variable(op.lower())
    ctx.node(op, inputs, [out], **attrs)
    return out


def _pool(ctx: Context, hidden: gs.Tensor, mode: str) -> gs.Variable:
    i64 = lambda v: ctx.const("c", np.array(v, np.int64))  # noqa: E731
    cu = ctx.packed(CU_SEQLENS)
    starts = _op(ctx, "Slice", [cu, i64([0]), i64([-1])])
    if mode == "cls":
        return _rows(ctx, "Gather", [hidden, starts], axis=0)
    ends = _op(ctx, "Slice", [cu, i64([1]), i64([2**62])])
    shape = _rows(ctx, "Shape", [hidden])                                          # [T, H]
    rows = _op(ctx, "Slice", [shape, i64([0]), i64([1])])                           # [T]
    width = _op(ctx, "Slice", [shape, i64([1]), i64([2])])                          # [H]
    batch = _op(ctx, "Sub", [_op(ctx, "Shape", [cu]), i64([1])])                    # [B]
    # segment[t]: ones at the starts of sequences 1..B-1, summed along the rows
    inner = _op(ctx, "Cast", [_op(ctx, "Slice", [cu, i64([1]), i64([-1])])], to=7)
    zeros = _op(ctx, "ConstantOfShape", [rows], value=ctx.const("c", np.zeros(1, np.int64)))
    ones = _op(ctx, "ConstantOfShape", [_op(ctx, "Shape", [inner])], value=ctx.const("c", np.ones(1, np.int64)))
    marks = _op(ctx, "ScatterElements", [zeros, inner, ones], axis=0, reduction="add")
    segment = _op(ctx, "CumSum", [marks, i64(0)])                                   # [T] int64
    index = _rows(ctx, "Expand", [_op(ctx, "Unsqueeze", [segment, i64([1])]), shape])  # [T, H]
    fill = 0.0 if mode == "mean" else float(np.finfo(np.float32).min)
    init = _rows(ctx, "CastLike", [_op(ctx, "ConstantOfShape", [_op(ctx, "Concat", [batch, width], axis=0)],
                                       value=ctx.const("c", np.array([fill], np.float32))), hidden])
    reduced = _rows(ctx, "ScatterElements", [init, index, hidden], axis=0,
                    reduction="add" if mode == "mean" else "max")                    # [B, H]
    if mode == "max":
        return reduced
    lengths = _op(ctx, "Unsqueeze", [_op(ctx, "Sub", [ends, starts]), i64([1])])      # [B, 1]
    count = _rows(ctx, "CastLike", [_op(ctx, "Max", [_op(ctx, "Cast", [lengths], to=1),
                                                      ctx.const("c", np.array(1e-9, np.float32))]), hidden])
    return _op(ctx, "Div", [reduced, count])


def _normalize(ctx: Context, x: gs.Tensor) -> gs.Variable:
    norm = _op(ctx, "ReduceL2", [x, ctx.const("c", np.array([1], np.int64))], keepdims=1)
    eps = _op(ctx, "CastLike", [ctx.const("c", np.array(1e-12, np.float32)), x])
    return _op(ctx, "Div", [x, _op(ctx, "Max", [norm, eps])])
