"""Tuning of the encoder's projection GEMMs (padfree.torch.gemms runs them): for each problem, torch's
call or the cuBLASLt algorithm that measured fastest, chosen once per process (and kept in a tuning
file where asked).

torch takes cuBLASLt's (or cuBLAS's) first heuristic pick. On the H100 that pick is up to 22% slower
than another listed candidate for some of BERT-base's shapes (bench/results/gemm-algos-h100.json:
the out-projection with the residual accumulated, 21504 x 768 x 768: 61 us against 48), and never
faster than the best one. So when a bucket's graph is captured, each problem is timed once per row
count (torch's call and cuBLASLt's listed candidates, each replayed from a CUDA graph) and the
fastest kept. fp32 keeps torch's call (its numerics are the reference for the fp32 tests).

Every row count is tuned. A 4096-row floor (set when the candidates still paid cuBLASLt's memsets and
were timed one round each) kept torch's calls for small buckets, where tuned picks measured faster in
the forward (H100, BERT-base fp16, exhaustive search, HF-style call, same process, alternating):
1x128 0.462 -> 0.453 ms, 4x256 0.668 -> 0.634, 8x256 0.846 -> 0.813, 16x256 1.148 -> 1.117, 32x128
1.077 -> 1.041.

The heuristic's list is not everything cuBLASLt can run: search="exhaustive" also screens every
tile x stages x cluster-shape configuration it accepts (~1400 for these shapes on the H100). There
that found 5-8% faster kernels than the heuristic's best for the QKV and FFN-up GEMMs at 9344 and
21504 rows (bench/results/gemm-enum-h100.json), at the cost of seconds per problem at capture time.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import logging
import math
import os
import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from . import cublaslt
from .streams import side_stream
from .workspaces import CounterSlots, keeping_cuda_graph

log = logging.getLogger(__name__)

CANDIDATES = 8         # the heuristic's list is ordered; the winners measured were in its first 6
# A cuBLASLt algorithm replaces torch's call where it measured faster at all. A 3% margin kept torch's
# FFN-down at 21504 rows (146.2 us against 144.9 for cuBLASLt's second heuristic pick), yet in the
# forward that pick ran 8.328 against 8.367 ms per call (H100, 120 calls each, alternating): torch's
# call keeps cuBLASLt's workspace memset in the graph, ~3.5 us of idle GPU each (workspaces.py).
KEEP_MARGIN = 1.0
ROUNDS = 3              # interleaved timing rounds per candidate (best round kept)
_CALLS, _REPLAYS = 10, 5
SEARCHES = ("heuristic", "exhaustive")
# what a caller may ask for: a search, or "none" (torch's GEMM calls, nothing timed)
GEMM_SEARCHES = (*SEARCHES, "none")
SCREEN_CALLS, SCREEN_REPLAYS, FINALISTS = 3, 1, 8   # search="exhaustive": one short timing each, then rounds
# Problems of at most SMALL_ROWS rows run for a few microseconds: they are timed over SMALL_REPEAT
# times the calls per graph and the replays. Timed as the larger ones, two exhaustive tunings of
# BERT-base's 128- and 256-row buckets picked different kernels for 3 and 4 of the 4 projections, their
# forwards 12 us apart at 1x128 (384-388 against 396-400 us per call). With the repeat, six tunings
# of the 128-row bucket agreed on QKV, FFN-up and -down and split between two out-projection kernels
# (tile ids 47 and 59, 0.1 us apart alone, 3-4 us per forward apart inside it: 385-388 against
# 389-392), and at 4x128 the forwards ran 490-497 us against 495-506. H100, one process, calls
# alternating. What is fastest inside a forward within such margins only a
# timing inside the forward can tell (a LayerNorm ahead of each timed call, as there, changed no pick).
SMALL_ROWS, SMALL_REPEAT = 1024, 4
# A problem's runner-up within this factor of its pick is offered to the encoder, which times both
# inside its captured forward (EncoderGemms.alternatives, PadfreeEncoder._choose_in_forward).
RUNNER_UP_MARGIN = 1.05
# Offered to problems of at most RUNNER_UP_MAX_ROWS rows (None: all). Larger ones were tried: under a
# large forward's sustained load the H100 runs at its power cap (BERT-base 64x512: ~690 of 700 W, SM
# clock ~1500 MHz against 1980, clock-event reason "sw power cap"), while the tuning's short bursts
# of one GEMM run at the boost clock, so a kernel's rank alone might not be its rank in the forward.
# Timed inside the forward at 2624, 9344 and 21504 rows, no runner-up beat its pick by more than the
# noise (twice the error of the difference, 5-90 us), and an earlier rule that swapped on any
# difference ran 64x512 8-29 us per call slower (H100): seconds of capture
# per large bucket for nothing.
RUNNER_UP_MAX_ROWS: int | None = SMALL_ROWS
MAX_REL_DIFF = 1e-2     # a candidate's max |difference| from torch's result, over torch's max |result|
# A forward reads each layer's weights once; where all layers' weights exceed the L2 (BERT-base: 170
# MB in fp16 against the H100's 50 MB), every GEMM of a forward reads its weights from DRAM. Where
# the weights are also most of what a GEMM reads (rows <= out_features), its candidates are timed
# that way (Problem.cold_weights): the timed calls cycle through copies of the weights that fill
# twice the L2, so that each call finds its copy evicted. Timed on one hot copy, the small GEMMs
# were ranked by a cost they do not pay in the forward.
COLD_WEIGHTS = True
# The workspace candidates may ask for. The fastest configurations on the H100 ask for 4 bytes (their
# tile scheduler's counter); each call of a forward gets its own (workspaces.CounterSlots).
WORKSPACE_BYTES = 1 << 20


@dataclass(frozen=True)
class Problem:
    rows: int
    in_features: int
    out_features: int
    dtype: torch.dtype
    epilogue: int           # cublaslt.EPILOGUE_*: DEFAULT, or the FFN's bias + activation
    accumulate: bool        # out += x @ W^T (the residual rides in the GEMM)
    cold_weights: bool = False  # timed with its weights out of L2 (COLD_WEIGHTS)


@dataclass
class Lt:
    linear: cublaslt.Linear
    algo: cublaslt.Algo
    label: str
    workspace: int          # bytes the algorithm asks for


_chosen: dict[tuple[int, Problem, str], Lt | None] = {}  # (device, problem, search) -> pick
# the candidate timed second, where within RUNNER_UP_MARGIN of the pick (None: torch's call)
_runner_up: dict[tuple[int, Problem, str], Lt | None] = {}


def graph_call_us(fn: Callable, calls: int = _CALLS, replays: int = _REPLAYS, slot_bytes: int = 0) -> float:
    """Median device time in us of one fn() call: `calls` calls captured in a CUDA graph, replayed
    `replays` times (the calls are too short to time from the host). Plain capture_begin/end:
    torch.cuda.graph would collect garbage every time. slot_bytes > 0: fn takes a workspace, each
    call its own slot of that size, zeroed at the graph's start with cuBLASLt's memsets removed, as
    EncoderGemms' calls run in a captured forward."""
    side = side_stream()
    side.wait_stream(torch.cuda.current_stream())
    slots = CounterSlots(calls, slot_bytes, torch.device("cuda", torch.cuda.current_device())) if slot_bytes else None
    call = fn if slots is None else (lambda: fn(slots.take()))
    with torch.cuda.stream(side):
        call()
        graph = keeping_cuda_graph() if slots is not None else torch.cuda.CUDAGraph()
        graph.capture_begin()
        try:
            if slots is not None:
                slots.start()
            for _ in range(calls):
                call()
        finally:
            graph.capture_end()
        if slots is not None:
            slots.drop_memsets(graph)
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


