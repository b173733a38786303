"""Output types and shapes of plugin nodes, so the rewritten model passes full shape inference.

ONNX shape inference knows no plugin ops; these rules (one per plugin of the spec) give each plugin
output its type and shape from its inputs' inferred ones, alternating with onnx's inference until
nothing changes.
"""
from __future__ import annotations

from typing import Callable

import onnx
from onnx import TensorProto, helper, shape_inference

from .context import DIM_B1, DIM_T

Dims = list  # entries: int or str (symbolic) or None
TypeShape = tuple[int, Dims]


def _same_as(i: int) -> Callable:
    return lambda node, ins: [ins[i]]


def _emb(node, ins):
    ids, word = ins[0], ins[3 if _attr(node, "has_token_type") else 2]
    return [(word[0], [ids[1][0], word[1][1]])]


def _attention(node, ins):
    qkv = ins[0]
    return [(qkv[0], [qkv[1][0], _attr(node, "num_heads") * _attr(node, "head_dim")])]


def _remove_padding(node, ins):
    t, s = ins[0]
    return [(t, [DIM_T] + s[2:]), (TensorProto.INT32, [DIM_B1]), (TensorProto.INT32, [])]


def _rebuild_padding(node, ins):
    (t, s), (_, mask) = ins[0], ins[2]
    return [(t, mask[:2] + s[1:])]


RULES = {
    "PadfreeEmbLayerNorm": _emb,
    "PadfreeAttention": _attention,
    "PadfreeSkipLayerNorm": _same_as(0),
    "PadfreeLayerNorm": _same_as(0),
    "PadfreeBiasGelu": _same_as(0),
    "PadfreeRemovePadding": _remove_padding,
    "PadfreeRebuildPadding": _rebuild_padding,
}


def _attr(node: onnx.NodeProto, name: str):
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def _known(vi: onnx.ValueInfoProto) -> TypeShape | None:
    tt = vi.type.tensor_type
    if not tt.elem_type or not tt.HasField("shape"):
        return None
    return tt.elem_type, [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]


def infer(model: onnx.ModelProto, domain: str, max_rounds: int = 16) -> onnx.ModelProto:
    """Shape inference through plugin nodes; raises ValueError naming a tensor left without a shape."""
    for _ in range(max_rounds):
        model = shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        g = model.graph
        known = {vi.name: _known(vi) for vi in list(g.input) + list(g.value_info) + list(g.output)}
        known.update({t.name: (t.data_type, list(t.dims)) for t in g.initializer})
        added = []
        for node in g.node:
            if node.domain != domain or all(known.get(o) for o in node.output if o):
                continue
            ins = [known.get(i) for i in node.input]
            if any(x is None for x in ins):
                continue
            for name, (elem, dims) in zip(node.output, RULES[node.op_type](node, ins)):
                if name and not known.get(name):
                    added.append(helper.make_tensor_value_info(name, elem, dims))
        if not added:
            break
        outputs = {o.name for o in g.output}
        g.value_info.extend(vi for vi in added if vi.name not in outputs)
        for o in g.output:
            vi = next((v for v in added if v.name == o.name), None)
            if vi is not None:
                o.CopyFrom(vi)
    known = {vi.name for vi in list(model.graph.value_info) + list(model.graph.output) if _known(vi)}
    known |= {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    missing = [o for n in model.graph.node for o in n.output if o and o not in known]
    if missing:
        raise ValueError(f"shape inference left {len(missing)} tensor(s) without a shape, e.g. {missing[:5]}")
    return model
