"""`padfree run SOURCE`: encode one batch with padfree's Runtime and print the output shapes, or with
--generate generate from it with an encoder-decoder (run_generate.py) and print the token ids.

SOURCE is an engine file (served by padfree.runtime.backends.engine), a `padfree export` folder (on ONNX
Runtime, CPU: padfree.runtime.backends.onnxrt_encoder), a Hugging Face model directory or a built-in
tiny model name (both through the PyTorch path, padfree.torch); with --generate, a seq2seq export folder
or an HF encoder-decoder directory. The batch comes from texts (--text, --text-file: tokenized with the
model's tokenizer, no padding), a JSON file of token ids (--input) or is drawn at random (--random B,S).
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..arguments import CommandError, non_negative_int, positive_int
from ..line_files import read_texts
from ..tokenizer_files import has_tokenizer
from . import run_generate

log = logging.getLogger(__name__)

DTYPES = ("fp32", "fp16", "bf16")


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="encode a batch with the padfree runtime",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="engine file, HF model directory, or built-in tiny model name")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", action="append", metavar="TEXT",
                      help="a text to encode (repeat for several), tokenized with the model's tokenizer")
    what.add_argument("--text-file", type=Path, metavar="FILE", help="texts to encode, one per line (UTF-8)")
    what.add_argument("--input", type=Path, metavar="FILE.json",
                      help='a list of token-id lists, or {"input_ids": ..., "attention_mask": ...,'
                           ' "token_type_ids": ...} (padded when attention_mask is given)')
    what.add_argument("--random", metavar="B,S", type=_batch_shape,
                      help="B random sequences, lengths uniform in [ceil(0.2*S), S]")
    p.add_argument("--tokenizer", metavar="DIR", help="the model's HF tokenizer folder (default: the one beside"
                   " SOURCE, which `padfree export` copies into its folder)")
    p.add_argument("--truncate", action="store_true",
                   help="cut texts over the model's limit to it (default: refuse them, naming the limit)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of --random (default 0)")
    p.add_argument("--padded", action="store_true", help="padded [B, S, H] outputs (zeros in padding)")
    p.add_argument("-o", "--output", type=Path, metavar="OUT.npz",
                   help="write the outputs (per-sequence form: packed [T, H] plus cu_seqlens)")
    p.add_argument("--dtype", choices=DTYPES, default="fp16", help="PyTorch path precision (default fp16)")
    p.add_argument("--device", default="cuda", help="PyTorch path device (default cuda)")
    p.add_argument("--gemm-search", choices=("heuristic", "exhaustive"), default="heuristic",
                   help="PyTorch path: how each new size bucket tunes its GEMMs (exhaustive: every cuBLASLt "
                        "configuration, seconds per bucket; padfree.torch.from_hf)")
    p.add_argument("--gemm-tuning", metavar="FILE.json",
                   help="PyTorch path: keep the GEMM choices in this file across runs (read if it exists)")
    p.add_argument("--max-batch", type=positive_int, help="split batches into chunks of at most this many sequences")
    p.add_argument("--max-tokens", type=positive_int, help="split batches into chunks of at most this many tokens")
    p.add_argument("--plugin-library", metavar="LIB", help="engine: the padfree plugin library to load (default:"
                   " $PADFREE_TRT_LIBRARY, else the installed one; never the path a sidecar records)")
    p.add_argument("--allow-plugin-mismatch", action="store_true",
                   help="engine: load a plugin library whose SHA-256 differs from the one it was built with")
    run_generate.register_options(p)
    p.set_defaults(func=main)


def _batch_shape(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected B,S (two integers), got {text!r}")
    return positive_int(parts[0]), positive_int(parts[1])


def load_hf_model(source: str) -> Any:
    """An HF model from a local directory, or a built-in tiny random-weight model (padfree.export)."""
    from padfree.export.errors import ExportError
    from padfree.export.models import load
    from padfree.export.sentence import is_sentence_dir

    try:
        # the PyTorch path serves the encoder, and a sentence-transformers directory's pooling
        # (sentence_embedding); a task head is left out (with a warning)
        task = None if is_sentence_dir(source) else "feature-extraction"
        model, description = load(source, task=task, allow_unused_weights=True)
    except ExportError as e:
        raise CommandError(f"{source!r} is not an engine file, and {e}") from None
    log.info("model: %s", description)
    return model


def open_runtime(args: argparse.Namespace):
    """The Runtime for SOURCE; padfree's errors (a bad engine, an unsupported model) end the command
    in padfree.cli with their message rather than a traceback."""
    import torch

    from padfree.runtime import Runtime

    limits = {"max_batch": args.max_batch, "max_tokens": args.max_tokens, "tokenizer": args.tokenizer}
    if Path(args.source).is_file():
        log.info("serving engine %s", args.source)
        return Runtime(args.source, **limits, plugin_library_path=args.plugin_library,
                       allow_plugin_mismatch=args.allow_plugin_mismatch)
    from padfree.runtime.backends.onnxrt_encoder import is_encoder_export
    if is_encoder_export(args.source):
        log.info("serving export folder %s on ONNX Runtime (CPU; plugin nodes through their references)", args.source)
        return Runtime(args.source, **limits)
    if Path(args.source).is_dir() and args.tokenizer is None:
        limits["tokenizer"] = args.source if has_tokenizer(args.source) else None
    from padfree.ops._tensors import PRECISION_DTYPES
    from padfree.torch import from_hf
    model = load_hf_model(args.source)
    if not torch.cuda.is_available():
        raise CommandError("the PyTorch path runs padfree's CUDA kernels, and torch sees no CUDA device here;"
                           " serve an engine file or a `padfree export` folder (ONNX Runtime, CPU), or run on a"
                           " machine with a GPU")
    dtype = PRECISION_DTYPES[args.dtype]
    log.info("serving %s through the PyTorch path (%s on %s)", type(model).__name__, args.dtype, args.device)
    return Runtime(from_hf(model, dtype=dtype, device=args.device, gemm_search=args.gemm_search,
                           gemm_tuning=args.gemm_tuning), **limits)


def read_batch(path: Path) -> dict[str, Any]:
    """Runtime.run's keyword arguments from a JSON batch file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CommandError(f"cannot read {path}: {e}") from None
    if isinstance(data, list):
        return {"batch": data}
    if isinstance(data, dict) and "input_ids" in data:
        unknown = set(data) - {"input_ids", "attention_mask", "token_type_ids"}
        if unknown:
            raise CommandError(f"{path}: unknown keys {sorted(unknown)}; expected input_ids, attention_mask,"
                               " token_type_ids")
        padded = data.get("attention_mask") is not None
        conv = np.asarray if padded else (lambda x: x)
        return {"batch": conv(data["input_ids"]),
                "attention_mask": conv(data["attention_mask"]) if padded else None,
                "token_type_ids": None if data.get("token_type_ids") is None else conv(data["token_type_ids"])}
    raise CommandError(f"{path}: expected a list of token-id lists or an object with input_ids")


