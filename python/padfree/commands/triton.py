"""`padfree triton SOURCE --repository models/`: a Triton Inference Server model with ragged batching.

SOURCE is one of:
  MODEL.engine   an engine built by `padfree build` (packed I/O form): models/NAME/config.pbtxt and
                 1/model.plan for Triton's TensorRT backend (cu_seqlens and max_seqlen as Triton batch
                 inputs, per-token outputs scattered back); the plugin library must be loaded into Triton
  EXPORT_DIR     a `padfree export` folder: a Python-backend model (1/model.py, padfree.Runtime) over
                 1/export/ on ONNX Runtime on the CPU
  HF_DIR         an HF encoder directory: a Python-backend model over 1/hf/ on the PyTorch path
                 (padfree.torch, GPU), for GPUs where no engine runs
Requests of any length are batched by Triton with no padding (docs/SERVING.md).
"""
from __future__ import annotations

import argparse
import logging
import os

from padfree.arguments import non_negative_int, positive_int

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser("triton", help="write a Triton model repository entry (ragged batching)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="SOURCE", help="MODEL.engine, a `padfree export` folder or an HF model directory")
    p.add_argument("--repository", required=True, metavar="DIR", help="Triton model repository folder")
    p.add_argument("--name", help="model name (default: the engine's file name without its suffix, or the folder's"
                                             " name)")
    p.add_argument("--max-batch", type=positive_int,
                   help="max_batch_size: most sequences per batch (engine default: what its largest profile holds"
                        " at its max_seqlen, max_tokens // max_seqlen, at most its max batch; Python model: 64)")
    p.add_argument("--max-queue-delay-us", type=non_negative_int, default=100,
                   help="dynamic batcher's max_queue_delay_microseconds (default 100)")
    p.add_argument("--instances", type=positive_int, default=1, help="instance_group count (default 1)")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"),
                   help="HF directory only: the PyTorch path's precision (default float16; bfloat16 answers float32)")
    p.add_argument("--python-path", metavar="PATHS",
                   help="Python model only: where model.py imports padfree and its packages from, os.pathsep-separated"
                        " (default: this Python's sys.path; the backend stub ignores PYTHONPATH)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from padfree.triton import TritonError, write_python_model, write_repository

    if os.path.isdir(args.source):
        path = args.python_path.split(os.pathsep) if args.python_path else None
        if args.dtype and not (os.path.isfile(os.path.join(args.source, "config.json"))
                               and not os.path.isfile(os.path.join(args.source, "report.json"))):
            raise TritonError(f"--dtype applies to an HF model directory (the PyTorch path); {args.source} is served"
                              " in its export's precision: leave --dtype out")
        target = write_python_model(args.source, args.repository, args.name, args.max_batch or 64,
                                    args.max_queue_delay_us, args.instances, args.dtype or "float16", path)
        log.info("wrote %s (config.pbtxt, 1/model.py, 1/%s)", target, "export" if (target / "1" / "export").is_dir()
                 else "hf")
        return 0
    unused = [flag for flag, value in (("--dtype", args.dtype), ("--python-path", args.python_path)) if value]
    if unused:
        raise TritonError(f"{' and '.join(unused)} apply to a Python-backend model (an export folder or an HF"
                          " directory);"
                          f" an engine runs in the precision it was built with: leave {' and '.join(unused)} out")
    target = write_repository(args.source, args.repository, args.name, args.max_batch, args.max_queue_delay_us,
                              args.instances)
    log.info("wrote %s (config.pbtxt, 1/model.plan)", target)
    return 0
