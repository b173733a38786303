"""`padfree check --engine MODEL.engine --reference model.onnx`: the engine (through padfree's
Runtime) against the plain ONNX model on ONNX Runtime, with polygraphy's Comparator, on the same
random variable-length batches (edge lengths 1 and max in each). Padded rows are zeroed in both
results before comparing: padfree writes zeros there, an HF export computes values no one reads.
Prints per-output max absolute / relative errors; exits 1 past the precision's tolerance.
"""
from __future__ import annotations

import argparse
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# (atol, rtol) per engine precision; elementwise |engine - reference| <= atol + rtol * |reference|.
TOLERANCES = {"fp32": (1e-4, 1e-4), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 5e-2)}


@dataclass
class OutputError:
    name: str
    max_abs: float
    max_rel: float
    passed: bool


def random_feeds(input_names: list[str], dtype: np.dtype, iterations: int, batch: int, max_seqlen: int,
                 vocab_size: int, type_vocab_size: int, seed: int, pad_id: int | None = None) -> list[OrderedDict]:
    """HF-style padded feeds: lengths uniform in [1, max_seqlen], the first two at max_seqlen and 1.
    pad_id: an id never drawn inside a sequence (RoBERTa numbers positions around it), and the padding."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(iterations):
        lengths = rng.integers(1, max_seqlen + 1, batch)
        lengths[: min(batch, 2)] = [max_seqlen, 1][: min(batch, 2)]
        mask = (np.arange(max_seqlen)[None, :] < lengths[:, None]).astype(dtype)
        if pad_id is None:
            ids = rng.integers(0, vocab_size, (batch, max_seqlen)) * mask
        else:
            ids = rng.integers(0, vocab_size - 1, (batch, max_seqlen))
            ids = np.where(mask == 1, np.where(ids >= pad_id, ids + 1, ids), pad_id)
        feed = OrderedDict(input_ids=ids.astype(dtype))
        if "attention_mask" in input_names:
            feed["attention_mask"] = mask
        if "token_type_ids" in input_names:
            types = rng.integers(0, max(type_vocab_size, 1), (batch, max_seqlen))
            feed["token_type_ids"] = (types * mask).astype(dtype)
        feeds.append(feed)
    return feeds


def compare(runner, reference_path: str, feeds: list[OrderedDict], atol: float, rtol: float) -> list[OutputError]:
    """Run `runner` (a polygraphy runner returning padded outputs) and ONNX Runtime on `feeds`."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator
    try:
        from polygraphy.comparator import SimpleCompareFunc
    except ImportError:  # polygraphy < 0.50
        from polygraphy.comparator import CompareFunc
        SimpleCompareFunc = CompareFunc.simple

    from padfree.polygraphy_runners import mask_padding

    reference = OnnxrtRunner(SessionFromOnnx(reference_path, providers=["CPUExecutionProvider"]), name="onnxruntime")
    results = Comparator.run([runner, reference], data_loader=feeds)
    mask_padding(results, feeds)
    accuracy = Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=atol, rtol=rtol))
    # One AccuracyResult (runner pair -> iterations -> output -> result) or, in newer polygraphy, a list of them.
    pairs = [accuracy] if hasattr(accuracy, "values") else list(accuracy)
    passed_by_output: dict[str, bool] = {}
    for pair in pairs:
        for per_iteration in pair.values():
            for iteration in per_iteration:
                for name, ok in iteration.items():
                    passed_by_output[name] = passed_by_output.get(name, True) and bool(ok)
    errors = []
    (_, ours), (_, theirs) = list(results.items())[:2]
    for name in theirs[0].keys():
        if name not in ours[0].keys():
            errors.append(OutputError(name, float("inf"), float("inf"), False))
            continue
        diffs = [np.abs(a[name].astype(np.float64) - b[name].astype(np.float64)) for a, b in zip(ours, theirs)]
        scales = [np.abs(b[name].astype(np.float64)) for b in theirs]
        max_abs = max(float(d.max()) for d in diffs)
        max_rel = max(float((d / np.maximum(s, 1e-6)).max()) for d, s in zip(diffs, scales))
        errors.append(OutputError(name, max_abs, max_rel, passed_by_output.get(name, False)))
    return errors


def report(errors: list[OutputError], atol: float, rtol: float) -> str:
    lines = [f"{'output':<22} {'max abs err':>12} {'max rel err':>12}  (atol {atol:g}, rtol {rtol:g})"]
    for e in errors:
        lines.append(f"{e.name:<22} {e.max_abs:>12.3e} {e.max_rel:>12.3e}  {'ok' if e.passed else 'FAIL'}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Reads args.engine, args.reference, and where present: seed, batch (or batch_size), iterations,
    max_seqlen, atol, rtol, plugin_library, allow_plugin_mismatch (as `padfree check` defines them).
    Exit status 0 within tolerance, 1 past it, 2 when the check could not run."""
    import onnx

    from padfree.export.errors import ExportError
    from padfree.export.onnx_files import load_model
    from padfree.polygraphy_runners import DEFAULT_INPUTS, EngineRunner

    from . import sidecar
    from .errors import EngineError

    try:
        metadata = sidecar.read(args.engine)
    except EngineError as e:
        log.error("%s", e)
        return 2
    model = metadata["model"]
    precision = metadata["precision"]
    atol, rtol = TOLERANCES[precision]
    atol = _arg(args, "atol", atol)
    rtol = _arg(args, "rtol", rtol)
    try:
        reference = load_model(args.reference, "the reference (--reference)", load_external_data=False)
    except ExportError as e:
        log.error("%s", e)
        return 2
    inputs = [i for i in reference.graph.input if i.name in DEFAULT_INPUTS]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(inputs[0].type.tensor_type.elem_type) if inputs else np.int64
    names = [i.name for i in inputs]
    largest = metadata["profiles"][-1]
    max_seqlen = min(_arg(args, "max_seqlen", 64), largest["max_seqlen"], model.get("max_positions") or 10**9)
    batch = min(_arg(args, "batch", _arg(args, "batch_size", 8)), largest["max_batch"])
    feeds = random_feeds(names, dtype, _arg(args, "iterations", 2), batch, max_seqlen,
                         model.get("vocab_size") or 100, model.get("type_vocab_size") or 0, _arg(args, "seed", 0),
                         model.get("position_pad_id"))
    options: dict[str, Any] = {"input_names": names, "index_dtype": dtype}
    if getattr(args, "plugin_library", None):
        options["plugin_library_path"] = args.plugin_library
    if getattr(args, "allow_plugin_mismatch", False):
        options["allow_plugin_mismatch"] = True
    runner = EngineRunner(args.engine, name="padfree-engine", **options)
    try:
        errors = compare(runner, args.reference, feeds, atol, rtol)
    except EngineError as e:
        log.error("%s", e)
        return 2
    print(report(errors, atol, rtol))
    failed = [e.name for e in errors if not e.passed]
    if failed:
        log.error("%s: %s past tolerance", args.engine, ", ".join(failed))
        return 1
    return 0


def _arg(args: argparse.Namespace, name: str, default):
    value = getattr(args, name, None)
    return default if value is None else value
