"""The Runtime backend over the PyTorch path: a padfree.torch PadfreeEncoder's forward_packed.

Sequence and vocabulary limits come from the encoder (its `limits`, else the HF config); max_tokens
and max_batch are not fixed by the model, so they are chosen here to bound one call's activation
memory and the size of the CUDA graphs the encoder captures per size bucket.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from ...ops._tensors import INT32_MAX
from ...positions import OFFSET_POSITION_MODEL_TYPES, positions_served
from .base import Limits, check_chunk_limits, limits_of, on_stream

# one call of BERT-base at 32768 fp16 tokens holds ~0.4 GB of intermediates; bench's 64x512 fits
DEFAULT_MAX_TOKENS = 32768
DEFAULT_MAX_BATCH = 512


def max_positions(config: Any) -> int:
    """Longest sequence an HF config's position table serves. RoBERTa numbers positions from
    pad_token_id + 1, so its table of max_position_embeddings rows serves pad_token_id + 1 fewer."""
    return positions_served(int(config.max_position_embeddings), getattr(config, "model_type", ""),
                            getattr(config, "pad_token_id", 1))


def _model_limits(encoder: Any) -> Limits:
    if getattr(encoder, "limits", None) is not None:
        return limits_of(encoder)
    config = getattr(encoder, "config", None)
    if config is None:
        raise TypeError(f"{type(encoder).__name__} has neither .limits nor an HF .config: EncoderBackend"
                        " cannot tell its vocabulary and position table sizes")
    parameter = next(iter(encoder.parameters()), None) if hasattr(encoder, "parameters") else None
    offset_positions = getattr(config, "model_type", "") in OFFSET_POSITION_MODEL_TYPES
    return Limits(max_tokens=INT32_MAX, max_batch=INT32_MAX, max_seqlen=max_positions(config),
                  vocab_size=int(config.vocab_size),
                  type_vocab_size=int(getattr(config, "type_vocab_size", 0) or 0),
                  dtype=getattr(encoder, "dtype", None) or getattr(parameter, "dtype", None),
                  position_pad_id=int(getattr(config, "pad_token_id", 1)) if offset_positions else None)


def _has_pooler(encoder: Any) -> bool:
    if hasattr(encoder, "has_pooler"):
        return bool(encoder.has_pooler)
    return getattr(encoder, "pooler", None) is not None


def _device(encoder: Any) -> torch.device:
    device = getattr(encoder, "device", None)
    if device is None:
        device = next(iter(encoder.parameters())).device
    return torch.device(device)


class EncoderBackend:
    """limits / output_names / execute_packed over PadfreeEncoder.forward_packed (DESIGN.md)."""

    def __init__(self, encoder: Any, max_tokens: int | None = None, max_batch: int | None = None):
        check_chunk_limits(max_tokens, max_batch)
        model = _model_limits(encoder)
        self.encoder = encoder
        self.device = _device(encoder)
        self.limits = dataclasses.replace(
            model, max_tokens=min(int(DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens), model.max_tokens),
            max_batch=min(int(DEFAULT_MAX_BATCH if max_batch is None else max_batch), model.max_batch))
        names = getattr(encoder, "output_names", None)
        self.output_names = list(names) if names is not None else (
            ["last_hidden_state"] + (["pooler_output"] if _has_pooler(encoder) else []))
        # a task model's logits are per sequence or per token by its head, not by name
        declared = getattr(encoder, "per_sequence_outputs", None)
        if declared is not None:
            self.per_sequence_outputs = frozenset(declared)
        # the Runtime copies every chunk's outputs out, so the encoder's own copy can be skipped
        params = inspect.signature(encoder.forward_packed).parameters
        self._extra = {"copy": False} if "copy" in params else {}

    def execute_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: torch.Tensor | None,
                       stream: torch.cuda.Stream | None) -> dict[str, torch.Tensor]:
        # forward_packed enqueues on torch's current stream (the Runtime's already, when it calls)
        with on_stream(stream):
            return self.encoder.forward_packed(input_ids, cu_seqlens, max_seqlen,
                                               token_type_ids=token_type_ids, **self._extra)

    def __repr__(self) -> str:
        return f"EncoderBackend({self.encoder!r}, {self.limits})"
