"""Text in: the Runtime's tokenizer, tokenization without padding, and encode() (sentence embeddings in
the style of sentence-transformers' encode).

Rules, each with its reason:
- **The model's own tokenizer.** Given (Runtime(..., tokenizer=DIR or a tokenizer object)), else found
  in the source's folder: an export folder (`padfree export` copies the tokenizer there), the folder
  of an engine file, an HF model directory (also the one an HF model or PadfreeEncoder was loaded
  from). Loaded with transformers' AutoTokenizer, never with trust_remote_code: a tokenizer_config.json
  naming custom code is refused (no code from data files).
- **No padding.** Each text becomes its own id sequence (special tokens added, as the tokenizer
  adds them for one text; token types all 0, so none are sent), and the Runtime packs them.
- **The limit is named, and truncation asked for.** A text longer than the model serves is refused,
  naming the limit and where it comes from, unless truncate=True: then it is cut as the tokenizer
  truncates (special tokens kept). The limit is the smallest of the backend's max_seqlen / max_tokens,
  the tokenizer's model_max_length, and a sentence-transformers model's max_seq_length
  (sentence_bert_config.json), the length sentence-transformers truncates to: so truncate=True gives
  sentence-transformers' inputs, and the default never silently differs from them.
- **sentence-transformers' text preprocessing.** Where sentence_bert_config.json is present (a
  sentence-transformers model), each text is stripped and, with do_lower_case, lowercased first, as
  its Transformer module does; other models' texts go to the tokenizer as given.
- **encode() returns the model's sentence_embedding** (a sentence-transformers model exported with its
  pooling; padfree does not guess a pooling for a model that has none), float32, one row per text,
  in the order given: packing needs no length sort.
"""
from __future__ import annotations

import contextlib
import json
import numbers
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._lib import PadfreeError
from ..ops._tensors import InputError
from ..tokenizer_files import SENTENCE_BERT_CONFIG, TOKENIZER, has_tokenizer

SENTENCE_EMBEDDING = "sentence_embedding"
# transformers' model_max_length when the tokenizer does not state one (VERY_LARGE_INTEGER, 1e30)
_UNSET_LENGTH = 10**9


class TextError(PadfreeError, ValueError):
    """Text cannot be taken: no tokenizer for the model, or a model without the output asked for."""


def check_texts(texts: Any) -> list[str]:
    """texts as a non-empty list of str, or InputError."""
    if isinstance(texts, (str, bytes)):
        raise InputError("texts: expected a list of strings, got one string; for one text pass [text]")
    try:
        texts = list(texts)
    except TypeError:
        raise InputError(f"texts: expected a list of strings, got {type(texts).__name__}") from None
    if not texts:
        raise InputError("no texts: pass at least one string")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"text {i}: expected a str, got {type(text).__name__}")
    return texts


def candidate_folders(source: Any, backend: Any) -> list[Path]:
    """Where the tokenizer of `source` may be, in order."""
    folders = []
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        folders.append(path if path.is_dir() else path.parent)
    for owner in (backend, getattr(backend, "encoder", None), source):
        for name in ("folder", "path"):
            value = getattr(owner, name, None)
            if isinstance(value, (str, os.PathLike)):
                folders.append(Path(value) if Path(value).is_dir() else Path(value).parent)
        config = getattr(owner, "config", None)
        origin = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
        if isinstance(origin, str) and origin and Path(origin).is_dir():   # a local HF directory
            folders.append(Path(origin))
    unique = []
    for folder in folders:
        if folder not in unique:
            unique.append(folder)
    return unique


def _load(folder: Path) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise TextError(f"text input needs transformers (pip install transformers) for the tokenizer in {folder}"
                        f" ({e})") from e
    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TextError(f"cannot load the tokenizer in {folder} ({type(e).__name__}: {first}); give the model's"
                        " own tokenizer folder (tokenizer=DIR, padfree run --tokenizer DIR)") from e


