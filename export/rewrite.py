"""rewrite(onnx_model) -> (model with padfree plugin nodes, report): the pass pipeline + finishing."""
from __future__ import annotations

import logging

import onnx
import onnx_graphsurgeon as gs

from . import precision, shapes, spec as spec_mod
from .context import Context
from .errors import ExportError, PartialFusionError
from .exporter import MIN_OPSET
from .passes import PIPELINE
from .report import RewriteReport

log = logging.getLogger(__name__)


def rewrite(model: onnx.ModelProto, io: str = "packed", allow_partial: bool = False,
            spec: spec_mod.Spec | None = None, dtype: str = "fp32") -> tuple[onnx.ModelProto, RewriteReport]:
    """Replace the encoder's subgraphs of an exported HF encoder with padfree plugin nodes.

    io="packed": inputs input_ids [T], token_type_ids [T] (where the model has them), cu_seqlens
    [B+1], max_seqlen [S] (only its length is read), all int32; outputs last_hidden_state [T, H]
    and pooler_output [B, H]. io="padded": inputs input_ids, attention_mask, token_type_ids [B, S]
    int32; padded outputs (zeros in padded rows).
    dtype: "fp32" | "fp16" | "bf16", the float dtype of the rewritten model's weights and outputs
    (export.precision).
    Raises PartialFusionError naming what did not match, unless allow_partial.
    """
    if dtype not in precision.DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(precision.DTYPES)}, got {dtype!r}")
    spec = spec or spec_mod.load()
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is below {MIN_OPSET}: export with --opset {MIN_OPSET} or newer")
    graph = gs.import_onnx(model)
    nodes_before = len(graph.nodes)
    ctx = Context(graph, io, spec)
    ctx.metadata = {p.key: p.value for p in model.metadata_props}
    for step in PIPELINE:
        graph = step.run(graph, ctx)
    report = RewriteReport.from_passes(io, ctx.reports, nodes_before, len(graph.nodes))
    log.info("%s", report.summary())
    if report.unmatched and not allow_partial:
        raise PartialFusionError(report)
    if not report.fused:
        raise ExportError("nothing in this model matched a padfree pattern: " + "; ".join(report.unmatched))
    return _finish(graph, ctx, model, dtype), report


def _finish(graph: gs.Graph, ctx: Context, original: onnx.ModelProto, dtype: str) -> onnx.ModelProto:
    """Export, with fresh shape inference through the plugins, metadata and onnx.checker."""
    ends = {id(t) for t in graph.inputs} | {id(t) for t in graph.outputs}
    for t in graph.tensors().values():
        if isinstance(t, gs.Variable) and id(t) not in ends:
            t.shape, t.dtype = None, None  # stale: shapes are inferred again below
    for t in graph.outputs:
        t.shape = None
    model = gs.export_onnx(graph, do_type_check=False)
    declared = shapes.output_dims(original)
    del model.graph.value_info[:]
    domains = {o.domain for o in model.opset_import}
    if ctx.spec.namespace not in domains:
        model.opset_import.append(onnx.helper.make_opsetid(ctx.spec.namespace, int(ctx.spec.version)))
    model.ir_version = original.ir_version
    model.producer_name, model.producer_version = "padfree", _version()
    meta = {p.key: p.value for p in original.metadata_props}
    meta.update({"padfree.io": ctx.io, "padfree.spec_version": ctx.spec.version})
    onnx.helper.set_model_props(model, meta)
    model = precision.cast(model, dtype)
    log.info("inferring shapes and checking the rewritten model (%s)", dtype)
    return shapes.infer_checked(model, ctx.spec, declared, "the rewritten model")


def _version() -> str:
    import padfree
    return padfree.__version__

