"""The floating-point dtype of an exported model: casting every float tensor to fp32 / fp16 / bf16.

The plain export is always float32 (it is the reference of `padfree check`). `padfree export
--dtype fp16|bf16` casts the rewritten model after the rewrite: the passes match float32 graphs
only, and a plugin node wants all its float tensors in one dtype, which a whole-model cast gives.
TensorRT-RTX builds strongly typed networks, so the dtype chosen here is the engine's precision.
The CPU check runs a fp16 / bf16 model cast back to float32 against the plain export with its weights
rounded to the same dtype (round_weights; round_values for an encoder-decoder's graphs, whose constants
are cast as well): both then compute in float32 on the same weight values, so the check holds the
rewrite to float32 tolerances whatever the dtype; the kernels' own fp16 / bf16 arithmetic is proven on
the GPU against float32 references.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

DTYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
_NUMPY = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
META_KEY = "padfree.dtype"


def float_dtype(model: onnx.ModelProto) -> str:
    """The model's float dtype: "fp32", "fp16" or "bf16" (from its float initializers)."""
    names = {v: k for k, v in DTYPES.items()}
    found = {t.data_type for t in model.graph.initializer if t.data_type in _FLOATS}
    if len(found) > 1:
        raise ValueError(f"the model mixes float dtypes {sorted(TensorProto.DataType.Name(d) for d in found)}")
    return names.get(found.pop(), "fp32") if found else "fp32"


def cast(model: onnx.ModelProto, dtype: str) -> onnx.ModelProto:
    """A copy of `model` with every float initializer, Constant, Cast target and float graph
    input / output in `dtype`; value_info is dropped (shapes are inferred again by the caller)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _cast_graph(out.graph, dtype)
    props = {p.key: p.value for p in out.metadata_props}
    props[META_KEY] = dtype
    onnx.helper.set_model_props(out, props)
    return out


def round_weights(model: onnx.ModelProto, dtype: str) -> onnx.ModelProto:
    """A copy of a float32 `model` whose weights (float initializers of more than one element) hold
    the values they take in `dtype`. Scalars are left as they are: in a plain export they are the
    formulas' constants (GELU's 1/sqrt(2), a mask's float32 minimum), which a rewritten model
    computes inside its plugins at float32, not weights."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.data_type == TensorProto.FLOAT and any(d > 1 for d in t.dims):
            value = numpy_helper.to_array(t).astype(_NUMPY[dtype]).astype(np.float32)
            t.CopyFrom(numpy_helper.from_array(value, t.name))
    return out


def _cast_graph(g: onnx.GraphProto, dtype: str) -> None:
    """cast() on one graph, and on its subgraphs (a Loop's body: their carried values and Constants)."""
    target = DTYPES[dtype]
    for t in g.initializer:
        if t.data_type in _FLOATS and t.data_type != target:
            t.CopyFrom(_cast_tensor(t, dtype))
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in _FLOATS:
                a.t.CopyFrom(_cast_tensor(a.t, dtype))
            elif a.type == onnx.AttributeProto.GRAPH:
                _cast_graph(a.g, dtype)
            elif node.op_type == "Cast" and a.name == "to" and a.i in _FLOATS:
                a.i = target
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type in _FLOATS:
            vi.type.tensor_type.elem_type = target
    del g.value_info[:]


def round_values(model: onnx.ModelProto, dtype: str) -> onnx.ModelProto:
    """A copy of a float32 `model` whose every float value (initializers, scalars and Constants
    included) is the one `cast(model, dtype)` holds, kept in float32: cast there and back. The
    reference for a graph exported in `dtype` whose formulas' constants are in that dtype too."""
    return cast(cast(model, dtype), "fp32")


def _cast_tensor(t: onnx.TensorProto, dtype: str) -> onnx.TensorProto:
    # float32 first: bf16 -> fp16 and fp16 -> bf16 round once, from the exact float32 value.
    value = numpy_helper.to_array(t).astype(np.float32)
    limit = float(ml_dtypes.finfo(_NUMPY[dtype]).max)
    # a finite value past the dtype's range (an attention mask's float32 minimum) saturates to its largest
    # finite value, as torch's masks in that dtype are, rather than becoming an infinity
    value = np.where(np.isfinite(value), np.clip(value, -limit, limit), value)
    return numpy_helper.from_array(value.astype(_NUMPY[dtype]), t.name)
