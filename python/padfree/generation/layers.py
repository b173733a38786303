"""The sublayers encoder and decoder share: embeddings with positions, LayerNorm, the FFN, residuals.

GEMMs run through torch (cuBLAS on the GPU, as padfree.torch's encoder does); the attention ops come
from dispatch.DecoderOps. Pre-LN families (M2M100, mBART) normalise each sublayer's input and add
the residual after; post-LN families (Marian, BART) add the residual and normalise the sum.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .models import FamilySpec
from .weights import FFNWeights, LayerNormWeights, StackWeights, fairseq_sinusoidal_table

__all__ = ["layer_norm", "activation", "linear_activation", "ffn_up", "ffn", "residual", "embed", "position_rows",
           "ensure_position_rows"]


def layer_norm(x: torch.Tensor, ln: LayerNormWeights) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), ln.weight, ln.bias, ln.eps)


def activation(x: torch.Tensor, name: str) -> torch.Tensor:
    if name == "relu":
        return F.relu(x)
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "silu":
        return F.silu(x)
    raise ValueError(f"activation {name!r}: expected relu, gelu, gelu_tanh or silu")


def residual(x: torch.Tensor, sublayer, ln: LayerNormWeights, pre_ln: bool) -> torch.Tensor:
    """x + sublayer(LN(x)) (pre-LN) or LN(x + sublayer(x)) (post-LN)."""
    if pre_ln:
        return x + sublayer(layer_norm(x, ln))
    return layer_norm(x + sublayer(x), ln)


def linear_activation(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:
    """activation(x W^T + b). ReLU on CUDA is the GEMM's epilogue (cuBLASLt, one kernel); GELU is not,
    since cuBLASLt's GELU epilogue is the tanh approximation and these models use the exact one."""
    if act == "relu" and x.is_cuda and bias is not None:
        return torch._addmm_activation(bias, x, weight.t())
    return activation(F.linear(x, weight, bias), act)


def ffn_up(x: torch.Tensor, w: FFNWeights, act: str) -> torch.Tensor:
    """activation(x W1^T + b1) (linear_activation)."""
    return linear_activation(x, w.fc1_weight, w.fc1_bias, act)


def ffn(x: torch.Tensor, w: FFNWeights, act: str) -> torch.Tensor:
    return F.linear(ffn_up(x, w, act), w.fc2_weight, w.fc2_bias)


def position_rows(spec: FamilySpec, pad: int, positions: torch.Tensor, tokens: torch.Tensor,
                  nonpad_rank: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of the position table that tokens at 0-based `positions` read.

    marian: p; learned (BART, mBART): p + 2; fairseq (M2M100): padding_idx + 1 + p where p counts the
    sequence's non-pad tokens before this one (nonpad_rank, the encoder's cumsum; the decoder passes
    None and p = position), and padding_idx (a zero row) for a pad token, as HF's
    create_position_ids_from_input_ids computes.
    """
    if spec.positions == "marian":
        return positions
    if spec.positions == "learned":
        return positions + 2
    rank = positions if nonpad_rank is None else nonpad_rank
    return torch.where(tokens == pad, torch.full_like(rank, pad), pad + 1 + rank)


def step_position_args(spec: FamilySpec, pad: int) -> dict:
    """position_rows() of a decoder step as the step embedding kernel takes it: the row is
    step + position_offset, or pad_position for a pad_token (fairseq's padding row)."""
    if spec.positions == "marian":
        return dict(position_offset=0)
    if spec.positions == "learned":
        return dict(position_offset=2)
    return dict(position_offset=pad + 1, pad_token=pad, pad_position=pad)


def ensure_position_rows(stack: StackWeights, spec: FamilySpec, pad: int, rows_needed: int) -> None:
    """Grow a fairseq table to rows_needed rows (HF grows its buffer the same way); other tables are fixed
    and the caller checks lengths against StackWeights.max_positions first."""
    if spec.positions == "fairseq" and stack.positions.shape[0] < rows_needed:
        table = fairseq_sinusoidal_table(rows_needed, stack.hidden, pad)
        stack.positions = table.to(device=stack.positions.device, dtype=stack.positions.dtype)


def embed(stack: StackWeights, tokens: torch.Tensor, rows: torch.Tensor,
          positions: torch.Tensor | None = None) -> torch.Tensor:
    """embed_tokens[tokens] * embed_scale + positions[rows], then layernorm_embedding where the family has it.

    tokens, rows: int64 [n]. Returns [n, hidden] in the weights' dtype (HF scales in the model dtype).
    positions: the table to read (default stack.positions; a captured decoder step holds on to the
    table it was captured with, since growing a fairseq table replaces the tensor).
    """
    x = F.embedding(tokens, stack.embed_tokens) * stack.embed_scale
    x = x + F.embedding(rows, stack.positions if positions is None else positions)
    if stack.layernorm_embedding is not None:
        x = layer_norm(x, stack.layernorm_embedding)
    return x
