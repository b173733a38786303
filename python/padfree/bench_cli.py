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
(bench_processes.py says why); --one-process times them all in one.
The script bench/bert.py runs this with its defaults; results go to bench/results/bert-<gpu>.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import time

from . import outputs
from .arguments import CommandError, non_negative_int, positive_int

SHAPES = ((1, 128), (16, 256), (64, 512), (128, 128))
SYSTEMS = ("hf", "compile", "padfree")  # hf: the eager and sdpa columns; padfree: its columns and the floor
# (shape) -> the "done" targets: padfree <= 1.5x floor and >= 2x faster than compile, or a latency
FLOOR_RATIO_TARGET, COMPILE_SPEEDUP_TARGET, SMALL_LATENCY_TARGET_MS = 1.5, 2.0, 0.4
STRETCH_FLOOR_RATIO = 1.25
KERNEL_GROUPS = (("attention", ("attention", "attn", "fmha")), ("layernorm", ("layernorm", "layer_norm")),
                 ("embedding", ("embedding",)), ("gelu", ("gelu",)),
                 ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "sm90_", "sm80_", "cublas")))


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
                   help="keep the encoder's GEMM choices in this file (read if it exists, rewritten after each capture)")
    p.add_argument("--programmatic-edges", action="store_true",
                   help="experimental: programmatic edges into the GEMMs of each captured forward (from_hf)")
    p.add_argument("--varlen-attn", action="store_true",
                   help="diagnostic column: the packed forward with torch's varlen_attn as its attention")
    p.add_argument("--one-process", action="store_true",
                   help="time every system in this process (default: each in a process of its own)")
    p.add_argument("--systems", default=None,
                   help="comma-separated systems to time, of " + ",".join(SYSTEMS)
                   + " (default: all that --no-hf / --no-compile leave)")


def _shape(text: str) -> tuple[int, int]:
    batch, max_seqlen = text.lower().split("x")
    return int(batch), int(max_seqlen)


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
    and 0.926 against 0.401 and 1.110 (H100, one run, bench/NOTES-bert.md v23): each column's own
    steady state is what a server running one model sees. gpu_only: the stream sleeps GPU_AHEAD_CYCLES
    before each start event, so the host has enqueued fn's work by the time the start fires (its GPU
    time alone; padfree_gpu)."""
    import torch
    for _ in range(warmup):
        fn()
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
    return statistics.median(times)


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


def _group(name: str) -> str:
    lowered = name.lower()
    for group, keys in KERNEL_GROUPS:
        if any(k in lowered for k in keys):
            return group
    return "other"


def build_models(layers: int, hf_impls: tuple[str, ...], with_padfree: bool, gemm_search: str = "heuristic",
                 gemm_tuning: str | None = None, programmatic_edges: bool = False):
    """BERT-base with random weights (seed 0) in fp16 on the GPU: HF copies (attn_implementation in
    hf_impls) and padfree's encoder (or None)."""
    import torch
    import transformers
    import padfree.torch as pt
    config = transformers.BertConfig(num_hidden_layers=layers)  # defaults are BERT-base
    torch.manual_seed(0)
    source = transformers.BertModel(config).eval()
    models = {}
    for impl in hf_impls:
        model = transformers.BertModel(transformers.BertConfig(num_hidden_layers=layers, attn_implementation=impl))
        model.load_state_dict(source.state_dict())
        models[impl] = model.to(device="cuda", dtype=torch.float16).eval()
    encoder = pt.from_hf(source, dtype=torch.float16, device="cuda", gemm_search=gemm_search,
                         gemm_tuning=gemm_tuning, programmatic_edges=programmatic_edges) if with_padfree else None
    return models, encoder


