"""A small ONNX graph builder for the graphs padfree writes from weights (cross_kv.onnx, decoder_step.onnx).

Nodes are named `<scope>/<op>_<n>` and their outputs `<node name>:<i>`, so a subgraph built inside one
scope is exactly the nodes whose names start with `<scope>/`: what a plugin-swap pass replaces
(ops.py's sites). Weights are initializers named after where they come from; a tensor used twice
(a tied LM head and embedding table) is stored once. Constants are int64 / float32 initializers,
shared by value.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..onnx_files import lowest_ir_version

__all__ = ["GraphBuilder", "FLOAT", "INT32", "INT64", "BOOL"]

FLOAT, INT32, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL


class GraphBuilder:
    def __init__(self, name: str):
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._scope: list[str] = []
        self._count: dict[str, int] = {}
        self._weights: dict[tuple, str] = {}
        self._consts: dict[tuple, str] = {}

    @contextmanager
    def scope(self, name: str):
        self._scope.append(name)
        try:
            yield "/".join(self._scope)
        finally:
            self._scope.pop()

    def input(self, name: str, elem_type: int, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, tensor: str, name: str, elem_type: int, shape: list) -> str:
        """Expose `tensor` as graph output `name` (an Identity renames it where the names differ)."""
        if tensor != name:
            self.nodes.append(helper.make_node("Identity", [tensor], [name], name=f"output/{name}"))
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def weight(self, tensor, name: str) -> str:
        """A float32 initializer from a torch tensor (stored once per storage and shape)."""
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        if key not in self._weights:
            array = tensor.detach().float().cpu().contiguous().numpy()
            self.initializers[name] = numpy_helper.from_array(array, name)
            self._weights[key] = name
        return self._weights[key]

    def const(self, value, dtype=np.int64) -> str:
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            name = f"const/{len(self._consts)}"
            self.initializers[name] = numpy_helper.from_array(array, name)
            self._consts[key] = name
        return self._consts[key]

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs) -> str | list[str]:
        prefix = "/".join(self._scope)
        base = f"{prefix}/{op_type}" if prefix else op_type
        n = self._count.get(base, 0)
        self._count[base] = n + 1
        name = f"{base}_{n}"
        names = [f"{name}:{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=name, **attrs))
        return names[0] if outputs == 1 else names

    def model(self, opset: int, metadata: dict[str, str] | None = None, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs,
                                  initializer=list(self.initializers.values()), doc_string=doc)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="padfree")
        model.ir_version = lowest_ir_version(model)   # not the installed onnx's newest: ONNX Runtime may be older
        if metadata:
            helper.set_model_props(model, metadata)
        return model
