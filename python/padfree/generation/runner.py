"""Decode states per shape bucket, the decode loop, and the CUDA graph that replays one whole step.

A decode step (decoder logits, log_softmax_topk with the processors, the beam bookkeeping or the
greedy pick, the cache-indirection reorder, the step counter's increment) is a function of device
tensors only (decoder.py, beam_search.py, sampling.py), so on CUDA it is captured once as a
torch.cuda.CUDAGraph and every step is one replay: the host issues one call per step instead of
~200 eager torch ops and kernel calls, which on a slow host cost more than the GPU work itself.

Rules, and why:
- A state (decoder buffers, search tensors, graph) serves one bucket: batch, rows per source,
  max_length, the bucketed source-token count and longest source, and the options that shape the
  step. Calls with the same bucket reuse it (a benchmark calls generate() with one shape); a small
  LRU bounds the memory held (max_states).
- The first call of a bucket runs step 0 eagerly on a side stream (warm-up: cuBLAS handles,
  lazily built kernels), then captures the step; later calls replay from step 0. With padfree's torch
  decoder on CUDA the state's encoder and cross-attention K/V are a second graph, warmed up and
  captured the same way (encoder_graph.py). All graphs share one memory pool: they never run
  concurrently and no graph output lives in the pool (everything a step keeps is a state tensor
  allocated outside the capture).
- The host learns that every sequence finished without stalling the GPU: every check_every steps it
  enqueues a non-blocking copy of the device flag `done` into pinned memory and records an event,
  then waits on the previous check's event (check_every steps older, so the GPU still has that
  much queued). The stop is seen up to 2 * check_every steps late; those steps change nothing
  (the flag is sticky and HF's stop condition means no pool can change; finished greedy rows pad),
  and the output length comes from the device state, so it is HF's.
- Sampling runs the same step eagerly (its torch.Generator is not registered with the graph), and
  so does everything with use_graphs=False and on the CPU: one step function, tested on the CPU.
- A capture that fails (an op the graph cannot hold) is logged, what torch leaves of it is undone
  (_undo_failed_capture), and the runner runs eagerly from then on.
- The step's logits come from a *decoder backend*, made per state by `make_decoder`: decoder.Decoder
  (torch, the kernels or their reference) by default; padfree.runtime's ONNX Runtime backend passes
  its own (an object with Decoder's attributes batch, rows, rows_per_source, step, device, vocab_size,
  ops and methods load, logits, reorder, advance). The searches (beam_search.py, sampling.py) see
  only that protocol, so there is one beam search and one greedy/sampling step for every backend.
"""
from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from .beam_search import BeamSearch
from .decoder import Decoder, seqlen_bucket, token_bucket
from .encoder import PackedSources
from .encoder_graph import EncoderGraph
from .options import GenerationOptions
from .sampling import SingleSearch

__all__ = ["DecodeState", "Runner", "state_key", "step_times"]

log = logging.getLogger(__name__)


def _undo_failed_capture(device: torch.device, pool, stream: torch.cuda.Stream) -> None:
    """What torch leaves behind when a capture fails inside torch.cuda.graph: its capture_end raises at
    cudaStreamEndCapture, before it ends the allocator's recording into `pool` and takes the device's
    default CUDA generator out of graph mode, and the context's exit never restores the current stream.
    Left so, the generator's next offset increment outside a capture raises ("Offset increment outside
    graph capture encountered unexpectedly", in any later random op of the process) and a capture into
    `pool` fails at its start. This ends the recording, gives the generator a copy of its state (the
    same seed and offset, not in a capture) and makes `stream` current again."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    end_recording = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end_recording is not None:
        try:
            end_recording(index, pool)
        except Exception:  # noqa: BLE001 - the recording had ended (a capture that failed later than that)
            pass
    torch.cuda.set_stream(stream)
    try:
        generator = torch.cuda.default_generators[index]
        generator.graphsafe_set_state(generator.clone_state())
    except Exception as e:  # noqa: BLE001 - best effort: say what may follow instead of failing this call
        log.warning("padfree.generation: the CUDA generator could not be taken out of the failed capture "
                    "(%s: %s); random ops on cuda:%d may fail from now on", type(e).__name__, e, index)


def _timing_event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def step_times(marks: list) -> list[float]:
    """ms of each step timed by Runner.step_marks (waits for the last one): the GPU time between
    consecutive marks, each step's end to the next's, with the first from the loop's start."""
    if len(marks) < 2:
        return []
    marks[-1].synchronize()
    return [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]


