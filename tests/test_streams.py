"""padfree.torch.streams: one side stream per device and thread (every extra stream a process runs
work on slows its CUDA graphs; streams.py says how much)."""
from __future__ import annotations

import threading

import pytest
import torch

from padfree.torch.streams import side_stream

gpu = pytest.mark.gpu


@gpu
def test_one_side_stream_per_device_and_thread():
    first = side_stream()
    assert side_stream() is first
    assert side_stream(torch.cuda.current_device()) is first
    assert side_stream(torch.device("cuda")) is first
    assert first != torch.cuda.current_stream()  # captures need a stream other than the caller's
    other = []
    thread = threading.Thread(target=lambda: other.append(side_stream()))
    thread.start()
    thread.join()
    assert other[0] is not first and other[0] != first  # two threads may capture at once


@gpu
def test_gemm_timing_and_captures_add_no_stream_beyond_it():
    seen = set()
    real = torch.cuda.Stream

    class Counting(real):
        def __new__(cls, *args, **kwargs):
            s = real.__new__(cls, *args, **kwargs)
            if kwargs.get("stream_id") is None:  # current_stream() wraps an existing stream by its id
                seen.add(s.cuda_stream)
            return s
    from padfree.torch import gemm_tuning as gemms
    torch.cuda.Stream = Counting
    try:
        side_stream()
        x = torch.randn(64, 64, device="cuda", dtype=torch.float16)
        for _ in range(3):
            gemms.graph_call_us(lambda: torch.mm(x, x), calls=2, replays=1)
    finally:
        torch.cuda.Stream = real
    assert seen <= {side_stream().cuda_stream}
