"""`padfree bench`: BERT-base (random weights, fp16) padding-free vs Hugging Face and torch.compile.

Columns per shape (batch x max_seqlen, lengths uniform in [0.2*max, max], torch.Generator seed 0):
  hf_eager, hf_sdpa     HF BertModel, attn_implementation eager / sdpa, on the padded batch
  compile               torch.compile(mode="reduce-overhead") of the sdpa model, padded batch
  padfree               the HF-style call on the padded device batch (validation, packing, the graph
                        replay, padded output): what replaces the HF call
  padfree_gpu           (diagnostic) the same call timed with the GPU kept busy first, so that the host
                        has enqueued it before its start event fires: the call's GPU time alone, without
                        the host's work in front of the first kernel (for the small shapes: at the
                        power-capped large ones the idle millisecond before each call lifts the clock)
  padfree_host_inputs   the same call with the padded batch on the CPU (a tokenizer's output): validated
                        and packed on the host, one asynchronous copy, no synchronization
  padfree_packed        forward_packed on already packed inputs (what padfree.runtime calls)
  ..._with_varlen_attn  (--varlen-attn, diagnostic) forward_packed with torch's varlen_attn as attention
  floor                 the 12 layers' four projection GEMMs on the valid tokens only, one CUDA graph
                        (torch's calls: cuBLASLt's first heuristic pick, no epilogue, no residual)
The encoder tunes its GEMMs when a bucket is first captured (--gemm-search, default exhaustive: every
cuBLASLt configuration screened, like an engine build's tactic search); first_call_s is that call.
Timing: CUDA events around each call after a warm-up, median of --reps. The padfree call on device
inputs synchronizes once inside (the token count must reach the host), and that wait is in its time.
The profile (--profile) is a torch.profiler trace of one forward_packed, kernel time by name.

Each system (HF, torch.compile, padfree) is timed in a process of its own, as a server runs one model
(padfree.bench.processes says why); --one-process times them all in one.
The script bench/bert.py runs this with its defaults; results go to bench/results/bert-<gpu>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .. import outputs
from ..arguments import CommandError, non_negative_int, positive_int
from ..bench.measure import measure
from ..bench.report import print_profile, print_table
from ..bench.timing import gpu_slug

SHAPES = ((1, 128), (16, 256), (64, 512), (128, 128))
SYSTEMS = ("hf", "compile", "padfree")  # hf: the eager and sdpa columns; padfree: its columns and the floor


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark BERT-base: padfree vs HF eager/sdpa and torch.compile",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default=",".join(f"{b}x{s}" for b, s in SHAPES),
                   help="comma-separated BATCHxMAX shapes (default: the issue's four)")
    p.add_argument("--out", default=None, help="result JSON (default bench/results/bert-<gpu>.json)")
    p.add_argument("--reps", type=positive_int, default=50, help="timed calls per column (median reported)")
    p.add_argument("--warmup", type=non_negative_int, default=10, help="untimed calls first")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile column (slow to build)")
    p.add_argument("--no-hf", action="store_true", help="skip the HF eager and sdpa columns")
    p.add_argument("--profile", action="store_true", help="kernel time by name of one padfree forward per shape")
    p.add_argument("--layers", type=positive_int, default=12, help="encoder layers (default 12: BERT-base)")
    p.add_argument("--gemm-search", default="exhaustive", choices=("heuristic", "exhaustive"),
                   help="how the encoder tunes a bucket's GEMMs at capture (padfree.torch.from_hf)")
    p.add_argument("--gemm-tuning", metavar="FILE.json",
                   help="keep the encoder's GEMM choices in this file (read if it exists, rewritten after each"
                        " capture)")
    p.add_argument("--programmatic-edges", action="store_true",
                   help="experimental: programmatic edges into the GEMMs of each captured forward (from_hf)")
    p.add_argument("--varlen-attn", action="store_true",
                   help="diagnostic column: the packed forward with torch's varlen_attn as its attention")
    p.add_argument("--one-process", action="store_true",
                   help="time every system in this process (default: each in a process of its own)")
    p.add_argument("--systems", default=None,
                   help="comma-separated systems to time, of " + ",".join(SYSTEMS)
                   + " (default: all that --no-hf / --no-compile leave)")


def chosen_systems(args) -> list[str]:
    if args.systems:
        systems = [s for s in args.systems.split(",") if s]
        unknown = set(systems) - set(SYSTEMS)
        if unknown:
            raise CommandError(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
        return systems
    return [s for s in SYSTEMS if not (s == "hf" and args.no_hf) and not (s == "compile" and args.no_compile)]


def run(args) -> int:
    import torch
    if not torch.cuda.is_available():
        raise CommandError("no CUDA device here; the benchmark runs on a GPU machine")
    systems = chosen_systems(args)
    if args.one_process or len(systems) == 1:
        result = measure(args, systems)
    else:
        from ..bench.processes import measure_apart
        result = measure_apart(args, systems)
    out = args.out or os.path.join("bench", "results", f"bert-{gpu_slug(result['device'])}.json")
    outputs.write_text(out, json.dumps(result, indent=1))
    print(f"wrote {out}; {result['device']}, torch {result['torch']}, host loop {result['host_loop_ms']} ms")
    for row in result["rows"]:
        if "profile" in row:
            print_profile(row)
    print_table(result["rows"])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="padfree bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