def _l2_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size


def weight_copies(problem: Problem, device: torch.device) -> int:
    """How many copies of the weights a timing of `problem` cycles through (COLD_WEIGHTS)."""
    if not problem.cold_weights:
        return 1
    weight_bytes = problem.in_features * problem.out_features * problem.dtype.itemsize
    return max(1, math.ceil(2 * _l2_bytes(device) / weight_bytes))


def _tune(problem: Problem, torch_call: Callable, device: torch.device, search: str,
          weight: torch.Tensor | None = None) -> tuple[Lt | None, list[Lt | None]]:
    """torch's call against cuBLASLt's candidates on random operands of the problem's shape.

    Candidates: the heuristic's first CANDIDATES, and with search="exhaustive" also the FINALISTS
    fastest of every configuration cuBLASLt accepts (Linear.enumerate: tile x stages x cluster shape),
    screened in one short timing each. A candidate must reproduce torch's result. The rest are timed in
    ROUNDS interleaved rounds and keep their best round: under the H100's power cap the clocks drift
    between measurements, and a single round once chose the heuristic's first GELU-epilogue candidate
    at 21504 rows, which bench/gemm_algos.py then measured 10% slower than torch's call (199 against
    181 us)."""
    gen = torch.Generator(device=device).manual_seed(0)
    new = dict(device=device, dtype=problem.dtype)
    x = torch.randn(problem.rows, problem.in_features, generator=gen, **new) * 0.1
    w = torch.randn(problem.out_features, problem.in_features, generator=gen, **new) * 0.05 if weight is None \
        else weight
    copies = weight_copies(problem, device)
    weights = itertools.cycle([w] + [w.clone() for _ in range(copies - 1)])
    bias = torch.randn(problem.out_features, generator=gen, **new)
    start = torch.randn(problem.rows, problem.out_features, generator=gen, **new)
    out = start.clone()
    torch_call(x, w, bias, out)
    expect = out.clone()
    linear = cublaslt.Linear(problem.rows, problem.in_features, problem.out_features, problem.dtype,
                             epilogue=problem.epilogue, accumulate=problem.accumulate,
                             max_workspace=WORKSPACE_BYTES)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    lt_bias = bias if problem.epilogue != cublaslt.EPILOGUE_DEFAULT else None

    def call(algo):
        return lambda ws=workspace: linear(x, next(weights), out, lt_bias, ws, algo)

    small = problem.rows <= SMALL_ROWS
    repeat = SMALL_REPEAT if small else 1

    def timed_us(algo, needs: int, calls: int = _CALLS, replays: int = _REPLAYS) -> float:
        # as a forward runs it: where it needs a workspace, a zeroed slot of its own and no memset
        return graph_call_us(call(algo), max(calls * repeat, copies), replays * repeat, slot_bytes=needs)

    def reproduces(algo) -> bool:
        out.copy_(start)
        try:
            call(algo)()
        except cublaslt.CublasLtError:
            return False  # a listed candidate the library then refuses: not ours to use
        scale = expect.float().abs().max().clamp(min=1e-6)
        return bool(((out.float() - expect.float()).abs().max() / scale) <= MAX_REL_DIFF)

    algos = {info.label(): (algo, info.workspace_size) for algo, info in linear.candidates(CANDIDATES)
             if reproduces(algo)}
    if search == "exhaustive":
        screened = [(timed_us(algo, info.workspace_size, SCREEN_CALLS, SCREEN_REPLAYS), info.label(), algo,
                     info.workspace_size) for algo, info in linear.enumerate() if reproduces(algo)]
        fastest = sorted(screened, key=lambda t: t[0])[:FINALISTS]
        algos.update((label, (algo, needs)) for _, label, algo, needs in fastest)
    calls: dict[str, Callable[[], float]] = {
        "torch": lambda: graph_call_us(lambda: torch_call(x, next(weights), bias, out), max(_CALLS * repeat, copies),
                                       _REPLAYS * repeat)}
    calls.update({label: (lambda a=algo, n=needs: timed_us(a, n)) for label, (algo, needs) in algos.items()})
    best_us = {name: float("inf") for name in calls}
    for _ in range(ROUNDS):
        for name, timing in calls.items():
            best_us[name] = min(best_us[name], timing())
    label = min(algos, key=best_us.__getitem__, default=None)
    keep_torch = label is None or best_us[label] >= best_us["torch"] * KEEP_MARGIN
    log.debug("%s: torch's call %.1f us, cuBLASLt's fastest %s %.1f us -> %s", problem, best_us["torch"], label,
              best_us.get(label, float("nan")), "torch" if keep_torch else label)

    def pick(name: str) -> Lt | None:
        return None if name == "torch" else Lt(linear, algos[name][0], name, algos[name][1])
    ranked = sorted(best_us, key=best_us.__getitem__)
    first = "torch" if keep_torch else label
    second = next(name for name in ranked if name != first) if len(ranked) > 1 else None
    runner_up = [pick(second)] if second is not None and best_us[second] <= best_us[first] * RUNNER_UP_MARGIN else []
    return pick(first), runner_up


