"""Make every tensor consistent with the I/O form and drop what the fusions left unused.

Each token-level tensor is either PACKED ([T, ...] rows) or DENSE (the exported [B, S, ...] layout).
Row-wise ops (MatMul by a constant, elementwise with constants over the last axis, LayerNorm over
the last axis, casts, activations) on packed rows give packed rows; every other op on token data
needs the dense layout, so a PadfreeRebuildPadding goes in front of it, and a PadfreeRemovePadding
goes in front of a plugin that gets dense input. After a full fusion no DENSE tensor remains and
the attention-mask plumbing is unused, so cleanup removes it; after a partial one (allow_partial)
the unfused parts run on padded rows between such bridges, and the report lists them.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..context import ATTENTION_MASK, CU_SEQLENS, Context, PassReport, log
from ..graph import const_value

NAME = "layout"
PACKED, DENSE = "packed", "dense"

_UNARY = {"Erf", "Tanh", "Relu", "Sigmoid", "Sqrt", "Neg", "Abs", "Exp", "Log", "Cast", "Identity", "Gelu",
          "Reciprocal", "Softplus"}
_BINARY = {"Add", "Sub", "Mul", "Div", "Pow"}


def _rowwise(node: gs.Node, kinds: dict[int, str]) -> bool:
    """Whether node maps each token row on its own, so that it commutes with (un)packing."""
    def per_feature_const(t: gs.Tensor) -> bool:
        v = const_value(t)
        return v is not None and (v.ndim <= 1 or all(d == 1 for d in v.shape[:-1]) and v.ndim <= 3)

    def token(t: gs.Tensor) -> bool:
        return kinds.get(id(t)) is not None

    if node.op in _UNARY:
        return True
    if node.op in _BINARY:
        return all(token(t) or per_feature_const(t) for t in node.inputs)
    if node.op == "MatMul":
        v = const_value(node.inputs[1])
        return token(node.inputs[0]) and v is not None and v.ndim == 2
    if node.op == "LayerNormalization":
        return node.attrs.get("axis", -1) == -1 and all(per_feature_const(t) for t in node.inputs[1:])
    if node.op in ("Split", "Squeeze"):
        return token(node.inputs[0]) and _on_last_axis(node)
    return False


def _on_last_axis(node: gs.Node) -> bool:
    """A Split or a Squeeze of the last axis only (a QA head's split of [.., 2] into start / end
    logits). Its axis is made -1: on packed rows the last axis has another positive index."""
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None

    def last(axis) -> bool:
        return axis == -1 or (rank is not None and rank >= 3 and axis == rank - 1)

    if node.op == "Split":
        if not last(node.attrs.get("axis", 0)):
            return False
        node.attrs["axis"] = -1
        return True
    axes = const_value(node.inputs[1]) if len(node.inputs) > 1 else None
    if axes is None or axes.size != 1 or not last(int(axes.reshape(-1)[0])):
        return False
    node.inputs[1] = gs.Constant(f"{node.name}/last_axis", np.array([-1], np.int64))
    return True


def _replace_original_inputs(ctx: Context, kinds: dict[int, str]) -> list[str]:
    """Original inputs still read (by unfused parts) become tensors computed from the new interface."""
    made = []
    for name, var in ctx.original_inputs.items():
        if not var.outputs:
            continue
        if name == ATTENTION_MASK:
            source = ctx.padded_mask()
        elif ctx.io == "padded":
            ctx.packed(name)
            source = ctx.new_inputs[name]
        else:
            source = ctx.variable(f"padded_{name}", np.int32)
            ctx.plugin("PadfreeRebuildPadding", [ctx.packed(name), ctx.packed(CU_SEQLENS), ctx.padded_mask()],
                       [source], {}, token_rows=False)
        ctx.node("Cast", [source], [var], to=_onnx_type(var.dtype))
        kinds[id(var)] = DENSE
        made.append(name)
    return made


def _swap(node: gs.Node, kinds: list, kind: str, convert) -> None:
    for i, k in enumerate(kinds):
        if k == kind:
            node.inputs[i] = convert(node.inputs[i])


def _onnx_type(dtype) -> int:
    from onnx import helper
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype if dtype is not None else np.int64))


def run(graph: gs.Graph, ctx: Context) -> gs.Graph:
    report = PassReport(NAME)
    ctx.reports.append(report)
    kinds: dict[int, str] = {}
    for name, t in ctx.new_inputs.items():
        if name in ("input_ids", "token_type_ids"):
            kinds[id(t)] = PACKED if ctx.io == "packed" else DENSE
    rebuilt = _replace_original_inputs(ctx, kinds)
    if rebuilt:
        report.notes.append(f"original inputs rebuilt for unfused parts: {rebuilt}")
    graph.toposort()
    cache: dict[tuple[str, int], gs.Tensor] = {}

    def convert(t: gs.Tensor, to: str) -> gs.Tensor:
        key = (to, id(t))
        if key not in cache:
            out = ctx.variable("packed" if to == PACKED else "padded", t.dtype)
            if to == PACKED:
                unused = [ctx.variable("cu_seqlens_unused", np.int32), ctx.variable("total_tokens_unused", np.int32)]
                ctx.plugin("PadfreeRemovePadding", [t, ctx.padded_mask()], [out, *unused], {}, token_rows=False)
            else:
                ctx.plugin("PadfreeRebuildPadding", [t, ctx.packed(CU_SEQLENS), ctx.padded_mask()], [out], {},
                           token_rows=False)
            kinds[id(out)] = to
            cache[key] = out
        return cache[key]

    dense_nodes: list[gs.Node] = []
    for node in list(graph.nodes):
        token_in = [kinds.get(id(t)) for t in node.inputs]
        if node.domain == ctx.spec.namespace:
            if node.op == "PadfreeRemovePadding":
                kinds[id(node.outputs[0])] = PACKED
                continue
            if node.op == "PadfreeRebuildPadding":
                kinds[id(node.outputs[0])] = DENSE
                continue
            _swap(node, token_in, DENSE, lambda t: convert(t, PACKED))
            kinds.update({id(t): PACKED for t in node.outputs})
        elif id(node) in ctx.batch_rows:
            if token_in[0] == DENSE:
                node.inputs[0] = convert(node.inputs[0], PACKED)
        elif not any(token_in):
            continue
        elif all(k in (PACKED, None) for k in token_in) and (id(node) in ctx.row_maps or _rowwise(node, kinds)):
            kinds.update({id(t): PACKED for t in node.outputs})
        else:
            _swap(node, token_in, PACKED, lambda t: convert(t, DENSE))
            if node.op not in ("Shape", "Size"):
                kinds.update({id(t): DENSE for t in node.outputs})
            dense_nodes.append(node)

    want = PACKED if ctx.io == "packed" else DENSE
    outputs = []
    for t in graph.outputs:
        kind = kinds.get(id(t))
        if kind is not None and kind != want:
            name, t.name = t.name, ctx.unique(t.name)
            t = convert(t, want)
            t.name = name
        outputs.append(t)
    graph.outputs = outputs
    graph.inputs = ctx.interface_inputs()
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    alive = {id(n) for n in graph.nodes}
    # Nodes this pass made to rebuild original inputs are bridges, not unfused model parts.
    dense_nodes = [n for n in dense_nodes if id(n) in alive and not n.name.startswith("padfree/")]
    if dense_nodes:
        ops = sorted({n.op for n in dense_nodes})
        report.miss(f"{len(dense_nodes)} node(s) still need the padded layout (not fused), ops {ops}, "
                    f"e.g. {dense_nodes[0].op} '{dense_nodes[0].name}'")
    log.debug("layout: %d node(s) on padded rows", len(dense_nodes))
    return graph
