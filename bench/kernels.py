"""Achieved bandwidth of the row-wise and packing kernels against a device-to-device copy.

Each kernel is captured CALLS times into a CUDA graph (so the Python binding's launch cost does not
hide a 10-microsecond kernel), the graph is replayed after a warm-up, and the median over REPS
replays, divided by CALLS, is the time per call (CUDA events). Bytes are the logical traffic: every
tensor read once and written once. The copy column is `dst.copy_(src)` moving the same bytes, timed
the same way, as the practical ceiling. Calls cycle through enough input sets (200 MB) that L2 does
not serve repeated reads. torch's own op on the same shapes is listed for context.

    python bench/kernels.py [--out bench/results/kernels-h100.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from padfree import ops
from padfree.bench.timing import lengths_for

CALLS = 20
REPS = 30
WARMUP = 3
ROTATE_BYTES = 200 << 20  # input sets cycled through per replay: 4x the H100's 50 MB L2


def time_per_call_ms(fns) -> tuple[float, str]:
    """Median time of one call, from CUDA-graph replays of CALLS calls cycling through `fns` (one
    per input set, so repeated calls do not just re-read L2); eager launches where capture fails."""
    for fn in fns:
        fn()  # allocations and lazy binding outside the capture
    torch.cuda.synchronize()
    calls = [fns[i % len(fns)] for i in range(CALLS)]
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in calls:
                fn()
        run, method = graph.replay, "cuda-graph"
    except Exception:  # noqa: BLE001 - reported as the method
        torch.cuda.synchronize()

        def run():
            for fn in calls:
                fn()
        method = "eager"
    for _ in range(WARMUP):
        run()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    return statistics.median(times), method


def input_sets(nbytes: int) -> int:
    return max(1, min(CALLS, -(-ROTATE_BYTES // max(nbytes, 1))))


def copy_ms(total_bytes: int) -> float:
    """A device-to-device copy that reads total_bytes / 2 and writes as many."""
    half = total_bytes // 2
    pairs = [(torch.empty(half, dtype=torch.uint8, device="cuda"), torch.empty(half, dtype=torch.uint8, device="cuda"))
             for _ in range(input_sets(total_bytes))]
    return time_per_call_ms([lambda s=s, d=d: d.copy_(s) for s, d in pairs])[0]


def lengths_uniform(batch: int, max_seqlen: int) -> torch.Tensor:
    """Lengths uniform in [0.2 * max, max] (the BERT benchmark's distribution), as a tensor."""
    return torch.tensor(lengths_for(batch, max_seqlen))


def cu_of(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32).cuda()


def layernorm_cases():
    for dtype, rows, hidden in [(torch.float16, 16384, 768), (torch.bfloat16, 16384, 768),
                                (torch.float32, 16384, 768), (torch.float16, 16384, 1024),
                                (torch.float16, 4096, 4096), (torch.float16, 2048, 8192)]:
        e = torch.finfo(dtype).bits // 8
        shape = f"[{rows}, {hidden}]"

        def tensors(rows=rows, hidden=hidden, dtype=dtype):
            x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
            g = 1 + 0.1 * torch.randn(hidden, device="cuda", dtype=dtype)
            b = 0.1 * torch.randn(hidden, device="cuda", dtype=dtype)
            return x, torch.randn_like(x), torch.empty_like(x), g, b

        def ln(rows=rows, hidden=hidden, dtype=dtype, tensors=tensors):
            x, _, y, g, b = tensors()
            return (lambda: ops.layernorm(x, g, b, eps=1e-12, out=y),
                    lambda: F.layer_norm(x, (hidden,), g, b, 1e-12))

        def skip(rows=rows, hidden=hidden, dtype=dtype, tensors=tensors):
            x, r, y, g, b = tensors()
            return (lambda: ops.skip_layernorm(x, r, g, b, bias=b, eps=1e-12, out=y),
                    lambda: F.layer_norm(x + b + r, (hidden,), g, b, 1e-12))

        yield "layernorm", shape, dtype, 2 * rows * hidden * e, ln
        yield "skip_layernorm", shape, dtype, 3 * rows * hidden * e, skip


def embedding_case():
    """BERT-base embeddings: 128 sequences of up to 128 tokens."""
    lengths = lengths_uniform(128, 128)
    tokens, hidden, dtype = int(lengths.sum()), 768, torch.float16
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()]).cuda()

    def make():
        cu = cu_of(lengths)
        ids = torch.randint(0, 30522, (tokens,), device="cuda", dtype=torch.int32)
        types = torch.randint(0, 2, (tokens,), device="cuda", dtype=torch.int32)
        word = torch.randn(30522, hidden, device="cuda", dtype=dtype)
        pos = torch.randn(512, hidden, device="cuda", dtype=dtype)
        typ = torch.randn(2, hidden, device="cuda", dtype=dtype)
        g, b = torch.ones(hidden, device="cuda", dtype=dtype), torch.zeros(hidden, device="cuda", dtype=dtype)
        y = torch.empty(tokens, hidden, device="cuda", dtype=dtype)
        return (lambda: ops.embedding_layernorm(ids, cu, word, pos, g, b, token_type_ids=types,
                                                token_type_embeddings=typ, out=y),
                lambda: F.layer_norm(word[ids] + pos[positions] + typ[types], (hidden,), g, b, 1e-12))

    # ids + types, word + position + type rows, output (position/type rows mostly hit L2)
    yield "embedding_layernorm", f"[{tokens}, {hidden}] (128x128)", dtype, tokens * (8 + 4 * hidden * 2), make


