"""Transposes of constant weights -> constants, before the passes that look for MatMul by a constant.

torch's exporter transposes a Linear weight that several calls share (ALBERT's layers, run
num_hidden_layers times from a few layer groups) once, as a Transpose node that every pass's MatMul
reads; a weight used once arrives already transposed. Each such Transpose becomes one constant, so
the shared layers still share one tensor (and the attention pass merges their Q/K/V once).
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..context import Context, PassReport, log
from ..graph import const_value

NAME = "shared_weights"


def run(graph: gs.Graph, ctx: Context) -> gs.Graph:
    folded = 0
    for node in [n for n in graph.nodes if n.op == "Transpose" and len(n.inputs) == 1]:
        value = const_value(node.inputs[0])
        out = node.outputs[0]
        if value is None or value.ndim != 2 or out in graph.outputs:
            continue
        perm = node.attrs.get("perm", list(range(value.ndim))[::-1])
        constant = ctx.const(f"{node.inputs[0].name}/transposed", np.transpose(value, perm))
        for consumer in list(out.outputs):
            for i, t in enumerate(consumer.inputs):
                if t is out:
                    consumer.inputs[i] = constant
        node.outputs.clear()
        folded += 1
    if folded:
        report = PassReport(NAME)
        ctx.reports.append(report)
        report.notes.append(f"{folded} shared weight(s) transposed once at export, folded into constants")
        log.debug("shared_weights: folded %d Transpose(s) of constant weights", folded)
    return graph.cleanup()
