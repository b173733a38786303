"""The encoder's four projection GEMMs at one row count (EncoderGemms), and one GEMM of a fixed problem
(TunedGemm: the decode step's output projection): torch's call, or the cuBLASLt algorithm that measured
fastest for that exact problem (padfree.torch.gemm_tuning says how it is chosen).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from . import cublaslt, gemm_tuning as tuning
from .workspaces import CounterSlots

log = logging.getLogger(__name__)


class EncoderGemms:
    """qkv / out / up / down projections at `rows` rows, each torch's call or a tuned cuBLASLt one.

    Construct outside graph capture (tuning synchronizes and allocates); the calls themselves only
    enqueue and are capturable. search: "heuristic" times the heuristic's candidates, "exhaustive"
    also screens every configuration cuBLASLt accepts (seconds per problem, once per process and row
    count). layers: how many layers a forward runs; weight_layers: how many distinct layers' weights it
    reads (None: `layers`; fewer where layers share weights, as ALBERT's), which decide
    gemm_tuning.COLD_WEIGHTS; prefetched: the forward prefetches each GEMM's weights into L2 (so they are timed hot). A
    forward (start_forward(), then each projection once per layer) gives each cuBLASLt call that
    needs a workspace its own slot of this object's CounterSlots, so that a graph of it can drop
    cuBLASLt's memsets (drop_memsets); no buffer is shared between encoders, buckets or graphs."""

    def __init__(self, rows: int, hidden: int, intermediate: int, dtype: torch.dtype, device: torch.device,
                 ffn_up, *, tune: bool, search: str = "heuristic", layers: int = 1, weight_layers: int | None = None,
                 prefetched: bool = False):
        if search not in tuning.SEARCHES:
            raise ValueError(f"search: expected one of {tuning.SEARCHES}, got {search!r}")
        # each projection as f(x, w, bias, out): torch's call unless a tuned algorithm replaces it
        self._impl: dict[str, Callable] = {"qkv": _mm, "out": _addmm, "down": _addmm,
                                           "up": lambda x, w, b, out: ffn_up(x, w, b, out=out)}
        self._labels = {name: "torch" for name in self._impl}
        self._torch_impl = dict(self._impl)
        self._slots: CounterSlots | None = None
        self._alternatives: dict[str, tuning.Lt | None] = {}
        self._picks: dict[str, tuning.Lt | None] = {}
        self._layers = layers
        if not tune or dtype == torch.float32 or device.type != "cuda":
            return
        try:
            cublaslt.library()
        except (cublaslt.CublasLtError, OSError):
            return  # torch without a loadable cuBLASLt: torch's calls it is
        streamed = tuning.streams_weights(layers if weight_layers is None else weight_layers, hidden,
                                          intermediate, dtype, device, prefetched)

        def problem(in_features, out_features, epilogue, accumulate):
            return tuning.Problem(rows, in_features, out_features, dtype, epilogue, accumulate,
                           streamed and rows <= out_features)
        default = cublaslt.EPILOGUE_DEFAULT
        problems = {"qkv": problem(hidden, 3 * hidden, default, False),
                    "out": problem(hidden, hidden, default, True),
                    "down": problem(intermediate, hidden, default, True)}
        if ffn_up.use_epilogue:  # else it is a GEMM and padfree's bias_gelu: not one cuBLASLt call
            act = cublaslt.EPILOGUE_RELU_BIAS if ffn_up.activation == "relu" else cublaslt.EPILOGUE_GELU_BIAS
            problems["up"] = problem(hidden, intermediate, act, False)
        picks: dict[str, tuning.Lt] = {}
        for name, problem in problems.items():
            pick, runner_up = tuning.choose(problem, self._impl[name], device, search)
            if pick is not None:
                picks[name] = pick
            if runner_up:
                self._alternatives[name] = runner_up[0]
        # a slot for every call that takes a workspace under either choice of each projection
        needing = {name: max(lt.workspace if lt is not None else 0
                             for lt in (picks.get(name), self._alternatives.get(name)))
                   for name in problems}
        if any(needing.values()):
            self._slots = CounterSlots(sum(n > 0 for n in needing.values()) * layers, max(needing.values()), device)
        self._picks = dict(picks)
        for name, lt in picks.items():
            self._install(name, lt)

    def _install(self, name: str, lt: tuning.Lt | None) -> None:
        """Projection `name` runs `lt` from now on (None: torch's call)."""
        if lt is None:
            self._impl[name], self._labels[name] = self._torch_impl[name], "torch"
            return
        take = self._slots.take if lt.workspace > 0 else (lambda: None)
        self._impl[name] = lambda x, w, b, out, lt=lt, take=take: lt.linear(x, w, out, b, take(), lt.algo)
        self._labels[name] = f"cublaslt {lt.label}"

    def alternatives(self) -> list[str]:
        """The projections with a runner-up to time inside a forward (gemm_tuning.RUNNER_UP_MAX_ROWS)."""
        return list(self._alternatives)

    def swap(self, name: str) -> None:
        """Projection `name` runs its runner-up, which becomes the pick (its old pick the runner-up)."""
        current = self._picks.get(name)
        self._install(name, self._alternatives[name])
        self._picks[name], self._alternatives[name] = self._alternatives[name], current

    def choices(self) -> dict[str, str]:
        """Which implementation each projection runs (for reports)."""
        return dict(self._labels)

    @property
    def workspace_calls(self) -> int:
        """How many of a forward's calls take a workspace slot (the current picks that ask for one)."""
        return self._layers * sum(lt is not None and lt.workspace > 0 for lt in self._picks.values())

    def start_forward(self) -> None:
        """Before a forward's first projection: zero the workspace slots (enqueued)."""
        if self._slots is not None:
            self._slots.start()

    def drop_memsets(self, graph: torch.cuda.CUDAGraph) -> int:
        """In a graph captured as one forward (not yet replayed): removes cuBLASLt's memsets of the
        workspace slots, which start_forward's zeroing made redundant. Returns how many."""
        return 0 if self._slots is None else self._slots.drop_memsets(graph)

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


class TunedGemm:
    """out[rows, N] = x[rows, K] @ W[N, K]^T for one problem: torch's call or the cuBLASLt configuration
    measured faster (gemm_tuning.choose: once per problem, search and process).

    Made where no graph is being captured (tuning synchronizes and allocates); a call only enqueues
    and is capturable. It keeps cuBLASLt's own workspace memset (the graph it lands in is not a forward
    of EncoderGemms' slots), which is how its candidates were timed. fp32, a CPU device, search="none",
    a torch without a loadable cuBLASLt, or a tuning that runs out of memory: torch's call."""

    def __init__(self, rows: int, in_features: int, out_features: int, dtype: torch.dtype, device: torch.device,
                 *, search: str = "heuristic", cold_weights: bool = False, weight: torch.Tensor | None = None):
        """weight: the GEMM's own weight, timed in place of a random one (gemm_tuning.choose)."""
        if search not in tuning.GEMM_SEARCHES:
            raise ValueError(f"search: expected one of {tuning.GEMM_SEARCHES}, got {search!r}")
        self.rows = rows
        self.lt: tuning.Lt | None = None
        self._workspace: torch.Tensor | None = None
        if search == "none" or dtype == torch.float32 or device.type != "cuda":
            return
        try:
            cublaslt.library()
            problem = tuning.Problem(rows, in_features, out_features, dtype, cublaslt.EPILOGUE_DEFAULT, False,
                                     cold_weights)
            self.lt, _ = tuning.choose(problem, _mm, device, search, weight)
        except (cublaslt.CublasLtError, OSError, RuntimeError) as e:  # RuntimeError: torch's, OOM included
            # the tuning is an optimization: a call it cannot make (memory, a refused capture) keeps torch's
            log.warning("padfree: the %d x %d x %d GEMM keeps torch's call: tuning it failed (%s: %s)", rows,
                        in_features, out_features, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            return
        if self.lt is not None and self.lt.workspace > 0:
            self._workspace = torch.empty(self.lt.workspace, dtype=torch.uint8, device=device)

    @property
    def label(self) -> str:
        return "torch" if self.lt is None else f"cublaslt {self.lt.label}"

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.lt is None or x.shape[0] != self.rows or not x.is_contiguous():
            return torch.nn.functional.linear(x, weight)
        out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        return self.lt.linear(x, weight, out, None, self._workspace, self.lt.algo)
