"""Types and shapes of every tensor of a rewritten model, in one topological pass.

ONNX's shape inference knows no plugin ops and stops at the first one; re-running it after each
plugin node costs a whole-model inference per node (minutes on BERT-large). Instead each node is
inferred once, in graph order: standard ops through ONNX's per-node inference (with the values of
constant inputs, which Slice, Gather and Unsqueeze need), plugin ops from the node spec
(plugins/spec/plugins.json), whose port shapes are expressions over the inputs' dims and the node's
fields ("T", "B+1", "num_heads*head_dim", "..."). The same pass checks that every plugin input
has the shape the spec asks for, so a plugin wired to the wrong tensor fails here, not in an engine.
"""
from __future__ import annotations

import re

import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

from .spec import Plugin, Spec

Dim = int | str | None  # a size, a symbolic name, or unknown
_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
_FIXED_TYPES = {"int32": TensorProto.INT32, "float32": TensorProto.FLOAT}  # ports of one dtype whatever the node's
_CONST_LIMIT = 1024  # constant inputs up to this many elements are passed to ONNX's inference as data
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ShapeError(ValueError):
    """A tensor whose shape cannot be inferred, or a plugin input that contradicts the spec."""


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
    return tt.elem_type, [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]


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


def _plugin_outputs(plugin: Plugin, node: onnx.NodeProto, ins: list) -> list[tuple[int, list[Dim]]]:
    fields = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    ports = [p for p in plugin.inputs if p.present(fields)]
    where = f"{plugin.name} node {node.name!r}"
    if len(ins) != len(ports):
        raise ShapeError(f"{where}: {len(ins)} inputs, the spec has {len(ports)} ({[p.name for p in ports]})")
    env: dict[str, Dim] = {k: v for k, v in fields.items() if isinstance(v, int)}
    dtypes: dict[str, int] = {}
    rest: list[Dim] = []
    float_type = 0
    for port, got, name in zip(ports, ins, node.input):
        if got is None or got[1] is None:
            raise ShapeError(f"{where}: input {port.name} ({name!r}) has no inferred shape")
        elem, dims = got
        dtypes[port.name] = elem
        fixed = _FIXED_TYPES.get(port.dtype)
        if fixed is not None and elem != fixed:
            raise ShapeError(f"{where}: input {port.name} ({name!r}) is {TensorProto.DataType.Name(elem)}, "
                             f"the spec wants {TensorProto.DataType.Name(fixed)}")
        if port.dtype == "float":
            if elem not in _FLOAT_TYPES or (float_type and elem != float_type):
                raise ShapeError(f"{where}: input {port.name} ({name!r}) is {TensorProto.DataType.Name(elem)}; "
                                 "every 'float' input of a node must share one floating-point type")
            float_type = elem
        rest = _bind(port.shape, dims, env, f"{where}: input {port.name} ({name!r}) has shape {dims}") or rest
    outs = []
    for port in plugin.outputs:
        if not port.present(fields):
            continue
        if port.dtype == "float":
            elem = float_type
        elif port.dtype.startswith("same as "):
            elem = dtypes[port.dtype[len("same as "):]]
        else:
            elem = _FIXED_TYPES.get(port.dtype, TensorProto.INT32)
        dims: list[Dim] = []
        for expr in port.shape:
            dims.extend(rest if expr == "..." else [_evaluate(expr, env, fresh=True)])
        outs.append((elem, dims))
    return outs


def _bind(shape: tuple[str, ...], dims: list[Dim], env: dict[str, Dim], what: str) -> list[Dim] | None:
    """Bind the port's names to the tensor's dims (checking the ones already bound); returns the
    dims matched by "..." (None where the port has none)."""
    if "..." in shape:
        lead = shape.index("...")
        if len(dims) < len(shape) - 1:
            raise ShapeError(f"{what}; the spec wants {list(shape)}")
        rest, dims = dims[lead:], dims[:lead]
        shape = shape[:lead]
    else:
        rest = None
        if len(dims) != len(shape):
            raise ShapeError(f"{what}; the spec wants {list(shape)}")
    for expr, dim in zip(shape, dims):
        if _IDENT.match(expr):
            bound = env.get(expr)
            if bound is None or (isinstance(bound, str) and isinstance(dim, int)):
                env[expr] = dim
            elif isinstance(bound, int) and isinstance(dim, int) and bound != dim:
                raise ShapeError(f"{what}; the spec wants {list(shape)} with {expr} = {bound} from the other inputs")
        else:
            want = _evaluate(expr, env, fresh=False)
            if isinstance(want, int) and isinstance(dim, int) and want != dim:
                raise ShapeError(f"{what}; the spec wants {expr} = {want}")
    return rest


def _evaluate(expr: str, env: dict[str, Dim], fresh: bool) -> Dim:
    """An expression of the spec ("T", "B+1", "num_heads*head_dim") over bound names. Unbound names
    give a symbolic dim when `fresh` (the packed token count of RemovePadding, named T's symbol)."""
    from .context import DIM_T

    if _IDENT.match(expr):
        value = env.get(expr)
        if value is None and fresh:
            return DIM_T if expr == "T" else expr
        return value
    if expr.endswith("+1") and _IDENT.match(expr[:-2]):
        base = env.get(expr[:-2])
        if isinstance(base, int):
            return base + 1
        return f"{base}_plus_1" if isinstance(base, str) else None
    product = 1
    for factor in expr.split("*"):
        value = int(factor) if factor.isdigit() else env.get(factor)
        if not isinstance(value, int):
            return None
        product *= value
    return product
