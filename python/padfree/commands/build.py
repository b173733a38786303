"""`padfree build MODEL.onnx -o MODEL.engine`: a TensorRT / TensorRT-RTX engine and its JSON sidecar."""
from __future__ import annotations

import argparse
import logging

from padfree.arguments import positive_int
from padfree.engines.trt_api import PRECISIONS  # the registry skips this command where padfree.engines is absent

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser("build", help="build a TensorRT engine from an ONNX model", description=__doc__)
    p.add_argument("onnx", metavar="MODEL.onnx", help="model.padfree.onnx (plugin nodes) or a plain model.onnx")
    p.add_argument("-o", "--output", required=True, metavar="MODEL.engine",
                   help="engine file; its sidecar goes to MODEL.engine.json")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="fp16, bf16 or fp32 (default: the ONNX's own dtype on TensorRT-RTX, which builds that"
                        " only, and for fp16 / bf16 exports; fp16 for a float32 ONNX on TensorRT)")
    p.add_argument("--max-tokens", type=positive_int, default=4096, help="most tokens of one batch (default 4096)")
    p.add_argument("--max-batch", type=positive_int, default=64, help="most sequences of one batch (default 64)")
    p.add_argument("--max-seqlen", type=positive_int,
                   help="longest sequence (default: min(max-tokens, position table))")
    p.add_argument("--profiles", nargs="+", default=[], metavar="TxB[xS]",
                   help="extra optimization profiles, e.g. 512x16 4096x64 (within the max limits)")
    p.add_argument("--max-cache", type=positive_int, default=None,
                   help="decoder step: the longest K/V cache, max_length - 1 (default 256)")
    p.add_argument("--num-beams", type=positive_int, default=None,
                   help="decoder step without plugin nodes: rows = batch x num_beams (default 1; a step on plugin "
                        "nodes serves the num_beams it was exported for)")
    p.add_argument("--timing-cache", metavar="FILE", help="read and update this timing cache")
    p.add_argument("--plugin-library", metavar="LIB",
                   help="libpadfree_trt.so (default: $PADFREE_TRT_LIBRARY, else the one installed with padfree)")
    p.add_argument("--backend", choices=("tensorrt", "tensorrt_rtx"), help="which installed TensorRT to use")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from padfree.arguments import CommandError
    from padfree.engines.build import BuildOptions, build
    from padfree.engines.errors import EngineError

    options = BuildOptions(onnx=args.onnx, output=args.output, precision=args.precision, max_tokens=args.max_tokens,
                           max_batch=args.max_batch, max_seqlen=args.max_seqlen, max_cache=args.max_cache,
                           num_beams=args.num_beams, profiles=list(args.profiles),
                           timing_cache=args.timing_cache, plugin_library=args.plugin_library, backend=args.backend,
                           progress=not (args.no_progress or getattr(args, "quiet", False)),
                           verbose=bool(getattr(args, "verbose", False)))
    try:
        metadata = build(options)
    except ValueError as e:  # padfree's errors end the command in padfree.cli; these join them
        if isinstance(e, EngineError):
            raise
        raise CommandError(str(e)) from e
    log.info("%s: %s %s, %s (%s), io %s, plugins: %s", args.output, metadata["backend"]["name"],
             metadata["backend"]["version"], metadata["precision"], metadata["precision_mode"],
             metadata["model"]["io"], ", ".join(metadata["plugins"]) or "none")
    return 0
