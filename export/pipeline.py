"""export(source, out_dir): model.onnx, model.padfree.onnx and report.json in one call."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import onnx

from .report import RewriteReport

log = logging.getLogger("padfree.export")
MODEL, REWRITTEN, REPORT = "model.onnx", "model.padfree.onnx", "report.json"
_PROTO_LIMIT = 1_800_000_000  # protobuf's 2 GiB cap, with headroom


@dataclass
class ExportResult:
    model_path: Path
    padfree_path: Path
    report_path: Path
    report: RewriteReport


def save(model: onnx.ModelProto, path: Path) -> None:
    large = model.ByteSize() > _PROTO_LIMIT
    onnx.save_model(model, str(path), save_as_external_data=large,
                    location=path.name + ".data" if large else None)


def export(source, out_dir: str | Path, io: str = "packed", opset: int | None = None,
           allow_partial: bool = False, attn_implementation: str | None = None, dtype: str = "fp32") -> ExportResult:
    """Export `source` (a built-in name, a local HF directory, or an HF model object) to out_dir.

    Writes out_dir/model.onnx (the plain export, dynamic batch and sequence axes),
    out_dir/model.padfree.onnx (rewritten onto padfree plugin nodes, `io` form) and
    out_dir/report.json (what was fused). model.onnx is float32 (the check's reference);
    model.padfree.onnx is in `dtype` ("fp32", "fp16" or "bf16"). Raises PartialFusionError unless everything fused or
    allow_partial is set (model.onnx is written either way).
    """
    from .exporter import DEFAULT_OPSET, export_onnx
    from .models import load
    from .rewrite import rewrite

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if isinstance(source, (str, Path)):
        log.info("loading %s", source)
        model, description = load(str(source), attn_implementation)
    else:
        model, description = source, type(source).__name__
    proto = export_onnx(model, description, opset or DEFAULT_OPSET)
    save(proto, out / MODEL)
    log.info("wrote %s (%d nodes) in %.1f s", out / MODEL, len(proto.graph.node), time.perf_counter() - t0)
    t1 = time.perf_counter()
    log.info("rewriting onto padfree plugins (%s I/O)", io)
    rewritten, report = rewrite(proto, io=io, allow_partial=allow_partial, dtype=dtype)
    save(rewritten, out / REWRITTEN)
    log.info("wrote %s (%d nodes) in %.1f s", out / REWRITTEN, len(rewritten.graph.node), time.perf_counter() - t1)
    data = {"source": description, "io": io, "dtype": dtype, "model": MODEL, "rewritten": REWRITTEN, **report.to_dict()}
    (out / REPORT).write_text(json.dumps(data, indent=2) + "\n")
    return ExportResult(out / MODEL, out / REWRITTEN, out / REPORT, report)