def gelu_cases():
    for dtype, approximate in [(torch.float16, "none"), (torch.bfloat16, "none"), (torch.float16, "tanh")]:
        def make(dtype=dtype, approximate=approximate):
            x = torch.randn(16384, 3072, device="cuda", dtype=dtype)
            bias = torch.randn(3072, device="cuda", dtype=dtype)
            y = torch.empty_like(x)
            return (lambda: ops.bias_gelu(x, bias, approximate=approximate, out=y),
                    lambda: F.gelu(x + bias, approximate=approximate))
        yield f"bias_gelu {approximate}", "[16384, 3072]", dtype, 2 * 16384 * 3072 * 2, make


def padding_cases():
    """At the BERT benchmark's largest shape: 64 x 512, hidden 768, fp16."""
    lengths = lengths_uniform(64, 512)
    tokens = int(lengths.sum())
    row = 768 * 2

    def tensors():
        cu = cu_of(lengths)
        padded = torch.randn(64, 512, 768, device="cuda", dtype=torch.float16)
        packed = torch.empty(tokens, 768, device="cuda", dtype=torch.float16)
        mask = (torch.arange(512)[None, :] < lengths[:, None]).to(torch.int32).cuda()
        return cu, padded, packed, mask

    def remove():
        cu, padded, packed, mask = tensors()
        rows = torch.nonzero(mask.flatten()).flatten()  # a gather torch can capture (no boolean mask)
        flat = padded.view(-1, 768)
        return (lambda: ops.remove_padding(padded, cu, tokens, out=packed),
                lambda: torch.index_select(flat, 0, rows, out=packed))

    def rebuild():
        cu, padded, packed, _ = tensors()
        return lambda: ops.rebuild_padding(packed, cu, 512, out=padded), None

    def from_mask():
        _, _, _, mask = tensors()
        return lambda: ops.cu_seqlens_from_mask(mask), lambda: F.pad(mask.sum(1).cumsum(0), (1, 0))

    def from_seqlens():
        seqlens = lengths.to(torch.int32).cuda()
        return lambda: ops.cu_seqlens_from_seqlens(seqlens), lambda: F.pad(seqlens.cumsum(0), (1, 0))

    yield "remove_padding", f"[64, 512, 768] -> [{tokens}, 768]", torch.float16, 2 * tokens * row, remove
    yield "rebuild_padding", f"[{tokens}, 768] -> [64, 512, 768]", torch.float16, tokens * row + 64 * 512 * row, rebuild
    yield "cu_seqlens_from_mask", "[64, 512]", torch.int32, 64 * 512 * 4, from_mask
    yield "cu_seqlens_from_seqlens", "[64]", torch.int32, 64 * 4, from_seqlens


