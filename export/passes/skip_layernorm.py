"""LayerNorm(residual + (MatMul(...) + bias)) -> PadfreeSkipLayerNorm(x, residual, bias, gamma, beta).

The dense layer's bias Add is folded into the node's bias input when nothing else reads the sum;
otherwise the node gets a zero bias and the Add stays.

Pre-LN layers (M2M100, mBART) normalize a residual stream that goes on past the LayerNorm: the sum
is read again by the next residual Add, so fusing it would save nothing (the Add stays), and the
first layer's LayerNorm reads the embedding plugin's rows. Such a LayerNorm stays ONNX's
LayerNormalization, which is row-wise and so as right on packed rows as on padded ones; it is
reported as kept, not as a pattern that failed to match.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..context import DIM_T, Context, PassReport, log
from ..graph import const_value, describe, producer, producer_op, split_const
from ._layernorm import match_layernorm

NAME = "skip_layernorm"


def _biased(t: gs.Tensor) -> tuple[gs.Tensor, gs.Tensor] | None:
    """t = Add(MatMul(...), constant bias [H]) read only by the residual Add: (MatMul output, bias)."""
    add = producer_op(t, "Add")
    if add is None or len(t.outputs) != 1:
        return None
    found = split_const(add)
    if found is None or found[1].ndim != 1 or producer_op(found[0], "MatMul") is None:
        return None
    bias = next(x for x in add.inputs if x is not found[0])
    return found[0], bias


def run(graph: gs.Graph, ctx: Context) -> gs.Graph:
    report = PassReport(NAME)
    ctx.reports.append(report)
    kept = 0
    for node in [n for n in graph.nodes if n.op == "LayerNormalization"]:
        where = f"LayerNormalization '{node.name}'"
        add = producer_op(node.inputs[0], "Add")
        source = producer(node.inputs[0])
        residual = add is not None and not any(const_value(x) is not None for x in add.inputs)
        readers = len(node.inputs[0].outputs)
        if (residual and readers > 1) or (source is not None and source.domain == ctx.spec.namespace):
            kept += 1   # pre-LN: see the module docstring
            continue
        if not residual or readers != 1:
            report.miss(f"{where}: input comes from {describe(source)}, expected a residual Add of two activations")
            continue
        ln = match_layernorm(ctx, node)
        if isinstance(ln, str):
            report.miss(ln)
            continue
        a, b = add.inputs
        gamma = const_value(ln.gamma)
        folded_a = _biased(a)
        folded = folded_a or _biased(b)
        if folded is not None:
            x, bias = folded
            residual = b if folded_a else a
        else:
            x, residual = (b, a) if producer_op(b, "MatMul") is not None else (a, b)
            bias = ctx.const("skip_bias", np.zeros(gamma.shape, gamma.dtype))
        out = node.outputs[0]
        node.outputs.clear()
        out.shape = [DIM_T, gamma.shape[0]]
        ctx.plugin("PadfreeSkipLayerNorm", [x, residual, bias, ln.gamma, ln.beta], [out], {"epsilon": ln.epsilon})
        report.add("PadfreeSkipLayerNorm")
        log.debug("skip_layernorm: fused %s (bias %s)", node.name, "folded" if folded else "zero")
    if kept:
        report.notes.append(f"{kept} pre-LN LayerNormalization(s) kept as ONNX's (row-wise: the same on packed rows)")
    return graph.cleanup()
