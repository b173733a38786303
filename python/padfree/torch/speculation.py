"""Speculative launches of a PadfreeEncoder's HF-style call on GPU inputs (padfree.torch.encoder).

Inputs shaped as an earlier call's launch that call's graph before their token count reaches the
host, behind a device-side guard (padfree.ops.GuardedGraph) that runs it only where the batch fits
the graph's bucket; the host then reads the totals back and serves or executes the batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .._lib import PadfreeError
from ..ops.inputs import input_layout
from .buckets import Bucket, bucket_for, round_seqlen, round_tokens
from .capture import _Graph
from .inputs import Batch, InputBuffer

GUESSES = 64  # padded input shapes whose last graph is remembered for speculative launches


@dataclass
class _Route:
    """A speculative call's way from its inputs' layout to the packer's C call (_speculate). Valid
    while the encoder's input buffer is `inputs` (the plan packs into it) and its graph LRU holds
    `graph` for `bucket`. It holds the graph, so the encoder drops it wherever the LRU may evict one
    (a capture, clear_graphs): an evicted graph is released as ever."""
    layout: tuple                           # padfree.ops.inputs.input_layout of the inputs
    bucket: Bucket
    graph: _Graph
    launch: Callable                        # the packer's C call for the layout (DeviceInputs.enqueue)
    inputs: InputBuffer


def _preimage(rounding, rounded: int, high: int) -> tuple[int, int]:
    """The inclusive range [low, high] of n with rounding(n) == rounded, for a non-decreasing
    rounding with rounding(high) == rounded (binary search for low)."""
    low, top = 1, high
    while low < top:
        mid = (low + top) // 2
        if rounding(mid) < rounded:
            low = mid + 1
        else:
            top = mid
    return low, high




class Speculation:
    """PadfreeEncoder's speculative launches (_speculate) and the guesses and routes behind them."""

    def _speculate(self, input_ids, attention_mask, token_type_ids):
        """For GPU inputs shaped as an earlier call's: enqueue the packing, then that call's graph
        behind a guard that runs it only if this batch fits its bucket (padfree.ops.GuardedGraph),
        then read the totals back. Returns (batch, outputs): outputs where the graph ran; batch alone
        where it was skipped (the inputs are validated and packed: the caller executes it); (None, None)
        where nothing was enqueued. Bad inputs raise InputError (their flags skipped the graph).

        The GPU idles through this Python until the packer's C call, so inputs laid out as the last
        speculative call's take its _Route there: one layout comparison and two identity checks
        instead of the guess, graph, buffer and plan lookups, then a launcher bound to the plan and
        the guarded graph (~2 us less than the lookups' way to the C call). H100 machines: the C
        call 9.9 us into the call with the route, 29 us through the lookups on a slower host; in one
        process, calls alternating with an encoder whose route is dropped, 1x128 392-393 us against
        394-396, 16x256 1089-1098 against 1092-1104."""
        try:
            layout = input_layout(input_ids, attention_mask, token_type_ids)
        except AttributeError:  # not tensors: the ordinary call says what is wrong
            return None, None
        route = self._route
        if route is not None and layout == route.layout and route.inputs is self._inputs \
                and self._graphs.holds(route.bucket, route.graph):
            route.launch(input_ids, attention_mask, token_type_ids)
            return self._speculated(route.graph, route.graph.guarded)
        self._route = None
        bucket = self._guesses.get(self._guess_key(input_ids, token_type_ids))
        g = None if bucket is None else self._graphs.get(bucket)
        if g is None:  # no guess, or its graph was evicted since
            return None, None
        guarded = self._guarded(g)
        launch = None if guarded is None else \
            self._device_inputs.enqueue(input_ids, attention_mask, token_type_ids, guarded, layout)
        if launch is None:
            return None, None
        self._route = _Route(layout, bucket, g, launch, self._inputs)
        return self._speculated(g, guarded)

    def _speculated(self, g: _Graph, guarded):
        """_speculate's read-back, after its launch."""
        batch = self._device_inputs.finish()
        if guarded.fits(0, batch.total_tokens, batch.max_seqlen):
            return batch, self._served(g, batch)
        self._route = None  # the caller remembers the bucket this batch needed
        return batch, None

    def _guess_key(self, input_ids, token_type_ids):
        if not self.use_graphs or not isinstance(input_ids, torch.Tensor) or not input_ids.is_cuda:
            return None
        return input_ids.shape, token_type_ids is not None

    def _remember(self, input_ids, token_type_ids, batch: Batch) -> None:
        key = self._guess_key(input_ids, token_type_ids)
        if key is not None:
            self._guesses.put(key, bucket_for(batch.total_tokens, batch.batch, batch.max_seqlen,
                                              self.weights.max_seqlen, batch.token_types))

    def _guarded(self, g: _Graph):
        """g's GuardedGraph over the packer's totals, made on first use: it runs for exactly the
        batches (of the guessed shape) that bucket_for maps to g's bucket, so a speculative call runs
        the graph an ordinary call would. None where it cannot be made (a torch without keep_graph,
        a driver without conditional graph nodes)."""
        if g.guarded is None:
            totals, lim, b = self._device_inputs.totals, self.limits, g.bucket
            cap = self.weights.max_seqlen
            try:
                g.guarded = False if totals is None else self._ops.GuardedGraph(
                    g.graph, totals, _preimage(round_tokens, b.tokens, min(b.tokens, lim.max_tokens)),
                    _preimage(lambda n: round_seqlen(n, cap), b.max_seqlen,
                              min(b.max_seqlen, lim.max_seqlen, lim.max_tokens)))
            except (PadfreeError, RuntimeError, AttributeError):
                g.guarded = False
        return g.guarded or None