def choose(problem: Problem, torch_call: Callable, device: torch.device, search: str,
           weight: torch.Tensor | None = None) -> tuple[Lt | None, list[Lt | None]]:
    """The pick for `problem` on `device` (None: torch's call) and its runner-up where one is offered
    (RUNNER_UP_MARGIN, RUNNER_UP_MAX_ROWS), tuned on first request and kept for the process (and in a
    tuning file: save_tuning). weight: the problem's own [out_features, in_features] weight, timed
    instead of a random one (a vocabulary-wide weight is not allocated a second time; the values do
    not change a GEMM's time)."""
    # an exhaustive search's pick also serves a heuristic request (it timed a superset)
    key = next((k for k in ((device.index, problem, "exhaustive"), (device.index, problem, search))
                if k in _chosen), (device.index, problem, search))
    if key not in _chosen:
        _chosen[key], runner_up = _tune(problem, torch_call, device, search, weight)
        _runner_up.pop(key, None)
        if runner_up:
            _runner_up[key] = runner_up[0]
    offered = key in _runner_up and (RUNNER_UP_MAX_ROWS is None or problem.rows <= RUNNER_UP_MAX_ROWS)
    return _chosen[key], [_runner_up[key]] if offered else []


def streams_weights(layers: int, hidden: int, intermediate: int, dtype: torch.dtype, device: torch.device,
                    prefetched: bool) -> bool:
    """Whether a forward's weights stream from DRAM, so that its GEMMs are timed cold (COLD_WEIGHTS)."""
    forward_weight_bytes = layers * (4 * hidden + 2 * intermediate) * hidden * dtype.itemsize
    return COLD_WEIGHTS and not prefetched and forward_weight_bytes > _l2_bytes(device)


