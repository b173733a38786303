"""Are a model's plugin nodes wired as the spec says? TensorRT parses and builds a plugin node whose
inputs are the wrong tensors as long as each has some type and shape, and the engine then answers
wrongly; `padfree build` asks here first.

Each plugin input's type and shape (from the model's value_info, inputs and initializers) is matched
against its port in plugins/spec/plugins.json: int32 ports take int32 tensors, a node's float ports
share one float type, ranks agree, and the spec's dimension names are bound consistently. Names made
of the node's fields (`3*num_heads*head_dim`) are evaluated; T, B, B+1 and S are bound once for the
whole graph (every plugin's `T` is the same dimension) and must be different symbols from each other;
any other name (H, vocab_size, ...) is bound once per node. Dimensions nobody recorded are not judged.
The binding itself is export/ports.py's, which the shape pass uses too.
"""
from __future__ import annotations

import os

import onnx
from onnx import helper

from . import spec as spec_mod
from .ports import Bindings, TypeShape, bind_inputs, named


def _types(graph: onnx.GraphProto) -> dict[str, TypeShape]:
    """name -> (elem_type, dims) for every tensor whose type the model records."""
    out: dict[str, TypeShape] = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else named(d.dim_param) for d in t.shape.dim]
        out[vi.name] = (t.elem_type, dims)
    for init in graph.initializer:
        out[init.name] = (init.data_type, list(init.dims))
    return out


def _check_node(node: onnx.NodeProto, plugin: spec_mod.Plugin, types: dict, graph_bindings: Bindings) -> list[str]:
    label = f"{node.op_type} node {node.name or '(unnamed)'}"
    fields = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    try:
        plugin.check_fields({k: v for k, v in fields.items() if k not in ("plugin_version", "plugin_namespace")})
    except (ValueError, TypeError) as e:
        return [f"{label}: {e}"]
    outputs = len(plugin.output_names(fields))
    if len(node.output) != outputs:
        return [f"{label}: {len(node.output)} outputs, the spec gives {outputs}"]
    inputs = [(name, types.get(name)) for name in node.input]
    return bind_inputs(plugin, label, fields, inputs, graph=graph_bindings).problems


def _distinct_graph_symbols(bindings: Bindings) -> list[str]:
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
    graph_bindings = Bindings()
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
