"""The one side stream per device (and thread) on which padfree.torch captures its graphs and times
its GEMM candidates.

Every CUDA stream a process runs work on costs its graphs: on the H100 (CUDA 13.0, driver 580), once
a third stream had run kernels, the 1x128 BERT-base forward's graph ran ~30 us slower on the GPU
(355 -> 388 us per plain replay; 90 kernels, each edge ~0.35 us later and the PDL overlap gone),
whichever stream launched it and whatever its priority, a graph captured before the third stream
ran included. torch.cuda.Stream() hands out the next of a pool of 32 streams on every
call, so a GEMM tuning that made a stream per timing ran its process on dozens. Kept to this one,
padfree itself adds one stream to the caller's.
"""
from __future__ import annotations

import threading

import torch

_local = threading.local()  # a stream being captured cannot take a second capture: one per thread


def side_stream(device: torch.device | int | None = None) -> torch.cuda.Stream:
    """This thread's padfree side stream on `device` (default: the current one), made on first use."""
    where = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    index = torch.cuda.current_device() if where.index is None else where.index
    streams = getattr(_local, "streams", None)
    if streams is None:
        streams = _local.streams = {}
    stream = streams.get(index)
    if stream is None:
        stream = streams[index] = torch.cuda.Stream(torch.device("cuda", index))
    return stream
