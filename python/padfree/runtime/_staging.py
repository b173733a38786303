"""Host -> device transfer of a run's int32 inputs through one reused, geometrically grown buffer:
pinned when the backend is on CUDA, so that the copy is asynchronous on the runtime's stream."""
from __future__ import annotations

import numpy as np
import torch

# TensorRT wants I/O addresses 256-byte aligned; every segment starts on such a boundary.
ALIGN_ELEMENTS = 256 // 4


def aligned(n: int) -> int:
    """n int32 elements rounded up to a whole number of 256-byte blocks (padfree.torch's input
    buffers use the same layout rule)."""
    return -(-n // ALIGN_ELEMENTS) * ALIGN_ELEMENTS


class Staging:
    """upload() lays int arrays end to end (each start aligned) in the host buffer, copies them to
    the device in one transfer and returns a device view per array.

    The buffer is reused across runs: before overwriting it, upload() waits for the previous run's
    copy out of it (an event), not for the previous run's whole work.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.pinned = device.type == "cuda"
        self._host: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None

    @property
    def capacity(self) -> int:
        return 0 if self._host is None else self._host.numel()

    def _reserve(self, n: int) -> torch.Tensor:
        if self._copied is not None:
            self._copied.synchronize()
        if n > self.capacity:
            # doubling keeps reallocations (pinned allocations are slow) logarithmic in the peak size
            size = max(aligned(n), 2 * self.capacity)
            self._host = torch.empty(size, dtype=torch.int32, pin_memory=self.pinned)
        return self._host

    def upload(self, arrays: list[np.ndarray], stream: torch.cuda.Stream | None) -> list[torch.Tensor]:
        offsets, total = [], 0
        for a in arrays:
            offsets.append(total)
            total += aligned(len(a))
        host = self._reserve(total)
        host_np = host.numpy()
        for a, off in zip(arrays, offsets):
            host_np[off:off + len(a)] = a  # int64 -> int32: the values were range-checked already
        if self.pinned:
            device = torch.empty(total, dtype=torch.int32, device=self.device)
            device.copy_(host[:total], non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record(stream)
        else:  # a CPU backend gets its own copy, so the next run cannot overwrite what it kept
            device = host[:total].clone()
        return [device[off:off + len(a)] for a, off in zip(arrays, offsets)]
