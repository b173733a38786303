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


def plan_chunks(lengths: np.ndarray, max_batch: int, max_tokens: int,
                cu_seqlens: np.ndarray | None = None) -> list[Chunk]:
    """Greedy, order-keeping split: a chunk takes sequences while it stays within max_batch sequences
    and max_tokens tokens. Consecutive chunks keep each chunk's tokens contiguous in the packed batch,
    so packing needs no gather. Every length must already be <= max_tokens (validate() checks).

    cu_seqlens: the batch's [0, cumsum(lengths)] where the caller has it. Each chunk's end is one
    binary search in it (the last sequence whose end stays within max_tokens of the chunk's start),
    so the host work grows with the number of chunks, not of sequences."""
    lengths = np.asarray(lengths)
    if not len(lengths):
        return []
    longest = int(lengths.max())
    if longest > max_tokens:
        i = int(np.flatnonzero(lengths > max_tokens)[0])
        raise ValueError(f"sequence {i} of {int(lengths[i])} tokens exceeds max_tokens {max_tokens}")
    cu = np.concatenate(([0], np.cumsum(lengths))) if cu_seqlens is None else cu_seqlens
    count, total = len(lengths), int(cu[-1])
    if count <= max_batch and total <= max_tokens:  # the common case: one chunk
        return [Chunk(0, count, 0, total, longest)]
    chunks: list[Chunk] = []
    first = 0
    while first < count:
        start = int(cu[first])
        # every length <= max_tokens, so the chunk holds at least sequence `first`
        stop = min(int(np.searchsorted(cu, start + max_tokens, side="right")) - 1, first + max_batch, count)
        chunks.append(Chunk(first, stop, start, int(cu[stop]), int(lengths[first:stop].max())))
        first = stop
    return chunks