def state_key(sources: PackedSources, options: GenerationOptions) -> tuple:
    return (sources.batch, token_bucket(sources.total_tokens), seqlen_bucket(sources.max_seqlen), options.step_key)


class DecodeState:
    """One bucket's decoder state, search state and (on CUDA) captured step; `encoder`, where the
    decoder is padfree's on CUDA, runs the encoder into it (encoder_graph.py)."""

    def __init__(self, decoder: Decoder, search: BeamSearch | SingleSearch, device: torch.device,
                 encoder: EncoderGraph | None = None):
        self.decoder, self.search, self.encoder = decoder, search, encoder
        self.graph: torch.cuda.CUDAGraph | None = None
        self.capture_failed = False
        self.cuda = device.type == "cuda"
        if self.cuda:
            # pinned flags and events, allocated once: cudaHostAlloc is slow
            self.flags = torch.zeros(2, 1, dtype=torch.bool, pin_memory=True)
            self.events = [torch.cuda.Event(), torch.cuda.Event()]


class Runner:
    """The states of one generator and the decode loop."""

    def __init__(self, weights, ops, device: torch.device, use_graphs: bool = True, max_states: int = 4,
                 check_every: int = 4, *, make_decoder=None, logits_bias=None, gemm_search: str = "heuristic"):
        """weights, ops: the torch decoder's (None with make_decoder). make_decoder(batch, rows_per_source,
        capacity, tokens, max_seqlen) -> a decoder backend (default: decoder.Decoder over weights and ops,
        its output projection's GEMM chosen by gemm_search);
        logits_bias: the bias log_softmax_topk adds to its logits (default: weights.step_logits_bias;
        a backend whose logits already include it passes None)."""
        self.weights, self.ops, self.device = weights, ops, device
        if make_decoder is None:
            def make_decoder(*sizes):
                return Decoder(weights, ops, *sizes, gemm_search=gemm_search)
            logits_bias = weights.step_logits_bias
        self.make_decoder, self.logits_bias = make_decoder, logits_bias
        self.use_graphs = use_graphs
        self.max_states = max_states
        self.check_every = check_every
        self.states: OrderedDict[tuple, DecodeState] = OrderedDict()
        self.captures = 0            # step graphs captured so far (a reused bucket adds none)
        self._pool = None
        # a list to time the decode steps on CUDA (bench/generate.py): run() appends a timing event before
        # its loop's first step and after each step (step_times reads them); None: no events
        self.step_marks: list | None = None

    def holds_state(self, sources: PackedSources, options: GenerationOptions) -> bool:
        """Whether a state of these sources' bucket is kept (a call on it allocates no decode buffers)."""
        return state_key(sources, options) in self.states

    def state(self, sources: PackedSources, options: GenerationOptions) -> DecodeState:
        """The bucket's state (moved to the LRU's end), created where new."""
        key = state_key(sources, options)
        state = self.states.get(key)
        if state is not None:
            self.states.move_to_end(key)
            return state
        while len(self.states) >= self.max_states:
            self.states.popitem(last=False)
        decoder = self.make_decoder(sources.batch, options.rows_per_source, options.max_length - 1,
                                    token_bucket(sources.total_tokens), seqlen_bucket(sources.max_seqlen))
        bias = self.logits_bias
        search = BeamSearch(decoder, options, bias) if options.num_beams > 1 else SingleSearch(decoder, options, bias)
        ours = self.weights is not None and isinstance(decoder, Decoder)
        encoder = EncoderGraph(self.weights, self.ops, decoder) if ours and self.device.type == "cuda" else None
        state = DecodeState(decoder, search, self.device, encoder)
        self.states[key] = state
        return state

    def clear(self) -> None:
        """Drop every state (and graph), returning their memory to torch's allocator and the device."""
        self.states.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def load(self, state: DecodeState, sources: PackedSources, encoder) -> None:
        """The state's decoder loaded with this call's sources (on the host or the device). encoder: the
        encoder's output [T, hidden], or a callable(sources on the device) returning it; a state with an
        EncoderGraph runs that instead, staged from the host or a device packer's buffers
        (inputs.DeviceSources; captured on its first call where graphs are on, replayed after)."""
        if state.encoder is None:
            if not isinstance(sources, PackedSources):
                raise ValueError("Runner.load: device-packed sources need the state's EncoderGraph")
            sources = sources.to(self.device)
            state.decoder.load(sources, encoder(sources) if callable(encoder) else encoder)
            return
        graph = state.encoder
        graph.stage(sources)
        if not self.use_graphs or graph.capture_failed:
            graph.body()
        elif graph.graph is not None:
            graph.graph.replay()
        else:   # the warm-up run is this call's encoder
            graph.graph = self._graph(graph.body, "the encoder")
            graph.capture_failed = graph.graph is None

    def _capture(self, state: DecodeState) -> int:
        """Step 0 eagerly on a side stream (the warm-up), then the step captured; returns the steps run (1)."""
        state.graph = self._graph(state.search.step, "the decode step")
        state.capture_failed = state.graph is None
        if state.graph is not None:
            self.captures += 1
        return 1

    def _graph(self, fn, what: str) -> torch.cuda.CUDAGraph | None:
        """fn() run eagerly on a side stream (the warm-up: cuBLAS handles, lazily built kernels), then
        captured into the shared pool; None (logged) where the capture fails: what torch leaves of it is
        undone and this runner captures nothing more, the call going on eagerly (the warm-up has done
        its work). Why no second attempt: an op that cannot be captured once fails every shape's
        capture, and each failure is a round of torch state to undo."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            fn()
        current.wait_stream(side)
        # The graphs share one memory pool (never replayed concurrently), but a pool handle outlives
        # its pool: once every graph captured into it is gone (clear(), or the LRU evicting the last
        # one), torch's allocator has dropped the pool and a capture into the old handle fails its
        # internal assert, leaving the bucket eager (~4x slower steps). So a capture with no live
        # graph beside it starts a fresh pool.
        live = any(s.graph is not None or (s.encoder is not None and s.encoder.graph is not None)
                   for s in self.states.values())
        if not live:  # (none before the first)
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                fn()
        except Exception as e:  # noqa: BLE001 - the call runs eagerly instead; the reason is logged
            _undo_failed_capture(self.device, self._pool, current)
            self.use_graphs = False
            log.warning("padfree.generation: capturing %s failed (%s: %s); this generator runs eagerly from "
                        "now on (CUDA graphs off)", what, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            return None
        return graph

    def run(self, state: DecodeState, max_steps: int) -> int:
        """Up to max_steps decode steps from the state's step 0, stopping (a little late) once the device
        flag says every sequence is done; returns the steps run."""
        search = state.search
        taken = 0
        graphs = (self.use_graphs and state.cuda and not search.options.do_sample and not state.capture_failed)
        if graphs and state.graph is None:
            taken = self._capture(state)
        step = state.graph.replay if graphs and state.graph is not None else search.step
        every = self.check_every
        pending = None
        checks = 0
        marks = self.step_marks if state.cuda else None
        if marks is not None:
            marks.append(_timing_event())
        while taken < max_steps:
            step()
            taken += 1
            if marks is not None:
                marks.append(_timing_event())
            if taken % every or taken >= max_steps:
                continue
            if not state.cuda:
                if bool(search.done):
                    break
                continue
            slot = checks % 2
            state.flags[slot].copy_(search.done, non_blocking=True)
            state.events[slot].record()
            checks += 1
            if pending is not None:
                state.events[pending].synchronize()     # every steps old: the GPU keeps the newer ones queued
                if bool(state.flags[pending]):
                    break
            pending = slot
        return taken
