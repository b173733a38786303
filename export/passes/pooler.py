"""The pooler's first-token select hidden[:, 0] -> Gather(hidden_packed, cu_seqlens[:-1]).

On packed rows, sequence b's first token is row cu_seqlens[b].
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..context import CU_SEQLENS, Context, PassReport, log
from ..graph import const_value

NAME = "pooler"


def run(graph: gs.Graph, ctx: Context) -> gs.Graph:
    report = PassReport(NAME)
    ctx.reports.append(report)
    for node in [n for n in graph.nodes if n.op == "Gather"]:
        data, index = node.inputs
        value = const_value(index)
        if node.attrs.get("axis", 0) != 1 or value is None or value.shape != () or int(value) != 0 \
                or id(data) not in ctx.plugin_outputs:
            continue
        starts = ctx.variable("sequence_starts")
        ctx.node("Slice", [ctx.packed(CU_SEQLENS), ctx.const("c", np.array([0], np.int64)),
                           ctx.const("c", np.array([-1], np.int64))], [starts])
        node.inputs[1] = starts
        node.attrs["axis"] = 0
        ctx.batch_rows.add(id(node))
        report.notes.append(f"first-token select '{node.name}' reads rows cu_seqlens[:-1]")
        log.debug("pooler: %s now gathers each sequence's first packed row", node.name)
    return graph
