"""Timing for `padfree bench`: CUDA-event medians, the GEMM floor, a kernel profile and the host's
speed, and the issue's recipe of sequence lengths. No CLI here (padfree.commands.bench)."""
from __future__ import annotations

import re
import statistics
import time

KERNEL_GROUPS = (("attention", ("attention", "attn", "fmha")), ("layernorm", ("layernorm", "layer_norm")),
                 ("embedding", ("embedding",)), ("gelu", ("gelu",)),
                 ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "sm90_", "sm80_", "cublas")))




def lengths_for(batch: int, max_seqlen: int) -> list[int]:
    """Uniform in [0.2*max, max], seed 0 (the issue's recipe, as bench/attention.py draws it)."""
    import torch
    gen = torch.Generator().manual_seed(0)
    return torch.randint(max(1, int(0.2 * max_seqlen)), max_seqlen + 1, (batch,), generator=gen).tolist()


def gpu_slug(name: str) -> str:
    known = re.search(r"(gh200|h100|h200|h20|b200|a100|a10g|l40s|l40|l4|t4)", name.lower())
    return known.group(1) if known else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


GPU_AHEAD_CYCLES = 2_000_000  # ~1 ms at the H100's clock: longer than any call's host work before its launches


def time_ms(fn, reps: int, warmup: int, gpu_only: bool = False) -> float:
    """Median ms of fn() between CUDA events on the current stream, in a block of its own calls.
    Never interleaved with another column's calls: under a sustained load the GPU runs at its power
    cap, and a call inherits the clock the previous one left. Timed call by call in turn, padfree and
    torch.compile measured 7.74 and 17.29 ms at 64x512 against 8.44 and 16.83 in blocks, 1x128 0.418
    and 0.926 against 0.401 and 1.110 (H100, one run): each column's own
    steady state is what a server running one model sees. gpu_only: the stream sleeps GPU_AHEAD_CYCLES
    before each start event, so the host has enqueued fn's work by the time the start fires (its GPU
    time alone; padfree_gpu)."""
    return statistics.median(samples_ms(fn, reps, warmup, gpu_only=gpu_only))


def samples_ms(fn, reps: int, warmup: int, cuda: bool = True, gpu_only: bool = False) -> list[float]:
    """The ms of each of `reps` calls of fn() after `warmup` untimed ones, in a block of their own (see
    time_ms): between CUDA events on the current stream, or with cuda=False between perf_counter
    readings (a CPU backend, whose calls return when done)."""
    import torch
    for _ in range(warmup):
        fn()
    if not cuda:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if gpu_only:
            torch.cuda._sleep(GPU_AHEAD_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def floor_graph(weights, tokens: int, reps: int):
    """The four projection GEMMs of every layer on `tokens` rows, captured once; returns (ms, flops)."""
    import torch

    from padfree.torch.streams import side_stream
    h, inter = weights.hidden_size, weights.intermediate_size
    gen = torch.Generator(device=weights.word_embeddings.device).manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=weights.word_embeddings.device,
                           dtype=weights.word_embeddings.dtype)
    x, ctx, mid, up = rand(tokens, h), rand(tokens, h), rand(tokens, h), rand(tokens, inter)
    qkv, proj, up_out, down = (torch.empty(tokens, n, dtype=x.dtype, device=x.device) for n in (3 * h, h, inter, h))

    def gemms():
        for lw in weights.layers:
            torch.mm(x, lw.qkv_weight.t(), out=qkv)
            torch.mm(ctx, lw.out_weight.t(), out=proj)
            torch.mm(mid, lw.up_weight.t(), out=up_out)
            torch.mm(up, lw.down_weight.t(), out=down)
    stream = side_stream()  # not a stream of its own: each one more slows every graph (streams.py)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        gemms()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        gemms()
    flops = 2.0 * tokens * h * (3 * h + h + 2 * inter) * len(weights.layers)
    return time_ms(graph.replay, reps, 5), flops


