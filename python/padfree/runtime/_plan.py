"""Splits a batch into consecutive chunks that each fit one execute_packed call."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Chunk:
    """Sequences [first, stop) of the batch, tokens [token_start, token_stop) of its packed ids."""
    first: int
    stop: int
    token_start: int
    token_stop: int
    max_seqlen: int

    @property
    def batch(self) -> int:
        return self.stop - self.first

    @property
    def tokens(self) -> int:
        return self.token_stop - self.token_start


def plan_chunks(lengths: np.ndarray, max_batch: int, max_tokens: int) -> list[Chunk]:
    """Greedy, order-keeping split: a chunk takes sequences while it stays within max_batch sequences
    and max_tokens tokens. Consecutive chunks keep each chunk's tokens contiguous in the packed batch,
    so packing needs no gather. Every length must already be <= max_tokens (validate() checks)."""
    chunks: list[Chunk] = []
    first, token_start, tokens, longest = 0, 0, 0, 0
    for i, n in enumerate(int(x) for x in lengths):
        if n > max_tokens:
            raise ValueError(f"sequence {i} of {n} tokens exceeds max_tokens {max_tokens}")
        if i > first and (i - first == max_batch or tokens + n > max_tokens):
            chunks.append(Chunk(first, i, token_start, token_start + tokens, longest))
            first, token_start, tokens, longest = i, token_start + tokens, 0, 0
        tokens += n
        longest = max(longest, n)
    if len(lengths):
        chunks.append(Chunk(first, len(lengths), token_start, token_start + tokens, longest))
    return chunks
