"""Probe values for the exported model's inputs (see padfree.export.probe)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..context import ATTENTION_MASK, Context
from ..graph import ancestors, const_value

# Two sequences of lengths 6 and 3 padded to 6: enough to tell a key-padding mask from others.
PROBE_MASK = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])


def token_ids_avoiding(tensors: list[gs.Tensor]) -> int:
    """A token id that no Equal node among the tensors' ancestors compares with: e.g. not RoBERTa's
    padding id, so that every probe token counts as a real token."""
    compared = set()
    for node in ancestors(tensors):
        if node.op == "Equal":
            for t in node.inputs:
                v = const_value(t)
                if v is not None:
                    compared.update(int(x) for x in v.reshape(-1))
    return next(i for i in range(2, 10**6) if i not in compared)


def feeds(ctx: Context, targets: list[gs.Tensor]) -> dict[str, np.ndarray]:
    token = token_ids_avoiding(targets)
    values = {ATTENTION_MASK: PROBE_MASK}
    out = {}
    for name, t in ctx.original_inputs.items():
        v = values.get(name, np.full(PROBE_MASK.shape, token if name == "input_ids" else 0))
        out[t.name] = v.astype(t.dtype if t.dtype is not None else np.int64)
    return out
