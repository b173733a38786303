"""Word + position + token-type embeddings of packed tokens, then LayerNorm (or not), in one kernel."""
from __future__ import annotations

import torch

from ._tensors import (
    InputError,
    call_kernel,
    check,
    check_eps,
    check_float,
    check_int32,
    check_width,
    dtype_code,
    l2_prefetch,
    output,
    ptr,
    stream_handle,
)


def embedding_layernorm(input_ids: torch.Tensor, cu_seqlens: torch.Tensor, word_embeddings: torch.Tensor,
                        position_embeddings: torch.Tensor, gamma: torch.Tensor | None, beta: torch.Tensor | None,
                        eps: float = 1e-12, token_type_ids: torch.Tensor | None = None,
                        token_type_embeddings: torch.Tensor | None = None, position_offset: int = 0,
                        out: torch.Tensor | None = None, prefetch: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm(word[id] + position[position_offset + t - cu_seqlens[b]] + type[tt]) * gamma + beta.

    input_ids: int32 [T]; cu_seqlens: int32 [B+1]; token_type_ids: int32 [T] or None (type 0).
    word_embeddings [V, H], position_embeddings [P, H], token_type_embeddings [TV, H] or None (no
    type term), gamma, beta [H]: one float dtype. Returns [T, H]. gamma and beta both None: no
    LayerNorm, the sum itself (in float32, rounded once to the dtype; Marian's and M2M100's
    embedding), eps unused. position_offset: 0 for BERT, padding_idx + 1 for RoBERTa (and M2M100).
    Ids and positions out of range are clamped (memory safety, no sync): callers validate ids on the
    host. prefetch: as for skip_layernorm.
    """
    position_offset = check_int32(position_offset, "position_offset")
    if (gamma is None) != (beta is None):
        raise InputError(f"gamma and beta: give both (LayerNorm) or neither (no LayerNorm), got gamma "
                         f"{'None' if gamma is None else 'a tensor'} and beta {'None' if beta is None else 'a tensor'}")
    check(input_ids, "input_ids", dtype=torch.int32, shape=[None])
    device = input_ids.device
    check(cu_seqlens, "cu_seqlens", dtype=torch.int32, shape=[None], device=device)
    check_float(word_embeddings, "word_embeddings", shape=[None, None])
    if word_embeddings.device != device:
        raise InputError(f"word_embeddings: expected a tensor on {device}, got {word_embeddings.device}")
    vocab_size, hidden = word_embeddings.shape
    check_width(hidden, "word_embeddings: hidden (last dimension)")
    like = word_embeddings
    check_float(position_embeddings, "position_embeddings", shape=[None, hidden], like=like)
    check_float(token_type_embeddings, "token_type_embeddings", shape=[None, hidden], like=like, optional=True)
    check_float(gamma, "gamma", shape=[hidden], like=like, optional=True)
    check_float(beta, "beta", shape=[hidden], like=like, optional=True)
    check_eps(eps)
    total_tokens = input_ids.numel()
    check(token_type_ids, "token_type_ids", dtype=torch.int32, shape=[total_tokens], device=device, optional=True)
    if token_type_ids is not None and token_type_embeddings is None:
        raise InputError("token_type_ids: given without token_type_embeddings; pass both or neither")
    batch = cu_seqlens.numel() - 1
    if batch < 1:
        raise InputError(f"cu_seqlens: expected [batch + 1] with batch >= 1, got {cu_seqlens.numel()} entries")
    check_int32(batch, "cu_seqlens: batch")
    for name, table in (("word_embeddings", word_embeddings), ("position_embeddings", position_embeddings),
                        ("token_type_embeddings", token_type_embeddings)):
        if table is not None:
            check_int32(table.shape[0], f"{name}: rows", minimum=1)
    prefetch_at, prefetch_bytes = l2_prefetch(prefetch, device)
    out = output(out, (total_tokens, hidden), like)
    if total_tokens:
        type_rows = 0 if token_type_embeddings is None else token_type_embeddings.shape[0]
        call_kernel("padfree_embedding_layernorm", device, ptr(input_ids), ptr(token_type_ids), ptr(cu_seqlens),
                    batch, total_tokens, ptr(word_embeddings), vocab_size, ptr(position_embeddings),
                    position_embeddings.shape[0], position_offset, ptr(token_type_embeddings), type_rows,
                    ptr(gamma), ptr(beta), hidden, float(eps), prefetch_at, prefetch_bytes,
                    dtype_code(like, "word_embeddings"), ptr(out), stream_handle(device))
    return out
