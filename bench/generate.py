"""Encoder-decoder generation: padfree.generation vs Hugging Face generate (sdpa), fp16 (issue 36's benchmark).

Models (random weights, from configs): Marian-base (vocab 58101, d_model 512, 6+6 layers, 8 heads,
FFN 2048) and an NLLB-600M-size M2M100 (vocab 256206, d_model 1024, 12+12 layers, 16 heads, FFN
4096). Sources: lengths uniform in [8, 64] (torch.Generator seed 7), random non-special ids.
Exactly 64 new tokens (min_new_tokens = max_new_tokens = 64), batch x beams 1x4, 16x4, 64x4, 64x1.
Columns: HF generate ms, padfree ms, padfree ms per decode step (the whole call over the new tokens;
and on CUDA a decode step alone: the mean GPU time between the step graph's replays in one more call),
and the step floor: the bytes one step must read (decoder weights incl. the output projection, the
self-attention K/V cache at the mean length, the packed cross-attention K/V) over the GPU's measured
copy bandwidth.
--ctranslate2 adds CTranslate2 (the peer to beat): the same weights converted with float16 weights,
Translator(compute_type=float16).translate_batch with HF's options, in a process of its own
(bench/ctranslate2_peer.py says how the vocabulary, the start token and the lengths are matched);
ct2_ms, padfree_vs_ct2 (= ct2_ms / padfree_ms) and sequences_equal_ct2_hf (its share of HF's sequences).
Timing: CUDA events, warm-up calls, median of --reps (time.perf_counter on the CPU; for CTranslate2,
whose translate_batch blocks until its results are on the host, perf_counter around that call).
On the device machine:
  python bench/generate.py [--models marian,nllb] [--shapes 1x4,16x4,64x4,64x1] [--reps 5] [--ctranslate2]
                           [--out FILE.json]
  (CTranslate2 there: source scripts/ctranslate2_env.sh with its wheel carried in .whl-ct2/)
Smoke test anywhere (tiny config, CPU without CUDA; tests/test_decoder_generation.py runs it):
  python bench/generate.py --quick [--ctranslate2]
Writes bench/results/generate-<gpu>.json (device, date, versions, commit, command, rows).
"""
from __future__ import annotations

import argparse
import datetime
import functools
import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW_TOKENS = 64
MODELS = {
    "marian": ("MarianConfig", dict(vocab_size=58101, decoder_vocab_size=58101, d_model=512, encoder_layers=6,
                                    decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
                                    encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512,
                                    pad_token_id=58100, eos_token_id=0, decoder_start_token_id=58100,
                                    forced_eos_token_id=0, activation_function="swish", scale_embedding=True)),
    "nllb": ("M2M100Config", dict(vocab_size=256206, d_model=1024, encoder_layers=12, decoder_layers=12,
                                  encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                                  decoder_ffn_dim=4096, max_position_embeddings=1024, pad_token_id=1, eos_token_id=2,
                                  bos_token_id=0, decoder_start_token_id=2, activation_function="relu",
                                  scale_embedding=True)),
    "tiny": ("MarianConfig", dict(vocab_size=97, decoder_vocab_size=97, d_model=64, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                  decoder_ffn_dim=128, max_position_embeddings=128, pad_token_id=96, eos_token_id=0,
                                  decoder_start_token_id=96, activation_function="swish", scale_embedding=True)),
}


def sources_for(batch: int, config, seed: int = 7) -> list[list[int]]:
    """Lengths uniform in [8, 64] and random non-special ids, from one torch.Generator seeded 7."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 65, (batch,), generator=gen).tolist()
    special = {config.pad_token_id, config.eos_token_id, config.decoder_start_token_id,
               getattr(config, "bos_token_id", None)}
    low = max(i for i in special if i is not None and i < 16) + 1
    high = min(config.vocab_size, 50000) - 1
    return [torch.randint(low, high, (n,), generator=gen).tolist() for n in lengths]



def time_ms(fn, reps: int, warmup: int, device: torch.device) -> float:
    """Median ms of fn(): CUDA events on the current stream, or perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read + bytes written per second)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), reps=20, warmup=3, device=device)
    return 2 * src.numel() * src.element_size() / (ms / 1e3)


