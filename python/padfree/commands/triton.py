"""`padfree triton MODEL.engine --repository models/`: a Triton Inference Server model with ragged batching.

Writes models/NAME/config.pbtxt and models/NAME/1/model.plan (the engine, copied whole): requests of
any length are batched by Triton with no padding (input_ids ragged, cu_seqlens and max_seqlen as
Triton batch inputs, per-token outputs scattered back; docs/SERVING.md). The engine must be a packed
encoder built by `padfree build`; the plugin library must be loaded into Triton (LD_PRELOAD).
"""
from __future__ import annotations

import argparse
import logging

from padfree.arguments import non_negative_int, positive_int

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser("triton", help="write a Triton model repository entry (ragged batching) for an engine",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("engine", metavar="MODEL.engine", help="an engine built by `padfree build` (packed I/O form)")
    p.add_argument("--repository", required=True, metavar="DIR", help="Triton model repository folder")
    p.add_argument("--name", help="model name (default: the engine's file name without its suffix)")
    p.add_argument("--max-batch", type=positive_int,
                   help="max_batch_size: most requests per batch (default: what the engine's largest profile holds"
                        " at its max_seqlen, max_tokens // max_seqlen, at most its max batch)")
    p.add_argument("--max-queue-delay-us", type=non_negative_int, default=100,
                   help="dynamic batcher's max_queue_delay_microseconds (default 100)")
    p.add_argument("--instances", type=positive_int, default=1, help="instance_group count (default 1)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from padfree.triton import write_repository

    target = write_repository(args.engine, args.repository, args.name, args.max_batch, args.max_queue_delay_us,
                              args.instances)
    log.info("wrote %s (config.pbtxt, 1/model.plan)", target)
    return 0
