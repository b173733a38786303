"""Optimization profiles over total tokens, batch and the longest sequence.

Each model input has a role that gives its shape from (T, B, S) = (total tokens, batch, longest
sequence): packed inputs input_ids / token_type_ids [T], cu_seqlens [B+1], the max_seqlen shape
input [S]; padded ones input_ids / attention_mask / token_type_ids [B, S]. A profile spans 1 to its
limits; several profiles (`--profiles 512x16 4096x64`) let small batches run on an engine tuned
for them, and the backend picks the smallest profile that fits a batch.

An encoder-decoder export's graphs (docs/EXPORT.md "Seq2seq") have roles of their own, over two more
dimensions: R, the rows of a decoder step (batch x num_beams hypotheses), and L, the K/V cache's
capacity (max_length - 1). encoder.onnx is a padded encoder ([B, S]); cross_kv.onnx takes the packed
encoder rows [T, hidden]; decoder_step(.padfree).onnx takes input_ids [R], step [1], cache_indir
[R, L], cu_seqlens [B+1], max_seqlen [S] (the swapped step), the caches [R, heads, L, head_dim]
and cross_kv.i [T, 2 hidden]. "=" is a dimension the model fixes (heads, head_dim, hidden). R spans
batch x num_beams with num_beams the graph's cross-attention field (rows = batch x num_beams is what
the plugin accepts, so min R = num_beams); a step without plugin nodes serves any width, R from 1 to
max_batch x num_beams (--num-beams, default 1).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .errors import BuildError
from .model_info import ModelInfo

_PACKED_ROLES = {"input_ids": "T", "token_type_ids": "T", "position_ids": "T", "cu_seqlens": "B+1", "max_seqlen": "S"}
_PADDED_ROLES = {"input_ids": "B,S", "attention_mask": "B,S", "token_type_ids": "B,S", "position_ids": "B,S"}
_STEP_ROLES = {"input_ids": "R", "step": "=", "cache_indir": "R,L", "cu_seqlens": "B+1", "max_seqlen": "S",
               "past_key.*": "R,=,L,=", "past_value.*": "R,=,L,=", "cross_kv.*": "T,="}
_CROSS_KV_ROLES = {"encoder_hidden_states": "T,="}
# generation.padfree.onnx takes the packed encoder's inputs (its caches live inside its loop)
_TABLES = {"packed": _PACKED_ROLES, "padded": _PADDED_ROLES, "decoder_step": _STEP_ROLES, "cross_kv": _CROSS_KV_ROLES,
           "generation": _PACKED_ROLES}


@dataclass(frozen=True)
class Profile:
    max_tokens: int
    max_batch: int
    max_seqlen: int
    max_cache: int = 0   # decoder step: the longest cache L (0: not a decoder step)
    num_beams: int = 0   # decoder step: rows = batch x num_beams

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v or k in ("max_tokens", "max_batch", "max_seqlen")}

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
    table = _TABLES[info.io]
    out = {}
    for t in info.inputs:
        role = table.get(t.name, table.get(t.name.split(".")[0] + ".*"))
        if role is None or len(role.split(",")) != len(t.shape):
            raise BuildError(f"input {t.name} {t.shape}: not an input of a padfree {info.io} graph"
                             f" (expected {', '.join(f'{k} [{v}]' for k, v in table.items())})")
        out[t.name] = role
    return out


def shapes(info: ModelInfo, profile: Profile) -> dict[str, dict[str, list[int]]]:
    """{input: {"min", "opt", "max"}} for one profile; opt at half the limits, for tuning."""
    fixed = {t.name: t.shape for t in info.inputs}

    def dims(name: str, role: str, t: int, b: int, s: int, r: int, c: int) -> list[int]:
        values = {"T": t, "B+1": b + 1, "S": s, "B": b, "R": r, "L": c}
        return [int(fixed[name][k]) if key == "=" else values[key] for k, key in enumerate(role.split(","))]

    half = lambda n: max(1, (n + 1) // 2)  # noqa: E731
    beams = max(1, profile.num_beams)
    # a graph whose plugin fixes num_beams takes rows = batch x num_beams only; a plain step any row count
    r_min = beams if info.num_beams else 1
    cache = max(1, profile.max_cache)
    lo = (1, 1, 1, r_min, 1)
    opt = (half(profile.max_tokens), half(profile.max_batch), half(profile.max_seqlen),
           max(r_min, beams * half(profile.max_batch)), half(cache))
    hi = (profile.max_tokens, profile.max_batch, profile.max_seqlen, beams * profile.max_batch, cache)
    return {name: {"min": dims(name, role, *lo), "opt": dims(name, role, *opt), "max": dims(name, role, *hi)}
            for name, role in roles(info).items()}