def decode_linear_cases():
    """A decode step's linear layers at 4 rows (batch x beams 1 x 4), fp16: Marian-base's and NLLB-600M's
    shapes (in, out), with the input LayerNorm where the decoder fuses one; torch's column is F.linear
    (cuBLAS) without the LayerNorm. Bytes: the weight (what bounds these calls)."""
    rows = 4
    shapes = [("marian qkv", 512, 1536, True), ("marian out", 512, 512, False), ("marian fc1", 512, 2048, True),
              ("marian fc2", 2048, 512, False), ("marian lm_head", 512, 58112, True),
              ("nllb qkv", 1024, 3072, True), ("nllb out", 1024, 1024, False), ("nllb fc1", 1024, 4096, True),
              ("nllb fc2", 4096, 1024, False), ("nllb lm_head", 1024, 256208, True)]
    for name, k, n, ln in shapes:
        def make(k=k, n=n, ln=ln):
            x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
            w = torch.randn(n, k, device="cuda", dtype=torch.float16) / 32
            norm = (torch.ones(k, device="cuda", dtype=torch.float16), torch.zeros(k, device="cuda",
                                                                                 dtype=torch.float16), 1e-5)
            out = torch.empty(rows, n, device="cuda", dtype=torch.float16)
            return (lambda: ops.decode_linear(x, w, ln=norm if ln else None, out=out),
                    lambda: F.linear(x, w))
        yield f"decode_linear {name}", f"[{rows}, {k}] x [{n}, {k}]^T{' +LN' if ln else ''}", torch.float16, \
            n * k * 2, make


def cases():
    """(name, shape text, dtype, bytes moved, make() -> (padfree fn, torch fn or None))."""
    yield from layernorm_cases()
    yield from embedding_case()
    yield from gelu_cases()
    yield from padding_cases()
    yield from decode_linear_cases()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "kernels-h100.json")
    parser.add_argument("--only", default="", help="run the kernels whose name contains this text")
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for name, shape, dtype, nbytes, make in cases():
        if args.only not in name:
            continue
        pairs = [make() for _ in range(input_sets(nbytes))]
        ms, method = time_per_call_ms([p[0] for p in pairs])
        torch_ms = time_per_call_ms([p[1] for p in pairs])[0] if pairs[0][1] is not None else None
        del pairs
        copy = copy_ms(nbytes)
        rows.append(dict(kernel=name, shape=shape, dtype=str(dtype).replace("torch.", ""), bytes=nbytes,
                         us=round(ms * 1e3, 2), GBps=round(nbytes / ms / 1e6, 1),
                         copy_us=round(copy * 1e3, 2), copy_GBps=round(nbytes / copy / 1e6, 1),
                         of_copy=round(copy / ms, 3), torch_us=None if torch_ms is None else round(torch_ms * 1e3, 2),
                         method=method))
    result = dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  torch=torch.__version__, cuda=torch.version.cuda, calls_per_replay=CALLS, reps=REPS,
                  note="us = median microseconds per call; of_copy = copy time of the same bytes / kernel time",
                  results=rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    header = (f"{'kernel':24} {'shape':36} {'dtype':9} {'us':>8} {'GB/s':>7} {'copy GB/s':>9} {'of copy':>7}"
              f" {'torch us':>8}")
    print(header)
    for r in rows:
        print(f"{r['kernel']:24} {r['shape']:36} {r['dtype']:9} {r['us']:8.2f} {r['GBps']:7.0f} {r['copy_GBps']:9.0f} "
              f"{r['of_copy']:7.2f} {r['torch_us'] if r['torch_us'] is not None else '-':>8}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
