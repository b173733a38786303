"""`padfree check MODEL --reference REF`: a rewritten model vs its plain export on ONNX Runtime (CPU).

With --engine it hands over to padfree.engines.check (a TensorRT engine vs the reference).
`padfree check OUT [--reference HF_DIR]` on a seq2seq export folder: generation on ONNX Runtime vs
HF's generate (padfree.export.seq2seq.check); the reference defaults to the directory it was exported from.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..arguments import EXIT_DIFFERENCE, EXIT_OK, CommandError, non_negative_int, positive_int, tolerance

log = logging.getLogger(__name__)
# Default relative tolerance by precision; atol = rtol / 10 (see padfree.export.compare). fp32's
# grows with depth (padfree.export.compare.fp32_tolerances); this is its floor.
RTOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "check", help="compare a rewritten model (or, with --engine, an engine) against the plain export",
        description="Runs both models through polygraphy's Comparator on one random variable-length "
                    "batch and prints the max absolute and relative error per output over valid tokens.",
        epilog="exit status: 0 within the tolerance, 1 past it, 2 the check could not run")
    p.add_argument("model", nargs="?", help="the rewritten model (OUT/model.padfree.onnx), or a seq2seq export folder")
    p.add_argument("--reference", help="the plain export (default: model.onnx beside MODEL); for a seq2seq export"
                   " folder, the HF model directory (default: the one it was exported from)")
    p.add_argument("--engine", help="a TensorRT engine to check instead (padfree.engines.check)")
    p.add_argument("--batch", type=positive_int, default=8, help="sequences in the random batch (default 8)")
    p.add_argument("--max-seqlen", type=positive_int, default=None,
                   help="longest sequence (default 64; a seq2seq check's longest source: 16)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the random batch (default 0)")
    p.add_argument("--max-new-tokens", type=positive_int, default=16,
                   help="seq2seq: tokens generated per source (default 16)")
    p.add_argument("--num-beams", type=positive_int, default=4, help="seq2seq: beam width checked (default 4)")
    p.add_argument("--precision", choices=tuple(RTOL), default="fp32",
                   help="sets the default tolerances (default fp32: a fp16 / bf16 rewritten model is checked in "
                        "float32 against the reference with the same rounded weights; with --engine, the "
                        "engine's own precision sets them)")
    p.add_argument("--rtol", type=tolerance, default=None,
                   help="relative tolerance, finite, >= 0 (fp32 default: 1e-4 per 12 layers, at least 1e-4)")
    p.add_argument("--atol", type=tolerance, default=None,
                   help="absolute tolerance, finite, >= 0 (default rtol / 10; a seq2seq"
                   " check's sequences_scores tolerance: 1e-4 per 12 layers of the deeper stack, at least 1e-4)")
    p.add_argument("--plugin-library", metavar="LIB", help="with --engine: the padfree plugin library to load"
                   " (default: $PADFREE_TRT_LIBRARY, else the installed one; never the path a sidecar records)")
    p.add_argument("--allow-plugin-mismatch", action="store_true",
                   help="with --engine: load a plugin library whose SHA-256 differs from the one the engine was"
                        " built with (refused otherwise)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from padfree.export.seq2seq.models import is_seq2seq_export
    if args.model and not args.engine and is_seq2seq_export(args.model):
        return _seq2seq_check(args)
    args.max_seqlen = 64 if args.max_seqlen is None else args.max_seqlen
    if args.engine:  # unset tolerances stay None: the engine's sidecar precision picks them
        return _engine_check(args)
    if not args.model:
        raise CommandError("give the rewritten model (MODEL) or --engine")
    if not args.reference:
        args.reference = default_reference(args.model)
    from padfree.export.compare import compare, format_results, fp32_tolerances
    from padfree.export.onnx_files import load_model
    from padfree.export.precision import float_dtype

    rewritten = load_model(args.model, "the rewritten model")
    reference = load_model(args.reference, "the reference (--reference)")
    if args.rtol is None:
        args.rtol = fp32_tolerances(rewritten)[0] if args.precision == "fp32" else RTOL[args.precision]
    args.atol = args.rtol / 10 if args.atol is None else args.atol
    try:
        ok, results, data = compare(rewritten, reference, batch=args.batch, max_seqlen=args.max_seqlen,
                                    seed=args.seed, rtol=args.rtol, atol=args.atol, verbose=args.verbose)
    except ValueError as e:
        raise CommandError(f"{args.model} vs {args.reference}: {e}") from e
    dtype = float_dtype(rewritten)
    weights = "" if dtype == "fp32" else f" (weights as {dtype} in both)"
    print(f"{args.model} vs {args.reference}{weights}: batch {args.batch}, lengths "
          f"{data.lengths.tolist()}, seed {args.seed}, ONNX Runtime CPU")
    print(format_results(results, args.rtol, args.atol))
    print("PASS" if ok else "FAIL: past the tolerance")
    return EXIT_OK if ok else EXIT_DIFFERENCE


def default_reference(model: str) -> str:
    """model.onnx in the rewritten model's folder (where `padfree export` writes it)."""
    from pathlib import Path

    beside = Path(model).parent / "model.onnx"
    if not beside.is_file() or beside.resolve() == Path(model).resolve():
        raise CommandError(f"no plain export beside {model} ({beside} is not there or is the model itself):"
                           " give it with --reference")
    log.info("reference: %s", beside)
    return str(beside)


def _seq2seq_check(args: argparse.Namespace) -> int:
    """Generation on ONNX Runtime from the export's graphs vs HF's generate on the reference model."""
    import json
    from pathlib import Path

    from padfree.export.seq2seq import check as seq2seq_check, models as seq2seq_models
    from padfree.export.seq2seq.pipeline import MANIFEST

    manifest = json.loads((Path(args.model) / MANIFEST).read_text())
    reference = args.reference or manifest.get("source_path")
    if not reference:
        raise CommandError(f"{args.model} was exported from a model object: give its HF directory with --reference")
    model, _ = seq2seq_models.load(reference)
    max_seqlen = 16 if args.max_seqlen is None else args.max_seqlen
    result = seq2seq_check.check(args.model, model, batch=args.batch, max_seqlen=max_seqlen,
                                 max_new_tokens=args.max_new_tokens, num_beams=args.num_beams, seed=args.seed,
                                 tol=args.atol)
    print(f"{args.model} vs {reference}: batch {args.batch}, source lengths {result.lengths}, seed {args.seed}, "
          f"{args.max_new_tokens} new tokens, ONNX Runtime CPU, float32")
    print("\n".join(result.lines))
    print("PASS" if result.ok else "FAIL: generation differs from HF's")
    return EXIT_OK if result.ok else EXIT_DIFFERENCE


def _engine_check(args: argparse.Namespace) -> int:
    try:
        module = importlib.import_module("padfree.engines.check")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("padfree"):
            raise CommandError(f"--engine needs padfree.engines.check, which this install does not have ({e})") from e
        raise
    return int(module.main(args) or 0)


if __name__ == "__main__":
    from padfree.cli import main as cli_main
    sys.exit(cli_main(["check", *sys.argv[1:]]))
