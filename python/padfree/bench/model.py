"""`padfree bench MODEL`: your model on your sequence lengths or texts.

MODEL: an engine file, a `padfree export` folder (ONNX Runtime, CPU), an HF model directory or a
built-in tiny model name (both through the PyTorch path, padfree.torch.from_hf: the encoder of a task
checkpoint, or a sentence-transformers directory with its pooling).
Sequences: --lengths FILE (one integer per line: random token ids of each length, numpy seed --seed)
or --texts FILE (one text per line, tokenized once with the model's tokenizer: not timed), in the
file's order, in batches of --batch-size (padfree needs no length sort).
Per system:
  throughput  --reps passes over every batch after --warmup passes, each run() returning without
              waiting (the next batch is packed while the device runs this one); the median pass
              gives sequences/s and tokens/s
  latency     each batch alone, waited for, over --reps passes: p50 / p90 / p99 / max ms per batch
  hf          (PyTorch path, unless --no-hf) the HF model itself (sdpa, same dtype and device) on each
              batch padded to its longest: the same two measurements, and the largest difference of
              its output from padfree's on the first batch
Timing: CUDA events on a GPU, perf_counter on the CPU (padfree.bench.timing.samples_ms).
"""
from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from ..arguments import CommandError
from ..line_files import read_lengths, read_texts

log = logging.getLogger(__name__)
PERCENTILES = (50, 90, 99)


def check_lengths(lengths: list[int], limits: Any, path: Path) -> None:
    """Every length within what the model serves, or CommandError naming the line and the limit."""
    limit, reason = min((int(limits.max_seqlen), "the longest sequence it serves, max_seqlen"),
                        (int(limits.max_tokens), "its max_tokens"))
    over = next((i for i, n in enumerate(lengths) if n > limit), None)
    if over is not None:
        raise CommandError(f"{path} line {over + 1}: length {lengths[over]} exceeds this model's limit of {limit}"
                           f" tokens ({reason}); shorten it or leave it out")


def random_sequences(lengths: list[int], limits: Any, seed: int) -> list[list[int]]:
    """Token ids of the given lengths, uniform over the vocabulary (ids below a RoBERTa-style model's
    padding id and the id itself left out: such a sequence would be refused)."""
    rng = np.random.default_rng(seed)
    high = int(limits.vocab_size or 1000)
    low = 0 if limits.position_pad_id is None else min(int(limits.position_pad_id) + 1, high - 1)
    ids = rng.integers(low, high, size=sum(lengths))
    cuts = np.cumsum(lengths)[:-1]
    return [part.tolist() for part in np.split(ids, cuts)]


def batches_of(sequences: list, size: int) -> list[list]:
    return [sequences[i:i + size] for i in range(0, len(sequences), size)]


def load_hf(source: str) -> tuple[Any, str]:
    """An HF directory or built-in name as the PyTorch path serves it: a sentence-transformers directory
    with its pooling, any other model's encoder (a task head left out), sdpa attention for the HF column."""
    from padfree.export import sentence, tasks
    from padfree.export.errors import ExportError
    from padfree.export.models import load

    task = tasks.SENTENCE_SIMILARITY if sentence.is_sentence_dir(source) else tasks.FEATURE_EXTRACTION
    try:
        return load(source, attn_implementation="sdpa", task=task, allow_unused_weights=True)
    except ExportError as e:
        raise CommandError(f"{source!r} is neither an engine file nor a `padfree export` folder, and {e}") from None


