"""export(source, out_dir): model.onnx, model.padfree.onnx and report.json in one call."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from padfree import outputs

from . import tasks, text_files
from .errors import ExportError
from .onnx_files import data_file, save_model as save
from .report import RewriteReport

log = logging.getLogger(__name__)
MODEL, REWRITTEN, REPORT = "model.onnx", "model.padfree.onnx", "report.json"


@dataclass
class ExportResult:
    model_path: Path
    padfree_path: Path
    report_path: Path
    report: RewriteReport


def output_set(out: Path) -> list[Path]:
    """The files of one export, in the order they are written (report.json last: it marks completion);
    the text files (tokenizer, config.json, export/text_files.py) come before report.json and are
    removed by text_files.remove_previous."""
    return [out / MODEL, data_file(out / MODEL), out / REWRITTEN, data_file(out / REWRITTEN), out / REPORT]


def export(source, out_dir: str | Path, io: str | None = None, opset: int | None = None,
           allow_partial: bool = False, attn_implementation: str | None = None, dtype: str = "fp32",
           num_beams: int | None = None, task: str | None = None, allow_unused_weights: bool = False,
           generation_tokens: int | None = None):
    """Export `source` (a built-in name, a local HF directory, or an HF model object) to out_dir.

    task: one of export.tasks.TASKS (feature-extraction, text-classification, token-classification,
    question-answering); None: a directory's config.json architectures say, a model object's class,
    a built-in is feature-extraction. Checkpoint weights the task leaves unused are an ExportError
    unless allow_unused_weights (docs/EXPORT.md "Tasks").

    An encoder-decoder (config.is_encoder_decoder) goes to padfree.export.seq2seq and returns a
    Seq2SeqExportResult (encoder.onnx, cross_kv.onnx, decoder_step.onnx; docs/EXPORT.md "Seq2seq");
    `allow_partial` has no seq2seq form and is refused there; `dtype` is the engine graphs'
    (encoder.<dtype>.onnx, cross_kv.<dtype>.onnx and decoder_step.padfree.onnx; the float32 graphs are
    written too); io "packed" adds encoder.padfree.onnx, the encoder rewritten onto plugin nodes on
    packed tokens (the default, "padded", keeps the padded encoder as the engines' encoder). num_beams
    (seq2seq only): the beam width decoder_step.padfree.onnx serves (default the model's
    generation_config.num_beams). generation_tokens (seq2seq with io "packed"): also write
    generation.padfree.onnx, a whole greedy generation of that many new tokens in one graph. An
    encoder returns an ExportResult, as follows (io None: "packed").

    Writes out_dir/model.onnx (the plain export, dynamic batch and sequence axes),
    out_dir/model.padfree.onnx (rewritten onto padfree plugin nodes, `io` form) and
    out_dir/report.json (what was fused), and beside them the source directory's tokenizer files and
    config.json (+ a sentence-transformers model's module configs; export/text_files.py), which
    report.json's "text_files" lists. model.onnx is float32 (the check's reference);
    model.padfree.onnx is in `dtype` ("fp32", "fp16" or "bf16"). Raises PartialFusionError unless
    everything fused or allow_partial is set (model.onnx is written either way).

    The previous export's files in out_dir are removed once the model has loaded, before anything
    is written, and each file is written atomically: whatever a failure or an interruption leaves,
    no file of an older export sits beside a newer one, and report.json (written last) exists only
    for a complete export.
    """
    from .exporter import DEFAULT_OPSET, export_onnx
    from .models import load
    from .precision import DTYPES
    from .rewrite import rewrite
    from .seq2seq.models import is_seq2seq_source
    from .tasks import check as check_task

    check_task(task)
    if is_seq2seq_source(source):
        if task is not None:
            raise ExportError("--task applies to encoders; an encoder-decoder exports its generation graphs")
        return _export_seq2seq(source, out_dir, io, opset, allow_partial, attn_implementation, dtype, num_beams,
                               generation_tokens)
    if num_beams is not None:
        raise ExportError("num_beams is an encoder-decoder export's option (the beam width of its decoder step)")
    if generation_tokens is not None:
        raise ExportError("generation_tokens is an encoder-decoder export's option (its whole-generation graph)")
    io = "packed" if io is None else io
    if io not in ("packed", "padded"):  # checked before the slow export, not after it
        raise ExportError(f"io must be 'packed' or 'padded', got {io!r}")
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = outputs.writable_folder(out_dir)
    t0 = time.perf_counter()
    if isinstance(source, (str, Path)):
        log.info("loading %s", source)
        model, description = load(str(source), attn_implementation, task, allow_unused_weights)
    else:
        model, description = _model_object(source, task, allow_unused_weights), type(source).__name__
    task = tasks.of_model(model)
    sources = _text_sources(source, task)
    outputs.remove(output_set(out))
    text_files.remove_previous(out, sources)
    proto = export_onnx(model, description, DEFAULT_OPSET if opset is None else opset, task)
    save(proto, out / MODEL)
    log.info("wrote %s (%d nodes) in %.1f s", out / MODEL, len(proto.graph.node), time.perf_counter() - t0)
    t1 = time.perf_counter()
    log.info("rewriting onto padfree plugins (%s I/O)", io)
    rewritten, report = rewrite(proto, io=io, allow_partial=allow_partial, dtype=dtype)
    save(rewritten, out / REWRITTEN)
    log.info("wrote %s (%d nodes) in %.1f s", out / REWRITTEN, len(rewritten.graph.node), time.perf_counter() - t1)
    copied = text_files.copy(out, sources, sentence=task == tasks.SENTENCE_SIMILARITY)
    data = {"source": description, "task": task, "io": io, "dtype": dtype, "model": MODEL, "rewritten": REWRITTEN,
            "text_files": copied, **report.to_dict()}
    outputs.write_text(out / REPORT, json.dumps(data, indent=2) + "\n")
    return ExportResult(out / MODEL, out / REWRITTEN, out / REPORT, report)


def _text_sources(source, task: str) -> list[Path]:
    """The folders whose tokenizer and configs the export copies (none for a built-in or a model object)."""
    from .models import BUILTIN
    from .sentence import is_sentence_dir, read

    if not isinstance(source, (str, Path)) or str(source) in BUILTIN:
        return []
    encoder_path = read(source).encoder_path if task == tasks.SENTENCE_SIMILARITY and is_sentence_dir(source) else None
    return text_files.sources_of(source, encoder_path)


def _model_object(model, task: str | None, allow_unused_weights: bool):
    """An HF model object for `task`: its own head, or (feature-extraction) its encoder alone when
    allow_unused_weights lets the head go."""
    own = tasks.of_model(model)
    if task is None or task == own:
        return model
    if task == tasks.FEATURE_EXTRACTION and allow_unused_weights:
        log.warning("exporting the encoder of %s without its %s head (allow_unused_weights)", type(model).__name__,
                    own)
        return tasks.encoder(model)
    raise ExportError(f"{type(model).__name__} is a {own} model: it cannot be exported as {task}"
                      + (" (pass allow_unused_weights to export its encoder alone)"
                         if task == tasks.FEATURE_EXTRACTION else ""))


def _export_seq2seq(source, out_dir, io, opset, allow_partial, attn_implementation, dtype, num_beams=None,
                    generation_tokens=None):
    from .exporter import DEFAULT_OPSET, MIN_OPSET
    from .seq2seq import models as seq2seq_models
    from .seq2seq.pipeline import export_seq2seq

    seq2seq_models.check_options(io, dtype, allow_partial)
    if num_beams is not None and (isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1):
        raise ExportError(f"num_beams must be a positive integer, got {num_beams!r}")
    opset = DEFAULT_OPSET if opset is None else opset
    import onnx
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise ExportError(f"opset {opset}: choose one in [{MIN_OPSET}, {onnx.defs.onnx_opset_version()}]")
    out = outputs.writable_folder(out_dir)
    source_path = None
    if isinstance(source, (str, Path)):
        log.info("loading %s", source)
        model, description = seq2seq_models.load(source, attn_implementation)
        source_path = str(Path(source).resolve())
    else:
        model, description = source, type(source).__name__
    outputs.remove(output_set(out))     # an encoder export's files in the same folder
    text_files.remove_previous(out, text_files.sources_of(source_path) if source_path else [])
    return export_seq2seq(model, description, out, opset, source_path, num_beams, dtype, io or "padded",
                          generation_tokens)
