"""Achieved bandwidth of the decoder kernels (one decoding step) against a device-to-device copy, and
decode_linear (on nn.Linear weights and on their fragment-order copies) and decode_gemm (the LayerNorm
folded into the weight; compute capability 9.0) against cuBLAS (torch's F.linear, with torch's LayerNorm
where the kernel fuses one).

Each kernel is captured CALLS times into a CUDA graph cycling through input sets (up to ~200 MB, so
repeated calls do not just re-read L2), and the median replay over REPS, divided by CALLS, is the
time per call (CUDA events). Bytes are what the kernel must read: self-attention the K and V of
positions 0..step of every row (through the indirection), cross-attention each source's K/V rows
once (its beams share them in L2), the top-k every logit once, a linear layer its weight. The copy figure is
(read + write bytes) / time of `dst.copy_(src)` of 1 GiB.

    python bench/decoder.py [--linear] [--out results.json]
"""
from __future__ import annotations

import argparse
import os
import statistics

import torch

from padfree import ops
from padfree.bench import record
from padfree.ops.decode_gemm import decode_gemm_fits, fold_layernorm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CALLS = 20
REPS = 20
ROTATE_BYTES = 200 << 20
MODELS = {  # heads, head_dim, vocab
    "marian-base": (8, 64, 58101),
    "nllb-600m": (16, 64, 256206),
}
FFN = {"marian-base": 2048, "nllb-600m": 4096}
NUM_BEAMS = 4
MAX_LEN = 256
SOURCE_LEN = 64


def time_ms(fns) -> float:
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for i in range(CALLS):
                fns[i % len(fns)]()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    return statistics.median(times)


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms([lambda: dst.copy_(src)])
    return 2 * src.numel() / ms / 1e6  # GB/s


