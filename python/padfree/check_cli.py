"""`padfree check MODEL --reference REF`: a rewritten model vs its plain export on ONNX Runtime (CPU).

With --engine it hands over to padfree.engines.check (a TensorRT engine vs the reference).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

log = logging.getLogger("padfree.check")
# Default relative tolerance by precision; atol = rtol / 10 (see padfree.export.compare).
RTOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "check", help="compare a rewritten model (or, with --engine, an engine) against the plain export",
        description="Runs both models through polygraphy's Comparator on one random variable-length "
                    "batch and prints the max absolute and relative error per output over valid tokens.")
    p.add_argument("model", nargs="?", help="the rewritten model (OUT/model.padfree.onnx)")
    p.add_argument("--reference", required=True, help="the plain export (OUT/model.onnx)")
    p.add_argument("--engine", help="a TensorRT engine to check instead (padfree.engines.check)")
    p.add_argument("--batch", type=int, default=8, help="sequences in the random batch (default 8)")
    p.add_argument("--max-seqlen", type=int, default=64, help="longest sequence (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random batch (default 0)")
    p.add_argument("--precision", choices=tuple(RTOL), default="fp32",
                   help="sets the default tolerances (default fp32: a fp16 / bf16 rewritten model is checked in "
                        "float32 against the reference with the same rounded weights; with --engine, the "
                        "engine's own precision sets them)")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (fp32 default 1e-4)")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance (default rtol / 10)")
    p.add_argument("--verbose", action="store_true", help="polygraphy's full comparison log")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.engine:  # unset tolerances stay None: the engine's sidecar precision picks them
        return _engine_check(args)
    args.rtol = RTOL[args.precision] if args.rtol is None else args.rtol
    args.atol = args.rtol / 10 if args.atol is None else args.atol
    if not args.model:
        log.error("give the rewritten model (MODEL) or --engine")
        return 2
    if args.batch < 1 or args.max_seqlen < 1:
        log.error("--batch and --max-seqlen must be at least 1")
        return 2
    import onnx

    from padfree.export.compare import compare, format_results
    from padfree.export.precision import float_dtype

    try:
        rewritten, reference = onnx.load(args.model), onnx.load(args.reference)
        ok, results, data = compare(rewritten, reference, batch=args.batch, max_seqlen=args.max_seqlen,
                                    seed=args.seed, rtol=args.rtol, atol=args.atol, verbose=args.verbose)
    except (OSError, ValueError) as e:
        log.error("%s", e)
        return 2
    dtype = float_dtype(rewritten)
    weights = "" if dtype == "fp32" else f" (weights as {dtype} in both)"
    print(f"{args.model} vs {args.reference}{weights}: batch {args.batch}, lengths "
          f"{data.lengths.tolist()}, seed {args.seed}, ONNX Runtime CPU")
    print(format_results(results, args.rtol, args.atol))
    print("PASS" if ok else "FAIL: past the tolerance")
    return 0 if ok else 1


def _engine_check(args: argparse.Namespace) -> int:
    try:
        module = importlib.import_module("padfree.engines.check")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("padfree"):
            log.error("--engine needs padfree.engines.check, which this install does not have (%s)", e)
            return 2
        raise
    return int(module.main(args) or 0)


if __name__ == "__main__":
    from padfree.cli import main as cli_main
    sys.exit(cli_main(["check", *sys.argv[1:]]))
