"""The backend protocol the Runtime serves (DESIGN.md "Runtime backends") and how its limits are read.

A backend is anything with `limits`, `output_names` and `execute_packed`: the engine backend
(padfree.engines.backend), the PyTorch-path backend (padfree.runtime.encoder_backend) or a test double.
An optional `device` attribute says where execute_packed wants its inputs (CUDA when absent).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

# Outputs with one row per sequence; every other output has one row per token.
PER_SEQUENCE_OUTPUTS = frozenset({"pooler_output"})


@dataclass(frozen=True)
class Limits:
    """What one execute_packed call accepts. vocab_size / type_vocab_size of None mean unknown (not
    checked); a type_vocab_size of 0 means the model takes no token_type_ids."""
    max_tokens: int
    max_batch: int
    max_seqlen: int
    vocab_size: int | None = None
    type_vocab_size: int | None = None
    dtype: torch.dtype | None = None

    def __post_init__(self):
        for name in ("max_tokens", "max_batch", "max_seqlen"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")


@runtime_checkable
class Backend(Protocol):
    limits: Any
    output_names: list[str]

    def execute_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: torch.Tensor | None,
                       stream: torch.cuda.Stream | None) -> dict[str, torch.Tensor]: ...


def limits_of(backend: Any) -> Limits:
    """The backend's limits as a Limits, whether it exposes a Limits, another object or a mapping
    under `limits`, or the fields as its own attributes."""
    source = getattr(backend, "limits", backend)
    if isinstance(source, Limits):
        return source

    def field(name: str, default: Any = None, required: bool = False) -> Any:
        value = source.get(name, default) if isinstance(source, Mapping) else getattr(source, name, default)
        if required and value is None:
            raise TypeError(f"{type(backend).__name__} does not state limits.{name}; a Runtime backend must"
                            " (DESIGN.md, Runtime backends)")
        return value

    def as_int(value: Any) -> int | None:
        return None if value is None else int(value)

    return Limits(max_tokens=int(field("max_tokens", required=True)),
                  max_batch=int(field("max_batch", required=True)),
                  max_seqlen=int(field("max_seqlen", required=True)),
                  vocab_size=as_int(field("vocab_size")),
                  type_vocab_size=as_int(field("type_vocab_size")),
                  dtype=field("dtype"))


def device_of(backend: Any) -> torch.device:
    device = getattr(backend, "device", None)
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
