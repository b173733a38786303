"""Host -> device transfer of a run's int32 inputs through reused, geometrically grown buffers:
pinned when the backend is on CUDA, so that the copy is asynchronous on the runtime's stream.

Two buffers alternate (double buffering): a run packs into one while the copy out of the other may
still be queued behind earlier GPU work, so a caller can pack batch N + 1 while batch N runs
(Runtime.submit). A buffer is rewritten only after the copy out of it completed (an event per buffer),
never after the whole run that used it.
"""
from __future__ import annotations

import numpy as np
import torch

# TensorRT wants I/O addresses 256-byte aligned; every segment starts on such a boundary.
ALIGN_ELEMENTS = 256 // 4
BUFFERS = 2


def aligned(n: int) -> int:
    """n int32 elements rounded up to a whole number of 256-byte blocks (padfree.torch's input
    buffers use the same layout rule)."""
    return -(-n // ALIGN_ELEMENTS) * ALIGN_ELEMENTS


class _Buffer:
    """One host buffer, its numpy view, and the event after the last copy out of it."""

    def __init__(self, pinned: bool):
        self.pinned = pinned
        self.host: torch.Tensor | None = None
        self.array: np.ndarray | None = None
        self.copied: torch.cuda.Event | None = None
        self.in_flight = False  # `copied` was recorded and not yet waited for

    @property
    def capacity(self) -> int:
        return 0 if self.host is None else self.host.numel()

    def reserve(self, n: int) -> np.ndarray:
        if self.in_flight:
            self.copied.synchronize()  # the previous copy out of this buffer, not that run's kernels
            self.in_flight = False
        if n > self.capacity:
            # doubling keeps reallocations (pinned allocations are slow) logarithmic in the peak size
            size = max(aligned(n), 2 * self.capacity)
            self.host = torch.empty(size, dtype=torch.int32, pin_memory=self.pinned)
            self.array = self.host.numpy()
        return self.array


class Staging:
    """upload() lays int arrays end to end (each start aligned) in the next host buffer, copies them
    to the device in one transfer and returns a device view per array."""

    def __init__(self, device: torch.device, buffers: int = BUFFERS):
        self.device = device
        self.pinned = device.type == "cuda"
        self._buffers = [_Buffer(self.pinned) for _ in range(buffers)]
        self._next = 0

    @property
    def capacity(self) -> int:
        """The largest buffer's size in int32 elements (buffers never shrink)."""
        return max(b.capacity for b in self._buffers)

    def upload(self, arrays: list[np.ndarray], stream: torch.cuda.Stream | None) -> list[torch.Tensor]:
        offsets, total = [], 0
        for a in arrays:
            offsets.append(total)
            total += aligned(len(a))
        buffer = self._buffers[self._next]
        self._next = (self._next + 1) % len(self._buffers)
        host_np = buffer.reserve(total)
        for a, off in zip(arrays, offsets):
            host_np[off:off + len(a)] = a  # int64 -> int32: the values were range-checked already
        host = buffer.host[:total]
        if self.pinned:
            device = host.to(self.device, non_blocking=True)  # one op: the allocation and the copy
            if buffer.copied is None:
                buffer.copied = torch.cuda.Event()
            buffer.copied.record(stream)
            buffer.in_flight = True
        else:  # a CPU backend gets its own copy, so the next run cannot overwrite what it kept
            device = host.clone()
        return [device[off:off + len(a)] for a, off in zip(arrays, offsets)]
