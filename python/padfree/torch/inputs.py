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
from ..runtime._inputs import checked_host_batch
from ..runtime._staging import aligned
from ..runtime.backends.base import Limits


@dataclass
class InputBuffer:
    """One int32 device buffer [cu_seqlens | ids | token types] and views of its leading parts.

    tokens / batch are the views' sizes. view() gives smaller views of the same memory: every bucket's
    graph reads the encoder's one buffer, so that GPU inputs can be packed before the total (and so the
    bucket) reaches the host. Host-packed inputs arrive in one copy (two with token types)."""
    flat: torch.Tensor
    ids_at: int                           # offsets in flat; cu_seqlens start at 0
    types_at: int                         # -1: the buffer has no token types region
    input_ids: torch.Tensor               # [tokens]
    token_type_ids: torch.Tensor | None   # [tokens]
    cu_seqlens: torch.Tensor              # [batch + 1]

    @classmethod
    def new(cls, tokens: int, batch: int, token_types: bool, device: torch.device) -> "InputBuffer":
        # every part starts 256-byte aligned, as TensorRT and the vectorized kernels want
        ids_at = aligned(batch + 1)
        types_at = ids_at + aligned(tokens) if token_types else -1
        flat = torch.zeros(ids_at + aligned(tokens) * (2 if token_types else 1), dtype=torch.int32, device=device)
        return cls._views(flat, ids_at, types_at, tokens, batch, token_types)

    @classmethod
    def _views(cls, flat, ids_at, types_at, tokens, batch, token_types) -> "InputBuffer":
        return cls(flat, ids_at, types_at, flat[ids_at:ids_at + tokens],
                   flat[types_at:types_at + tokens] if token_types else None, flat[:batch + 1])

    def view(self, tokens: int, batch: int, token_types: bool) -> "InputBuffer":
        """The first tokens / batch + 1 entries of each part, in the same memory."""
        if tokens > self.input_ids.shape[0] or batch >= self.cu_seqlens.shape[0] or \
                (token_types and self.token_type_ids is None):
            raise ValueError(f"an input buffer of {self.input_ids.shape[0]} tokens and "
                             f"{self.cu_seqlens.shape[0] - 1} sequences has no view of {tokens} and {batch}"
                             f"{' with token types' if token_types else ''}")
        return self._views(self.flat, self.ids_at, self.types_at, tokens, batch, token_types)

    def same_memory(self, other: "InputBuffer") -> bool:
        """Whether the two are views of one buffer (so that each part starts at the same address)."""
        return self.flat.data_ptr() == other.flat.data_ptr() and self.ids_at == other.ids_at

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
    host = checked_host_batch(input_ids, attention_mask, token_type_ids, limits)
    total, batch = len(host.input_ids), len(host.lengths)
    types = host.token_type_ids

    def fill(buf: InputBuffer) -> None:
        tokens, cap = buf.input_ids.shape[0], buf.cu_seqlens.shape[0] - 1
        pinned = buf.flat.device.type == "cuda"
        # cu_seqlens, the gap to the ids and the ids: one staged copy
        stage = torch.empty(buf.ids_at + tokens, dtype=torch.int32, pin_memory=pinned)
        a = stage.numpy()
        a[:batch + 1] = host.cu_seqlens
        a[batch + 1:cap + 1] = total  # sequences of bucket padding are empty
        a[cap + 1:buf.ids_at] = 0
        a[buf.ids_at:buf.ids_at + total] = host.input_ids  # int64 or int32 -> int32: range-checked
        a[buf.ids_at + total:] = 0  # rows of no sequence (bucket padding)
        buf.flat[:buf.ids_at + tokens].copy_(stage, non_blocking=pinned)
        if types is not None:
            stage = torch.empty(tokens, dtype=torch.int32, pin_memory=pinned)
            a = stage.numpy()
            a[:total] = types
            a[total:] = 0
            buf.token_type_ids.copy_(stage, non_blocking=pinned)

    return Batch(total, batch, int(host.lengths.max()), host.padded_width, types is not None, fill)


