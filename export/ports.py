"""The node spec's port shapes as expressions over a node's dims and fields.

plugins/spec/plugins.json gives every plugin port a dtype and a shape made of names ("T", "H",
"vocab_size"), "B+1", products of the node's int fields ("3*num_heads*head_dim") and "..." (any
trailing dims). `bind_inputs` matches a node's input types against its ports, binding the names and
reporting each contradiction as a sentence; `output_dims` evaluates the output ports from those
bindings. One implementation serves the shape pass (export/shapes.py: outputs from inputs) and the
wiring check (export/wiring.py: a model's plugin inputs against the spec).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from onnx import TensorProto

from .spec import Plugin

Dim = int | str | None  # a size, a symbolic name, or unknown
TypeShape = tuple[int, list[Dim]]
GRAPH_SYMBOLS = ("T", "B", "B+1", "S")  # one dimension each for the whole graph (wiring binds them once)
FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
# one dtype whatever the node's
FIXED_TYPES = {"int32": TensorProto.INT32, "int64": TensorProto.INT64, "float32": TensorProto.FLOAT}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def named(dim_param: str) -> str | None:
    """A dim_param as a symbol; onnx's shape inference names the dims it cannot relate to others unk__N,
    which says nothing about which dimension they are."""
    return None if not dim_param or dim_param.startswith("unk__") else dim_param


@dataclass
class Bindings:
    """Spec name -> the model's dimension, with who bound it (for the message)."""
    dims: dict[str, Dim] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)

    def bind(self, name: str, dim: Dim, here: str) -> str | None:
        if dim is None:
            return None
        if name not in self.dims:
            self.dims[name], self.where[name] = dim, here
            return None
        if self.dims[name] != dim:
            return f"{here} has {name} = {dim!r}, but {self.where[name]} has {name} = {self.dims[name]!r}"
        return None


@dataclass
class NodePorts:
    """What bind_inputs learnt of one node: its names, the float type, the dims "..." matched."""
    label: str
    fields: dict
    local: Bindings
    graph: Bindings
    float_type: int = 0
    dtypes: dict[str, int] = field(default_factory=dict)  # input port -> elem type
    rest: list[Dim] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def lookup(self, name: str) -> Dim:
        if name in self.local.dims:
            return self.local.dims[name]
        if name in self.graph.dims:
            return self.graph.dims[name]
        return self.fields.get(name) if isinstance(self.fields.get(name), int) else None


def product(expression: str, fields: dict) -> int | None:
    """A fixed extent ("1": the decoder's step), one int field ("num_beams") or `3*num_heads*head_dim`
    with the node's int fields; None for anything else."""
    if expression.isdigit():
        return int(expression)
    if "*" not in expression:
        return fields[expression] if isinstance(fields.get(expression), int) else None
    value = 1
    for factor in expression.split("*"):
        if factor.isdigit():
            value *= int(factor)
        elif isinstance(fields.get(factor), int):
            value *= fields[factor]
        else:
            return None
    return value


def bind_inputs(plugin: Plugin, label: str, fields: dict, inputs: list[tuple[str, TypeShape | None]],
                graph: Bindings | None = None) -> NodePorts:
    """Match the node's inputs (tensor name, (elem type, dims) or None where nothing is recorded: not
    judged) against the plugin's present input ports. Names in GRAPH_SYMBOLS bind in `graph` where
    one is given (the same T for every node), all others per node."""
    node = NodePorts(label, fields, Bindings(), graph if graph is not None else Bindings())
    ports = [p for p in plugin.inputs if p.present(fields)]
    if len(inputs) != len(ports):
        node.problems.append(f"{label}: {len(inputs)} inputs, the spec gives {len(ports)} "
                             f"({', '.join(p.name for p in ports)})")
        return node
    for port, (tensor, got) in zip(ports, inputs):
        here = f"{label} input {port.name} (tensor {tensor!r})"
        if got is None:
            continue
        elem, dims = got
        node.dtypes[port.name] = elem
        fixed = FIXED_TYPES.get(port.dtype)
        if fixed is not None and elem != fixed:
            node.problems.append(f"{here} is {TensorProto.DataType.Name(elem)}, the spec wants {port.dtype}")
            continue
        if port.dtype == "float":
            if elem not in FLOAT_TYPES:
                node.problems.append(f"{here} is {TensorProto.DataType.Name(elem)}, the spec wants a float type")
                continue
            if node.float_type and elem != node.float_type:
                node.problems.append(f"{here} is {TensorProto.DataType.Name(elem)}, the node's other float inputs"
                                     f" are {TensorProto.DataType.Name(node.float_type)}")
            node.float_type = node.float_type or elem
        if dims is None:
            continue
        shape = list(port.shape)
        if "..." in shape:
            lead = shape.index("...")
            if len(dims) < len(shape) - 1:
                node.problems.append(f"{here} has shape {dims}, the spec wants [{', '.join(shape)}]")
                continue
            node.rest, dims, shape = list(dims[lead:]), dims[:lead], shape[:lead]
        elif len(dims) != len(shape):
            node.problems.append(f"{here} has shape {dims}, the spec wants [{', '.join(shape)}]")
            continue
        for symbol, dim in zip(shape, dims):
            want = product(symbol, fields)
            if want is not None:
                if isinstance(dim, int) and dim != want:
                    node.problems.append(f"{here} has {dim} for {symbol}, which the node's fields make {want}")
                continue
            bindings = node.graph if symbol in GRAPH_SYMBOLS and graph is not None else node.local
            problem = bindings.bind(symbol, dim, here)
            if problem:
                node.problems.append(problem)
    return node


def output_dims(plugin: Plugin, node: NodePorts, fresh: dict[str, str]) -> list[TypeShape]:
    """The present output ports' (elem type, dims), from bind_inputs' bindings. A name no input bound
    takes its symbol from `fresh` (RemovePadding's data-dependent T), else stays unknown; "B+1" of a
    symbolic B is the symbol "<B>_plus_1"."""
    outs = []
    for port in plugin.outputs:
        if not port.present(node.fields):
            continue
        if port.dtype == "float":
            elem = node.float_type
        elif port.dtype.startswith("same as "):
            elem = node.dtypes.get(port.dtype[len("same as "):], 0)
        else:
            elem = FIXED_TYPES.get(port.dtype, TensorProto.INT32)
        dims: list[Dim] = []
        for expr in port.shape:
            if expr == "...":
                dims.extend(node.rest)
            elif _NAME.match(expr):
                value = node.lookup(expr)
                dims.append(fresh.get(expr) if value is None else value)
            elif expr.endswith("+1") and node.lookup(expr) is None:
                base = node.lookup(expr[:-2])
                dims.append(base + 1 if isinstance(base, int) else f"{base}_plus_1" if base else None)
            else:
                dims.append(node.lookup(expr) if node.lookup(expr) is not None else product(expr, node.fields))
        outs.append((elem, dims))
    return outs
