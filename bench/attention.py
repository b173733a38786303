"""Fused varlen attention: padfree vs torch.nn.attention.varlen.varlen_attn (FlashAttention in torch).

Two comparisons per shape, both on the same packed QKV projection output [T, 3*H]:
  kernel alone:  padfree.attention_varlen(qkv)              vs varlen_attn(q, k, v)
  bias included: padfree.attention_varlen(qkv, qkv_bias)    vs (qkv + bias) then varlen_attn
q, k, v are strided views of the packed qkv (no copies) where varlen_attn takes them; otherwise
contiguous copies made outside the timed region (the JSON says which).

Timing: each measured call is captured RUNS_PER_GRAPH times in a CUDA graph over rotating input
sets (more bytes than L2), the graph is replayed after a warm-up, each replay timed with CUDA
events; the median replay / RUNS_PER_GRAPH is reported. Floors: bytes (qkv read once, out written
once) over the measured copy bandwidth, and the two GEMMs' FLOPs over the measured fp16 GEMM rate.

Usage (device machine, after `source scripts/device_env.sh`):
  python bench/attention.py [--out bench/results/attention-h100.json] [--paths]
--paths also times each kernel path forced (PADFREE_ATTENTION_PATH) to check the switch points.
"""
from __future__ import annotations

import argparse
import datetime
import inspect
import json
import math
import os
import statistics
import sys

import torch

from padfree.bench.timing import lengths_for  # the benchmark recipe: uniform in [0.2*max, max], seed 0
from padfree.ops import attention_varlen

RUNS_PER_GRAPH = 20
REPLAYS = 30
WARMUP_REPLAYS = 3
L2_BYTES = 50 * 2**20

# (name, batch, max_seqlen, num_heads, head_dim): BERT-base attention first.
SHAPES = [
    ("bert 1x128", 1, 128, 12, 64),
    ("bert 16x256", 16, 256, 12, 64),
    ("bert 64x512", 64, 512, 12, 64),
    ("bert 128x128", 128, 128, 12, 64),
    ("hd128 1x128", 1, 128, 6, 128),
    ("hd128 16x256", 16, 256, 6, 128),
    ("hd128 64x512", 64, 512, 6, 128),
    ("hd128 128x128", 128, 128, 6, 128),
    ("long 8x4096", 8, 4096, 12, 64),
]


