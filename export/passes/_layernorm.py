"""The LayerNormalization facts the LayerNorm-ending fusions share."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..graph import const_value


@dataclass
class LayerNorm:
    node: gs.Node
    gamma: gs.Tensor
    beta: gs.Tensor
    epsilon: float


def match_layernorm(ctx, node: gs.Node) -> LayerNorm | str:
    """A LayerNormalization over the last axis with constant gamma [H] (and beta [H] or none), or why not."""
    axis = node.attrs.get("axis", -1)
    if axis != -1:
        return f"{node.op} '{node.name}' normalises axis {axis}, not the last one"
    gamma = const_value(node.inputs[1])
    if gamma is None or gamma.ndim != 1:
        return f"{node.op} '{node.name}': scale is not a constant vector"
    beta_t = node.inputs[2] if len(node.inputs) > 2 else None
    beta = const_value(beta_t) if beta_t is not None else np.zeros_like(gamma)
    if beta is None or beta.shape != gamma.shape:
        return f"{node.op} '{node.name}': bias is not a constant vector of the scale's size"
    if beta_t is None:
        beta_t = ctx.const("ln_beta", beta)
    return LayerNorm(node, node.inputs[1], beta_t, float(node.attrs.get("epsilon", 1e-5)))