def chosen_systems(args) -> list[str]:
    if args.systems:
        systems = [s for s in args.systems.split(",") if s]
        unknown = set(systems) - set(SYSTEMS)
        if unknown:
            raise CommandError(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
        return systems
    return [s for s in SYSTEMS if not (s == "hf" and args.no_hf) and not (s == "compile" and args.no_compile)]


def bench_shape(batch: int, max_seqlen: int, timed: dict, args, vocab_size: int) -> dict:
    """One shape's row. timed: {"hf": {impl: model}, "compile": module, "padfree": encoder,
    "varlen_attn": encoder, "reference": HF sdpa model for padfree's accuracy}, each where present."""
    import torch
    lengths = lengths_for(batch, max_seqlen)
    tokens = sum(lengths)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1000, vocab_size, (batch, max_seqlen), generator=gen)
    mask = (torch.arange(max_seqlen)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids, mask = (ids * mask).cuda(), mask.cuda()
    row = {"batch": batch, "max_seqlen": max_seqlen, "total_tokens": tokens, "longest": max(lengths),
           "padding_fraction": 1 - tokens / (batch * max_seqlen), "ms": {}}
    ms = row["ms"]
    with torch.no_grad():
        for impl, model in timed.get("hf", {}).items():
            ms[f"hf_{impl}"] = time_ms(lambda: model(input_ids=ids, attention_mask=mask), args.reps, args.warmup)
        if "compile" in timed:
            ms["compile"] = time_ms(lambda: timed["compile"](input_ids=ids, attention_mask=mask), args.reps,
                                    max(args.warmup, 5))
        if "padfree" in timed:
            _bench_padfree(row, ids, mask, lengths, timed, args)
    add_ratios(row)
    return row


def _bench_padfree(row: dict, ids, mask, lengths: list[int], timed: dict, args) -> None:
    import torch
    encoder, fa_encoder, ms = timed["padfree"], timed.get("varlen_attn"), row["ms"]
    t0 = time.perf_counter()
    encoder(ids, mask)  # captures the bucket's graph, tuning its GEMMs first
    torch.cuda.synchronize()
    row["first_call_s"] = time.perf_counter() - t0
    ms["padfree"] = time_ms(lambda: encoder(ids, mask), args.reps, args.warmup)
    ms["padfree_gpu"] = time_ms(lambda: encoder(ids, mask), args.reps, args.warmup, gpu_only=True)
    ids_cpu, mask_cpu = ids.cpu(), mask.cpu()
    ms["padfree_host_inputs"] = time_ms(lambda: encoder(ids_cpu, mask_cpu), args.reps, args.warmup)
    packed = {"input_ids": ids[mask.bool()].to(torch.int32),
              "cu_seqlens": torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32),
              "max_seqlen": max(lengths)}
    ms["padfree_packed"] = time_ms(lambda: encoder.forward_packed(**packed), args.reps, args.warmup)
    if fa_encoder is not None:
        ms["padfree_packed_with_varlen_attn"] = time_ms(lambda: fa_encoder.forward_packed(**packed),
                                                       args.reps, args.warmup)
    ms["floor"], flops = floor_graph(encoder.weights, row["total_tokens"], args.reps)
    row["floor_tflops"] = flops / (ms["floor"] * 1e-3) / 1e12
    # accuracy after every timing: the reference's kernels run on the caller's stream only
    valid = mask.bool()
    ours = encoder(ids, mask).last_hidden_state.float()
    if "reference" in timed:
        ref = timed["reference"](input_ids=ids, attention_mask=mask).last_hidden_state.float()
        row["rel_err_vs_hf_sdpa"] = float((ours[valid] - ref[valid]).norm() / ref[valid].norm())
    if fa_encoder is not None:
        ref = fa_encoder(ids, mask).last_hidden_state.float()
        row["rel_err_vs_varlen_attn_variant"] = float((ours[valid] - ref[valid]).norm() / ref[valid].norm())
    row["bucket"] = encoder.graph_buckets[-1]._asdict()
    row["gemms"] = encoder.gemm_choices(encoder.graph_buckets[-1])
    if args.profile:
        row["profile_mode"], row["profile"] = kernel_profile(encoder, packed)


