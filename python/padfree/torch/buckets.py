"""CUDA-graph buckets: which captured graph serves a packed batch, and a small LRU of graphs.

A graph bakes in every shape, so a batch is served by the graph of its bucket: total tokens rounded
up on a grid that wastes at most 1/STEPS_PER_OCTAVE of the rows (geometric above 4096 tokens), batch
rounded up to a power of two (padded sequences have length 0: no work, DESIGN.md), max_seqlen rounded
up to a power of two and capped at the model's maximum (the attention kernel's tiling follows max_seqlen;
every real sequence stays within it).
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Generic, Hashable, NamedTuple, TypeVar

MIN_TOKENS = 64
# Every wasted row is a GEMM row computed for nothing (1/16 measured 4.7% extra GEMM time at BERT
# 128x128); a finer grid costs only more distinct graphs, each one capture and its static output.
STEPS_PER_OCTAVE = 64


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def round_tokens(total_tokens: int) -> int:
    """total_tokens rounded up to the grid: multiples of 64, or of 1/STEPS_PER_OCTAVE of the power of
    two below."""
    if total_tokens < 1:
        raise ValueError(f"total_tokens must be >= 1, got {total_tokens}")
    step = max(MIN_TOKENS, (1 << (total_tokens.bit_length() - 1)) // STEPS_PER_OCTAVE)
    return -(-total_tokens // step) * step


def round_batch(batch: int) -> int:
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return _pow2_ceil(batch)


def round_seqlen(max_seqlen: int, cap: int) -> int:
    """max_seqlen rounded up to a power of two (at least 16), never above cap (>= max_seqlen)."""
    if not 1 <= max_seqlen <= cap:
        raise ValueError(f"max_seqlen must be in [1, {cap}], got {max_seqlen}")
    return min(cap, max(16, _pow2_ceil(max_seqlen)))


class Bucket(NamedTuple):
    tokens: int
    batch: int
    max_seqlen: int
    token_types: bool  # whether the graph reads token_type_ids (else type 0 everywhere)


@functools.lru_cache(maxsize=4096)  # on the host path in front of every replay: ~0.3 us instead of ~5
def bucket_for(total_tokens: int, batch: int, max_seqlen: int, seqlen_cap: int,
               token_types: bool) -> Bucket:
    return Bucket(round_tokens(total_tokens), round_batch(batch),
                  round_seqlen(max_seqlen, seqlen_cap), token_types)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most `capacity` entries; get() refreshes an entry, put() evicts the least recently used."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def holds(self, key: K, value: V) -> bool:
        """Whether `key` maps to this very `value`; refreshes it if so (get() without the lookup's result)."""
        if self._items.get(key) is not value:
            return False
        self._items.move_to_end(key)
        return True

    def put(self, key: K, value: V) -> list[V]:
        """Insert; returns the evicted values (the caller releases them)."""
        self._items[key] = value
        self._items.move_to_end(key)
        evicted = []
        while len(self._items) > self.capacity:
            evicted.append(self._items.popitem(last=False)[1])
        return evicted

    def clear(self) -> None:
        self._items.clear()

    def keys(self) -> list[K]:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)
