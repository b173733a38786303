"""`padfree bench [MODEL]`: your model on your lengths or texts, or the built-in BERT-base benchmark.

With MODEL (an engine file, a `padfree export` folder, an HF model directory or a built-in tiny model
name) and --lengths FILE or --texts FILE: sequences/s, tokens/s and per-batch latency percentiles of
padfree.Runtime on those sequences in the file's order, and on the PyTorch path the HF model's
(padfree.bench.model says how). Example:
  padfree bench ./my-model --lengths lengths.txt --batch-size 64

Without MODEL: BERT-base (random weights, fp16) padding-free vs Hugging Face and torch.compile.
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
from pathlib import Path

from .. import outputs
from ..arguments import CommandError, non_negative_int, positive_int
from ..bench.measure import measure
from ..bench.report import print_profile, print_table
from ..bench.timing import gpu_slug

SHAPES = ((1, 128), (16, 256), (64, 512), (128, 128))
SYSTEMS = ("hf", "compile", "padfree")  # hf: the eager and sdpa columns; padfree: its columns and the floor
DTYPES = ("fp32", "fp16", "bf16")
# Options of one mode only (dest -> flag), refused in the other; and each mode's defaults for the shared ones.
BERT_ONLY = {"shapes": "--shapes", "no_compile": "--no-compile", "profile": "--profile", "layers": "--layers",
             "programmatic_edges": "--programmatic-edges", "varlen_attn": "--varlen-attn",
             "one_process": "--one-process", "systems": "--systems"}
MODEL_ONLY = {"lengths": "--lengths", "texts": "--texts", "batch_size": "--batch-size", "tokenizer": "--tokenizer",
              "truncate": "--truncate", "seed": "--seed", "dtype": "--dtype", "device": "--device",
              "plugin_library": "--plugin-library", "allow_plugin_mismatch": "--allow-plugin-mismatch"}
BERT_DEFAULTS = {"shapes": ",".join(f"{b}x{s}" for b, s in SHAPES), "reps": 50, "warmup": 10, "layers": 12,
                 "gemm_search": "exhaustive"}
# a user's batches fall into many size buckets: an exhaustive GEMM search per bucket would take minutes
MODEL_DEFAULTS = {"reps": 5, "warmup": 1, "gemm_search": "heuristic", "batch_size": 128, "seed": 0,
                  "dtype": "fp16", "device": "cuda"}


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark your model on your lengths or texts (MODEL), or BERT-base:"
                              " padfree vs HF and torch.compile",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="your model: an engine file, a `padfree export` folder (ONNX Runtime, CPU), an HF model"
                        " directory or a built-in tiny model name (PyTorch path); without it, the BERT-base benchmark")
    p.add_argument("--out", default=None, help="result JSON (default: bench/results/bert-<gpu>.json without MODEL;"
                                               " none with MODEL)")
    p.add_argument("--reps", type=positive_int, default=None,
                   help="timed calls per column (median reported; default 50), with MODEL timed passes over"
                        " all batches (default 5)")
    p.add_argument("--warmup", type=non_negative_int, default=None,
                   help="untimed calls first (default 10), with MODEL untimed passes (default 1)")
    p.add_argument("--no-hf", action="store_true", help="skip the HF columns")
    p.add_argument("--gemm-search", default=None, choices=("heuristic", "exhaustive"),
                   help="how the encoder tunes a bucket's GEMMs at capture (padfree.torch.from_hf; default exhaustive,"
                        " with MODEL heuristic)")
    p.add_argument("--gemm-tuning", metavar="FILE.json",
                   help="keep the encoder's GEMM choices in this file (read if it exists, rewritten after each"
                        " capture)")
    mine = p.add_argument_group("your model (MODEL)")
    what = mine.add_mutually_exclusive_group()
    what.add_argument("--lengths", type=Path, metavar="FILE",
                      help="sequence lengths in tokens, one integer per line: random token ids of those lengths")
    what.add_argument("--texts", type=Path, metavar="FILE",
                      help="texts, one per line (UTF-8), tokenized with the model's tokenizer (not timed)")
    mine.add_argument("--batch-size", type=positive_int, default=None,
                      help="sequences per run() call, in the file's order (default 128)")
    mine.add_argument("--tokenizer", metavar="DIR", help="--texts: the model's HF tokenizer folder (default: the one"
                      " beside MODEL)")
    mine.add_argument("--truncate", action="store_true",
                      help="--texts: cut texts over the model's limit to it (default: refuse them, naming the limit)")
    mine.add_argument("--seed", type=non_negative_int, default=None,
                      help="--lengths: seed of the random ids (default 0)")
    mine.add_argument("--dtype", choices=DTYPES, default=None, help="PyTorch path precision (default fp16)")
    mine.add_argument("--device", default=None, help="PyTorch path device (default cuda)")
    mine.add_argument("--plugin-library", metavar="LIB", help="engine: the padfree plugin library to load (default:"
                      " $PADFREE_TRT_LIBRARY, else the installed one)")
    mine.add_argument("--allow-plugin-mismatch", action="store_true",
                      help="engine: load a plugin library whose SHA-256 differs from the one it was built with")
    bert = p.add_argument_group("the built-in BERT-base benchmark (no MODEL)")
    bert.add_argument("--shapes", default=None,
                      help=f"comma-separated BATCHxMAX shapes (default: the issue's four, {BERT_DEFAULTS['shapes']})")
    bert.add_argument("--no-compile", action="store_true", help="skip the torch.compile column (slow to build)")
    bert.add_argument("--profile", action="store_true", help="kernel time by name of one padfree forward per shape")
    bert.add_argument("--layers", type=positive_int, default=None, help="encoder layers (default 12: BERT-base)")
    bert.add_argument("--programmatic-edges", action="store_true",
                      help="experimental: programmatic edges into the GEMMs of each captured forward (from_hf)")
    bert.add_argument("--varlen-attn", action="store_true",
                      help="diagnostic column: the packed forward with torch's varlen_attn as its attention")
    bert.add_argument("--one-process", action="store_true",
                      help="time every system in this process (default: each in a process of its own)")
    bert.add_argument("--systems", default=None,
                      help="comma-separated systems to time, of " + ",".join(SYSTEMS)
                      + " (default: all that --no-hf / --no-compile leave)")


def _given(args, options: dict[str, str]) -> list[str]:
    return [flag for dest, flag in options.items() if getattr(args, dest, None) not in (None, False)]


def resolve(args):
    """The mode's defaults filled in; an option of the other mode, or MODEL without its sequences, is a
    CommandError saying what to do."""
    if args.model is None:
        given = _given(args, MODEL_ONLY)
        if given:
            raise CommandError(f"{', '.join(given)}: for benchmarking your own model; give MODEL first"
                               " (padfree bench MODEL --lengths FILE)")
        defaults = BERT_DEFAULTS
    else:
        given = _given(args, BERT_ONLY)
        if given:
            raise CommandError(f"{', '.join(given)}: options of the built-in BERT-base benchmark, which MODEL"
                               " replaces; leave them out")
        if args.lengths is None and args.texts is None:
            raise CommandError("padfree bench MODEL times your sequences: give --lengths FILE (one integer per line)"
                               " or --texts FILE (one text per line)")
        defaults = MODEL_DEFAULTS
    for dest, value in defaults.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    return args


def chosen_systems(args) -> list[str]:
    if args.systems:
        systems = [s for s in args.systems.split(",") if s]
        unknown = set(systems) - set(SYSTEMS)
        if unknown:
            raise CommandError(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
        return systems
    return [s for s in SYSTEMS if not (s == "hf" and args.no_hf) and not (s == "compile" and args.no_compile)]


def run(args) -> int:
    resolve(args)
    if args.model is not None:
        from ..bench.model import run_model
        return run_model(args)
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
