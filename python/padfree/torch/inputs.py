"""HF-style inputs -> validated packed inputs for PadfreeEncoder, written straight into the int32
buffer the forward reads (a graph's static inputs, or a fresh one when running eagerly).

Two routes, one set of rules and messages (padfree.runtime's host validation):
- host inputs (CPU tensors, numpy, lists, a list of sequences): validated and packed on the host,
  then one asynchronous copy from pinned memory; no synchronization.
- inputs already on the GPU: checked and measured there, the total read back (the one
  synchronization: the token count must reach the host to pick the graph), packed there (DeviceInputs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .._lib import KernelArgumentError
from ..ops._tensors import INT32_MAX, InputError
from ..runtime._inputs import to_host_batch, validate
from ..runtime._staging import aligned
from ..runtime.backend import Limits


@dataclass
class InputBuffer:
    """One int32 device buffer [ids | token types | cu_seqlens] and its views, so that host-packed
    inputs arrive in one copy. tokens/batch are its capacity (a bucket's, or a batch's exact size)."""
    flat: torch.Tensor
    input_ids: torch.Tensor               # [tokens]
    token_type_ids: torch.Tensor | None   # [tokens]
    cu_seqlens: torch.Tensor              # [batch + 1]

    @staticmethod
    def layout(tokens: int, batch: int, token_types: bool) -> tuple[int, int, int]:
        """(types offset or -1, cu_seqlens offset, total size) in elements; ids start at 0."""
        # every part starts 256-byte aligned, as TensorRT and the vectorized kernels want
        types_at = aligned(tokens) if token_types else -1
        cu_at = aligned(tokens) * (2 if token_types else 1)
        return types_at, cu_at, cu_at + batch + 1

    @classmethod
    def new(cls, tokens: int, batch: int, token_types: bool, device: torch.device) -> "InputBuffer":
        types_at, cu_at, size = cls.layout(tokens, batch, token_types)
        flat = torch.zeros(size, dtype=torch.int32, device=device)
        return cls(flat, flat[:tokens], flat[types_at:types_at + tokens] if token_types else None,
                   flat[cu_at:cu_at + batch + 1])

    def pad_batch(self, batch: int, tokens: int) -> None:
        """Sequences past `batch` (bucket padding) get length 0: cu_seqlens repeats its last value."""
        if self.cu_seqlens.shape[0] > batch + 1:
            self.cu_seqlens[batch + 1:].fill_(tokens)


@dataclass
class Batch:
    """A validated batch: its sizes, and fill(buffer) writing it into an InputBuffer."""
    total_tokens: int
    batch: int
    max_seqlen: int
    padded_width: int                   # S of the padded outputs
    token_types: bool
    fill: Callable[[InputBuffer], None]


def from_host(input_ids: Any, attention_mask: Any, token_type_ids: Any, limits: Limits) -> Batch:
    host = to_host_batch(input_ids, attention_mask, token_type_ids)
    validate(host, limits)
    total, batch = len(host.input_ids), len(host.lengths)
    types = host.token_type_ids

    def fill(buf: InputBuffer) -> None:
        tokens, cap = buf.input_ids.shape[0], buf.cu_seqlens.shape[0] - 1
        types_at, cu_at, size = InputBuffer.layout(tokens, cap, types is not None)
        pinned = buf.flat.device.type == "cuda"
        stage = torch.empty(size, dtype=torch.int32, pin_memory=pinned)
        a = stage.numpy()
        a[:total] = host.input_ids  # int64 -> int32: validate() range-checked the ids
        a[total:tokens] = 0         # rows of no sequence (bucket padding)
        if types is not None:
            a[types_at:types_at + total] = types
            a[types_at + total:types_at + tokens] = 0
        a[cu_at:cu_at + batch + 1] = host.cu_seqlens
        a[cu_at + batch + 1:size] = total
        buf.flat.copy_(stage, non_blocking=pinned)

    return Batch(total, batch, int(host.lengths.max()), host.padded_width, types is not None, fill)


class DeviceInputs:
    """Padded inputs already on the GPU -> a Batch, reading back three ints instead of the tensors.

    padfree.ops.padded_input_stats checks every row on the device (mask values and right padding,
    empty rows, id ranges at valid positions) and sums the lengths; the host reads flags, total and
    longest (the one synchronization: the total picks the graph) and fill() packs on the device
    straight into the graph's input buffer. Anything the fast route does not take (a flag, an
    over-long sequence, an unusual dtype or layout) goes the host route, which then raises with the
    exact message (padfree.runtime's rules). Measured on the H100 (NOTES-bert.md v4): the host route
    spent 0.25-0.45 ms of Python and numpy per call before the graph could start.
    """

    def __init__(self, limits: Limits, device: torch.device, ops):
        self.limits = limits
        self.device = device
        self._ops = ops
        self._readback: torch.Tensor | None = None  # flags, total, longest: pinned on first use
        self._stats = torch.empty(0, dtype=torch.int32, device=device)

    def _stats_buffer(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """A reused [B + 3] device buffer (None for a shape padded_input_stats refuses anyway).
        Reuse is safe: the previous call's pack kernel, the last reader of its seqlens, was enqueued
        on this stream before this call's stats kernel."""
        if input_ids.dim() != 2:
            return None
        n = input_ids.shape[0] + 3
        if self._stats.numel() < n:
            self._stats = torch.empty(2 * n, dtype=torch.int32, device=self.device)
        return self._stats[:n]

    def __call__(self, input_ids, attention_mask, token_type_ids) -> Batch:
        for name, t in (("input_ids", input_ids), ("attention_mask", attention_mask),
                        ("token_type_ids", token_type_ids)):
            if t is not None and (not isinstance(t, torch.Tensor) or t.device != self.device):
                where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
                raise InputError(f"{name}: expected a tensor on {self.device} (or on the CPU), got {where}")
        lim = self.limits
        vocab = INT32_MAX + 1 if lim.vocab_size is None else min(lim.vocab_size, INT32_MAX + 1)
        if self._readback is None:
            self._readback = torch.empty(3, dtype=torch.int32, pin_memory=True)
        try:
            stats = self._ops.padded_input_stats(input_ids, attention_mask, token_type_ids, vocab,
                                                 lim.type_vocab_size or 0, out=self._stats_buffer(input_ids),
                                                 host_stats=self._readback)
        except (InputError, KernelArgumentError):  # a dtype, layout or size the kernel does not take
            return self._on_host(input_ids, attention_mask, token_type_ids)
        batch, width = input_ids.shape
        torch.cuda.current_stream(self.device).synchronize()  # the copy into _readback has landed
        flags, total, longest = self._readback.tolist()
        if flags or longest > min(lim.max_seqlen, lim.max_tokens) or total > lim.max_tokens:
            return self._on_host(input_ids, attention_mask, token_type_ids)
        ops, seqlens = self._ops, stats[:batch]

        def fill(buf: InputBuffer) -> None:
            # padded_input_stats accepted these inputs, and the buffers are the encoder's
            ops.pack_padded_inputs_prechecked(input_ids, token_type_ids, seqlens, buf.input_ids,
                                              buf.token_type_ids, buf.cu_seqlens)

        return Batch(total, batch, longest, width, token_type_ids is not None, fill)

    def _on_host(self, input_ids, attention_mask, token_type_ids) -> Batch:
        """Copied to pinned host memory, then validated and packed as host inputs (raises InputError
        for whatever the device route flagged)."""
        staged = []
        for t in (input_ids, attention_mask, token_type_ids):
            if t is None:
                staged.append(None)
                continue
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            staged.append(host)
        torch.cuda.current_stream(self.device).synchronize()
        return from_host(*staged, self.limits)