def time_graph(fn, sets: int) -> float:
    """Median ms per call of fn(i) (i = input set), from CUDA-graph replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(min(sets, 3)):  # warm-up outside capture: lazy init, kernel attributes
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in range(RUNS_PER_GRAPH):
            fn(r % sets)
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / RUNS_PER_GRAPH)
    return statistics.median(times)


def measure_ceilings() -> dict:
    """Device-to-device copy bandwidth (read + write bytes) and fp16 GEMM rate, measured here."""
    n = 1 << 28  # 512 MiB of fp16
    a = torch.empty(n, dtype=torch.float16, device="cuda").uniform_()
    b = torch.empty_like(a)
    copy_ms = time_graph(lambda i: b.copy_(a), 1)
    m = 8192
    x = torch.randn(m, m, dtype=torch.float16, device="cuda")
    y = torch.randn(m, m, dtype=torch.float16, device="cuda")
    gemm_ms = time_graph(lambda i: torch.mm(x, y), 1)
    del a, b, x, y
    return {"copy_bytes_per_s": 2 * n * 2 / (copy_ms * 1e-3), "fp16_gemm_flop_per_s": 2 * m**3 / (gemm_ms * 1e-3)}


def varlen_callable():
    """varlen_attn, and how to pass the scale (its signature changed between torch releases)."""
    from torch.nn.attention.varlen import varlen_attn
    params = inspect.signature(varlen_attn).parameters
    return varlen_attn, ("scale" in params), str(inspect.signature(varlen_attn))


def bench_shape(name, batch, max_seqlen, num_heads, head_dim, ceilings, varlen, with_paths):
    varlen_attn, takes_scale, _ = varlen
    lengths = lengths_for(batch, max_seqlen)
    total = sum(lengths)
    max_len = max(lengths)
    hidden = num_heads * head_dim
    dtype = torch.float16
    set_bytes = total * 3 * hidden * 2
    sets = max(2, min(16, math.ceil(4 * L2_BYTES / set_bytes)))
    gen = torch.Generator(device="cuda").manual_seed(1)
    qkvs = [torch.randn(total, 3 * hidden, device="cuda", generator=gen, dtype=dtype) for _ in range(sets)]
    biases = [0.1 * torch.randn(3 * hidden, device="cuda", generator=gen, dtype=dtype) for _ in range(sets)]
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).cuda()
    outs = [torch.empty(total, hidden, device="cuda", dtype=dtype) for _ in range(sets)]
    scale = 1.0 / math.sqrt(head_dim)
    kw = {"scale": scale} if takes_scale else {}

    def split(qkv):
        return qkv.view(total, 3, num_heads, head_dim).unbind(1)

    layout = "strided views of qkv"
    q, k, v = split(qkvs[0])
    try:
        ref = varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - older FA entry points want contiguous q/k/v
        print(f"  varlen_attn refused strided views ({type(e).__name__}: {e}); using contiguous copies")
        layout = "contiguous copies (made outside the timed region)"
    qkv_split = ([split(x) for x in qkvs] if layout.startswith("strided")
                 else [tuple(t.contiguous() for t in split(x)) for x in qkvs])
    ours = attention_varlen(qkvs[0], cu, max_len, num_heads, out=outs[0])
    ref = varlen_attn(*qkv_split[0], cu, cu, max_len, max_len, **kw).reshape(total, hidden)
    agreement = ((ours.float() - ref.float()).norm() / ref.float().norm()).item()
    summed = [torch.empty_like(x) for x in qkvs]

    def padfree_plain(i):
        attention_varlen(qkvs[i], cu, max_len, num_heads, out=outs[i])

    def padfree_bias(i):
        attention_varlen(qkvs[i], cu, max_len, num_heads, biases[i], out=outs[i])

    def torch_plain(i):
        varlen_attn(*qkv_split[i], cu, cu, max_len, max_len, **kw)

    def torch_bias(i):
        torch.add(qkvs[i], biases[i], out=summed[i])
        q, k, v = split(summed[i])
        if not layout.startswith("strided"):
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)

    row = {
        "shape": name, "batch": batch, "max_seqlen": max_seqlen, "num_heads": num_heads, "head_dim": head_dim,
        "dtype": "float16", "total_tokens": total, "lengths_max": max_len, "input_sets": sets,
        "padfree_ms": time_graph(padfree_plain, sets),
        "varlen_attn_ms": time_graph(torch_plain, sets),
        "padfree_bias_ms": time_graph(padfree_bias, sets),
        "bias_add_varlen_attn_ms": time_graph(torch_bias, sets),
        "relative_difference_vs_varlen_attn": agreement,
    }
    flops = 4.0 * sum(n * n for n in lengths) * head_dim * num_heads
    bytes_moved = total * (3 * hidden + hidden) * 2
    row["floor_ms"] = max(bytes_moved / ceilings["copy_bytes_per_s"], flops / ceilings["fp16_gemm_flop_per_s"]) * 1e3
    memory_bound = bytes_moved / ceilings["copy_bytes_per_s"] > flops / ceilings["fp16_gemm_flop_per_s"]
    row["floor_bound"] = "memory" if memory_bound else "compute"
    if with_paths:
        for path in forced_paths(max_len, head_dim):
            os.environ["PADFREE_ATTENTION_PATH"] = path
            try:
                outs[0].fill_(math.nan)
                padfree_plain(0)
                row[f"diff_{path}"] = ((outs[0].float() - ref.float()).norm() / ref.float().norm()).item()
                row[f"path_{path}_ms"] = time_graph(padfree_plain, sets)
            finally:
                del os.environ["PADFREE_ATTENTION_PATH"]
    del qkvs, outs, summed
    torch.cuda.empty_cache()
    return row, layout


def forced_paths(max_len: int, head_dim: int) -> list[str]:
    """The PADFREE_ATTENTION_PATH values that run their own kernel at these sizes ("resident" holds at
    most 128 keys; "tma" and "held" are the wgmma kernel's head_dim-64 variants)."""
    return [path for path in ("resident", "tiled", "wgmma", "tma", "held")
            if not (path == "resident" and max_len > 128) and not (path in ("tma", "held") and head_dim != 64)]


def run_once(shapes) -> int:
    for name, batch, max_seqlen, num_heads, head_dim in shapes:
        lengths = lengths_for(batch, max_seqlen)
        qkv = torch.randn(sum(lengths), 3 * num_heads * head_dim, device="cuda", dtype=torch.float16)
        cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).cuda()
        for path in forced_paths(max(lengths), head_dim):
            os.environ["PADFREE_ATTENTION_PATH"] = path
            attention_varlen(qkv, cu, max(lengths), num_heads)
        os.environ.pop("PADFREE_ATTENTION_PATH", None)
        torch.cuda.synchronize()
        print(f"{name}: one call per path done")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/attention-h100.json")
    parser.add_argument("--paths", action="store_true", help="also time each kernel path forced")
    parser.add_argument("--shapes", default="", help="comma-separated substrings of shape names to run")
    parser.add_argument("--once", action="store_true",
                        help="no timing: one call per shape and path (PADFREE_ATTENTION_PATH), for ncu")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: the benchmark runs on the device machine")
        return 1
    wanted = [s for s in args.shapes.split(",") if s]
    if args.once:
        return run_once([s for s in SHAPES if not wanted or any(w in s[0] for w in wanted)])
    varlen = varlen_callable()
    ceilings = measure_ceilings()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, varlen_attn{varlen[2]}")
    print(f"copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s,"
          f" fp16 GEMM {ceilings['fp16_gemm_flop_per_s'] / 1e12:.0f} TFLOP/s")
    rows, layout = [], None
    for shape in SHAPES:
        if wanted and not any(w in shape[0] for w in wanted):
            continue
        row, layout = bench_shape(*shape, ceilings, varlen, args.paths)
        rows.append(row)
        print(json.dumps(row))
    result = {
        "benchmark": "fused varlen attention, padfree vs torch varlen_attn",
        "device": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "varlen_attn_signature": varlen[2], "varlen_attn_inputs": layout,
        "lengths": "uniform in [0.2*max, max], torch.Generator seed 0", "timing":
            f"CUDA graph of {RUNS_PER_GRAPH} calls over rotating inputs, median of {REPLAYS} replays",
        "ceilings": ceilings, "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    header = (f"{'shape':15} {'tokens':>6} {'padfree':>8} {'varlen':>8} {'ratio':>6} {'pf+bias':>8}"
              f" {'add+varlen':>10} {'ratio':>6} {'floor':>7}")
    print(header)
    for r in rows:
        print(f"{r['shape']:15} {r['total_tokens']:6d} {r['padfree_ms']:8.4f} {r['varlen_attn_ms']:8.4f} "
              f"{r['varlen_attn_ms'] / r['padfree_ms']:6.2f} {r['padfree_bias_ms']:8.4f} "
              f"{r['bias_add_varlen_attn_ms']:10.4f} {r['bias_add_varlen_attn_ms'] / r['padfree_bias_ms']:6.2f} "
              f"{r['floor_ms']:7.4f}" + "".join(f" {k[5:-3]}={v:.4f}" for k, v in r.items() if k.startswith("path_")))
    print("times in ms (median per call); ratio = torch / padfree (> 1: padfree faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