def step_bytes(weights, sources: list[list[int]], rows: int, new_tokens: int) -> dict:
    """Bytes one decode step must read: decoder weights with the output projection, the self K/V cache at
    the mean length over the run, the packed cross-attention K/V (once per source, not per beam)."""
    element = torch.empty((), dtype=weights.dtype).element_size()
    layers, hidden = len(weights.decoder.layers), weights.decoder.hidden
    mean_length = (new_tokens + 1) / 2
    parts = {"decoder_weights": weights.decoder_bytes(),
             "self_kv_cache": int(2 * layers * rows * hidden * mean_length * element),
             "cross_kv": 2 * layers * sum(map(len, sources)) * hidden * element}
    parts["total"] = sum(parts.values())
    return parts


def build(name: str, dtype: torch.dtype, device: torch.device):
    import transformers
    config_class, values = MODELS[name]
    config = getattr(transformers, config_class)(**values)
    torch.manual_seed(0)
    with warnings.catch_warnings(), torch.device(device):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForSeq2SeqLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    return model


def reference_ops(sources: dict[str, str]) -> dict[str, str]:
    """The generator's ops that run their torch reference instead of a kernel, with the reason."""
    return {op: source for op, source in sources.items() if source != "kernel"}


def refuse_reference_ops(name: str, sources: dict[str, str], device: torch.device, allowed: bool,
                         flag: str | None = "--allow-reference") -> None:
    """On CUDA, stop before timing where an op falls back to its torch reference without being asked to
    (PADFREE_GENERATION_TORCH_OPS): a library that does not load, or lacks a kernel, would otherwise be
    timed and reported as padfree's numbers. flag: the caller's option that allows it, if any."""
    fallen = {op: source for op, source in reference_ops(sources).items() if "requested" not in source}
    if device.type != "cuda" or not fallen or allowed:
        return
    op, source = next(iter(fallen.items()))
    remedy = (f"or pass {flag} to time them anyway (recorded in each row's padfree_reference_ops)" if flag
              else "or name them in PADFREE_GENERATION_TORCH_OPS to time the reference on purpose")
    raise SystemExit(f"{os.path.basename(sys.argv[0])}: {name}: {len(fallen)} of padfree's ops would run their torch "
                     f"reference on {device}, {op} first ({source}); fix the kernel library, {remedy}")


