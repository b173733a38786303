"""Packed-batch helpers shared by the kernel tests (lengths with both edges, their cu_seqlens)."""
from __future__ import annotations

import torch


def random_lengths(gen: torch.Generator, batch: int, max_seqlen: int, low: int = 1) -> torch.Tensor:
    """Lengths in [low, max_seqlen], with 1 (where low allows) and max_seqlen among them."""
    lengths = torch.randint(low, max_seqlen + 1, (batch,), generator=gen)
    lengths[-1] = max_seqlen
    if batch > 1:
        lengths[0] = max(low, 1) if low > 0 else 0
    return lengths


def cu_of(lengths: torch.Tensor) -> torch.Tensor:
    """int32 [batch + 1] prefix sum of lengths, on the CPU."""
    return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.long().cumsum(0)]).to(torch.int32)
