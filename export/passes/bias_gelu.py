"""GELU of the feed-forward block -> PadfreeBiasGelu(x, bias) with the dense layer's bias folded in.

Accepted forms: the Gelu op (opset 20, approximate "none" or "tanh"); the erf decomposition
x * 0.5 * (1 + erf(x / sqrt(2))) and the tanh decomposition
x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), with the three factors multiplied in any
order torch writes them.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from ..context import DIM_T, Context, PassReport, log
from ..graph import const_value, describe, only_consumer, producer, producer_op, scalar, split_const

NAME = "bias_gelu"


def _by_const(node: gs.Node | None, op: str, value: float, rel: float = 1e-5) -> gs.Tensor | None:
    """For node = op(t, c) (c first too for commutative ops) with scalar c close to value: t."""
    if node is None or node.op != op:
        return None
    found = split_const(node)
    if found is None or found[1].size != 1 or not math.isclose(float(found[1].reshape(-1)[0]), value, rel_tol=rel):
        return None
    if op in ("Div", "Pow") and node.inputs[0] is not found[0]:
        return None
    return found[0]


def _factors(node: gs.Node, x: gs.Tensor, depth: int = 2) -> list[gs.Tensor]:
    """Operands of a tree of single-use Muls (not expanding x itself)."""
    out = []
    for t in node.inputs:
        inner = producer_op(t, "Mul") if t is not x else None
        out.extend(_factors(inner, x, depth - 1) if inner is not None and len(t.outputs) == 1 and depth
                   else [t])
    return out


def _times_half_x(p: gs.Tensor, x: gs.Tensor) -> gs.Tensor | None:
    """The output y of the Muls computing x * 0.5 * p downstream of p, if they do."""
    node, found = only_consumer(p), None
    for _ in range(2):
        if node is None or node.op != "Mul":
            break
        leaves = _factors(node, x)
        halves = [t for t in leaves if scalar(t) == 0.5]
        if len(leaves) == 3 and sum(t is x for t in leaves) == 1 and sum(t is p for t in leaves) == 1 and halves:
            found = node.outputs[0]
        node = only_consumer(node.outputs[0])
    return found


def _erf_gelu(erf: gs.Node) -> tuple[gs.Tensor, gs.Tensor, int] | None:
    src = producer(erf.inputs[0])
    x = _by_const(src, "Div", math.sqrt(2)) or _by_const(src, "Mul", 1 / math.sqrt(2))
    plus1 = only_consumer(erf.outputs[0])
    if x is None or _by_const(plus1, "Add", 1.0) is not erf.outputs[0]:
        return None
    y = _times_half_x(plus1.outputs[0], x)
    return (x, y, 0) if y is not None else None


def _tanh_gelu(tanh: gs.Node) -> tuple[gs.Tensor, gs.Tensor, int] | None:
    inner = _by_const(producer(tanh.inputs[0]), "Mul", math.sqrt(2 / math.pi), rel=1e-4)
    add = producer_op(inner, "Add") if inner is not None else None
    plus1 = only_consumer(tanh.outputs[0])
    if add is None or _by_const(plus1, "Add", 1.0) is not tanh.outputs[0]:
        return None
    for x, cubic in (add.inputs, add.inputs[::-1]):
        cube = _by_const(producer(cubic), "Mul", 0.044715, rel=1e-3)
        if cube is not None and _by_const(producer(cube), "Pow", 3.0) is x:
            y = _times_half_x(plus1.outputs[0], x)
            return (x, y, 1) if y is not None else None
    return None


def _gelu_op(node: gs.Node) -> tuple[gs.Tensor, gs.Tensor, int] | None:
    return node.inputs[0], node.outputs[0], int(node.attrs.get("approximate", "none") == "tanh")


def _split_bias(x: gs.Tensor, y: gs.Tensor) -> tuple[gs.Tensor, gs.Tensor] | None:
    """x = Add(MatMul(...), bias [N]) read only by this GELU: (MatMul output, bias)."""
    add = producer_op(x, "Add")
    found = split_const(add) if add is not None else None
    if found is None or found[1].ndim != 1 or producer_op(found[0], "MatMul") is None:
        return None
    if not all(_leads_to(u, y) for u in x.outputs):
        return None
    return found[0], next(t for t in add.inputs if t is not found[0])


def _leads_to(node: gs.Node, y: gs.Tensor, limit: int = 12) -> bool:
    seen, todo = set(), [node]
    while todo and len(seen) <= limit:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if any(t is y for t in n.outputs):
            return True
        todo.extend(c for t in n.outputs for c in t.outputs)
    return False


def run(graph: gs.Graph, ctx: Context) -> gs.Graph:
    report = PassReport(NAME)
    ctx.reports.append(report)
    matchers = {"Erf": _erf_gelu, "Tanh": _tanh_gelu, "Gelu": _gelu_op}
    for node in [n for n in graph.nodes if n.op in matchers]:
        found = matchers[node.op](node)
        if found is None:
            if node.op != "Tanh":  # a Tanh alone is no GELU (BERT's pooler has one)
                report.miss(f"{describe(node)} is not part of a recognised GELU")
            continue
        x, y, approximate = found
        if producer_op(x, "Gemm") is not None:
            # a task head on each sequence's first row (ELECTRA's classifier: dense, GELU, out_proj),
            # exported as Gemm on [batch, H]: not token rows, and a few ONNX ops per sequence
            report.notes.append(f"GELU at {describe(node)} of a per-sequence head left as ONNX ops")
            continue
        split = _split_bias(x, y)
        if split is not None:
            x, bias = split
            width = const_value(bias).shape[0]
        else:
            mm = producer_op(x, "MatMul")
            w = const_value(mm.inputs[1]) if mm is not None else None
            if w is None:
                report.miss(f"GELU at {describe(node)}: its input is not a MatMul by a constant, width unknown")
                continue
            width = w.shape[-1]
            bias = ctx.const("gelu_bias", np.zeros(width, w.dtype))
        producer(y).outputs.clear()
        y.shape = [DIM_T, width]
        ctx.plugin("PadfreeBiasGelu", [x, bias], [y], {"approximate": approximate})
        report.add("PadfreeBiasGelu")
        log.debug("bias_gelu: fused at %s (%s form, bias %s)", node.name, "tanh" if approximate else "erf",
                  "folded" if split else "zero")
    return graph.cleanup()
