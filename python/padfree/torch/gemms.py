"""The encoder's four projection GEMMs at one row count: torch's call, or the cuBLASLt algorithm that
measured fastest for that exact problem.

torch takes cuBLASLt's (or cuBLAS's) first heuristic pick. On the H100 that pick is up to 22% slower
than another listed candidate for some of BERT-base's shapes (bench/results/gemm-algos-h100.json:
the out-projection with the residual accumulated, 21504 x 768 x 768: 61 us against 48), and never
faster than the best one. So when a bucket's graph is captured, each problem is timed once per row
count (torch's call and cuBLASLt's listed candidates, each replayed from a CUDA graph) and the
fastest kept; small problems, where every candidate measured within a few percent, keep torch's call.
fp32 keeps torch's call too (its numerics are the reference for the fp32 tests).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from . import cublaslt

TUNE_MIN_ROWS = 4096   # measured: below this every candidate was within 2% of torch's call
CANDIDATES = 8         # the heuristic's list is ordered; the winners measured were in its first 6
KEEP_MARGIN = 0.97     # a cuBLASLt algorithm replaces torch's call only when >= 3% faster
ROUNDS = 3              # interleaved timing rounds per candidate (best round kept)
_CALLS, _REPLAYS = 10, 5


@dataclass(frozen=True)
class Problem:
    rows: int
    in_features: int
    out_features: int
    dtype: torch.dtype
    epilogue: int           # cublaslt.EPILOGUE_*: DEFAULT, or the FFN's bias + activation
    accumulate: bool        # out += x @ W^T (the residual rides in the GEMM)


@dataclass
class _Lt:
    linear: cublaslt.Linear
    algo: cublaslt.Algo
    label: str


_chosen: dict[tuple[int, Problem], _Lt | None] = {}


def graph_call_us(fn: Callable[[], object], calls: int = _CALLS, replays: int = _REPLAYS) -> float:
    """Median device time in us of one fn() call: `calls` calls captured in a CUDA graph, replayed
    `replays` times (the calls are too short to time from the host). Plain capture_begin/end:
    torch.cuda.graph would collect garbage every time."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin()
        try:
            for _ in range(calls):
                fn()
        finally:
            graph.capture_end()
        graph.replay()
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    torch.cuda.current_stream().wait_stream(side)
    return statistics.median(times) / calls * 1e3


def _tune(problem: Problem, torch_call: Callable, device: torch.device) -> _Lt | None:
    """torch's call against cuBLASLt's candidates on random operands of the problem's shape.

    Each is timed in ROUNDS interleaved rounds and keeps its best round: under the H100's power cap
    the clocks drift between measurements, and a single round once chose the heuristic's first
    GELU-epilogue candidate at 21504 rows, which bench/gemm_algos.py then measured 10% slower than
    torch's call (199 against 181 us)."""
    gen = torch.Generator(device=device).manual_seed(0)
    new = dict(device=device, dtype=problem.dtype)
    x = torch.randn(problem.rows, problem.in_features, generator=gen, **new) * 0.1
    w = torch.randn(problem.out_features, problem.in_features, generator=gen, **new) * 0.05
    bias = torch.randn(problem.out_features, generator=gen, **new)
    out = torch.randn(problem.rows, problem.out_features, generator=gen, **new)
    linear = cublaslt.Linear(problem.rows, problem.in_features, problem.out_features, problem.dtype,
                             epilogue=problem.epilogue, accumulate=problem.accumulate)
    lt_bias = bias if problem.epilogue != cublaslt.EPILOGUE_DEFAULT else None
    calls: dict[str, Callable] = {"torch": lambda: torch_call(x, w, bias, out)}
    algos = {}
    for algo, info in linear.candidates(CANDIDATES):
        try:
            linear(x, w, out, lt_bias, None, algo)
        except cublaslt.CublasLtError:
            continue  # a listed candidate the library then refuses: not ours to use
        algos[info.label()] = algo
        calls[info.label()] = (lambda a: lambda: linear(x, w, out, lt_bias, None, a))(algo)
    best_us = {name: float("inf") for name in calls}
    for _ in range(ROUNDS):
        for name, fn in calls.items():
            best_us[name] = min(best_us[name], graph_call_us(fn))
    label = min(algos, key=best_us.__getitem__, default=None)
    if label is None or best_us[label] >= best_us["torch"] * KEEP_MARGIN:
        return None
    return _Lt(linear, algos[label], label)


class EncoderGemms:
    """qkv / out / up / down projections at `rows` rows, each torch's call or a tuned cuBLASLt one.

    Construct outside graph capture (tuning synchronizes and allocates); the calls themselves only
    enqueue and are capturable. The cuBLASLt candidates are those that need no workspace, so no
    buffer is shared between encoders, streams or graphs."""

    def __init__(self, rows: int, hidden: int, intermediate: int, dtype: torch.dtype, device: torch.device,
                 ffn_up, *, tune: bool, tune_min_rows: int = TUNE_MIN_ROWS):
        # each projection as f(x, w, bias, out): torch's call unless a tuned algorithm replaces it
        self._impl: dict[str, Callable] = {"qkv": _mm, "out": _addmm, "down": _addmm,
                                           "up": lambda x, w, b, out: ffn_up(x, w, b, out=out)}
        self._labels = {name: "torch" for name in self._impl}
        if not tune or rows < tune_min_rows or dtype == torch.float32 or device.type != "cuda":
            return
        try:
            cublaslt.library()
        except (cublaslt.CublasLtError, OSError):
            return  # torch without a loadable cuBLASLt: torch's calls it is
        default = cublaslt.EPILOGUE_DEFAULT
        problems = {"qkv": Problem(rows, hidden, 3 * hidden, dtype, default, False),
                    "out": Problem(rows, hidden, hidden, dtype, default, True),
                    "down": Problem(rows, intermediate, hidden, dtype, default, True)}
        if ffn_up.use_epilogue:  # else it is a GEMM and padfree's bias_gelu: not one cuBLASLt call
            act = cublaslt.EPILOGUE_RELU_BIAS if ffn_up.activation == "relu" else cublaslt.EPILOGUE_GELU_BIAS
            problems["up"] = Problem(rows, hidden, intermediate, dtype, act, False)
        for name, problem in problems.items():
            key = (device.index, problem)
            if key not in _chosen:
                _chosen[key] = _tune(problem, self._impl[name], device)
            lt = _chosen[key]
            if lt is not None:
                self._impl[name] = lambda x, w, b, out, lt=lt: lt.linear(x, w, out, b, None, lt.algo)
                self._labels[name] = f"cublaslt {lt.label}"

    def choices(self) -> dict[str, str]:
        """Which implementation each projection runs (for reports)."""
        return dict(self._labels)

    def qkv(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
        self._impl["qkv"](x, w, None, out)

    def out_residual(self, x: torch.Tensor, w: torch.Tensor, acc: torch.Tensor) -> None:
        """acc += x @ w^T"""
        self._impl["out"](x, w, None, acc)

    def up(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> None:
        """out = act(x @ w^T + bias)"""
        self._impl["up"](x, w, bias, out)

    def down_residual(self, x: torch.Tensor, w: torch.Tensor, acc: torch.Tensor) -> None:
        """acc += x @ w^T"""
        self._impl["down"](x, w, None, acc)


def _mm(x, w, _bias, out):
    torch.mm(x, w.t(), out=out)


def _addmm(x, w, _bias, acc):
    acc.addmm_(x, w.t())
