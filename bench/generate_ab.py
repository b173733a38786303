"""Two configurations of padfree.generation against each other in one process, calls alternating.

Why in one process: on an H200, two processes running the same NLLB-size configuration measured steps up to
20 % apart (medians of 9-11 calls, each tight within its process), more than most changes being judged;
alternating the calls of both configurations in one process moves both columns alike. (padfree.bench.timing
times columns in blocks instead, since a call inherits the clock its predecessor left: there the columns are
different workloads; here both are the same model and shapes, so each inherits a like clock.)

A configuration is a set of PADFREE_* variables (padfree.env; docs/ENVIRONMENT.md), in force while its
generator is made and while each of its decode states is made (its first calls at a shape):

    python bench/generate_ab.py --a PADFREE_FRAGMENT_ROWS=8 --b PADFREE_FRAGMENT_ROWS=64 --models nllb --shapes 16x4

Models, sources and options are bench/generate.py's (random weights, lengths uniform in [8, 64], exactly
--new-tokens per hypothesis, fp16 on CUDA). Printed: each shape's median ms per decode step of a and b, b / a,
and each column's range; --out writes them as JSON with the date, versions, commit and command.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate as bench_generate  # noqa: E402  (bench/generate.py: the models, sources and options)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def configuration(text: str) -> dict[str, str]:
    """NAME=VALUE[,NAME=VALUE...] of padfree.env's variables ("" for none)."""
    from padfree import env
    settings = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name not in env.VARIABLES:
            raise argparse.ArgumentTypeError(f"{item!r}: expected NAME=VALUE with NAME one of padfree.env's "
                                             f"variables (docs/ENVIRONMENT.md)")
        settings[name] = value
    return settings


@contextlib.contextmanager
def environment(settings: dict[str, str]):
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=configuration, default={}, help="configuration a: NAME=VALUE,... (default: none)")
    parser.add_argument("--b", type=configuration, required=True, help="configuration b: NAME=VALUE,...")
    parser.add_argument("--models", default="marian,nllb", help="comma-separated: marian, nllb (tiny: --quick's)")
    parser.add_argument("--shapes", default="16x4", help="batch x beams, comma-separated")
    parser.add_argument("--rounds", type=int, default=9, help="timed calls of each configuration (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="calls of each configuration before the rounds")
    parser.add_argument("--new-tokens", type=int, default=bench_generate.NEW_TOKENS)
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: the tiny model, shape 2x2, 4 new tokens, 2 rounds, CPU without CUDA")
    parser.add_argument("--out", default=None, help="JSON report (printed only where not given)")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.shapes, args.new_tokens, args.rounds, args.warmup = "tiny", "2x2", 4, 2, 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.quick:
        print("generate_ab.py: no CUDA device (run with --quick for the CPU smoke test)", file=sys.stderr)
        return 2
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    configs = {"a": args.a, "b": args.b}
    import padfree.torch as pt
    from padfree.bench import record, timing
    from padfree.generation.inputs import padded_batch
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        model = bench_generate.build(name, dtype, device)
        generators = {}
        for key, settings in configs.items():
            with environment(settings):
                generators[key] = pt.from_hf(model, dtype=dtype, device=device)
            bench_generate.refuse_reference_ops(f"{name}, configuration {key}", generators[key].ops.sources, device,
                                                allowed=False, flag=None)
        for batch, beams in shapes:
            sources = bench_generate.sources_for(batch, model.config)
            ids, mask = padded_batch(sources, model.config.pad_token_id, device)
            options = dict(num_beams=beams, min_new_tokens=args.new_tokens, max_new_tokens=args.new_tokens)
            calls = {key: functools.partial(g.generate, ids, mask, **options) for key, g in generators.items()}
            times = {key: [] for key in configs}
            with torch.inference_mode():
                for key, call in calls.items():
                    with environment(configs[key]):    # the shape's decode state is made by the first call
                        for _ in range(max(1, args.warmup)):
                            call()
                for r in range(args.rounds):
                    for key in ("a", "b") if r % 2 == 0 else ("b", "a"):
                        ms = timing.samples_ms(calls[key], reps=1, warmup=0, cuda=device.type == "cuda")[0]
                        times[key].append(ms / args.new_tokens)
            med = {key: statistics.median(v) for key, v in times.items()}
            row = {"model": name, "batch": batch, "beams": beams, "new_tokens": args.new_tokens,
                   "a_ms_per_step": med["a"], "b_ms_per_step": med["b"], "b_over_a": med["b"] / med["a"],
                   "a_range": [min(times["a"]), max(times["a"])], "b_range": [min(times["b"]), max(times["b"])]}
            rows.append(row)
            print(f"{name:7s} {batch}x{beams:<3d} ms/step a {med['a']:.3f}  b {med['b']:.3f}  b/a {row['b_over_a']:.3f}"
                  f"  (a {row['a_range'][0]:.3f}-{row['a_range'][1]:.3f}, b {row['b_range'][0]:.3f}-"
                  f"{row['b_range'][1]:.3f})", flush=True)
        del generators, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        report = {"benchmark": "two generation configurations in one process, calls alternating",
                  "device": device_name, "dtype": str(dtype), **record.provenance(ROOT),
                  "a": args.a, "b": args.b, "rounds": args.rounds, "warmup": args.warmup,
                  "timing": ("CUDA events" if device.type == "cuda" else "perf_counter")
                  + ", median ms per decode step of each configuration's calls", "rows": rows}
        record.write(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
