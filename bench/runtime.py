"""padfree.Runtime's own cost: Runtime.run() against the encoder's forward_packed on the same batch.

Models (random weights from configs, fp16, padfree.torch.from_hf): BERT-large (24 layers, hidden 1024,
16 heads, FFN 4096), RoBERTa-base and DistilBERT (transformers' config defaults). Shapes, batch x longest:
bert-large 32x384, roberta-base 64x256, distilbert 128x64 (roberta-base's checkpoint config: 514
positions, one token type). Lengths: lognormal, median half the
longest, sigma 0.5, rounded and clipped to [1, longest] (numpy default_rng seed 0); ids uniform in
[1000, vocab) (never a padding id).
Columns, each the median ms of --reps calls after --warmup, CUDA events around each call, each in a
block of its own calls (padfree.bench.timing.time_ms):
  forward_packed     the encoder on packed int32 inputs already on the GPU (what run() calls)
  hf_call            encoder(input_ids, attention_mask) on padded GPU tensors (checked and packed on
                     the GPU, padded outputs)
  run_lists          Runtime.run(list of Python int lists), per-sequence torch outputs
  run_numpy          Runtime.run(list of int64 numpy arrays)
  run_padded         Runtime.run(input_ids, attention_mask), int64 CPU tensors (a tokenizer's output)
  run_numpy_output   Runtime.run(numpy arrays, output="numpy"): host arrays out, synchronized
  run_numpy_packed   Runtime.run(numpy arrays, packed=True): [T, H] and cu_seqlens, no view per sequence
  pipelined          per batch, --pipeline batches through submit() with one batch in flight
                     ahead (numpy in, numpy out): host work overlapping the GPU's (perf_counter)
host_ms: the host's time in one submit() per input form (lists / numpy / padded with per-sequence
outputs; numpy_packed / lists_packed with packed=True) and in one forward_packed call (median of
time.perf_counter, the GPU idle at each call's start). own_host_ms: the runtime's own host work per
form (checks, packing, staging, output copies and views): each submit's time less its backend call's,
timed within the same call. Each row also records the largest
difference between run()'s outputs and forward_packed's (the same kernels: 0).

On the device machine:
  python bench/runtime.py [--models bert-large,roberta-base,distilbert] [--reps 50] [--out FILE.json]
Host work alone, anywhere (no GPU: a backend that does nothing, one value per token, so that only the
runtime's own work is timed; torch_views: torch's split of the batch's rows into per-sequence views
alone, the share of the lists / numpy forms' time that is torch's own):
  python bench/runtime.py --host-only [--batch 128]
Writes bench/results/runtime-<gpu>.json (device, date, versions, commit, command, rows); --host-only
prints its rows and writes only where --out says (host speed differs per machine: no committed result).
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name -> (transformers config class, fields, batch, longest)
MODELS = {
    "bert-large": ("BertConfig", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                      intermediate_size=4096), 32, 384),
    "roberta-base": ("RobertaConfig", dict(max_position_embeddings=514, type_vocab_size=1), 64, 256),
    "distilbert": ("DistilBertConfig", {}, 128, 64),
}


def lengths_for(batch: int, longest: int, seed: int = 0) -> np.ndarray:
    """Lognormal lengths, median longest / 2, sigma 0.5, rounded and clipped to [1, longest]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(longest / 2), 0.5, batch)), 1, longest).astype(np.int64)


def batch_forms(lengths: np.ndarray, vocab_size: int, seed: int = 1) -> dict:
    """One batch in every input form: numpy arrays, Python lists, padded int64 tensors + mask."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(1000, vocab_size, size=int(n)) for n in lengths]
    width = int(lengths.max())
    ids = np.zeros((len(seqs), width), dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return {"numpy": seqs, "lists": [s.tolist() for s in seqs],
            "padded": (torch.from_numpy(ids), torch.from_numpy(mask))}


def host_ms(fn, reps: int, warmup: int, sync=None) -> float:
    """Median ms of the host's time in fn(), with sync() (the GPU idle) before each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def own_host_ms(rt, fn, reps: int, warmup: int) -> float:
    """Median ms of the host's time in fn() (a submit) less its backend call's, each call's two times
    taken together (the GPU idle at each call's start): the runtime's own host work, unaffected by
    how the host's speed drifts between separately timed blocks."""
    inner, spent = rt.backend.execute_packed, [0.0]

    def timed(*args):
        t0 = time.perf_counter()
        result = inner(*args)
        spent[0] += time.perf_counter() - t0
        return result
    rt.backend.execute_packed = timed
    try:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            spent[0] = 0.0
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0 - spent[0]) * 1e3)
    finally:
        del rt.backend.execute_packed  # the instance attribute: the class's method again
    return statistics.median(times)