def kernel_profile(encoder, packed: dict) -> tuple[str, list[dict]]:
    """Device time per kernel name over one forward: the graph replay where the profiler sees the
    graph's kernels, else one eager forward (the same kernels, at the exact token count)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def trace():
        encoder.forward_packed(**packed)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            encoder.forward_packed(**packed)
            torch.cuda.synchronize()
        by_name: dict[str, list[float]] = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                by_name.setdefault(event.name, []).append(event.time_range.elapsed_us() / 1e3)
        return [{"kernel": name, "group": _group(name), "calls": len(t), "ms": sum(t)} for name, t in by_name.items()]

    rows, mode = trace(), "graph replay"
    if sum(r["calls"] for r in rows) < 4 * len(encoder.weights.layers):
        use_graphs, encoder.use_graphs = encoder.use_graphs, False
        try:
            rows, mode = trace(), "eager"
        finally:
            encoder.use_graphs = use_graphs
    return mode, sorted(rows, key=lambda r: -r["ms"])


def torch_attention_ops():
    """padfree.ops with attention_varlen swapped for torch's varlen_attn (FlashAttention) plus a bias
    add: a diagnostic of what the encoder would run at with that attention kernel."""
    import types

    from torch.nn.attention.varlen import varlen_attn

    from padfree import ops

    def attention_varlen(qkv, cu_seqlens, max_seqlen, num_heads, qkv_bias=None, softmax_scale=None, out=None):
        tokens, width = qkv.shape
        q, k, v = (qkv + qkv_bias).view(tokens, 3, num_heads, width // (3 * num_heads)).unbind(1)
        # the default scale, 1/sqrt(head_dim), is the encoder's
        out.copy_(varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen).reshape(tokens, -1))
        return out
    names = ("embedding_layernorm", "skip_layernorm", "bias_gelu", "rebuild_padding")
    return types.SimpleNamespace(attention_varlen=attention_varlen, **{n: getattr(ops, n) for n in names})


def kernel_chain(events: list[tuple[float, float, str]], marker: str) -> dict | None:
    """A repeated sequence of kernels (a decode step) as a chain: `events` are (start_us, end_us, name)
    of device kernels, the sequences told apart by their first kernel, whose name contains `marker`. Over
    the middle half of the complete sequences, those with the most common kernel count, each position's
    mean duration and exposed time: its end minus the latest end before it in the sequence (the first
    kernel from its own start). Exposed times sum to the sequence's span; under PDL a kernel starts
    before its producer ends, so its duration overstates what it adds, its exposed time does not.
    None where fewer than two markers occur."""
    from collections import Counter
    events = sorted(events)
    starts = [i for i, (_, _, name) in enumerate(events) if marker in name]
    runs = [events[a:b] for a, b in zip(starts, starts[1:])]
    if not runs:
        return None
    middle = runs[len(runs) // 4:max(len(runs) // 4 + 1, 3 * len(runs) // 4)]
    count = Counter(len(run) for run in middle).most_common(1)[0][0]
    kept = [run for run in middle if len(run) == count]
    duration, exposed = [0.0] * count, [0.0] * count
    for run in kept:
        last = run[0][0]
        for i, (start, end, _) in enumerate(run):
            duration[i] += end - start
            exposed[i] += max(0.0, end - last)
            last = max(last, end)
    n = len(kept)
    chain = [{"position": i, "kernel": kept[0][i][2][:120], "us": duration[i] / n, "exposed_us": exposed[i] / n}
             for i in range(count)]
    return {"sequences": n, "kernels": count, "span_us": sum(exposed) / n, "chain": chain}


def _group(name: str) -> str:
    lowered = name.lower()
    for group, keys in KERNEL_GROUPS:
        if any(k in lowered for k in keys):
            return group
    return "other"


def host_loop_ms() -> float:
    """Milliseconds of a fixed pure-Python loop (best of 5): the process's host speed. The device
    machines are VMs whose CPU speed differs up to 2x between processes, and the small shapes' calls
    carry their host time before the GPU's first kernel (1x128: ~20 us between the slow and the fast
    processes), so a run records it beside its times."""
    def once():
        t0, d = time.perf_counter(), {}
        for i in range(200000):
            d[i & 1023] = i
        return (time.perf_counter() - t0) * 1e3
    return round(min(once() for _ in range(5)), 2)


