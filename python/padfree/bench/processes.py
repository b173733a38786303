"""`padfree bench` with each system timed in a process of its own (the default).

A process's CUDA state carries from one system's timing into the next. On the H100 (CUDA 13.0,
driver 580) the 1x128 padfree forward's graph ran ~30 us (8%) slower on the GPU once a third CUDA
stream had run work in its process: every edge between kernels later, the programmatic overlap gone.
torch.compile's reduce-overhead mode runs its graphs on streams of its
own, so timed after it in one process, padfree was timed in a state that no server running padfree
alone is in. A server runs one model per process, and so does this benchmark: HF, torch.compile and
padfree each in a child `padfree bench --systems X`, one after another (never at once: they would
share the GPU), and the parent merges their rows. --one-process times all of them in one process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from .measure import add_ratios


def child_argv(args, system: str, out: str) -> list[str]:
    """The command that times `system` alone with this run's settings."""
    argv = [sys.executable, "-m", "padfree.commands.bench", "--systems", system, "--out", out, "--shapes", args.shapes,
            "--reps", str(args.reps), "--warmup", str(args.warmup), "--layers", str(args.layers)]
    if system == "padfree":
        argv += ["--gemm-search", args.gemm_search]
        if args.gemm_tuning:
            argv += ["--gemm-tuning", args.gemm_tuning]
        argv += [flag for flag, on in (("--no-hf", args.no_hf),  # else it checks its accuracy against HF sdpa
                                       ("--profile", args.profile),
                                       ("--programmatic-edges", args.programmatic_edges),
                                       ("--varlen-attn", args.varlen_attn)) if on]
    return argv


def measure_apart(args, systems: list[str]) -> dict:
    """Every system's rows from a child process each, merged into one result."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for system in systems:
            out = os.path.join(tmp, f"{system}.json")
            print(f"== {system}, in a process of its own", flush=True)
            done = subprocess.run(child_argv(args, system, out))
            if done.returncode != 0:
                from ..arguments import CommandError
                raise CommandError(f"timing {system} failed (exit {done.returncode}); its messages are above")
            with open(out) as f:
                results[system] = json.load(f)
    return merge(results)


def merge(results: dict[str, dict]) -> dict:
    """One result: padfree's rows (accuracy, bucket, GEMM choices, profile) with every process's times,
    and each process's own record (date, host speed, environment)."""
    base = results.get("padfree") or next(iter(results.values()))
    merged = {k: v for k, v in base.items() if k not in ("rows", "date", "host_loop_ms", "systems")}
    merged.update(date=min(r["date"] for r in results.values()), systems=list(results), processes="one per system",
                  host_loop_ms={system: r["host_loop_ms"] for system, r in results.items()})
    merged["rows"] = []
    for i, row in enumerate(base["rows"]):
        row = dict(row, ms=dict(row["ms"]))
        for result in results.values():
            other = result["rows"][i]
            assert (other["batch"], other["max_seqlen"]) == (row["batch"], row["max_seqlen"])
            row["ms"].update(other["ms"])
        add_ratios(row)
        merged["rows"].append(row)
    return merged
