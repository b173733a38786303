"""The backend protocol the Runtime serves (DESIGN.md "Runtime backends") and how its limits are read.

A backend is anything with `limits`, `output_names` and `execute_packed`: the engine backend
(padfree.runtime.backends.engine), the PyTorch-path backend (padfree.runtime.backends.encoder) or a test double.
An optional `device` attribute says where execute_packed wants its inputs (CUDA when absent); an
optional `per_sequence_outputs` (a set of output names) says which outputs have one row per sequence
(all others one per token). A backend without it is read by name (PER_SEQUENCE_OUTPUTS): the name
alone cannot tell, as `logits` is per sequence for text classification and per token for token
classification.
"""
from __future__ import annotations

import contextlib
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from ...ops._tensors import InputError


def on_stream(stream: torch.cuda.Stream | None):
    """A context making `stream` (and its device) current, or a null one where it already is (None:
    whatever is current): torch.cuda.device + torch.cuda.stream cost ~20 us of host time a call, a
    fifth of a small batch's whole host budget, and a stream that is current is on the current device."""
    if stream is None or stream == torch.cuda.current_stream():
        return contextlib.nullcontext()
    return _switched(stream)


@contextlib.contextmanager
def _switched(stream: torch.cuda.Stream):
    with torch.cuda.device(stream.device), torch.cuda.stream(stream):
        yield


# Outputs with one row per sequence where a backend does not say (per_sequence_outputs_of).
PER_SEQUENCE_OUTPUTS = frozenset({"pooler_output", "sentence_embedding"})


def per_sequence_outputs_of(backend: Any) -> frozenset[str]:
    """The backend's outputs with one row per sequence: its own per_sequence_outputs, else by name."""
    declared = getattr(backend, "per_sequence_outputs", None)
    if declared is None:
        return frozenset(n for n in backend.output_names if n in PER_SEQUENCE_OUTPUTS)
    unknown = set(declared) - set(backend.output_names)
    if unknown:
        raise TypeError(f"{type(backend).__name__}.per_sequence_outputs names {sorted(unknown)}, which are not"
                        f" among its output_names {list(backend.output_names)}")
    return frozenset(declared)


@dataclass(frozen=True)
class Limits:
    """What one execute_packed call accepts. vocab_size / type_vocab_size of None mean unknown (not
    checked); a type_vocab_size of 0 means the model takes no token_type_ids. position_pad_id: the id
    a RoBERTa-style model's positions are numbered around (HF counts only the other tokens); padfree
    numbers a sequence's tokens 0, 1, 2, ... so a sequence holding this id is refused (None: no such id)."""
    max_tokens: int
    max_batch: int
    max_seqlen: int
    vocab_size: int | None = None
    type_vocab_size: int | None = None
    dtype: torch.dtype | None = None
    position_pad_id: int | None = None

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
    # stream None: torch's current stream (on a CUDA backend, its device is the current one)


def check_chunk_limits(max_tokens: Any, max_batch: Any) -> None:
    """A caller's max_tokens / max_batch: None (the backend's own) or a positive int, never 0 or a
    negative taken for "unset"."""
    for name, value in (("max_tokens", max_tokens), ("max_batch", max_batch)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(f"{name} must be a positive int or None (the backend's limit), got {value!r}")


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
                  dtype=field("dtype"), position_pad_id=as_int(field("position_pad_id")))


def device_of(backend: Any) -> torch.device:
    device = getattr(backend, "device", None)
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def check_index(t: Any, name: str, device: torch.device, length: int | None = None) -> None:
    """Raise InputError unless t is an int32 [length] contiguous tensor on `device` (compared by
    equality, not is_cuda, so that a CPU backend or test double checks the same way)."""
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise InputError(f"{name}: expected a tensor on device {device}, got one on {t.device}")
    if t.dtype != torch.int32:
        raise InputError(f"{name}: expected dtype torch.int32, got {t.dtype}")
    if t.dim() != 1 or (length is not None and t.shape[0] != length):
        want = "[*]" if length is None else f"[{length}]"
        raise InputError(f"{name}: expected shape {want}, got {list(t.shape)}")
    if not t.is_contiguous():
        raise InputError(f"{name}: expected a contiguous tensor; call .contiguous()")


def check_packed(input_ids: Any, cu_seqlens: Any, max_seqlen: Any, token_type_ids: Any,
                 device: torch.device) -> None:
    """execute_packed's inputs as the protocol states them: int32 [T] ids (T >= 1), int32 [B + 1]
    cu_seqlens (B >= 1), int32 [T] token types or None, all on `device`; max_seqlen a positive int.
    Their values are not read (that would synchronize): the Runtime validated them on the host."""
    check_index(input_ids, "input_ids", device)
    if input_ids.shape[0] < 1:
        raise InputError("input_ids: expected at least one token, got an empty tensor")
    check_index(cu_seqlens, "cu_seqlens", device)
    if cu_seqlens.shape[0] < 2:
        raise InputError(f"cu_seqlens: expected [batch + 1] with batch >= 1, got {cu_seqlens.shape[0]} entries")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 1:
        raise InputError(f"max_seqlen: expected a positive int, got {max_seqlen!r}")
    if token_type_ids is not None:
        check_index(token_type_ids, "token_type_ids", device, input_ids.shape[0])