def add_ratios(row: dict) -> None:
    """The ratios of the columns present (the systems' processes merge their times first)."""
    ms, ratios = row["ms"], {}
    if "padfree" in ms and "floor" in ms:
        ratios["padfree_over_floor"] = ms["padfree"] / ms["floor"]
        ratios["packed_over_floor"] = ms["padfree_packed"] / ms["floor"]
    if "compile" in ms and "padfree" in ms:
        ratios["compile_over_padfree"] = ms["compile"] / ms["padfree"]
    row["ratios"] = ratios


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
    print(f"-- {row['batch']}x{row['max_seqlen']}: kernel time of one forward ({row['profile_mode']}) {total:.3f} ms: " +
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


def host_loop_ms() -> float:
    """Milliseconds of a fixed pure-Python loop (best of 5): the process's host speed. The device
    machines are VMs whose CPU speed differs up to 2x between processes, and the small shapes' calls
    carry their host time before the GPU's first kernel (1x128: ~20 us between the slow and the fast
    processes; NOTES-bert.md v27), so a run records it beside its times."""
    def once():
        t0, d = time.perf_counter(), {}
        for i in range(200000):
            d[i & 1023] = i
        return (time.perf_counter() - t0) * 1e3
    return round(min(once() for _ in range(5)), 2)


def run(args) -> int:
    import torch
    if not torch.cuda.is_available():
        raise CommandError("no CUDA device here; the benchmark runs on a GPU machine")
    systems = chosen_systems(args)
    if args.one_process or len(systems) == 1:
        result = measure(args, systems)
    else:
        from .bench_processes import measure_apart
        result = measure_apart(args, systems)
    out = args.out or os.path.join("bench", "results", f"bert-{gpu_slug(result['device'])}.json")
    outputs.write_text(out, json.dumps(result, indent=1))
    print(f"wrote {out}; {result['device']}, torch {result['torch']}, host loop {result['host_loop_ms']} ms")
    for row in result["rows"]:
        if "profile" in row:
            print_profile(row)
    print_table(result["rows"])
    return 0


def measure(args, systems: list[str]) -> dict:
    """Every shape's row for `systems`, timed in this process."""
    import torch
    import transformers
    hf_impls = ("eager", "sdpa") if "hf" in systems else ()
    with_reference = "padfree" in systems and not args.no_hf  # HF sdpa, padfree's accuracy check
    # one HF sdpa model serves its column, torch.compile's source and the accuracy reference
    needs_sdpa = with_reference or "compile" in systems
    models, encoder = build_models(args.layers, hf_impls or (("sdpa",) if needs_sdpa else ()),
                                   "padfree" in systems, args.gemm_search, args.gemm_tuning, args.programmatic_edges)
    timed = {"hf": {impl: models[impl] for impl in hf_impls}}
    if "compile" in systems:
        timed["compile"] = torch.compile(models["sdpa"], mode="reduce-overhead", dynamic=False)
    if encoder is not None:
        timed["padfree"] = encoder
        if with_reference:
            timed["reference"] = models["sdpa"]
        if args.varlen_attn:
            from padfree.torch import PadfreeEncoder
            timed["varlen_attn"] = PadfreeEncoder(encoder.weights, encoder.config, ops=torch_attention_ops())
    vocab_size = transformers.BertConfig().vocab_size
    rows, host_ms = [], [host_loop_ms()]
    for batch, max_seqlen in [_shape(s) for s in args.shapes.split(",") if s]:
        rows.append(bench_shape(batch, max_seqlen, timed, args, vocab_size))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "profile"}), flush=True)
    return {"benchmark": "BERT-base encoder, fp16, random weights", "device": torch.cuda.get_device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
            "layers": args.layers, "systems": systems, "processes": "one",
            "encoder": repr(encoder), "programmatic_edges": args.programmatic_edges,
            # the library's A/B switches (attention.cu, common.cuh), so that a run says what it ran
            "environment": {k: v for k, v in os.environ.items()
                            if k.startswith("PADFREE_") and not k.endswith("_LIBRARY")},
            "host_loop_ms": {"start": host_ms[0], "end": host_loop_ms()},
            "lengths": "uniform in [0.2*max, max], torch.Generator seed 0",
            "timing": f"CUDA events per call, median of {args.reps} after {args.warmup} warm-up calls",
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="padfree bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