def bench_model(name: str, shapes: list[tuple[int, int]], args, device: torch.device, dtype: torch.dtype,
                bandwidth: float) -> list[dict]:
    import padfree.torch as pt
    from padfree.generation.inputs import padded_batch
    model = build(name, dtype, device)
    generator = pt.from_hf(model, dtype=dtype, device=device, gemm_search=args.gemm_search)
    print(f"# {name}: {generator!r}", flush=True)
    refuse_reference_ops(name, generator.ops.sources, device, args.allow_reference)
    rows, peer_shapes, hf_sequences = [], [], []
    for batch, beams in shapes:
        sources = sources_for(batch, model.config)
        ids, mask = padded_batch(sources, model.config.pad_token_id, device)
        options = dict(num_beams=beams, min_new_tokens=args.new_tokens, max_new_tokens=args.new_tokens)
        row = {"model": name, "batch": batch, "beams": beams, "new_tokens": args.new_tokens,
               "source_tokens": sum(map(len, sources))}
        ours_call = functools.partial(generator.generate, ids, mask, **options)
        theirs_call = functools.partial(model.generate, ids, attention_mask=mask, **options)
        with torch.inference_mode():
            ours = ours_call()
            row["padfree_ms"] = time_ms(ours_call, args.reps, args.warmup, device)
            if not args.no_hf:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    theirs = theirs_call()
                    row["hf_ms"] = time_ms(theirs_call, args.reps, args.warmup, device)
                row["speedup"] = row["hf_ms"] / row["padfree_ms"]
                row["sequences_equal_hf"] = equal_share(ours, theirs, model.config.pad_token_id)
                hf_sequences.append(theirs.cpu())
        peer_shapes.append({"batch": batch, "beams": beams, "sources": sources})
        row["padfree_ms_per_step"] = row["padfree_ms"] / args.new_tokens
        steps = decode_step_times(generator, ours_call) if device.type == "cuda" else []
        if steps:   # the decode steps alone; the rest of a call is the host's work, the encoder, the result
            row["padfree_step_ms"] = sum(steps) / len(steps)
            row["padfree_outside_steps_ms"] = row["padfree_ms"] - sum(steps)
        if args.profile and device.type == "cuda":
            with torch.inference_mode():
                row["step_profile"], row["step_chain"] = step_profile(ours_call, args.new_tokens)
            print_profile(row)
        reference = reference_ops(generator.ops.sources)
        if reference:               # requested, allowed, or a kernel that refused a configuration mid-run
            row["padfree_reference_ops"] = reference
        runner = getattr(generator, "runner", None)
        if runner is not None:      # CUDA graphs captured so far (0: the decode steps ran eagerly)
            row["padfree_graphs"] = runner.captures
            gemm = getattr(next(reversed(runner.states.values())).decoder, "output_gemm", None)
            # the output projection: a tuned GEMM's choice, or "kernel" (decode_linear took it)
            row["padfree_output_gemm"] = "kernel" if gemm is None else gemm.label
        row["step_bytes"] = step_bytes(generator.weights, sources, batch * beams, args.new_tokens)
        row["step_floor_ms"] = row["step_bytes"]["total"] / bandwidth * 1e3
        row["step_over_floor"] = row["padfree_ms_per_step"] / row["step_floor_ms"]
        if "padfree_step_ms" in row:
            row["step_alone_over_floor"] = row["padfree_step_ms"] / row["step_floor_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.ctranslate2:
        add_ctranslate2(model, rows, peer_shapes, hf_sequences, args, device)
    return rows


def add_ctranslate2(model, rows: list[dict], shapes: list[dict], hf_sequences: list[torch.Tensor], args,
                    device: torch.device) -> None:
    """CTranslate2's column for one model's rows: the model saved, converted and timed by
    bench/ctranslate2_peer.py in processes of their own (CT2's CUDA streams and state stay out of this one);
    the options and the vocabulary mapping come from this model's own configs."""
    import ctranslate2_peer as peer  # bench/, beside this script
    from transformers.utils import logging as hf_logging

    name, pad, start = rows[0]["model"], model.config.pad_token_id, model.config.decoder_start_token_id
    try:
        tokenizer = peer.StandInTokenizer(model.config)
        requests = [peer.translate_options(model.generation_config, num_beams=shape["beams"],
                                           max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
                    for shape in shapes]
    except peer.UnsupportedPeerModel as e:
        return skip_ctranslate2(args, f"{name}: {e}")
    script = os.path.join(ROOT, "bench", "ctranslate2_peer.py")
    with tempfile.TemporaryDirectory(prefix="padfree-ct2-") as tmp:
        hf_dir, ct2_dir = os.path.join(tmp, "hf"), os.path.join(tmp, "ct2")
        hf_logging.disable_progress_bar()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save_pretrained(hf_dir)
        quantization = ["float16"] if device.type == "cuda" else []
        if subprocess.run([sys.executable, script, "convert", hf_dir, ct2_dir, *quantization]).returncode != 0:
            return skip_ctranslate2(args, f"{name}: bench/ctranslate2_peer.py convert failed (its message above)")
        request = {"model_dir": ct2_dir, "device": device.type, "reps": args.reps, "warmup": args.warmup,
                   "compute_type": "float16" if device.type == "cuda" else "float32",
                   "shapes": [{"source": [tokenizer.convert_ids_to_tokens(s) for s in shape["sources"]],
                               "options": options} for shape, (options, _) in zip(shapes, requests)]}
        paths = [os.path.join(tmp, "request.json"), os.path.join(tmp, "result.json")]
        with open(paths[0], "w") as f:
            json.dump(request, f)
        if subprocess.run([sys.executable, script, "time", *paths]).returncode != 0:
            return skip_ctranslate2(args, f"{name}: bench/ctranslate2_peer.py time failed (its message above)")
        with open(paths[1]) as f:
            result = json.load(f)
    args.ctranslate2_options[name] = {k: v for k, v in requests[-1][0].items() if k != "beam_size"}
    for i, (row, peer_row, (_, append_eos)) in enumerate(zip(rows, result["rows"], requests)):
        row["ct2_ms"] = peer_row["ct2_ms"]
        row["padfree_vs_ct2"] = peer_row["ct2_ms"] / row["padfree_ms"]
        if hf_sequences:
            ours = peer.hf_sequences(peer_row["hypotheses"], tokenizer, start, args.new_tokens, append_eos)
            width = max(map(len, ours))
            ct2 = torch.tensor([s + [pad] * (width - len(s)) for s in ours])
            row["sequences_equal_ct2_hf"] = equal_share(ct2, hf_sequences[i], pad)
        print(json.dumps({k: row[k] for k in ("model", "batch", "beams", "ct2_ms", "padfree_vs_ct2",
                                              "sequences_equal_ct2_hf") if k in row}), flush=True)


def skip_ctranslate2(args, reason: str) -> None:
    args.ctranslate2_skipped.append(reason)
    print(f"# CTranslate2 column skipped: {reason}", flush=True)


def ctranslate2_version() -> str | None:
    """CTranslate2's version where it is importable (found without importing it here), else None."""
    if importlib.util.find_spec("ctranslate2") is None:
        return None
    try:
        return importlib.metadata.version("ctranslate2")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def decode_step_times(generator, call) -> list[float]:
    """ms of each decode step of one more warm call: CUDA events between the step graph's replays
    (Runner.step_marks), the step's GPU time without the call's host work, encoder and result."""
    from padfree.generation.runner import step_times
    runner = getattr(generator, "runner", None)
    if runner is None:
        return []
    runner.step_marks = []
    try:
        with torch.inference_mode():
            call()
        return step_times(runner.step_marks)
    finally:
        runner.step_marks = None


def step_profile(call, new_tokens: int) -> tuple[list[dict], dict | None]:
    """Over one warm generate() call: device time and launches per decode step by kernel group (the
    encoder's kernels included, spread over the steps), and a decode step as a chain (each kernel's
    exposed time, padfree.bench.timing.kernel_chain; steps start at the step embedding): where a step's
    time goes."""
    from torch.profiler import ProfilerActivity, profile

    from padfree.bench.timing import _group, kernel_chain
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    groups: dict[str, list[float]] = {}
    kernels = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in event.name.lower():
            groups.setdefault(f"{_group(event.name)}: {event.name[:80]}", []).append(event.time_range.elapsed_us())
            if "memset" not in event.name.lower():
                kernels.append((event.time_range.start, event.time_range.end, event.name))
    rows = [{"kernels": key, "launches_per_step": len(t) / new_tokens, "us_per_step": sum(t) / new_tokens}
            for key, t in groups.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"]), kernel_chain(kernels, "step_embedding")


def print_profile(row: dict) -> None:
    total = sum(r["us_per_step"] for r in row["step_profile"])
    launches = sum(r["launches_per_step"] for r in row["step_profile"])
    print(f"-- {row['model']} {row['batch']}x{row['beams']}: {launches:.0f} kernels, {total:.0f} us of kernel time "
          f"per step (ms/step {row['padfree_ms_per_step']:.3f})")
    for r in row["step_profile"][:25]:
        print(f"   {r['us_per_step']:8.1f} us {r['launches_per_step']:6.1f}x  {r['kernels']}")
    chain = row.get("step_chain")
    if chain:
        print(f"   as a chain: {chain['kernels']} kernels, {chain['span_us']:.0f} us from the step embedding's start "
              f"to the last end ({chain['sequences']} steps); by exposed time:")
        for r in sorted(chain["chain"], key=lambda r: -r["exposed_us"])[:15]:
            print(f"   {r['exposed_us']:8.1f} us exposed {r['us']:8.1f} us long  #{r['position']:<3} "
                  f"{r['kernel'][:80]}")


def equal_share(ours: torch.Tensor, theirs: torch.Tensor, pad: int) -> float:
    """The share of output sequences identical to HF's (the shorter output padded with pad)."""
    width = max(ours.shape[1], theirs.shape[1])
    a, b = (torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad) for t in (ours, theirs))
    return float((a == b).all(dim=1).float().mean())


def print_table(rows: list[dict]) -> None:
    ct2 = any("ct2_ms" in r for r in rows)

    def cell(r: dict, key: str, width: int, digits: int) -> str:
        return f"{r[key]:{width}.{digits}f}" if key in r else f"{'-':>{width}}"

    print(f"{'model':8} {'shape':>6} {'HF ms':>10} {'padfree ms':>11} {'x':>6} {'ms/step':>8} {'step':>7} {'floor':>7} "
          f"{'/floor':>7} {'=HF':>5}" + (f" {'CT2 ms':>8} {'xCT2':>6} {'=CT2':>5}" if ct2 else ""))
    for r in rows:
        print(f"{r['model']:8} {r['batch']:>3}x{r['beams']:<2} {cell(r, 'hf_ms', 10, 1)} {r['padfree_ms']:11.1f} "
              f"{cell(r, 'speedup', 6, 2)} {r['padfree_ms_per_step']:8.3f} {cell(r, 'padfree_step_ms', 7, 3)} "
              f"{r['step_floor_ms']:7.3f} {r['step_over_floor']:7.2f} {cell(r, 'sequences_equal_hf', 5, 2)}"
              + (f" {cell(r, 'ct2_ms', 8, 1)} {cell(r, 'padfree_vs_ct2', 6, 2)} "
                 f"{cell(r, 'sequences_equal_ct2_hf', 5, 2)}" if ct2 else ""))


def main(argv: list[str] | None = None) -> int:
    from padfree.torch.gemm_tuning import GEMM_SEARCHES
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="marian,nllb", help="comma-separated: marian, nllb (tiny: --quick's)")
    parser.add_argument("--shapes", default="1x4,16x4,64x4,64x1", help="batch x beams, comma-separated")
    parser.add_argument("--reps", type=int, default=5, help="timed calls per column (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--no-hf", action="store_true", help="skip the HF generate column")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: the tiny model, shapes 1x4,2x1, 8 new tokens, one rep, CPU without CUDA")
    parser.add_argument("--profile", action="store_true",
                        help="also print (and record) the kernel time per decode step by kernel group, and a "
                             "step as a chain of kernels (each one's exposed time)")
    parser.add_argument("--ctranslate2", action="store_true",
                        help="add CTranslate2's column (ct2_ms, padfree_vs_ct2, sequences_equal_ct2_hf); "
                             "skipped with a message where ctranslate2 is not importable")
    parser.add_argument("--allow-reference", action="store_true",
                        help="time the run even where an op falls back to its torch reference on CUDA (recorded)")
    parser.add_argument("--gemm-search", default="heuristic", choices=GEMM_SEARCHES,
                        help="from_hf's gemm_search: how the output projection's GEMM is tuned (none: torch's call)")
    parser.add_argument("--out", default=None, help="JSON report (default bench/results/generate-<gpu>.json)")
    args = parser.parse_args(argv)
    from padfree.bench import record, timing
    args.ctranslate2_skipped, args.ctranslate2_options = [], {}
    ct2_version = ctranslate2_version() if args.ctranslate2 else None
    if args.ctranslate2 and ct2_version is None:
        args.ctranslate2 = False
        skip_ctranslate2(args, "ctranslate2 is not importable (pip install ctranslate2; on the device machine: "
                               "source scripts/ctranslate2_env.sh)")
    if args.quick:
        args.models, args.shapes, args.new_tokens, args.reps, args.warmup = "tiny", "1x4,2x1", 8, 1, 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.quick:
        parser.error("the benchmark runs on a CUDA device; --quick runs the smoke test on the CPU")
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]
    bandwidth = copy_bandwidth(device, 2**30 if device.type == "cuda" else 2**24)
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        rows += bench_model(name, shapes, args, device, dtype, bandwidth)
    print_table(rows)
    import transformers
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = {"benchmark": "encoder-decoder generation, random weights, exactly new_tokens per hypothesis",
              "device": device_name, "dtype": str(dtype),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
              "commit": record.commit(ROOT), "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
              "copy_bandwidth_gbs": bandwidth / 1e9,
              "sources": "lengths uniform in [8, 64], torch.Generator seed 7",
              "timing": ("CUDA events" if device.type == "cuda" else "perf_counter")
              + f", median of {args.reps} after {args.warmup} warm-up calls",
              "hf": "generate, attn_implementation=sdpa, same weights and options",
              "per_step": ("padfree_ms_per_step: the whole call over new_tokens (host work, encoder and result "
                           "included; step_over_floor uses it); padfree_step_ms: a decode step alone, the mean GPU "
                           "time between the step graph's replays over one more call (CUDA events; "
                           "step_alone_over_floor)")}
    if args.ctranslate2_options or args.ctranslate2_skipped:
        report["ctranslate2"] = ct2_version or "not importable"
    if args.ctranslate2_options:
        report["ct2"] = ("the same weights converted (TransformersConverter, stand-in vocabulary, "
                         + ("float16 weights), Translator(device=cuda, compute_type=float16)" if device.type == "cuda"
                            else "float32), Translator(device=cpu, compute_type=float32)")
                         + ", translate_batch(beam_size=beams, max_batch_size=batch, **ct2_options[model]) timed in a "
                           "process of its own (median wall time of the blocking call after the warm-up calls); "
                           "Marian: new_tokens - 1 steps, HF's forced eos appended")
        report["ct2_options"] = args.ctranslate2_options
    if args.ctranslate2_skipped:
        report["ct2_skipped"] = args.ctranslate2_skipped
    report["rows"] = rows
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   f"generate-{timing.gpu_slug(device_name)}{'-quick' if args.quick else ''}.json")
    record.write(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
