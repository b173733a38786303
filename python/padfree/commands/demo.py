"""`padfree demo`: export a built-in 12-layer BERT, rewrite it onto padfree plugins, check the
rewrite against the plain export on ONNX Runtime (CPU), then build a TensorRT engine where a
TensorRT (or TensorRT-RTX) is installed. No GPU needed; without TensorRT the last step says why not."""
from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from ..arguments import EXIT_DIFFERENCE, EXIT_OK, non_negative_int

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="export + rewrite + check (+ engine build where TensorRT is) a built-in"
                                           " 12-layer BERT on the CPU")
    p.add_argument("-o", "--output", default=None, help="output folder (default: a temporary one)")
    p.add_argument("--model", default="small-bert",
                   help="built-in model to use (default small-bert: 12 layers, hidden 256)")
    p.add_argument("--io", choices=("packed", "padded"), default="packed")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from .export import _quiet_exporter

    _quiet_exporter(False)
    if args.output is None:
        with tempfile.TemporaryDirectory(prefix="padfree-demo-") as tmp:
            return _run(args, Path(tmp))
    return _run(args, Path(args.output))


def _run(args, out: Path) -> int:
    import onnx

    from padfree.export.compare import compare, format_results, fp32_tolerances
    from padfree.export.pipeline import export

    t0 = time.perf_counter()
    result = export(args.model, out, io=args.io)
    t1 = time.perf_counter()
    rewritten = onnx.load(result.padfree_path)
    ok, results, data = compare(rewritten, onnx.load(result.model_path), batch=8, max_seqlen=64, seed=args.seed)
    t2 = time.perf_counter()
    engine_line = _build_engine(result, out)
    t3 = time.perf_counter()
    print(result.report.format())
    print(f"\ncheck on ONNX Runtime (CPU), batch of {len(data.lengths)} with lengths {data.lengths.tolist()}:")
    print(format_results(results, *fp32_tolerances(rewritten)))
    print(f"\n{'step':<26} {'seconds':>8}\n{'export + rewrite':<26} {t1 - t0:>8.1f}\n{'check (ONNX Runtime)':<26} "
          f"{t2 - t1:>8.1f}\n{'TensorRT engine':<26} {t3 - t2:>8.1f}")
    print(f"\nengine: {engine_line}")
    where = out if args.output else "a temporary folder (use -o DIR to keep the files)"
    print(f"\nmodel.onnx, model.padfree.onnx, report.json (and any engine) in {where}")
    print("demo PASS" if ok else "demo FAIL: the rewrite does not match the plain export")
    return EXIT_OK if ok else EXIT_DIFFERENCE


def _build_engine(result, out: Path) -> str:
    """Builds the rewritten graph when the plugin library is there, else the plain export (so that
    the TensorRT half of the pipeline runs wherever TensorRT does); returns a line saying which."""
    from padfree.engines import plugin_library, trt_api
    from padfree.engines.build import BuildOptions, build
    from padfree.engines.errors import BackendUnavailableError, EngineError

    try:
        api = trt_api.load(None)
    except BackendUnavailableError as e:
        return f"skipped: {e}"
    library = plugin_library.find(required=False)
    source = result.padfree_path if library is not None else result.model_path
    engine = out / (Path(source).stem + ".engine")
    try:  # precision None: the engine follows the exported dtype
        build(BuildOptions(onnx=str(source), output=str(engine), precision=None, max_tokens=1024,
                          max_batch=16, plugin_library=None if library is None else str(library),
                          progress=False))
    except EngineError as e:
        return f"FAILED to build {Path(source).name} with {api.name} {api.version}: {e}"
    why = "" if library is not None else f" (no {plugin_library.LIBRARY_NAME} here: the plain export instead)"
    return f"built {engine.name} from {Path(source).name} with {api.name} {api.version}{why}"
