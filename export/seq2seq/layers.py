"""The decoder's standard sublayers in ONNX, from padfree.generation's weights (generation/layers.py in
ONNX): LayerNormalization, Gemm with the weight as stored ([out, in], transB=1), the activations,
pre-LN / post-LN residuals. Activations are written out (erf GELU, tanh GELU, x * sigmoid(x)) so
that opset 17 and 18 models carry them; the formulas are torch's."""
from __future__ import annotations

import math

import numpy as np

from .builder import GraphBuilder

__all__ = ["layer_norm", "linear", "activation", "residual"]


def layer_norm(b: GraphBuilder, x: str, ln, name: str) -> str:
    return b.op("LayerNormalization", [x, b.weight(ln.weight, f"{name}.weight"), b.weight(ln.bias, f"{name}.bias")],
                axis=-1, epsilon=float(ln.eps))


def linear(b: GraphBuilder, x: str, weight, bias, name: str) -> str:
    """x @ weight^T (+ bias): weight [out, in] as torch stores it."""
    inputs = [x, b.weight(weight, f"{name}.weight")]
    if bias is not None:
        inputs.append(b.weight(bias, f"{name}.bias"))
    return b.op("Gemm", inputs, transB=1)


def activation(b: GraphBuilder, x: str, kind: str) -> str:
    """generation.models.ACTIVATIONS' values: relu, gelu (erf), gelu_tanh, silu."""
    f32 = np.float32
    if kind == "relu":
        return b.op("Relu", [x])
    if kind == "silu":
        return b.op("Mul", [x, b.op("Sigmoid", [x])])
    if kind == "gelu":
        inner = b.op("Erf", [b.op("Mul", [x, b.const(1 / math.sqrt(2.0), f32)])])
    elif kind == "gelu_tanh":
        cube = b.op("Mul", [b.op("Mul", [x, x]), x])
        inner = b.op("Tanh", [b.op("Mul", [b.op("Add", [x, b.op("Mul", [cube, b.const(0.044715, f32)])]),
                                            b.const(math.sqrt(2.0 / math.pi), f32)])])
    else:
        raise ValueError(f"activation {kind!r}: expected relu, gelu, gelu_tanh or silu")
    return b.op("Mul", [b.op("Mul", [x, b.const(0.5, f32)]), b.op("Add", [inner, b.const(1.0, f32)])])


def residual(b: GraphBuilder, x: str, sublayer, ln, pre_ln: bool, name: str) -> str:
    """x + sublayer(LN(x)) (pre-LN) or LN(x + sublayer(x)) (post-LN)."""
    if pre_ln:
        return b.op("Add", [x, sublayer(layer_norm(b, x, ln, name))])
    return layer_norm(b, b.op("Add", [x, sublayer(x)]), ln, name)