class DeviceInputs:
    """Padded inputs already on the GPU -> a Batch, reading back three ints instead of the tensors.

    padfree.ops.PaddedInputPacker checks every row on the device (mask values and right padding, empty
    rows, id ranges at valid positions), sums the lengths and packs straight into the encoder's input
    buffer, which every graph reads; then the host reads flags, total and longest (the one
    synchronization: the total picks the graph). Anything this route does not take (a flag, an
    over-long sequence, an unusual dtype or layout) goes the host route, which then raises with the
    exact message (padfree.runtime's rules). Measured on the H100: the host
    route spent 0.25-0.45 ms of Python and numpy per call before the graph could start, this one
    ~0.05 ms.
    """

    def __init__(self, limits: Limits, device: torch.device, ops, buffer: Callable[[int], InputBuffer]):
        """buffer(batch): the encoder's input buffer, with room for at least `batch` sequences."""
        self.limits = limits
        self.device = device
        self._ops = ops
        self._buffer = buffer
        self._packer = None  # pinned memory: made on first use
        self._packed = None  # the buffer enqueue() packed into, for finish()

    def __call__(self, input_ids, attention_mask, token_type_ids) -> Batch:
        for name, t in (("input_ids", input_ids), ("attention_mask", attention_mask),
                        ("token_type_ids", token_type_ids)):
            if t is not None and (not isinstance(t, torch.Tensor) or t.get_device() != self.device.index):
                where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
                raise InputError(f"{name}: expected a tensor on {self.device} (or on the CPU), got {where}")
        lim = self.limits
        if self._packer is None:
            vocab = INT32_MAX + 1 if lim.vocab_size is None else min(lim.vocab_size, INT32_MAX + 1)
            # a RoBERTa-style model's padding id inside a sequence is flagged by the packer's kernel
            # (PADFREE_INPUT_FORBIDDEN_ID): the host route then refuses it with its place
            forbidden = -1 if lim.position_pad_id is None else lim.position_pad_id
            self._packer = self._ops.PaddedInputPacker(self.device, vocab, lim.type_vocab_size or 0, forbidden)
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            return self._on_host(input_ids, attention_mask, token_type_ids)
        batch = input_ids.shape[0]
        packed = self._buffer(batch)
        types = packed.token_type_ids if token_type_ids is not None else None
        try:
            flags, total, longest = self._packer(input_ids, attention_mask, token_type_ids, packed.input_ids,
                                                 types, packed.cu_seqlens)
        except (InputError, KernelArgumentError):  # a dtype, layout or size the kernels do not take
            return self._on_host(input_ids, attention_mask, token_type_ids)
        return self._batch(flags, total, longest, input_ids, attention_mask, token_type_ids, packed)

    def enqueue(self, input_ids, attention_mask, token_type_ids, then=None, layout=None):
        """The packer's one C call without its read-back (PaddedInputPacker.enqueue), where the inputs
        are laid out as in an earlier call: returns that call as fn(input_ids, attention_mask,
        token_type_ids), for inputs laid out as these (then finish() reads back and makes the Batch),
        or None and nothing ran. then: a GuardedGraph over `totals`, launched in the same C call;
        work enqueued later may read `totals` on the device too. layout: the inputs' input_layout()
        where the caller has it."""
        if self._packer is None or not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            return None
        packed = self._buffer(input_ids.shape[0])
        types = packed.token_type_ids if token_type_ids is not None else None
        launch = self._packer.enqueue(input_ids, attention_mask, token_type_ids, packed.input_ids, types,
                                      packed.cu_seqlens, then, layout)
        if launch is not None:
            # finish() reads `packed` after later calls of `launch` too: they pack nowhere else (the
            # encoder keeps a launcher only while its input buffer is this one)
            self._packed = packed
        return launch

    def finish(self) -> Batch:
        """The Batch of the last enqueue(), or of the last call of the launcher it returned (raises
        InputError for bad inputs, as a call does)."""
        packer = self._packer
        inputs, packer.last_inputs = packer.last_inputs, ()  # not kept alive past the call
        return self._batch(*packer.results(), *inputs, self._packed)

    @property
    def totals(self) -> torch.Tensor | None:
        """Where enqueue() leaves flags, total and longest on the device (None before the first call)."""
        return None if self._packer is None else self._packer.totals

    def _batch(self, flags, total, longest, input_ids, attention_mask, token_type_ids, packed) -> Batch:
        lim = self.limits
        if flags or longest > min(lim.max_seqlen, lim.max_tokens) or total > lim.max_tokens:
            return self._on_host(input_ids, attention_mask, token_type_ids)
        complete = total <= packed.input_ids.shape[0]
        packer = self._packer

        def fill(buf: InputBuffer) -> None:
            if complete and buf.same_memory(packed):
                return  # packed there before the read-back
            packer.repack(input_ids, token_type_ids, buf.input_ids, buf.token_type_ids, buf.cu_seqlens)

        batch, width = input_ids.shape
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
