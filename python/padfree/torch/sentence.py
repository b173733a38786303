"""Sentence embeddings on the PyTorch path: which pooling a model asks for, and the output type.

A model brings its pooling where it has one: sentence-transformers' SentenceTransformer (modules
Transformer, Pooling, optional Normalize, in that order), or the SentenceModel that
padfree.export.models.load makes of a sentence-transformers directory. Any other module, or a
pooling other than CLS / mean / max (with the prompt included), is refused by name, as the exporter
refuses it. A plain encoder pools only where from_hf is asked to (pooling=..., normalize=...).
The pooling runs on the encoder's packed rows in one kernel (padfree.ops.sequence_pool); the
encoder's own pooler (BERT's dense + tanh) is not part of such a model and is not run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..ops._tensors import InputError
from ..ops.pooling import POOLING_MODES
from .weights import UnsupportedModelError

OUTPUT = "sentence_embedding"
# sentence-transformers < 5 kept one Pooling flag per mode (later versions: `pooling_mode`)
_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max",
          "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
          "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


@dataclass
class SentencePooling:
    encoder: torch.nn.Module  # the HF encoder whose rows are pooled
    pooling: str              # one of POOLING_MODES
    normalize: bool


def _sentence_transformer(model) -> SentencePooling | None:
    """The pooling of a sentence_transformers.SentenceTransformer (None for any other model)."""
    if type(model).__name__ != "SentenceTransformer" or not isinstance(model, torch.nn.Sequential):
        return None
    modules = list(model)
    kinds = [type(m).__name__ for m in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        raise UnsupportedModelError(f"SentenceTransformer with modules {kinds}: padfree.torch runs Transformer,"
                                    " Pooling and an optional Normalize, in that order")
    transformer, pooling = modules[0], modules[1]
    mode = getattr(pooling, "pooling_mode", None)
    modes = [mode] if isinstance(mode, str) else list(mode) if mode else \
        [name for flag, name in _FLAGS.items() if getattr(pooling, flag, False)]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise UnsupportedModelError(f"SentenceTransformer pooling {modes or 'none'}: padfree.torch runs one of"
                                    f" {', '.join(POOLING_MODES)}")
    if getattr(pooling, "include_prompt", True) is False:
        raise UnsupportedModelError("SentenceTransformer pooling with include_prompt=False (prompt tokens left"
                                    " out) is not supported")
    encoder = getattr(transformer, "auto_model", None)
    if encoder is None:
        raise UnsupportedModelError("SentenceTransformer: its Transformer module holds no auto_model")
    return SentencePooling(encoder, modes[0], len(kinds) == 3)


def _export_sentence_model(model) -> SentencePooling | None:
    """The pooling of padfree.export's SentenceModel (None for any other model, or without the exporter)."""
    try:
        from padfree.export.sentence import of_model
    except ImportError:
        return None
    found = of_model(model)
    return None if found is None else SentencePooling(model.encoder, found.pooling, found.normalize)


def of_model(model, pooling: str | None, normalize: bool | None) -> tuple[Any, str | None, bool]:
    """(the encoder to run, pooling or None, normalize) for from_hf's model and pooling arguments.

    A sentence model's own pooling is used; a pooling argument that contradicts it is an InputError
    (the model says how it was trained to pool), as are an unknown mode and normalize without pooling.
    """
    if pooling is not None and pooling not in POOLING_MODES:
        raise InputError(f"pooling: expected one of {', '.join(POOLING_MODES)} or None, got {pooling!r}")
    found = _sentence_transformer(model) or _export_sentence_model(model)
    if found is None:
        if normalize and pooling is None:
            raise InputError("normalize=True needs a pooling (pooling='cls', 'mean' or 'max'): it normalizes"
                             " the sentence embedding")
        return model, pooling, bool(normalize)
    for name, given, own in (("pooling", pooling, found.pooling), ("normalize", normalize, found.normalize)):
        if given is not None and given != own:
            raise InputError(f"{name}={given!r}, but the sentence model {type(model).__name__} has {name}"
                             f" {own!r}; leave {name} out to use the model's")
    return found.encoder, found.pooling, found.normalize


_OUTPUT_TYPE = None


def sentence_output(embedding: torch.Tensor):
    """A transformers ModelOutput with `sentence_embedding` [B, H] (as sentence-transformers' features
    name it): attribute and key access alike."""
    global _OUTPUT_TYPE
    if _OUTPUT_TYPE is None:  # transformers is imported on first use, as for the HF-style outputs
        from dataclasses import dataclass as output_dataclass

        from transformers.utils import ModelOutput

        @output_dataclass
        class SentenceEmbeddingOutput(ModelOutput):
            sentence_embedding: torch.Tensor | None = None

        _OUTPUT_TYPE = SentenceEmbeddingOutput
    return _OUTPUT_TYPE(sentence_embedding=embedding)
