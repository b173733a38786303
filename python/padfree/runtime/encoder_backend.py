"""The Runtime backend over the PyTorch path: a padfree.torch PadfreeEncoder's forward_packed.

Its limits come from the model's config (position table, vocabularies); max_tokens and max_batch are
not fixed by the model, so they are chosen here to bound one call's activation memory.
"""
from __future__ import annotations

from typing import Any

import torch

from .backend import Limits

DEFAULT_MAX_TOKENS = 16384
DEFAULT_MAX_BATCH = 256


def _config(encoder: Any) -> Any:
    config = getattr(encoder, "config", None)
    if config is None:
        raise TypeError(f"{type(encoder).__name__} has no .config; EncoderBackend needs the HF config"
                        " of the model (vocab and position table sizes)")
    return config


def max_positions(config: Any) -> int:
    """Longest sequence the position table serves. RoBERTa numbers positions from pad_token_id + 1,
    so its table of max_position_embeddings rows serves pad_token_id + 1 fewer tokens."""
    size = int(getattr(config, "max_position_embeddings"))
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        size -= int(getattr(config, "pad_token_id", 1)) + 1
    return size


def _has_pooler(encoder: Any) -> bool:
    names = getattr(encoder, "output_names", None)
    if names is not None:
        return "pooler_output" in names
    if hasattr(encoder, "has_pooler"):
        return bool(encoder.has_pooler)
    return getattr(encoder, "pooler", None) is not None


def _first_parameter(encoder: Any) -> torch.Tensor | None:
    parameters = getattr(encoder, "parameters", None)
    return next(iter(parameters()), None) if callable(parameters) else None


class EncoderBackend:
    """limits / output_names / execute_packed over PadfreeEncoder.forward_packed (DESIGN.md)."""

    def __init__(self, encoder: Any, max_tokens: int | None = None, max_batch: int | None = None):
        config = _config(encoder)
        parameter = _first_parameter(encoder)
        self.encoder = encoder
        self.device = torch.device(getattr(encoder, "device", None) or parameter.device)
        dtype = getattr(encoder, "dtype", None) or (parameter.dtype if parameter is not None else None)
        self.limits = Limits(max_tokens=int(max_tokens or DEFAULT_MAX_TOKENS),
                             max_batch=int(max_batch or DEFAULT_MAX_BATCH),
                             max_seqlen=max_positions(config),
                             vocab_size=int(config.vocab_size),
                             type_vocab_size=int(getattr(config, "type_vocab_size", 0) or 0),
                             dtype=dtype)
        self.output_names = ["last_hidden_state"] + (["pooler_output"] if _has_pooler(encoder) else [])

    def execute_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: torch.Tensor | None,
                       stream: torch.cuda.Stream | None) -> dict[str, torch.Tensor]:
        # forward_packed enqueues on torch's current stream
        with torch.cuda.stream(stream):
            return self.encoder.forward_packed(input_ids, cu_seqlens, max_seqlen, token_type_ids=token_type_ids)

    def __repr__(self) -> str:
        return f"EncoderBackend({type(self.encoder).__name__}, {self.limits})"