class TextTokenizer:
    """A model's tokenizer with the limit its texts must keep to (see the rules above)."""

    def __init__(self, tokenizer: Any, folder: Path | None, limits: Any):
        self.tokenizer = tokenizer
        self.folder = folder
        sentence = _sentence_config(folder)
        self.strip = sentence is not None
        self.lower = bool(sentence and sentence.get("do_lower_case"))
        bounds = [(int(limits.max_seqlen), "the longest sequence the model serves, max_seqlen"),
                  (int(limits.max_tokens), "the backend's max_tokens")]
        model_max = getattr(tokenizer, "model_max_length", None)
        if isinstance(model_max, numbers.Integral) and 0 < model_max < _UNSET_LENGTH:
            bounds.append((int(model_max), "the tokenizer's model_max_length"))
        if sentence and isinstance(sentence.get("max_seq_length"), int) and sentence["max_seq_length"] > 0:
            bounds.append((sentence["max_seq_length"], f"max_seq_length in {SENTENCE_BERT_CONFIG}"))
        self.limit, self.limit_reason = min(bounds, key=lambda b: b[0])

    @classmethod
    def for_runtime(cls, given: Any, source: Any, backend: Any, limits: Any) -> TextTokenizer:
        """The tokenizer `given` (a folder or a tokenizer object), else the one found beside `source`."""
        if given is not None and not isinstance(given, (str, os.PathLike)):
            if not callable(given):
                raise TextError(f"tokenizer: expected a folder or an HF tokenizer, got {type(given).__name__}")
            return cls(given, None, limits)
        if given is not None:
            folder = Path(given)
            if not has_tokenizer(folder):
                raise TextError(f"tokenizer {folder}: no tokenizer files there (one of {', '.join(TOKENIZER)});"
                                " give the folder of the model's tokenizer")
            return cls(_load(folder), folder, limits)
        folders = candidate_folders(source, backend)
        folder = next((f for f in folders if has_tokenizer(f)), None)
        if folder is None:
            where = ", ".join(map(str, folders)) or "nowhere (the model came from no folder)"
            raise TextError(f"no tokenizer found for this model (looked in {where}); give one with tokenizer=DIR"
                            " (padfree run --tokenizer DIR), or export the HF model with `padfree export HF_DIR -o"
                            " OUT`, which copies its tokenizer beside the ONNX, and serve OUT or an engine built"
                            " into it")
        return cls(_load(folder), folder, limits)

    def __call__(self, texts: list[str], truncate: bool = False, first: int = 0) -> list[list[int]]:
        """Token ids of each text (no padding); InputError for a text over the limit (unless truncate)
        or one without tokens. `first`: the index of texts[0] in the caller's list, for messages."""
        if self.strip:
            texts = [t.strip() for t in texts]
        if self.lower:
            texts = [t.lower() for t in texts]
        options = dict(add_special_tokens=True, padding=False, return_attention_mask=False,
                       return_token_type_ids=False, verbose=False)
        if truncate:
            ids = self.tokenizer(texts, truncation=True, max_length=self.limit, **options)["input_ids"]
        else:
            ids = self.tokenizer(texts, truncation=False, **options)["input_ids"]
        for i, seq in enumerate(ids):
            if len(seq) > self.limit and not truncate:
                raise InputError(f"text {first + i} has {len(seq)} tokens, more than this model's limit of"
                                 f" {self.limit} ({self.limit_reason}); shorten it, or pass truncate=True"
                                 f" (padfree run --truncate) to cut it to {self.limit} tokens")
            if not seq:
                raise InputError(f"text {first + i} has no tokens (an empty text, and a tokenizer that adds no"
                                 " special tokens); leave it out")
        return ids


def _sentence_config(folder: Path | None) -> dict | None:
    if folder is None or not (folder / SENTENCE_BERT_CONFIG).is_file():
        return None
    try:
        data = json.loads((folder / SENTENCE_BERT_CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise TextError(f"cannot read {folder / SENTENCE_BERT_CONFIG}: {e}") from e
    return data if isinstance(data, dict) else None


def encode(runtime: Any, texts: Any, batch_size: int, normalize: bool, truncate: bool, output: str,
           stream: Any) -> torch.Tensor | np.ndarray:
    """Runtime.encode (docstring there)."""
    from ._runtime import OUTPUT_FORMATS, _as_stream

    if SENTENCE_EMBEDDING not in runtime.output_names:
        raise TextError(f"encode() returns a model's {SENTENCE_EMBEDDING} output, and this model has none (its"
                        f" outputs: {', '.join(runtime.output_names)}): export a sentence-transformers directory"
                        " (modules.json + pooling) with `padfree export DIR -o OUT` and serve that, give the"
                        " PyTorch path a sentence model or a pooling (padfree.torch.from_hf(model, pooling='mean')),"
                        " or call run() on tokenize(texts) for these outputs")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if output not in OUTPUT_FORMATS:
        raise ValueError(f"output must be one of {OUTPUT_FORMATS}, got {output!r}")
    texts = check_texts(texts)
    tokenize = runtime.text_tokenizer
    if runtime.device.type == "cuda":
        stream = _as_stream(stream, runtime.device) or runtime.stream or torch.cuda.current_stream(runtime.device)
    parts = []
    # run() returns device tensors without waiting: the next batch is tokenized while this one runs
    for start in range(0, len(texts), batch_size):
        ids = tokenize(texts[start:start + batch_size], truncate, first=start)
        try:
            out = runtime.run(ids, output="torch", stream=stream, packed=True)   # no per-token views
        except InputError as e:
            raise InputError(f"texts {start}..{start + len(ids) - 1}: {e}") from None
        parts.append(out[SENTENCE_EMBEDDING])
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        embeddings = torch.cat(parts).float()
        if normalize:
            embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
        if output == "numpy":
            return embeddings.cpu().numpy()
    return embeddings
