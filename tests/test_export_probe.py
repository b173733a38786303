"""The export's small ONNX Runtime models (export/probe.py's evaluations, the seq2seq GraphBuilder's
graphs) run on the ONNX Runtime installed beside any onnx: they carry the lowest IR version their opsets
need, not the installed onnx's newest, and a probe's output may be any tensor of the graph."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("onnxruntime")
gs = pytest.importorskip("onnx_graphsurgeon")

from padfree.export.onnx_files import lowest_ir_version  # noqa: E402
from padfree.export.probe import evaluate  # noqa: E402
from padfree.export.seq2seq.builder import GraphBuilder  # noqa: E402


def test_lowest_ir_version_follows_the_opsets():
    for opset, ir in ((13, 7), (17, 8), (18, 8), (21, 10)):
        model = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", opset)])
        assert model.ir_version == onnx.IR_VERSION      # what onnx's helper stamps
        assert lowest_ir_version(model) == ir, opset


def test_a_built_graph_carries_its_opsets_lowest_ir():
    b = GraphBuilder("g")
    x = b.input("x", TensorProto.FLOAT, ["n"])
    b.output(b.op("Relu", [x]), "y", TensorProto.FLOAT, ["n"])
    model = b.model(18)
    assert model.ir_version == 8


def test_a_probe_reads_a_range_that_feeds_a_gather():
    """Marian's position ids under torch 2.11's export: Shape -> Squeeze -> Range -> Gather of the table, the
    Range's output a probe target beside the Gather's (onnxruntime 1.30's optimizer dropped the Range)."""
    mask = gs.Variable("mask", dtype=np.int64, shape=["b", "s"])
    shape, length, arange, rows = (gs.Variable(n) for n in ("shape", "length", "arange", "rows"))
    table = gs.Constant("table", np.arange(40, dtype=np.float32).reshape(10, 4))
    nodes = [gs.Node("Shape", inputs=[mask], outputs=[shape], attrs={"start": 1, "end": 2}),
             gs.Node("Squeeze", inputs=[shape, gs.Constant("axes", np.array([0], np.int64))], outputs=[length]),
             gs.Node("Range", inputs=[gs.Constant("start", np.array(0, np.int64)), length,
                                      gs.Constant("delta", np.array(1, np.int64))], outputs=[arange]),
             gs.Node("Gather", inputs=[table, arange], outputs=[rows], attrs={"axis": 0})]
    graph = gs.Graph(nodes=nodes, inputs=[mask], outputs=[rows], opset=18)
    ids, found = evaluate(graph, [arange, rows], {"mask": np.ones((2, 5), np.int64)})
    assert ids.tolist() == [0, 1, 2, 3, 4]
    assert np.array_equal(found, np.arange(40, dtype=np.float32).reshape(10, 4)[:5])
