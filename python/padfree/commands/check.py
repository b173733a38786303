"""`padfree check MODEL --reference REF`: a rewritten model vs its plain export on ONNX Runtime (CPU).

With --engine it hands over to padfree.engines.check (a TensorRT engine vs the reference).
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
    p.add_argument("model", nargs="?", help="the rewritten model (OUT/model.padfree.onnx)")
    p.add_argument("--reference", required=True, help="the plain export (OUT/model.onnx)")
    p.add_argument("--engine", help="a TensorRT engine to check instead (padfree.engines.check)")
    p.add_argument("--batch", type=positive_int, default=8, help="sequences in the random batch (default 8)")
    p.add_argument("--max-seqlen", type=positive_int, default=64, help="longest sequence (default 64)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the random batch (default 0)")
    p.add_argument("--precision", choices=tuple(RTOL), default="fp32",
                   help="sets the default tolerances (default fp32: a fp16 / bf16 rewritten model is checked in "
                        "float32 against the reference with the same rounded weights; with --engine, the "
                        "engine's own precision sets them)")
    p.add_argument("--rtol", type=tolerance, default=None,
                   help="relative tolerance, finite, >= 0 (fp32 default: 1e-4 per 12 layers, at least 1e-4)")
    p.add_argument("--atol", type=tolerance, default=None, help="absolute tolerance, finite, >= 0 (default rtol / 10)")
    p.add_argument("--plugin-library", metavar="LIB", help="with --engine: the padfree plugin library to load"
                   " (default: $PADFREE_TRT_LIBRARY, else the installed one; never the path a sidecar records)")
    p.add_argument("--allow-plugin-mismatch", action="store_true",
                   help="with --engine: load a plugin library whose SHA-256 differs from the one the engine was"
                        " built with (refused otherwise)")
    p.add_argument("--verbose", action="store_true", help="polygraphy's full comparison log")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.engine:  # unset tolerances stay None: the engine's sidecar precision picks them
        return _engine_check(args)
    if not args.model:
        raise CommandError("give the rewritten model (MODEL) or --engine")
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
