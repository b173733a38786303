"""`padfree run SOURCE --generate`: generate with an encoder-decoder through padfree's Runtime.

SOURCE is a seq2seq `padfree export` folder (ONNX Runtime, CPU: padfree.runtime.backends.onnxrt_seq2seq),
its generation graph (generation.padfree.onnx: the whole generation in one ONNX Runtime run, with the
options it was exported with; padfree.runtime.backends.onnxrt_generation) or a Hugging Face
encoder-decoder directory (the PyTorch path, padfree.generation: CUDA kernels, or
their torch references with --device cpu --dtype fp32). The options are Hugging Face generate's
(--num-beams, --max-new-tokens, --option KEY=VALUE for any other), merged with the model's
generation_config as from_hf's generate merges them; an option padfree does not implement is refused
by name. Each source's hypotheses are printed as token ids, and as text for texts or with --tokenizer.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..arguments import CommandError

log = logging.getLogger(__name__)


def register_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation (an encoder-decoder: a seq2seq export folder or an HF directory)")
    g.add_argument("--generate", action="store_true",
                   help="generate from each sequence with the encoder-decoder instead of encoding it")
    g.add_argument("--num-beams", type=int, default=None, help="beam width (default: the model's generation_config)")
    g.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens generated per hypothesis at most (default: the model's generation_config)")
    g.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other option of Hugging Face's generate (VALUE read as JSON where it parses: "
                        "--option length_penalty=0.8 --option early_stopping=true); repeat for several")


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    """generate()'s keyword options from the command line."""
    options: dict[str, Any] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise CommandError(f"--option {item!r}: expected KEY=VALUE with KEY an option name (num_beams=4)")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    for key in ("num_beams", "max_new_tokens"):
        value = getattr(args, key)
        if value is not None:
            if key in options:
                raise CommandError(f"--{key.replace('_', '-')} and --option {key}=...: give one")
            options[key] = value
    return options


def is_generation_engine(source: str) -> bool:
    """Whether SOURCE is an engine built from a generation graph (its sidecar says so; a sidecar that does not
    check out is refused with sidecar.read's message)."""
    from padfree.engines import sidecar
    if not os.path.isfile(source) or not sidecar.path_for(source).is_file():
        return False
    return sidecar.read(source)["model"]["io"] == "generation"


def is_seq2seq(source: str) -> bool:
    """Whether SOURCE names an encoder-decoder: a seq2seq export folder, its generation graph or an engine
    built from it, or an HF encoder-decoder directory."""
    from padfree.export.seq2seq.models import is_seq2seq_source
    from padfree.runtime.backends.onnxrt_generation import is_generation_graph
    from padfree.runtime.backends.onnxrt_seq2seq import is_seq2seq_export
    return (is_seq2seq_export(source) or is_generation_graph(source) or is_generation_engine(source)
            or is_seq2seq_source(source))


def open_generator(args: argparse.Namespace):
    """The Runtime that generates for SOURCE."""
    import torch

    from padfree.runtime import Runtime
    from padfree.runtime.backends.onnxrt_generation import is_generation_graph
    from padfree.runtime.backends.onnxrt_seq2seq import is_seq2seq_export

    tokenizer = args.tokenizer
    if is_seq2seq_export(args.source):
        log.info("generating from export folder %s on ONNX Runtime (CPU)", args.source)
        return Runtime(args.source, tokenizer=tokenizer)
    if is_generation_graph(args.source):
        log.info("generating with the generation graph %s on ONNX Runtime (CPU)", args.source)
        return Runtime(args.source, tokenizer=tokenizer)
    if is_generation_engine(args.source):
        log.info("generating with the whole-generation engine %s", args.source)
        return Runtime(args.source, tokenizer=tokenizer, plugin_library_path=getattr(args, "plugin_library", None),
                       allow_plugin_mismatch=getattr(args, "allow_plugin_mismatch", False))
    from padfree.export.errors import ExportError
    from padfree.export.seq2seq.models import is_seq2seq_source, load
    from padfree.ops._tensors import PRECISION_DTYPES
    from padfree.tokenizer_files import has_tokenizer
    from padfree.torch import from_hf

    if not is_seq2seq_source(args.source):
        raise CommandError(f"--generate: {args.source!r} is not an encoder-decoder (a seq2seq `padfree export` "
                           f"folder or an HF directory whose config.json has is_encoder_decoder); encode it without "
                           f"--generate")
    try:
        model, description = load(args.source)
    except ExportError as e:
        raise CommandError(str(e)) from None
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CommandError("the PyTorch path generates on CUDA, and torch sees no CUDA device here; pass --device cpu "
                           "--dtype fp32 (padfree.generation's torch references), or generate from a seq2seq "
                           "`padfree export` folder (ONNX Runtime, CPU)")
    if device.type == "cpu" and args.dtype != "fp32":
        raise CommandError(f"--device cpu generates in float32: pass --dtype fp32 (got --dtype {args.dtype})")
    log.info("generating with %s through the PyTorch path (%s on %s)", description, args.dtype, device)
    if tokenizer is None and has_tokenizer(args.source):
        tokenizer = args.source
    return Runtime(from_hf(model, dtype=PRECISION_DTYPES[args.dtype], device=device), tokenizer=tokenizer)


