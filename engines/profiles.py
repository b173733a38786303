"""Optimization profiles over total tokens, batch and the longest sequence.

Each model input has a role that gives its shape from (T, B, S) = (total tokens, batch, longest
sequence): packed inputs input_ids / token_type_ids [T], cu_seqlens [B+1], the max_seqlen shape
input [S]; padded ones input_ids / attention_mask / token_type_ids [B, S]. A profile spans 1 to its
limits; several profiles (`--profiles 512x16 4096x64`) let small batches run on an engine tuned
for them, and the backend picks the smallest profile that fits a batch.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .errors import BuildError
from .model_info import ModelInfo

_PACKED_ROLES = {"input_ids": "T", "token_type_ids": "T", "position_ids": "T", "cu_seqlens": "B+1", "max_seqlen": "S"}
_PADDED_ROLES = {"input_ids": "B,S", "attention_mask": "B,S", "token_type_ids": "B,S", "position_ids": "B,S"}


@dataclass(frozen=True)
class Profile:
    max_tokens: int
    max_batch: int
    max_seqlen: int

    def to_dict(self) -> dict:
        return asdict(self)

    def fits(self, tokens: int, batch: int, seqlen: int) -> bool:
        return tokens <= self.max_tokens and batch <= self.max_batch and seqlen <= self.max_seqlen


def parse(text: str, max_seqlen: int) -> Profile:
    """"TOKENSxBATCH" or "TOKENSxBATCHxSEQLEN" (SEQLEN defaults to min(max_seqlen, TOKENS))."""
    m = re.fullmatch(r"(\d+)x(\d+)(?:x(\d+))?", text.strip())
    if not m:
        raise ValueError(f"profile {text!r}: expected TOKENSxBATCH or TOKENSxBATCHxSEQLEN, e.g. 4096x64")
    tokens, batch = int(m.group(1)), int(m.group(2))
    seqlen = int(m.group(3)) if m.group(3) else min(max_seqlen, tokens)
    return make(tokens, batch, seqlen)


def make(max_tokens: int, max_batch: int, max_seqlen: int) -> Profile:
    for name, value in (("max_tokens", max_tokens), ("max_batch", max_batch), ("max_seqlen", max_seqlen)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if max_seqlen > max_tokens:
        raise ValueError(f"max_seqlen ({max_seqlen}) cannot exceed max_tokens ({max_tokens})")
    return Profile(max_tokens, max_batch, max_seqlen)


def roles(info: ModelInfo) -> dict[str, str]:
    table = _PACKED_ROLES if info.io == "packed" else _PADDED_ROLES
    out = {}
    for t in info.inputs:
        role = table.get(t.name)
        if role is None or len(role.split(",")) != len(t.shape):
            raise BuildError(f"input {t.name} {t.shape}: not an input of a padfree encoder in {info.io} form"
                             f" (expected {', '.join(f'{k} [{v}]' for k, v in table.items())})")
        out[t.name] = role
    return out


def shapes(info: ModelInfo, profile: Profile) -> dict[str, dict[str, list[int]]]:
    """{input: {"min", "opt", "max"}} for one profile; opt at half the limits, for tuning."""
    def dims(role: str, t: int, b: int, s: int) -> list[int]:
        values = {"T": t, "B+1": b + 1, "S": s, "B": b}
        return [values[r] for r in role.split(",")]

    half = lambda n: max(1, (n + 1) // 2)  # noqa: E731
    lo, opt, hi = (1, 1, 1), (half(profile.max_tokens), half(profile.max_batch), half(profile.max_seqlen)), (
        profile.max_tokens, profile.max_batch, profile.max_seqlen)
    return {name: {"min": dims(role, *lo), "opt": dims(role, *opt), "max": dims(role, *hi)}
            for name, role in roles(info).items()}
