"""Types and shapes of every tensor of a rewritten model, in one topological pass.

ONNX's shape inference knows no plugin ops and stops at the first one; re-running it after each
plugin node costs a whole-model inference per node (minutes on BERT-large). Instead each node is
inferred once, in graph order: standard ops through ONNX's per-node inference (with the values of
constant inputs, which Slice, Gather and Unsqueeze need), plugin ops from the node spec
(plugins/spec/plugins.json), whose port shapes are expressions over the inputs' dims and the node's
fields ("T", "B+1", "num_heads*head_dim", "..."; export/ports.py). The same pass checks that every
plugin input has the shape the spec asks for, so a plugin wired to the wrong tensor fails here, not
in an engine.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

from . import ports
from .context import DIM_T
from .ports import Dim
from .spec import Plugin, Spec

_CONST_LIMIT = 1024  # constant inputs up to this many elements are passed to ONNX's inference as data


class ShapeError(ValueError):
    """A tensor whose shape cannot be inferred, or a plugin input that contradicts the spec."""


def output_dims(model: onnx.ModelProto) -> dict[str, list[Dim]]:
    """The dims a model declares for its graph outputs (names, sizes, None where unknown): what a
    rewrite of it passes to infer() as `declared`, so that its interface keeps its names."""
    return {o.name: [d.dim_param or d.dim_value or None for d in o.type.tensor_type.shape.dim]
            for o in model.graph.output}


def infer_checked(model: onnx.ModelProto, spec: Spec, declared: dict[str, list[Dim]], what: str) -> onnx.ModelProto:
    """infer(), then onnx.checker in full: how every graph padfree writes is finished. An ExportError
    "{what} does not check: ..." where either fails."""
    from .errors import ExportError
    try:
        model = infer(model, spec, declared)
        onnx.checker.check_model(model, full_check=True)
    except (ShapeError, onnx.checker.ValidationError, shape_inference.InferenceError) as e:
        raise ExportError(f"{what} does not check: {e}") from e
    return model


def infer(model: onnx.ModelProto, spec: Spec, declared: dict[str, list[Dim]] | None = None) -> onnx.ModelProto:
    """Fill model.graph.value_info and the outputs' types; raise ShapeError naming what failed.

    declared: names of graph outputs -> dims to keep where inference finds only an anonymous
    symbol (e.g. the batch axis of a row gathered per sequence), so the interface keeps its names.
    """
    g = model.graph
    opsets = {o.domain or "": o.version for o in model.opset_import}
    known: dict[str, tuple[int, list[Dim]]] = {}
    data: dict[str, TensorProto] = {}
    for t in g.initializer:
        known[t.name] = (t.data_type, list(t.dims))
        if _numel(t.dims) <= _CONST_LIMIT:
            data[t.name] = t
    for vi in g.input:
        known[vi.name] = _type_shape(vi.type)
    for node in g.node:
        if node.domain == spec.namespace:
            outs = _plugin_outputs(spec[node.op_type], node, [known.get(i) if i else None for i in node.input])
        else:
            outs = _standard_outputs(node, known, data, opsets, model.ir_version)
        for name, ts in zip(node.output, outs):
            if name:
                known[name] = ts
        if node.op_type == "Constant" and not node.domain:
            data[node.output[0]] = numpy_helper.from_array(numpy_helper.to_array(node.attribute[0].t),
                                                           node.output[0])
    missing = [o for n in g.node for o in n.output if o and (o not in known or known[o][1] is None)]
    if missing:
        raise ShapeError(f"could not infer the shape of {len(missing)} tensor(s), e.g. {missing[:5]}")

    outputs = {o.name for o in g.output}
    inputs = {i.name for i in g.input} | {t.name for t in g.initializer}
    del g.value_info[:]
    g.value_info.extend(helper.make_tensor_value_info(name, elem, dims) for name, (elem, dims) in known.items()
                        if name not in outputs and name not in inputs)
    for o in g.output:
        elem, dims = known[o.name]
        dims = _keep_names(dims, (declared or {}).get(o.name))
        o.CopyFrom(helper.make_tensor_value_info(o.name, elem, dims))
    return model


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _type_shape(tp: onnx.TypeProto) -> tuple[int, list[Dim] | None]:
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type, None
    return tt.elem_type, [d.dim_value if d.HasField("dim_value") else ports.named(d.dim_param) for d in tt.shape.dim]


def _keep_names(inferred: list[Dim], declared: list[Dim] | None) -> list[Dim]:
    if declared is None or len(declared) != len(inferred):
        return inferred
    return [d if isinstance(i, (str, type(None))) and isinstance(d, str) else i for i, d in zip(inferred, declared)]


def _standard_outputs(node, known, data, opsets, ir_version) -> list[tuple[int, list[Dim]]]:
    try:
        schema = onnx.defs.get_schema(node.op_type, opsets.get(node.domain or "", 1), node.domain or "")
    except onnx.defs.SchemaError as e:
        raise ShapeError(f"node {node.name!r}: no ONNX schema for {node.domain or 'ai.onnx'}::{node.op_type}") from e
    types = {}
    for name in node.input:
        if name:
            if name not in known:
                raise ShapeError(f"node {node.name!r} ({node.op_type}) reads {name!r}, which nothing produces")
            elem, dims = known[name]
            types[name] = helper.make_tensor_type_proto(elem, dims)
    try:
        inferred = shape_inference.infer_node_outputs(
            schema, node, types, {k: data[k] for k in node.input if k in data},
            opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()], ir_version=ir_version)
    except Exception as e:  # onnx raises InferenceError and plain RuntimeErrors from C++
        raise ShapeError(f"node {node.name!r} ({node.op_type}): {e}") from e
    return [_type_shape(inferred[o]) if o in inferred else (0, None) for o in node.output]


def _plugin_outputs(plugin: Plugin, node: onnx.NodeProto, ins: list) -> list[ports.TypeShape]:
    fields = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    label = f"{plugin.name} node {node.name!r}"
    missing = [name for name, got in zip(node.input, ins) if got is None or got[1] is None]
    if missing:
        raise ShapeError(f"{label}: input tensor(s) {missing} have no inferred shape")
    bound = ports.bind_inputs(plugin, label, fields, list(zip(node.input, ins)))
    if bound.problems:
        raise ShapeError("; ".join(bound.problems))
    return ports.output_dims(plugin, bound, fresh={"T": DIM_T})