def submit_calls(rt, forms: dict) -> dict:
    """form -> a call submitting the batch in that form."""
    return {"lists": lambda: rt.submit(forms["lists"]), "numpy": lambda: rt.submit(forms["numpy"]),
            "padded": lambda: rt.submit(*forms["padded"]),
            "numpy_packed": lambda: rt.submit(forms["numpy"], packed=True),
            "lists_packed": lambda: rt.submit(forms["lists"], packed=True)}


def pipelined_ms(rt, batch, count: int) -> float:
    """Per-batch ms of `count` batches through submit() with one in flight ahead (numpy out)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pending = rt.submit(batch, output="numpy")
    for _ in range(count - 1):
        following = rt.submit(batch, output="numpy")
        pending.result()
        pending = following
    pending.result()
    return (time.perf_counter() - t0) * 1e3 / count


def build_encoder(name: str):
    import transformers

    import padfree.torch as pt
    config_name, fields, _, _ = MODELS[name]
    config = getattr(transformers, config_name)(**fields)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).eval()
    return pt.from_hf(model, dtype=torch.float16, device="cuda"), config


def bench_model(name: str, args) -> dict:
    from padfree import Runtime
    from padfree.bench.timing import time_ms
    encoder, config = build_encoder(name)
    _, _, batch, longest = MODELS[name]
    lengths = lengths_for(batch, longest)
    forms = batch_forms(lengths, config.vocab_size)
    cu = np.concatenate(([0], np.cumsum(lengths)))
    packed = {"input_ids": torch.from_numpy(np.concatenate(forms["numpy"])).to("cuda", torch.int32),
              "cu_seqlens": torch.from_numpy(cu).to("cuda", torch.int32), "max_seqlen": int(lengths.max())}
    ids, mask = (t.cuda() for t in forms["padded"])
    rt = Runtime(encoder)
    row = {"model": name, "batch": batch, "longest": longest, "total_tokens": int(cu[-1]),
           "mean_length": float(lengths.mean()), "max_seqlen": int(lengths.max()), "ms": {}}
    ms = row["ms"]
    with torch.no_grad():
        encoder.forward_packed(**packed)  # captures the bucket's graph (a capture synchronizes)
        ms["forward_packed"] = time_ms(lambda: encoder.forward_packed(**packed), args.reps, args.warmup)
        ms["hf_call"] = time_ms(lambda: encoder(ids, mask), args.reps, args.warmup)
        ms["run_lists"] = time_ms(lambda: rt.run(forms["lists"]), args.reps, args.warmup)
        ms["run_numpy"] = time_ms(lambda: rt.run(forms["numpy"]), args.reps, args.warmup)
        ms["run_padded"] = time_ms(lambda: rt.run(*forms["padded"]), args.reps, args.warmup)
        ms["run_numpy_output"] = time_ms(lambda: rt.run(forms["numpy"], output="numpy"), args.reps, args.warmup)
        ms["run_numpy_packed"] = time_ms(lambda: rt.run(forms["numpy"], packed=True), args.reps, args.warmup)
        pipelined_ms(rt, forms["numpy"], args.warmup + 2)
        ms["pipelined"] = statistics.median(pipelined_ms(rt, forms["numpy"], args.pipeline) for _ in range(5))
        host = {f"submit_{form}": host_ms(call, args.reps, args.warmup, torch.cuda.synchronize)
                for form, call in submit_calls(rt, forms).items()}
        host["forward_packed"] = host_ms(lambda: encoder.forward_packed(**packed), args.reps, args.warmup,
                                         torch.cuda.synchronize)
        row["host_ms"] = host
        row["own_host_ms"] = {form: own_host_ms(rt, call, args.reps, args.warmup)
                              for form, call in submit_calls(rt, forms).items()}
        ours = torch.cat(rt.run(forms["numpy"])["last_hidden_state"]).float()
        reference = encoder.forward_packed(**packed)["last_hidden_state"].float()
        row["max_abs_diff_vs_forward_packed"] = float((ours - reference).abs().max())
    row["runtime_over_forward_packed"] = {k: ms[k] / ms["forward_packed"] for k in ms if k != "forward_packed"}
    return row


class _NullBackend:
    """The backend protocol doing no work: outputs of one value per token from a buffer it reuses."""
    output_names = ["last_hidden_state", "pooler_output"]
    device = "cpu"

    def __init__(self, max_tokens: int, max_batch: int, max_seqlen: int, vocab_size: int):
        from padfree.runtime import Limits
        self.limits = Limits(max_tokens=max_tokens, max_batch=max_batch, max_seqlen=max_seqlen,
                             vocab_size=vocab_size, type_vocab_size=2, dtype=torch.float32)
        self._tokens, self._pooled = torch.zeros(max_tokens, 1), torch.zeros(max_batch, 1)

    def execute_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, stream):
        return {"last_hidden_state": self._tokens[:input_ids.shape[0]],
                "pooler_output": self._pooled[:cu_seqlens.shape[0] - 1]}


def host_row(longest: int, args) -> dict:
    """One batch of args.batch sequences up to `longest` through a Runtime over _NullBackend."""
    from padfree import Runtime
    from padfree.runtime._inputs import checked_host_batch
    from padfree.runtime._plan import plan_chunks
    lengths = lengths_for(args.batch, longest)
    forms = batch_forms(lengths, 30522)
    rt = Runtime(_NullBackend(32768, 512, 512, 30522))

    def inputs(batch):  # run()'s input work: conversion, validation, the chunk plan
        given = batch if isinstance(batch, tuple) else (batch, None)
        host = checked_host_batch(*given, None, rt.limits)
        return plan_chunks(host.lengths, rt.limits.max_batch, rt.limits.max_tokens, host.cu_seqlens)
    row = {"batch": args.batch, "longest": longest, "total_tokens": int(lengths.sum()),
           "mean_length": float(lengths.mean()), "host_ms": {}}
    for form, call in submit_calls(rt, forms).items():
        row["host_ms"][f"submit_{form}"] = host_ms(call, args.reps, args.warmup)
        if form in forms:  # numpy_packed: the numpy form's input work
            row["host_ms"][f"inputs_{form}"] = host_ms(lambda b=forms[form]: inputs(b), args.reps, args.warmup)
    row["host_ms"]["submit_numpy_output"] = host_ms(lambda: rt.submit(forms["numpy"], output="numpy"),
                                                    args.reps, args.warmup)
    row["host_ms"]["submit_padded_output"] = host_ms(lambda: rt.submit(*forms["padded"], padded=True),
                                                     args.reps, args.warmup)
    # torch's own cost of the per-sequence views that the lists / numpy forms return (one
    # split_with_sizes call): the part of their host time no runtime can save while it returns views
    tokens, sizes = torch.zeros(int(lengths.sum()), 1), lengths.tolist()
    row["host_ms"]["torch_views"] = host_ms(lambda: tokens.split_with_sizes(sizes), args.reps, args.warmup)
    return row


def bench_host_only(args) -> list[dict]:
    torch.set_num_threads(1)  # the backend's copies are tiny; worker threads would only add noise
    return [host_row(longest, args) for longest in (64, 128, 256)]


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        print(f"{r.get('model', 'null backend')} {r['batch']}x{r['longest']}, {r['total_tokens']} tokens")
        if "ms" in r:
            print("  ms    " + "  ".join(f"{k} {v:.3f}" for k, v in r["ms"].items()))
        print("  host  " + "  ".join(f"{k} {v:.3f}" for k, v in r["host_ms"].items()))
        if "own_host_ms" in r:
            print("  own   " + "  ".join(f"{k} {v:.3f}" for k, v in r["own_host_ms"].items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--reps", type=int, default=50, help="timed calls per column (median reported)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--pipeline", type=int, default=50, help="batches per pipelined measurement")
    parser.add_argument("--host-only", action="store_true",
                        help="time the host work alone with a backend that does nothing (no GPU needed)")
    parser.add_argument("--batch", type=int, default=128, help="--host-only: sequences per batch")
    parser.add_argument("--out", default=None, help="JSON report (default bench/results/runtime-<gpu>.json)")
    args = parser.parse_args(argv)
    if min(args.reps, args.pipeline, args.batch) < 1 or args.warmup < 0:
        parser.error("--reps, --pipeline and --batch must be positive, --warmup not negative")
    unknown = [m for m in args.models.split(",") if m and m not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    if not args.host_only and not torch.cuda.is_available():
        parser.error("the benchmark runs on a CUDA device; --host-only times the host work anywhere")
    from padfree import env
    from padfree.bench import record
    from padfree.bench.timing import gpu_slug, host_loop_ms
    loop_start = host_loop_ms()
    if args.host_only:
        rows = bench_host_only(args)
        device = "cpu (host work only)"
    else:
        rows = []
        for name in [m for m in args.models.split(",") if m]:
            rows.append(bench_model(name, args))
            torch.cuda.empty_cache()  # the model's memory goes back before the next one is built
        device = torch.cuda.get_device_name()
    print_rows(rows)
    import transformers
    report = {"benchmark": "padfree.Runtime's own cost: run() against forward_packed and the HF-style call",
              "device": device, "dtype": None if args.host_only else "float16",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
              "commit": record.commit(ROOT), "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
              "environment": env.snapshot(), "host_loop_ms": {"start": loop_start, "end": host_loop_ms()},
              "lengths": "lognormal, median longest/2, sigma 0.5, clipped to [1, longest], numpy seed 0",
              "timing": (f"CUDA events per call, median of {args.reps} after {args.warmup} warm-up calls; host_ms:"
                         " perf_counter, GPU idle at each call's start; pipelined: perf_counter over"
                         f" {args.pipeline} batches, median of 5") if not args.host_only else
              f"perf_counter, median of {args.reps} after {args.warmup} warm-up calls",
              "rows": rows}
    if args.host_only and args.out is None:
        return 0
    out = args.out or os.path.join(ROOT, "bench", "results", f"runtime-{gpu_slug(device)}.json")
    record.write(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