def sets_for(bytes_per_set: int) -> int:
    return max(1, min(CALLS, ROTATE_BYTES // max(bytes_per_set, 1)))


def bench_self(heads, head_dim, rows, step, dtype):
    hidden = heads * head_dim
    elt = torch.finfo(dtype).bits // 8
    cache_bytes = 2 * rows * heads * MAX_LEN * head_dim * elt
    fns = []
    step_t = torch.tensor([step], dtype=torch.int32, device="cuda")
    for _ in range(sets_for(cache_bytes)):
        qkv = torch.randn(rows, 3 * hidden, device="cuda", dtype=dtype)
        k = torch.randn(rows, heads, MAX_LEN, head_dim, device="cuda", dtype=dtype)
        v = torch.randn_like(k)
        indir = torch.randint(0, rows, (rows, MAX_LEN), device="cuda", dtype=torch.int32)
        out = torch.empty(rows, hidden, device="cuda", dtype=dtype)
        fns.append(lambda qkv=qkv, k=k, v=v, indir=indir, out=out: ops.decoder_self_attention(
            qkv, k, v, indir, step_t, heads, out=out))
    ms = time_ms(fns)
    return ms, 2 * rows * heads * (step + 1) * head_dim * elt


def bench_cross(heads, head_dim, rows, dtype):
    hidden = heads * head_dim
    elt = torch.finfo(dtype).bits // 8
    batch = rows // NUM_BEAMS
    total = batch * SOURCE_LEN
    cu = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * SOURCE_LEN
    fns = []
    for _ in range(sets_for(total * 2 * hidden * elt)):
        q = torch.randn(rows, hidden, device="cuda", dtype=dtype)
        kv = torch.randn(total, 2 * hidden, device="cuda", dtype=dtype)
        out = torch.empty(rows, hidden, device="cuda", dtype=dtype)
        fns.append(lambda q=q, kv=kv, out=out: ops.cross_attention(q, kv, cu, SOURCE_LEN, NUM_BEAMS, heads, out=out))
    ms = time_ms(fns)
    return ms, total * 2 * hidden * elt


def bench_topk(vocab, rows, dtype):
    """log_softmax_topk as a decode step calls it: the vocabulary padded to a multiple of 64 (the padded
    LM head, weights.pad_output_projection) with a bias of -inf on the padded ids."""
    elt = torch.finfo(dtype).bits // 8
    k = 2 * NUM_BEAMS
    padded = -(-vocab // 64) * 64
    bias = torch.zeros(padded, device="cuda", dtype=dtype)
    bias[vocab:] = float("-inf")
    fns = []
    bs = torch.zeros(rows, device="cuda")
    for _ in range(sets_for(rows * padded * elt)):
        logits = torch.randn(rows, padded, device="cuda", dtype=dtype)
        scores = torch.empty(rows, k, device="cuda")
        ids = torch.empty(rows, k, device="cuda", dtype=torch.int32)
        ws = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
        fns.append(lambda logits=logits, scores=scores, ids=ids, ws=ws: ops.log_softmax_topk(
            logits, k, bias=bias, beam_scores=bs, out_scores=scores, out_ids=ids, workspace=ws))
    ms = time_ms(fns)
    return ms, rows * padded * elt


LINEAR_IMPLS = ("decode_linear", "fragments", "decode_gemm", "cublas+torch")


def bench_linear(rows, k, n, dtype, *, ln, residual, act, impl):
    """One linear layer of a decode step: decode_linear (LayerNorm, bias, activation and residual
    fused) on the nn.Linear weight or ("fragments") on its fragment-order copy, decode_gemm on the layer
    fold_layernorm makes, or ("cublas+torch") cuBLAS's GEMM with torch's LayerNorm / bias / activation /
    residual ops."""
    elt = torch.finfo(dtype).bits // 8
    fns = []
    for _ in range(sets_for(n * k * elt)):
        x = torch.randn(rows, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=dtype)
        r = torch.randn(rows, n, device="cuda", dtype=dtype) if residual else None
        norm = (torch.ones(k, device="cuda", dtype=dtype), torch.zeros(k, device="cuda", dtype=dtype), 1e-5)
        out = torch.empty(rows, n, device="cuda", dtype=dtype)
        if impl == "cublas+torch":
            def fn(x=x, w=w, b=b, r=r, norm=norm):
                h = torch.nn.functional.layer_norm(x, (k,), norm[0], norm[1], norm[2]) if ln else x
                y = torch.nn.functional.linear(h, w, b)
                if act is not None:
                    y = torch.nn.functional.relu(y)
                return y + r if r is not None else y
        elif impl == "decode_gemm":
            folded = fold_layernorm(w, b, norm if ln else None)

            def fn(x=x, layer=folded, r=r, out=out):
                return ops.decode_gemm(x, layer, residual=r, activation=act, out=out)
        else:
            weight = ops.fragment_layout(w) if impl == "fragments" else w

            def fn(x=x, w=weight, b=b, r=r, norm=norm, out=out):
                return ops.decode_linear(x, w, b, r, ln=norm if ln else None, activation=act, out=out)
        fns.append(fn)
    return time_ms(fns), n * k * elt


def linear_shapes(model, hidden, ffn, vocab):
    """(name, in, out, LayerNorm, residual, activation) of a pre-LN decoder layer's linears and the LM head."""
    padded = -(-vocab // 64) * 64
    return [(f"{model} qkv", hidden, 3 * hidden, True, False, None),
            (f"{model} out", hidden, hidden, False, True, None),
            (f"{model} fc1", hidden, ffn, True, False, "relu"),
            (f"{model} fc2", ffn, hidden, False, True, None),
            (f"{model} lm_head", hidden, padded, True, False, None)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    parser.add_argument("--linear", action="store_true", help="decode_linear and decode_gemm against cuBLAS instead")
    parser.add_argument("--rows", type=lambda v: [int(r) for r in v.split(",")], default=[1, 4, 8],
                        help="--linear's row counts, comma-separated")
    args = parser.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    copy = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}  copy {copy:.0f} GB/s (read + write)  dtype {args.dtype}")
    benchmark = "decode_linear and decode_gemm against cuBLAS" if args.linear else "decoder kernels against copy"
    results = {"benchmark": benchmark,
               "device": torch.cuda.get_device_name(), "dtype": args.dtype, **record.provenance(ROOT),
               "timing": f"CUDA graph of {CALLS} calls cycling through input sets, median of {REPS} replays",
               "copy_GBps": copy, "rows": []}

    def report(name, ms, nbytes):
        gbps = nbytes / ms / 1e6
        print(f"{name:44s} {ms * 1e3:8.2f} us  {nbytes / 1e6:9.2f} MB  {gbps:7.0f} GB/s  {gbps / copy:6.1%} of copy")
        results["rows"].append({"kernel": name, "us": ms * 1e3, "bytes": nbytes, "GBps": gbps})

    if args.linear:
        for model, (heads, head_dim, vocab) in MODELS.items():
            for rows in args.rows:
                for name, k, n, ln, residual, act in linear_shapes(model, heads * head_dim, FFN[model], vocab):
                    for impl in LINEAR_IMPLS:
                        if impl == "fragments" and not ops.fragments.fragments_fit(rows, k, n, dtype, ln=ln):
                            continue
                        if impl == "decode_linear" and not ops.decoder.decode_linear_fits(rows, k, dtype, ln=ln):
                            continue
                        if impl == "decode_gemm" and not decode_gemm_fits(rows, k, n, dtype, torch.device("cuda")):
                            continue
                        report(f"{name} rows {rows:2d} {impl}",
                               *bench_linear(rows, k, n, dtype, ln=ln, residual=residual, act=act, impl=impl))
        if args.out:
            record.write(results, args.out)
        return
    for model, (heads, head_dim, vocab) in MODELS.items():
        for rows in (4, 16, 64, 256):
            for step in (32, 64):
                report(f"{model} self  rows {rows:3d} step {step}", *bench_self(heads, head_dim, rows, step, dtype))
            report(f"{model} cross rows {rows:3d} src {SOURCE_LEN}", *bench_cross(heads, head_dim, rows, dtype))
            report(f"{model} topk  rows {rows:3d} V {vocab} k {2 * NUM_BEAMS}", *bench_topk(vocab, rows, dtype))
    if args.out:
        record.write(results, args.out)


if __name__ == "__main__":
    main()