def open_model(args) -> tuple[Any, Any, str]:
    """(Runtime, the HF model for the hf column or None, a description) for MODEL."""
    import torch

    from padfree.runtime import Runtime
    from padfree.runtime.backends.onnxrt_encoder import is_encoder_export
    from padfree.tokenizer_files import has_tokenizer

    source = args.model
    if Path(source).is_file():
        runtime = Runtime(source, tokenizer=args.tokenizer, plugin_library_path=args.plugin_library,
                          allow_plugin_mismatch=args.allow_plugin_mismatch)
        return runtime, None, f"engine {source}"
    if is_encoder_export(source):
        return Runtime(source, tokenizer=args.tokenizer), None, f"export folder {source} on ONNX Runtime (CPU)"
    if Path(source).is_dir() and (Path(source) / "seq2seq.json").is_file():
        raise CommandError(f"{source} is an encoder-decoder export; padfree bench times encoders")
    from padfree.ops._tensors import PRECISION_DTYPES
    from padfree.torch import from_hf
    model, description = load_hf(source)
    if getattr(model.config, "is_encoder_decoder", False):
        raise CommandError(f"{source} is an encoder-decoder ({type(model).__name__}); padfree bench times encoders")
    if not torch.cuda.is_available():
        raise CommandError("the PyTorch path runs padfree's CUDA kernels, and torch sees no CUDA device here;"
                           " bench an engine file or a `padfree export` folder (ONNX Runtime, CPU), or run on a"
                           " machine with a GPU")
    dtype = PRECISION_DTYPES[args.dtype]
    encoder = from_hf(model, dtype=dtype, device=args.device, gemm_search=args.gemm_search,
                      gemm_tuning=args.gemm_tuning)
    tokenizer = args.tokenizer or (source if Path(source).is_dir() and has_tokenizer(source) else None)
    runtime = Runtime(encoder, tokenizer=tokenizer)
    hf = None if args.no_hf else model.to(device=runtime.device, dtype=dtype).eval()
    return runtime, hf, f"{description}, PyTorch path ({args.dtype})"


def sequences_for(args, runtime) -> tuple[list[list[int]], str]:
    from padfree.ops._tensors import InputError
    if args.texts is not None:
        texts = read_texts(args.texts)
        try:
            return runtime.tokenize(texts, truncate=args.truncate), f"texts {args.texts} (tokenized, not timed)"
        except InputError as e:
            raise CommandError(f"{args.texts}: {e}") from None
    lengths = read_lengths(args.lengths)
    check_lengths(lengths, runtime.limits, args.lengths)
    origin = f"lengths {args.lengths}, random ids (seed {args.seed})"
    return random_sequences(lengths, runtime.limits, args.seed), origin


def keep_every_graph(runtime, batches: list[list]) -> int | None:
    """Raise the PyTorch path encoder's max_graphs to the buckets the batches use, so that the timed
    passes replay graphs rather than recapture evicted ones. Returns the bucket count (None: no graphs)."""
    from padfree.runtime._plan import plan_chunks
    from padfree.torch.buckets import bucket_for
    encoder = getattr(runtime.backend, "encoder", None)
    if not getattr(encoder, "use_graphs", False):
        return None
    limits, cap = runtime.limits, encoder.weights.max_seqlen
    buckets = set()
    for batch in batches:
        lengths = np.array([len(s) for s in batch])
        for c in plan_chunks(lengths, limits.max_batch, limits.max_tokens,
                             np.concatenate(([0], np.cumsum(lengths)))):
            buckets.add(bucket_for(c.tokens, c.batch, c.max_seqlen, cap, False))
    encoder.max_graphs = max(encoder.max_graphs, len(buckets))
    return len(buckets)


def padded(batch: list[list[int]], device) -> tuple[Any, Any]:
    import torch
    width = max(map(len, batch))
    ids = np.zeros((len(batch), width), np.int64)
    mask = np.zeros((len(batch), width), np.int64)
    for i, s in enumerate(batch):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def measure_system(call, batches: list[list], tokens: int, args, cuda: bool) -> dict:
    """Throughput (median pass) and per-batch latency percentiles of call(batch)."""
    from .timing import samples_ms

    def one_pass():
        for batch in batches:
            call(batch)
    pass_ms = statistics.median(samples_ms(one_pass, args.reps, args.warmup, cuda=cuda))
    latencies = [t for _ in range(args.reps) for batch in batches
                 for t in samples_ms(lambda b=batch: call(b), 1, 0, cuda=cuda)]
    count = sum(map(len, batches))
    return {"pass_ms": pass_ms, "sequences_per_s": count / pass_ms * 1e3, "tokens_per_s": tokens / pass_ms * 1e3,
            "latency_ms": {**{f"p{q}": float(np.percentile(latencies, q)) for q in PERCENTILES},
                           "max": max(latencies)}}


def primary(out: Any) -> tuple[str, Any]:
    """The output compared with HF's: the sentence embedding where there is one, else last_hidden_state."""
    for name in ("sentence_embedding", "last_hidden_state"):
        value = out.get(name) if isinstance(out, dict) else getattr(out, name, None)
        if value is not None:
            return name, value
    raise CommandError(f"no sentence_embedding or last_hidden_state among the outputs {sorted(out)}")


