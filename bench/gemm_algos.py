"""BERT-base's four projection GEMMs: torch's call (cuBLASLt's first heuristic pick) against every
candidate cuBLASLt's heuristic lists for the same problem (padfree.torch.cublaslt), on the H100.

Each time: a CUDA graph of CALLS calls, median over REPLAYS replays, per call. Rows: the encoder's
bucket rows at the benchmark shapes (1x128, 16x256, 128x128, 64x512). On the device machine:
  python bench/gemm_algos.py [--out FILE.json] [--rows N ...] [--enumerate]
--enumerate adds every configuration cuBLASLt accepts beyond the heuristic's list (tile x stages x
cluster shape per algorithm id), screened in one short round; the fastest are then re-timed against
torch's call in interleaved rounds (best round kept: the H100's clocks drift under its power cap).
"""
import argparse
import datetime
import json
import sys
import time

import torch

from padfree.torch import cublaslt
from padfree.torch.gemm_tuning import graph_call_us

CALLS, REPLAYS = 20, 15
SCREEN_CALLS, SCREEN_REPLAYS = 5, 3
FINALISTS, ROUNDS = 8, 3
ROWS = (128, 2624, 9344, 21504)
H, FFN = 768, 3072


def problems(rows: int):
    """(name, in, out, epilogue, accumulate, the encoder's torch call)"""
    def rnd(*s):
        return torch.randn(*s, device="cuda", dtype=torch.float16) * 0.05
    x, w_qkv, w_o, w_up, w_down = rnd(rows, H), rnd(3 * H, H), rnd(H, H), rnd(FFN, H), rnd(H, FFN)
    up_in, b_up = rnd(rows, FFN), rnd(FFN)
    qkv, acc, up = torch.empty(rows, 3 * H, device="cuda", dtype=torch.float16), rnd(rows, H), rnd(rows, FFN)
    return [
        ("qkv", x, w_qkv, None, qkv, cublaslt.EPILOGUE_DEFAULT, False,
         lambda: torch.mm(x, w_qkv.t(), out=qkv)),
        ("out+residual", x, w_o, None, acc, cublaslt.EPILOGUE_DEFAULT, True,
         lambda: acc.addmm_(x, w_o.t())),
        ("up+bias+gelu", x, w_up, b_up, up, cublaslt.EPILOGUE_GELU_BIAS, False,
         lambda: torch._addmm_activation(b_up, x, w_up.t(), use_gelu=True, out=up)),
        ("down+residual", up_in, w_down, None, acc, cublaslt.EPILOGUE_DEFAULT, True,
         lambda: acc.addmm_(up_in, w_down.t())),
    ]


def _time_candidates(lin, pairs, x, w, bias, out, workspace, expect, ref, calls, replays):
    """[{algo, us, max_rel_diff_vs_torch, workspace}] for each (algo, info), numbers checked against
    torch's output first (fresh output for the non-accumulating GEMMs)."""
    timed = []
    for algo, info in pairs:
        try:
            lin(x, w, out, bias, workspace, algo)
            torch.cuda.synchronize()
        except (cublaslt.CublasLtError, RuntimeError) as e:
            timed.append({"algo": info.label(), "error": str(e)})
            continue
        got = out.clone()
        out.copy_(ref)
        err = ((got.float() - expect.float()).abs().max() / expect.float().abs().max().clamp(min=1e-6)).item()
        us = graph_call_us(lambda: lin(x, w, out, bias, workspace, algo), calls, replays)  # noqa: B023 - timed before the loop moves on
        out.copy_(ref)
        timed.append({"algo": info.label(), "us": us, "max_rel_diff_vs_torch": err,
                      "workspace": info.workspace_size, "_algo": algo})
    return timed


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--candidates", type=int, default=32)
    p.add_argument("--rows", type=int, nargs="*", default=list(ROWS))
    p.add_argument("--enumerate", action="store_true",
                   help="also every configuration cublasLtMatmulAlgoCheck accepts (Linear.enumerate): screened "
                        "in one short round, the fastest FINALISTS re-timed against torch in ROUNDS rounds")
    p.add_argument("--split-k", type=int, nargs="*", default=[1],
                   help="with --enumerate: split-K factors to enumerate too (each reduction scheme)")
    args = p.parse_args(argv)
    workspace = torch.empty(cublaslt.WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    report = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "torch": torch.__version__, "cublaslt": cublaslt._loaded_library_path(), "rows": []}
    print(f"{'gemm':>14} {'rows':>6} {'torch us':>9} {'lt#0 us':>8} {'best us':>8} {'best/torch':>10}  best algo")
    for rows in args.rows:
        for name, x, w, bias, out, epi, accumulate, torch_call in problems(rows):
            lin = cublaslt.Linear(rows, x.shape[1], w.shape[0], torch.float16, epilogue=epi, accumulate=accumulate,
                                  max_workspace=cublaslt.WORKSPACE_BYTES)
            ref = out.clone()
            torch_call()
            expect = out.clone()
            out.copy_(ref)
            pairs = lin.candidates(args.candidates)
            row = {"gemm": name, "rows": rows}
            if args.enumerate:
                t0 = time.perf_counter()
                extra = lin.enumerate(split_ks=tuple(args.split_k))
                row["enumerated"] = len(extra)
                row["enumerate_s"] = time.perf_counter() - t0
                pairs = pairs + extra
            screen = _time_candidates(lin, pairs, x, w, bias, out, workspace, expect, ref,
                                      *((SCREEN_CALLS, SCREEN_REPLAYS) if args.enumerate else (CALLS, REPLAYS)))
            ok = [t for t in screen if "us" in t and t["max_rel_diff_vs_torch"] < 2e-2]
            if args.enumerate:  # the screen's clocks drift: finalists and torch in interleaved rounds
                finalists = sorted(ok, key=lambda t: t["us"])[:FINALISTS]
                best_us = {"torch": float("inf"), **{t["algo"]: float("inf") for t in finalists}}
                for _ in range(ROUNDS):
                    best_us["torch"] = min(best_us["torch"], graph_call_us(torch_call, CALLS, REPLAYS))
                    for t in finalists:
                        fn = (lambda a: lambda: lin(x, w, out, bias, workspace, a))(t["_algo"])  # noqa: B023 - timed before the loop moves on
                        best_us[t["algo"]] = min(best_us[t["algo"]], graph_call_us(fn, CALLS, REPLAYS))
                out.copy_(ref)
                for t in finalists:
                    t["screen_us"], t["us"] = t["us"], best_us[t["algo"]]
                t_torch, ok = best_us["torch"], finalists
            else:
                t_torch = graph_call_us(torch_call, CALLS, REPLAYS)
            best = min(ok, key=lambda t: t["us"]) if ok else None
            first = next((t for t in screen if t["algo"].startswith("#0 ")), None)
            for t in screen:
                t.pop("_algo", None)
            row.update(torch_us=t_torch, candidates=screen)
            report["rows"].append(row)
            first_us = first["us"] if first and "us" in first else float("nan")
            best_time = best["us"] if best else float("nan")
            print(f"{name:>14} {rows:>6} {t_torch:9.1f} {first_us:8.1f} "
                  f"{best_time:8.1f} {best_time / t_torch if best else float('nan'):10.3f}  "
                  f"{best['algo'] if best else '-'}"
                  + (f"  ({row['enumerated']} enumerated in {row['enumerate_s']:.1f} s)" if args.enumerate else ""),
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
