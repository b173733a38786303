"""Small onnx-graphsurgeon helpers the passes share: producers, constants, scalar factors."""
from __future__ import annotations

from typing import Iterable

import numpy as np
import onnx_graphsurgeon as gs


def producer(t: gs.Tensor) -> gs.Node | None:
    return t.inputs[0] if t is not None and len(t.inputs) == 1 else None


def producer_op(t: gs.Tensor, *ops: str) -> gs.Node | None:
    """The node producing t when its op is one of `ops`, else None."""
    node = producer(t)
    return node if node is not None and node.op in ops else None


def const_value(t: gs.Tensor | None) -> np.ndarray | None:
    """The value of a constant tensor: an initializer or the output of a Constant node."""
    if t is None:
        return None
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    node = producer(t)
    if node is not None and node.op == "Constant":
        value = node.attrs.get("value")
        if isinstance(value, gs.Constant):
            return np.asarray(value.values)
        for key in ("value_float", "value_int", "value_floats", "value_ints"):
            if key in node.attrs:
                return np.asarray(node.attrs[key])
    return None


def scalar(t: gs.Tensor | None) -> float | None:
    """The value of a constant holding one element (any rank), else None."""
    v = const_value(t)
    return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None


def split_const(node: gs.Node) -> tuple[gs.Tensor, np.ndarray] | None:
    """For a binary node with exactly one constant operand: (the other operand, the constant)."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    va, vb = const_value(a), const_value(b)
    if (va is None) == (vb is None):
        return None
    return (b, va) if va is not None else (a, vb)


def only_consumer(t: gs.Tensor) -> gs.Node | None:
    return t.outputs[0] if len(t.outputs) == 1 else None


def ancestors(tensors: Iterable[gs.Tensor], stop: set[int] | None = None) -> list[gs.Node]:
    """All nodes that `tensors` depend on (each once), not walking past tensors whose id is in stop."""
    seen: set[int] = set()
    out: list[gs.Node] = []
    todo = [t for t in tensors]
    while todo:
        t = todo.pop()
        if stop and id(t) in stop:
            continue
        for node in t.inputs:
            if id(node) in seen:
                continue
            seen.add(id(node))
            out.append(node)
            todo.extend(node.inputs)
    return out


def describe(node: gs.Node | None) -> str:
    return "nothing" if node is None else f"{node.op} node '{node.name}'"