def difference(runtime, hf, batch: list[list[int]]) -> dict:
    """The largest absolute difference of padfree's output from the HF model's on one batch."""
    import torch
    with torch.no_grad():
        name, ours = primary(runtime.run(batch, output="torch"))
        _, theirs = primary(hf(*padded(batch, runtime.device)))
    if isinstance(ours, list):     # per sequence [len_i, H]: HF's valid rows
        theirs = torch.cat([theirs[i, :len(s)] for i, s in enumerate(batch)])
        ours = torch.cat(ours)
    return {"output": name, "max_abs_diff": float((ours.float() - theirs.float()).abs().max())}


def run_model(args) -> int:
    import torch

    from padfree.outputs import write_text

    from .record import provenance
    if args.out is not None:  # before the model loads
        from padfree import outputs
        outputs.writable_file(Path(args.out), "result (--out)")
    if args.lengths is not None:
        read_lengths(args.lengths)                # a malformed file fails before the model loads
    runtime, hf, description = open_model(args)
    if not hasattr(runtime.backend, "execute_packed"):
        raise CommandError(f"{args.model} is an encoder-decoder; padfree bench times encoders")
    sequences, origin = sequences_for(args, runtime)
    batches = batches_of(sequences, args.batch_size)
    graphs = keep_every_graph(runtime, batches)
    cuda = runtime.device.type == "cuda"
    tokens = sum(map(len, sequences))
    lengths = np.array([len(s) for s in sequences])
    device = torch.cuda.get_device_name(runtime.device) if cuda else "cpu"
    log.info("%s: %d sequences, %d tokens, batches of %d, on %s", description, len(sequences), tokens,
             args.batch_size, device)
    systems = {}
    with torch.no_grad():
        systems["padfree"] = measure_system(lambda b: runtime.run(b, output="torch"), batches, tokens, args, cuda)
        if hf is not None:
            systems["hf"] = measure_system(lambda b: hf(*padded(b, runtime.device)), batches, tokens, args, cuda)
    result = {"benchmark": "padfree bench MODEL", "model": args.model, "description": description,
              "backend": repr(runtime.backend), "device": device,
              "dtype": str(runtime.limits.dtype).removeprefix("torch."),
              **provenance(),
              "sequences": {"from": origin, "count": len(sequences), "total_tokens": tokens,
                            "mean_length": float(lengths.mean()), "shortest": int(lengths.min()),
                            "longest": int(lengths.max()), "batch_size": args.batch_size, "batches": len(batches)},
              "graph_buckets": graphs,
              "timing": ("CUDA events" if cuda else "perf_counter") + f"; throughput: median of {args.reps} passes"
                        f" after {args.warmup} warm-up passes; latency: each batch alone, {args.reps} times",
              "systems": systems}
    if hf is not None:
        result["padfree_over_hf"] = {"sequences_per_s": systems["padfree"]["sequences_per_s"]
                                     / systems["hf"]["sequences_per_s"],
                                     "p50_latency": systems["hf"]["latency_ms"]["p50"]
                                     / systems["padfree"]["latency_ms"]["p50"]}
        result["hf_agreement"] = difference(runtime, hf, batches[0])
    print_result(result)
    if args.out is not None:
        write_text(args.out, json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


def print_result(result: dict) -> None:
    s = result["sequences"]
    print(f"{result['description']} on {result['device']}: {s['count']} sequences, {s['total_tokens']} tokens"
          f" (lengths {s['shortest']}-{s['longest']}, mean {s['mean_length']:.1f}), {s['batches']} batches of"
          f" {s['batch_size']}")
    if result["graph_buckets"] is not None:
        print(f"  CUDA-graph buckets used: {result['graph_buckets']} (from_hf's max_graphs must be at least that"
              " to replay every batch)")
    print(f"  {'system':8} {'seq/s':>10} {'tokens/s':>12} "
          + " ".join(f"{'p' + str(q) + ' ms':>9}" for q in PERCENTILES) + f" {'max ms':>9}")
    for name, r in result["systems"].items():
        lat = r["latency_ms"]
        print(f"  {name:8} {r['sequences_per_s']:10.1f} {r['tokens_per_s']:12.0f} "
              + " ".join(f"{lat[f'p{q}']:9.3f}" for q in PERCENTILES) + f" {lat['max']:9.3f}")
    if "padfree_over_hf" in result:
        ratio, agree = result["padfree_over_hf"], result["hf_agreement"]
        print(f"  padfree / hf: {ratio['sequences_per_s']:.2f}x sequences/s, {ratio['p50_latency']:.2f}x p50 latency;"
              f" {agree['output']} differs from HF's by at most {agree['max_abs_diff']:.3g} (first batch)")