def random_batch(batch: int, max_len: int, vocab_size: int | None, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, -(-max_len // 5)), max_len + 1, size=batch)
    high = vocab_size or 1000
    return [rng.integers(0, high, size=n, dtype=np.int64) for n in lengths]


def main(args: argparse.Namespace) -> int:
    from padfree.ops._tensors import InputError

    if args.output is not None:  # before the model loads and the batch runs
        _writable_npz(args.output)
    texts = args.text if args.text is not None else read_texts(args.text_file) if args.text_file else None
    if texts is None and args.truncate:
        raise CommandError("--truncate applies to texts: give --text or --text-file")
    if texts is None and args.tokenizer and not args.generate:
        raise CommandError("--tokenizer applies to texts: give --text or --text-file")
    if args.generate:
        run_generate.refuse_encoder_options(args)
        runtime = run_generate.open_generator(args)
    else:
        run_generate.check_not_generation_options(args, args.source)
        runtime = open_runtime(args)
    if texts is not None:
        try:
            ids = runtime.tokenize(texts, truncate=args.truncate)
        except InputError as e:
            raise CommandError(f"bad input: {e}") from None
        log.info("%d texts: %s tokens", len(ids), [len(i) for i in ids])
        run_args = {"batch": ids}
    elif args.input is not None:
        run_args = read_batch(args.input)
    else:
        b, s = args.random
        s = min(s, runtime.limits.max_seqlen)
        run_args = {"batch": random_batch(b, s, runtime.limits.vocab_size, args.seed)}
    start = time.perf_counter()
    if args.generate:
        if run_args.get("token_type_ids") is not None:
            raise CommandError(f"{args.input}: token_type_ids: an encoder-decoder's sources take none")
        batch, mask = run_args["batch"], run_args.get("attention_mask")
        if mask is not None:  # a padded batch: as HF's generate takes it, [B, S] tensors
            import torch
            batch, mask = torch.as_tensor(batch), torch.as_tensor(mask)
        out = run_generate.generate(runtime, batch, args, texts, mask)
        print(f"generate: {(time.perf_counter() - start) * 1e3:.2f} ms (first call: includes warm-up)")
        if args.output is not None:
            save(out, args.output)
            print(f"wrote {args.output}")
        return 0
    try:
        out = runtime.run(**run_args, padded=args.padded, output="numpy")
    except InputError as e:
        raise CommandError(f"bad input: {e}") from None
    elapsed = time.perf_counter() - start
    print(describe(out, elapsed))
    if args.output is not None:
        save(out, args.output)
        print(f"wrote {args.output}")
    return 0


def describe(out: dict[str, Any], seconds: float) -> str:
    lines = []
    for name, value in out.items():
        if isinstance(value, list):
            lengths = [len(v) for v in value]
            tail = list(value[0].shape[1:])
            lines.append(f"{name}: {len(value)} sequences of [len, {', '.join(map(str, tail))}]"
                         f" {value[0].dtype}, lengths {lengths}")
        else:
            lines.append(f"{name}: {list(value.shape)} {value.dtype}")
    lines.append(f"run: {seconds * 1e3:.2f} ms (first call: includes warm-up)")
    return "\n".join(lines)


def save(out: dict[str, Any], path: Path) -> None:
    arrays = {}
    for name, value in out.items():
        if isinstance(value, list):
            arrays[name] = np.concatenate(value)
            arrays["cu_seqlens"] = np.concatenate(([0], np.cumsum([len(v) for v in value]))).astype(np.int32)
        else:
            arrays[name] = value
    import io

    from padfree import outputs
    buffer = io.BytesIO()  # np.savez(path) would append .npz to any other name
    np.savez(buffer, **arrays)
    outputs.write_bytes(path, buffer.getvalue())


def _writable_npz(path: Path) -> None:
    from padfree import outputs
    outputs.writable_file(path, "output (-o)")
