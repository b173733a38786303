"""ONNX export and graph rewrite (padfree.export).

    export(source, out_dir, io="packed"|"padded", opset=None, allow_partial=False) -> ExportResult
    rewrite(onnx_model, io="packed"|"padded", allow_partial=False) -> (onnx_model, RewriteReport)
    reference.with_references(rewritten) -> a copy ONNX Runtime runs (plugin nodes expanded)

Imported lazily so that `import padfree.export` needs neither torch nor onnx.
"""
from __future__ import annotations


def export(*args, **kwargs):
    from .pipeline import export as _export
    return _export(*args, **kwargs)


def rewrite(*args, **kwargs):
    from .rewrite import rewrite as _rewrite
    return _rewrite(*args, **kwargs)


export.__doc__ = "See padfree.export.pipeline.export."
rewrite.__doc__ = "See padfree.export.rewrite.rewrite."
