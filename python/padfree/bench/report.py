"""The table `padfree bench` prints: each row's times and ratios, judged against the issue's targets."""
from __future__ import annotations

# (shape) -> the "done" targets: padfree <= 1.5x floor and >= 2x faster than compile, or a latency
FLOOR_RATIO_TARGET, COMPILE_SPEEDUP_TARGET, SMALL_LATENCY_TARGET_MS = 1.5, 2.0, 0.4
STRETCH_FLOOR_RATIO = 1.25


def _targets(row: dict) -> str:
    r = row["ratios"]
    if "padfree" not in row["ms"]:
        return "n/a"
    if (row["batch"], row["max_seqlen"]) == (1, 128):
        return "ok" if row["ms"]["padfree"] <= SMALL_LATENCY_TARGET_MS else "MISS"
    ok = (r.get("padfree_over_floor", FLOOR_RATIO_TARGET + 1) <= FLOOR_RATIO_TARGET
          and r.get("compile_over_padfree", 0) >= COMPILE_SPEEDUP_TARGET)
    return "ok" if ok else ("MISS" if "compile_over_padfree" in r else "n/a")


def print_profile(row: dict) -> None:
    groups: dict[str, float] = {}
    for k in row["profile"]:
        groups[k["group"]] = groups.get(k["group"], 0.0) + k["ms"]
    total = sum(groups.values())
    print(f"-- {row['batch']}x{row['max_seqlen']}: kernel time of one forward ({row['profile_mode']})"
          f" {total:.3f} ms: " +
          ", ".join(f"{g} {t:.3f} ({t / total:.0%})" for g, t in sorted(groups.items(), key=lambda x: -x[1])))
    for k in row["profile"][:8]:
        print(f"   {k['ms']:8.3f} ms {k['calls']:4d}x  {k['kernel'][:100]}")


def print_table(rows: list[dict]) -> None:
    cols = {"hf_eager": "eager", "hf_sdpa": "sdpa", "compile": "compile", "padfree": "padfree", "padfree_gpu": "pf-gpu",
            "padfree_host_inputs": "host-in", "padfree_packed": "packed",
            "padfree_packed_with_varlen_attn": "pk+FA", "floor": "floor"}
    print(f"{'shape':>8} {'tokens':>6} " + " ".join(f"{c:>8}" for c in cols.values())
          + f" {'pf/floor':>8} {'pk/floor':>8} {'cmp/pf':>7} target")
    for r in rows:
        cells = " ".join(f"{r['ms'][c]:8.3f}" if c in r["ms"] else f"{'-':>8}" for c in cols)
        ratios = [r["ratios"].get(k) for k in ("padfree_over_floor", "packed_over_floor", "compile_over_padfree")]
        cells += "".join(f" {'-' if x is None else f'{x:.2f}':>{w}}" for x, w in zip(ratios, (8, 8, 7)))
        print(f"{r['batch']:>4}x{r['max_seqlen']:<3} {r['total_tokens']:6d} {cells} {_targets(r)}")
    print("median ms; pf = padfree HF-style call on device inputs, pk = packed; targets: pf/floor <= 1.5 "
          "(stretch 1.25), compile/pf >= 2, 1x128 pf <= 0.4 ms")