def generate(runtime, batch: Any, args: argparse.Namespace, texts: list[str] | None,
             attention_mask: Any = None) -> dict[str, np.ndarray]:
    """Generate for `batch` (token-id lists, or padded ids with attention_mask), print each source's
    hypotheses; returns the arrays -o writes."""
    from padfree.generation.models import UnsupportedModelError
    from padfree.ops._tensors import InputError

    options = options_of(args)
    # sequences_scores come with beam search only (padfree returns no per-step scores)
    scores_wanted = int(options.get("num_beams", _default_beams(runtime))) > 1
    try:
        out = runtime.generate(batch, attention_mask, **options, return_dict_in_generate=True,
                               **({"output_scores": True} if scores_wanted else {}))
    except (InputError, UnsupportedModelError, ValueError) as e:
        raise CommandError(f"bad input or option: {e}") from None
    sequences = out.sequences.cpu().numpy()
    scores = getattr(out, "sequences_scores", None)
    scores = None if scores is None else scores.float().cpu().numpy()
    per_source = max(1, len(sequences) // max(1, len(batch)))
    decoded = None
    if texts is not None or args.tokenizer:   # a tokenizer the sources came from or was given for the outputs
        decoded = runtime.text_tokenizer.tokenizer.batch_decode(sequences.tolist(), skip_special_tokens=True)
    for i, row in enumerate(sequences):
        source, rank = divmod(i, per_source)
        head = f"source {source}" + (f" #{rank}" if per_source > 1 else "")
        score = "" if scores is None else f" (score {scores[i]:.4f})"
        print(f"{head}: {row.tolist()}{score}")
        if decoded is not None:
            print(f"  {decoded[i]!r}")
    arrays = {"sequences": sequences}
    if scores is not None:
        arrays["sequences_scores"] = scores
    return arrays


def _default_beams(runtime) -> int:
    """The beam width a generation graph was written with, or the one the model's generation_config gives
    (1 where it says nothing)."""
    backend = runtime.backend
    facts = getattr(backend, "facts", None)
    if facts is not None:
        return int(facts.get("num_beams", 1))
    config = getattr(backend, "generation_config", None) or getattr(getattr(backend, "generator", None),
                                                                    "generation_config", None)
    return int(getattr(config, "num_beams", None) or 1)


def refuse_encoder_options(args: argparse.Namespace) -> None:
    """Options of the encoding mode that generation has no use for."""
    if args.padded:
        raise CommandError("--padded shapes encoder outputs; generation returns token ids: leave it out")


def check_not_generation_options(args: argparse.Namespace, source: str) -> None:
    """Generation options without --generate, or an encoder-decoder without it."""
    given = [f"--{k.replace('_', '-')}" for k in ("num_beams", "max_new_tokens") if getattr(args, k) is not None]
    if args.option:
        given.append("--option")
    if given:
        raise CommandError(f"{', '.join(given)}: generation options; pass --generate with them")
    if Path(source).exists() and is_seq2seq(source):
        raise CommandError(f"{source} is an encoder-decoder: pass --generate (with --num-beams, --max-new-tokens, "
                           f"--option KEY=VALUE) to generate from each sequence")
