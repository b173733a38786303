"""The model sizes padfree's kernels are built for: the one list that the exporter's attention pass,
the engine builder, padfree.torch and padfree.ops refuse other sizes by, before a kernel would.

Pure Python (no torch, no library load), so that the exporter and the builder can read it anywhere.
tests/test_capi.py checks ATTENTION_HEAD_DIMS against what the built library accepts.
"""
from __future__ import annotations

ATTENTION_HEAD_DIMS = (32, 64, 128)  # the head_dim values plugins/kernels/attention/attention.cu instantiates
MAX_HIDDEN = 8192  # the LayerNorm-family kernels hold a row in registers
HIDDEN_MULTIPLE = 8  # one 16-byte vector of fp16/bf16


def hidden_problem(hidden: int) -> str | None:
    """Why the LayerNorm-family kernels cannot run rows of `hidden` elements, or None if they can."""
    if hidden <= 0:
        return f"hidden size {hidden} is not positive"
    if hidden % HIDDEN_MULTIPLE:
        return f"hidden size {hidden} is not a multiple of {HIDDEN_MULTIPLE} (one 16-byte vector of fp16)"
    if hidden > MAX_HIDDEN:
        return f"hidden size {hidden} exceeds {MAX_HIDDEN}, the largest the LayerNorm kernels hold"
    return None


def head_dim_problem(head_dim: int) -> str | None:
    """Why the attention kernels cannot run heads of `head_dim`, or None if they can."""
    if head_dim not in ATTENTION_HEAD_DIMS:
        built = ", ".join(map(str, ATTENTION_HEAD_DIMS))
        return f"head_dim {head_dim} is not built into padfree's attention kernels (built: {built})"
    return None


def attention_problem(num_heads: int, head_dim: int) -> str | None:
    """Why an attention of num_heads x head_dim (hidden = their product) has no padfree kernels, or None."""
    if num_heads < 1:
        return f"num_heads {num_heads} is not positive"
    return head_dim_problem(head_dim) or hidden_problem(num_heads * head_dim)
