"""Evaluate part of a graph with ONNX Runtime on small probe inputs.

Some facts are easier to establish by running the exporter's own subgraph than by matching every
way it can be written: that an additive attention mask is a key-padding mask (not causal, not
learned), and which position each token gets. The passes still match the structure around these
tensors; the probe only pins down what a tensor's values are.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .graph import ancestors
from .onnx_files import lowest_ir_version


def evaluate(graph: gs.Graph, targets: list[gs.Tensor], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Values of `targets` given values of the graph inputs they depend on (feeds: by input name).

    Raises KeyError naming a graph input the targets need that `feeds` lacks.
    """
    import onnxruntime as ort

    needed = ancestors(targets)
    ids = {id(n) for n in needed}
    nodes = [n for n in graph.nodes if id(n) in ids]
    input_ids = {id(t) for n in nodes for t in n.inputs} | {id(t) for t in targets}
    inputs = [t for t in graph.inputs if id(t) in input_ids]
    for t in inputs:
        if t.name not in feeds:
            raise KeyError(f"probe needs a value for graph input {t.name!r}")
    sub = gs.Graph(nodes=nodes, inputs=inputs, outputs=[], opset=graph.opset,
                   import_domains=graph.import_domains)
    model = gs.export_onnx(sub, do_type_check=False)
    model.ir_version = lowest_ir_version(model)  # gs stamps the installed onnx's newest IR
    del model.graph.value_info[:]  # the exporter's intermediate shapes are not all right
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t.name) for t in targets)
    for t in inputs:  # the probe's own feed sizes, not the symbolic ones of the graph
        model.graph.input[[i.name for i in model.graph.input].index(t.name)].type.tensor_type.ClearField("shape")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # no graph optimizations: a probe runs once on a few nodes, and ONNX Runtime 1.30's optimizer drops a
    # Range whose output is a graph output (a position-ids probe: "Failed to find node output ... arange")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run([t.name for t in targets], {t.name: feeds[t.name] for t in inputs})
