"""Are a model's plugin nodes wired as the spec says? TensorRT parses and builds a plugin node whose
inputs are the wrong tensors as long as each has some type and shape, and the engine then answers
wrongly; `padfree build` asks here first.

Each plugin input's type and shape (from the model's value_info, inputs and initializers) is matched
against its port in plugins/spec/plugins.json: int32 ports take int32 tensors, a node's float ports
share one float type, ranks agree, and the spec's dimension names are bound consistently. Names made
of the node's fields (`3*num_heads*head_dim`) are evaluated; T, B, B+1 and S are bound once for the
whole graph (every plugin's `T` is the same dimension) and must be different symbols from each other;
any other name (H, vocab_size, ...) is bound once per node. Dimensions nobody recorded are not judged.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto, helper

from . import spec as spec_mod

Dim = int | str | None
_GRAPH_SYMBOLS = ("T", "B", "B+1", "S")
_INT32 = TensorProto.INT32
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
_EXPRESSION = re.compile(r"[A-Za-z_][A-Za-z_0-9]*(\*[A-Za-z_][A-Za-z_0-9]*|\*\d+)*|\d+(\*[A-Za-z_][A-Za-z_0-9]*)+")


@dataclass
class _Bindings:
    """Spec dimension name -> the model's dimension, with who bound it (for the message)."""
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


def _types(graph: onnx.GraphProto) -> dict[str, tuple[int, list[Dim]]]:
    """name -> (elem_type, dims) for every tensor whose type the model records."""
    out: dict[str, tuple[int, list[Dim]]] = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else _named(d.dim_param) for d in t.shape.dim]
        out[vi.name] = (t.elem_type, dims)
    for init in graph.initializer:
        out[init.name] = (init.data_type, list(init.dims))
    return out


def _named(dim_param: str) -> str | None:
    # onnx's shape inference names the dimensions it cannot relate to others unk__N: not a symbol
    return None if not dim_param or dim_param.startswith("unk__") else dim_param


def _value(expression: str, fields: dict) -> int | None:
    """`3*num_heads*head_dim` with the node's fields; None when the name is not such a product."""
    if expression.isdigit():  # a fixed extent, e.g. the decoder's step [1]
        return int(expression)
    if not _EXPRESSION.fullmatch(expression) or "*" not in expression:
        return None
    value = 1
    for factor in expression.split("*"):
        if factor.isdigit():
            value *= int(factor)
        elif isinstance(fields.get(factor), int):
            value *= fields[factor]
        else:
            return None
    return value


def _check_node(node: onnx.NodeProto, plugin: spec_mod.Plugin, types: dict, graph_bindings: _Bindings) -> list[str]:
    label = f"{node.op_type} node {node.name or '(unnamed)'}"
    fields = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    try:
        plugin.check_fields({k: v for k, v in fields.items() if k not in ("plugin_version", "plugin_namespace")})
    except (ValueError, TypeError) as e:
        return [f"{label}: {e}"]
    ports = [p for p in plugin.inputs if p.present(fields)]
    found = []
    if len(node.input) != len(ports) or len(node.output) != len(plugin.output_names(fields)):
        return [f"{label}: {len(node.input)} inputs and {len(node.output)} outputs, the spec gives"
                f" {len(ports)} ({', '.join(p.name for p in ports)}) and {len(plugin.output_names(fields))}"]
    local = _Bindings()
    float_type = None
    for port, name in zip(ports, node.input):
        here = f"{label} input {port.name} (tensor {name!r})"
        if name not in types:
            continue  # nothing recorded: not judged
        elem, dims = types[name]
        if port.dtype == "int32" and elem != _INT32:
            found.append(f"{here} is {TensorProto.DataType.Name(elem)}, the spec wants int32")
            continue
        if port.dtype == "float32" and elem != TensorProto.FLOAT:
            found.append(f"{here} is {TensorProto.DataType.Name(elem)}, the spec wants float32")
            continue
        if port.dtype == "float":
            if elem not in _FLOATS:
                found.append(f"{here} is {TensorProto.DataType.Name(elem)}, the spec wants a float type")
                continue
            if float_type is not None and elem != float_type:
                found.append(f"{here} is {TensorProto.DataType.Name(elem)}, the node's other float inputs are"
                             f" {TensorProto.DataType.Name(float_type)}")
            float_type = float_type or elem
        if "..." in port.shape:
            continue
        if len(dims) != len(port.shape):
            found.append(f"{here} has shape {dims}, the spec wants [{', '.join(port.shape)}]")
            continue
        for symbol, dim in zip(port.shape, dims):
            want = _value(symbol, fields)
            if want is not None:
                if isinstance(dim, int) and dim != want:
                    found.append(f"{here} has {dim} for {symbol}, which the node's fields make {want}")
                continue
            bindings = graph_bindings if symbol in _GRAPH_SYMBOLS else local
            problem = bindings.bind(symbol, dim, here)
            if problem:
                found.append(problem)
    return found


def _distinct_graph_symbols(bindings: _Bindings) -> list[str]:
    """T, B, B+1 and S bound to one named dimension: a port took a tensor of another role."""
    by_dim: dict[str, list[str]] = {}
    for symbol, dim in bindings.dims.items():
        if isinstance(dim, str):
            by_dim.setdefault(dim, []).append(symbol)
    return [f"{' and '.join(symbols)} are all the dimension {dim!r} ({'; '.join(bindings.where[s] for s in symbols)})"
            for dim, symbols in by_dim.items() if len(symbols) > 1]


def problems(model: onnx.ModelProto | str | os.PathLike, spec: spec_mod.Spec | None = None) -> list[str]:
    """Sentences naming each plugin input wired against the spec; [] when every node checks out."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    spec = spec or spec_mod.load()
    types = _types(model.graph)
    graph_bindings = _Bindings()
    found: list[str] = []
    for node in model.graph.node:
        if node.domain != spec.namespace and not node.op_type.startswith("Padfree"):
            continue
        if node.op_type not in spec.plugins:
            found.append(f"{node.op_type} node {node.name or '(unnamed)'}: not a plugin of the spec"
                         f" ({', '.join(spec.plugins)})")
            continue
        found += _check_node(node, spec[node.op_type], types, graph_bindings)
    return found + _distinct_graph_symbols(graph_bindings)