TUNING_FORMAT = "padfree-gemm-tuning/1"
_TUNING_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def save_tuning(path: str | os.PathLike, device: torch.device) -> int:
    """Writes what the tuning chose on `device` so far (every problem and search, torch's call
    included) to a JSON file, replacing it atomically; returns the number of entries. The algorithms
    are cuBLASLt's opaque descriptors: load_tuning takes them back only for the same device name and
    cuBLASLt version, and re-checks each."""
    entries = []
    for (index, problem, search), lt in _chosen.items():
        if index != device.index:
            continue
        entries.append({"rows": problem.rows, "in_features": problem.in_features,
                        "out_features": problem.out_features, "dtype": str(problem.dtype).removeprefix("torch."),
                        "epilogue": problem.epilogue, "accumulate": problem.accumulate,
                        "cold_weights": problem.cold_weights, "search": search,
                        "algo": None if lt is None else bytes(lt.algo).hex(),
                        "label": "torch" if lt is None else lt.label})
    doc = {"format": TUNING_FORMAT, "device": torch.cuda.get_device_name(device),
           "cublaslt_version": cublaslt.version(), "entries": entries}
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    return len(entries)


def load_tuning(path: str | os.PathLike, device: torch.device) -> int:
    """Takes the choices of a save_tuning file for `device` (those not made in this process yet);
    returns how many. A file from another device or cuBLASLt version gives none; an entry cuBLASLt
    no longer accepts is skipped (its problem is tuned again when needed). Raises ValueError for a file
    that is not a tuning file."""
    try:
        with open(path) as f:
            doc = json.load(f)
        if doc.get("format") != TUNING_FORMAT or not isinstance(doc.get("entries"), list):
            raise ValueError(f"format is not {TUNING_FORMAT!r}")
        if doc.get("device") != torch.cuda.get_device_name(device) or doc.get("cublaslt_version") != cublaslt.version():
            return 0
        loaded = 0
        for e in doc["entries"]:
            problem = Problem(int(e["rows"]), int(e["in_features"]), int(e["out_features"]), _TUNING_DTYPES[e["dtype"]],
                              int(e["epilogue"]), bool(e["accumulate"]), bool(e.get("cold_weights", False)))
            key = (device.index, problem, e["search"])
            if e["search"] not in SEARCHES or key in _chosen:
                continue
            lt = None
            if e["algo"] is not None:
                raw = bytes.fromhex(e["algo"])
                if len(raw) != ctypes.sizeof(cublaslt.Algo):
                    raise ValueError(f"an algorithm of {len(raw)} bytes")
                linear = cublaslt.Linear(problem.rows, problem.in_features, problem.out_features, problem.dtype,
                                         epilogue=problem.epilogue, accumulate=problem.accumulate,
                                         max_workspace=WORKSPACE_BYTES)
                algo = cublaslt.Algo.from_buffer_copy(raw)
                workspace = linear.check(algo)
                if workspace is None or workspace > WORKSPACE_BYTES:
                    continue
                lt = Lt(linear, algo, str(e["label"]), workspace)
            _chosen[key] = lt
            loaded += 1
        return loaded
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{os.fspath(path)}: not a usable padfree GEMM tuning file ({err})") from err
