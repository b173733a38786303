"""A right-padded batch of integer model inputs on the GPU -> packed int32 inputs, in two calls
around one read-back of three ints (plugins/kernels/inputs.h): padded_input_stats measures and checks
every row, the caller reads the totals to size its buffers (a CUDA graph's bucket), pack_padded_inputs
writes them. The host never reads the padded tensors themselves. PaddedInputPacker is the two around
the read-back as one lean call, for a caller whose packed buffers do not depend on the total."""
from __future__ import annotations

import ctypes
import time

import torch

from .._lib import OwnedHandle
from ._tensors import InputError, call_kernel, check, check_int32, current_device, ptr, stream_handle

MASK_BYTES = {torch.bool: 1, torch.uint8: 1, torch.int32: 4, torch.int64: 8}
ID_BYTES = {torch.int32: 4, torch.int64: 8}
# the bits of stats[batch] (PADFREE_INPUT_* in padfree.h)
FLAG_NAMES = {1: "a mask value other than 0 and 1", 2: "a mask row that is not ones then zeros",
              4: "an empty sequence", 8: "a token id out of range", 16: "a token type id out of range",
              32: "the model's padding id as a token"}


def _forbidden(forbidden_id) -> int:
    if isinstance(forbidden_id, bool) or not isinstance(forbidden_id, int) or forbidden_id < -1:
        raise InputError(f"forbidden_id: expected an id >= 0, or -1 for none, got {forbidden_id!r}")
    return forbidden_id


def padded_input_stats(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       token_type_ids: torch.Tensor | None, vocab_size: int, type_vocab_size: int,
                       out: torch.Tensor | None = None, host_stats: torch.Tensor | None = None,
                       forbidden_id: int = -1) -> torch.Tensor:
    """input_ids [B, S] int32/int64, attention_mask [B, S] bool/uint8/int32/int64 or None (all tokens),
    token_type_ids [B, S] like input_ids or None -> int32 [B + 3]: seqlens [B], then the OR of the
    FLAG_NAMES bits, the total and the longest length. Ids are checked at valid positions only.
    out: an int32 [B + 3] buffer to write instead of a new one. host_stats: a pinned int32 [3] CPU
    tensor that receives a stream-ordered copy of the last three (read it after synchronizing).
    forbidden_id: an id no valid position may hold (flag 32; a RoBERTa-style model's padding id), -1: none."""
    check(input_ids, "input_ids", dtype=tuple(ID_BYTES), shape=[None, None])
    shape = list(input_ids.shape)
    check(attention_mask, "attention_mask", dtype=tuple(MASK_BYTES), shape=shape, device=input_ids.device,
          optional=True)
    check(token_type_ids, "token_type_ids", dtype=input_ids.dtype, shape=shape, device=input_ids.device,
          optional=True)
    batch, padded_seqlen = (check_int32(n, f"input_ids: {what}", minimum=1)
                            for n, what in zip(shape, ("batch", "width")))
    if out is None:
        out = torch.empty(batch + 3, dtype=torch.int32, device=input_ids.device)
    check(out, "out", dtype=torch.int32, shape=[batch + 3], device=input_ids.device)
    if host_stats is not None and not (isinstance(host_stats, torch.Tensor) and host_stats.device.type == "cpu"
                                       and host_stats.is_pinned() and host_stats.dtype == torch.int32
                                       and host_stats.shape == (3,) and host_stats.is_contiguous()):
        raise InputError("host_stats: expected a pinned, contiguous int32 CPU tensor of shape [3]")
    mask_bytes = 0 if attention_mask is None else MASK_BYTES[attention_mask.dtype]
    call_kernel("padfree_padded_input_stats", input_ids.device, ptr(attention_mask), mask_bytes, ptr(input_ids),
                ptr(token_type_ids), ID_BYTES[input_ids.dtype], batch, padded_seqlen, int(vocab_size),
                int(type_vocab_size), _forbidden(forbidden_id), ptr(out), out.data_ptr() + 4 * batch, ptr(host_stats),
                stream_handle(input_ids.device))
    return out


def pack_padded_inputs(input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, seqlens: torch.Tensor,
                       packed_ids: torch.Tensor, packed_token_type_ids: torch.Tensor | None,
                       cu_seqlens: torch.Tensor) -> None:
    """seqlens (int32 [B], from padded_input_stats) -> cu_seqlens [C + 1] (C >= B; entries past B repeat
    the total), packed_ids [>= total] int32 and packed_token_type_ids likewise where token_type_ids is
    given. Positions past the packed buffers' length are never written."""
    check(input_ids, "input_ids", dtype=tuple(ID_BYTES), shape=[None, None])
    batch, padded_seqlen = input_ids.shape
    device = input_ids.device
    check(token_type_ids, "token_type_ids", dtype=input_ids.dtype, shape=[batch, padded_seqlen], device=device,
          optional=True)
    check(seqlens, "seqlens", dtype=torch.int32, shape=[batch], device=device)
    check(packed_ids, "packed_ids", dtype=torch.int32, shape=[None], device=device)
    check(packed_token_type_ids, "packed_token_type_ids", dtype=torch.int32, shape=[packed_ids.shape[0]],
          device=device, optional=token_type_ids is None)
    check(cu_seqlens, "cu_seqlens", dtype=torch.int32, shape=[None], device=device)
    check_int32(batch, "input_ids: batch", minimum=1)
    check_int32(padded_seqlen, "input_ids: width", minimum=1)
    check_int32(cu_seqlens.shape[0] - 1, "cu_seqlens: capacity", minimum=batch)
    check_int32(packed_ids.shape[0], "packed_ids: length")
    call_kernel("padfree_pack_padded_inputs", device, input_ids.data_ptr(), ptr(token_type_ids),
                ID_BYTES[input_ids.dtype], seqlens.data_ptr(), batch, padded_seqlen, cu_seqlens.shape[0] - 1,
                packed_ids.shape[0], packed_ids.data_ptr(), ptr(packed_token_type_ids), cu_seqlens.data_ptr(),
                stream_handle(device))


def stream_synchronize(device: torch.device) -> None:
    """Wait for the current stream of `device` (one foreign call: torch's Stream object costs more)."""
    call_kernel("padfree_stream_synchronize", device, stream_handle(device))


def _layout(t):
    return None if t is None else (t.shape, t.dtype, t.get_device(), t.stride())


def input_layout(input_ids, attention_mask, token_type_ids) -> tuple:
    """What an input plan is made for: the three inputs' shapes, dtypes, devices and strides
    (AttributeError for inputs that are not tensors)."""
    return _layout(input_ids), _layout(attention_mask), _layout(token_type_ids)


class _InputPlan(OwnedHandle):
    """A padfree_input_plan (the prepare call's fixed arguments) and the seqlens buffer it writes."""
    _DESTROY = "padfree_input_plan_destroy"

    def __init__(self, seqlens: torch.Tensor, *args):
        from .. import _lib

        handle = ctypes.c_void_p()
        _lib.call("padfree_input_plan_create", *args, ctypes.byref(handle))
        self._handle, self.seqlens = handle, seqlens


class PaddedInputPacker:
    """padded_input_stats, pack_padded_inputs and the read-back of flags / total / longest, with the
    fewest host instructions: the HF-style call of padfree.torch runs these before its CUDA graph can
    start, so the GPU idles through every one.

    The first call with a given layout of its inputs (shapes, dtypes, device, strides) and packed
    buffers (the same tensor objects) runs the checked bindings above and makes an input plan for the
    layout (padfree_input_plan_create: the prepare call's other arguments, checked once); later calls
    with both skip their Python checks and make one C call with the inputs' addresses
    (padfree_input_plan_launch: padfree_prepare_padded_inputs' results, in one kernel where the batch
    is small; packing writes nothing past the packed buffers). The pack is enqueued before the
    read-back: when the total exceeds packed_ids, the buffers hold a cut batch and the caller packs
    again into larger ones with repack().
    """

    MAX_LAYOUTS = 64  # forgets them all past this (a cache, not a registry)
    RESULTS_WAIT_S = 1.0

    def __init__(self, device: torch.device, vocab_size: int, type_vocab_size: int, forbidden_id: int = -1):
        device = torch.device(device)
        if device.index is None:  # "cuda": the current device, pinned down now (the layouts record it)
            device = torch.device(device.type, torch.cuda.current_device())
        self.device = device
        self._vocab = (int(vocab_size), int(type_vocab_size), _forbidden(forbidden_id))  # the C order
        self._host = torch.empty(3, dtype=torch.int32, pin_memory=True)
        self._host_values = self._host.numpy()
        self._seqlens = torch.empty(0, dtype=torch.int32, device=self.device)
        self._last_seqlens = self._seqlens  # where the last call's lengths are (repack reads them)
        self.last_inputs: tuple = ()  # the last launch's (input_ids, attention_mask, token_type_ids)
        self._totals = torch.empty(3, dtype=torch.int32, device=self.device)
        # The packed buffers the plans were made for, kept alive (so identity is a sound test).
        self._buffers: tuple = ()
        self._plans: dict = {}  # layout of (input_ids, attention_mask, token_type_ids) -> _InputPlan

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None, packed_ids: torch.Tensor,
                 packed_token_type_ids: torch.Tensor | None, cu_seqlens: torch.Tensor) -> tuple[int, int, int]:
        """Inputs as padded_input_stats takes them, buffers as pack_padded_inputs does; synchronizes.
        Returns (flags, total, longest): FLAG_NAMES bits, the token count and the longest length."""
        from .. import _lib

        if self.enqueue(input_ids, attention_mask, token_type_ids, packed_ids, packed_token_type_ids, cu_seqlens):
            _lib.call("padfree_stream_synchronize", stream_handle(self.device))
        else:
            self._checked(input_ids, attention_mask, token_type_ids, packed_ids, packed_token_type_ids, cu_seqlens)
        flags, total, longest = self._host_values.tolist()
        return flags, total, longest

    def enqueue(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                token_type_ids: torch.Tensor | None, packed_ids: torch.Tensor,
                packed_token_type_ids: torch.Tensor | None, cu_seqlens: torch.Tensor, then=None, layout=None):
        """The one C call without the read-back, where the inputs and buffers are laid out as in an
        earlier call: returns the launcher that made it (see launcher(); its flags / total / longest
        land in `totals` on the device and are read with results()); None where they are not, and
        nothing ran (the caller then calls the packer, which checks them). then: a
        padfree.ops.GuardedGraph over `totals` to launch in the same C call, right behind. layout:
        input_layout() of the inputs where the caller has it already."""
        plan = self.plan_for(input_ids, attention_mask, token_type_ids, packed_ids, packed_token_type_ids,
                             cu_seqlens, layout)
        if plan is None:
            return None
        launch = self.launcher(plan, then)
        launch(input_ids, attention_mask, token_type_ids)
        return launch

    def plan_for(self, input_ids, attention_mask, token_type_ids, packed_ids, packed_token_type_ids, cu_seqlens,
                 layout=None):
        """The plan an earlier call made for this layout of the inputs (input_layout(), or `layout`
        where the caller has it) and these buffers, or None (plans made with other buffers are dropped)."""
        # Python of the fewest steps: it is latency in front of the GPU's first kernel
        buffers = self._buffers
        if not buffers or packed_ids is not buffers[0] or packed_token_type_ids is not buffers[1] \
                or cu_seqlens is not buffers[2]:
            self._plans.clear()  # made with other buffers (their sizes are part of the checks)
            self._buffers = ()
            return None
        if layout is None:
            try:
                layout = input_layout(input_ids, attention_mask, token_type_ids)
            except AttributeError:  # not tensors: the checked bindings say what is wrong
                return None
        plan = self._plans.get(layout)
        return plan if plan is not None and current_device() == self.device.index else None

    def launcher(self, plan, then=None):
        """The packer's C call bound to a plan (from plan_for) and a guarded graph (or None):
        fn(input_ids, attention_mask, token_type_ids) for inputs of the plan's layout, with the
        library function, handles and buffers looked up once, for a caller that launches them again
        and again (the HF-style call's speculative route: Python in front of the GPU's first
        kernel). Holds both open while it is held."""
        from .. import _lib

        name = "padfree_input_plan_launch"
        fn, values, seqlens, device = _lib.function(name), self._host_values, plan.seqlens, self.device
        plan_handle, then_handle = plan.handle, None if then is None else then.handle

        def launch(input_ids, attention_mask, token_type_ids) -> None:
            values.fill(-1)  # results() waits until all three are written
            self._last_seqlens = seqlens
            self.last_inputs = (input_ids, attention_mask, token_type_ids)
            status = fn(plan_handle, ptr(attention_mask), input_ids.data_ptr(), ptr(token_type_ids), then_handle,
                        stream_handle(device))
            if status:
                _lib.raise_for_status(name, status)

        launch.holds = (plan, then)
        return launch

    @property
    def totals(self) -> torch.Tensor:
        """int32 [3] on the device: flags, total, longest of the last enqueue(), at a fixed address."""
        return self._totals

    def results(self) -> tuple[int, int, int]:
        """(flags, total, longest) of the last enqueue(): waits for that call's GPU work only, not
        for what was enqueued behind it, by watching the pinned values the prepare step writes
        (none of them negative once written; cheaper than recording and waiting on an event). Past
        RESULTS_WAIT_S it synchronizes the stream instead, which surfaces a CUDA error if one
        kept the values from coming."""
        values = self._host_values
        deadline = None
        while True:
            flags, total, longest = values.tolist()
            if min(flags, total, longest) >= 0:
                return flags, total, longest
            if deadline is None:
                deadline = time.perf_counter() + self.RESULTS_WAIT_S
            elif time.perf_counter() > deadline:
                stream_synchronize(self.device)
                flags, total, longest = values.tolist()
                return flags, total, longest

    def _checked(self, input_ids, attention_mask, token_type_ids, packed_ids, packed_token_type_ids, cu_seqlens):
        """The checked bindings (first call with a layout); on success the layout gets a plan."""
        check(input_ids, "input_ids", dtype=tuple(ID_BYTES), shape=[None, None], device=self.device)
        batch, width = input_ids.shape
        stats = torch.empty(batch + 3, dtype=torch.int32, device=self.device)
        vocab, type_vocab, forbidden = self._vocab
        padded_input_stats(input_ids, attention_mask, token_type_ids, vocab, type_vocab, out=stats,
                           host_stats=self._host, forbidden_id=forbidden)
        seqlens = self._seqlens_for(batch)
        seqlens[:batch].copy_(stats[:batch])
        pack_padded_inputs(input_ids, token_type_ids, seqlens[:batch], packed_ids, packed_token_type_ids,
                           cu_seqlens)
        self._last_seqlens = seqlens
        stream_synchronize(self.device)
        # (plans made for other buffers were dropped by enqueue(), which always runs first)
        if len(self._plans) >= self.MAX_LAYOUTS:
            self._plans.clear()
        mask_bytes = 0 if attention_mask is None else MASK_BYTES[attention_mask.dtype]
        self._plans[(_layout(input_ids), _layout(attention_mask), _layout(token_type_ids))] = _InputPlan(
            seqlens, mask_bytes, ID_BYTES[input_ids.dtype], int(token_type_ids is not None), batch, width,
            *self._vocab, seqlens.data_ptr(), self._totals.data_ptr(), self._host.data_ptr(),
            cu_seqlens.shape[0] - 1, packed_ids.shape[0], packed_ids.data_ptr(), ptr(packed_token_type_ids),
            cu_seqlens.data_ptr())
        self._buffers = (packed_ids, packed_token_type_ids, cu_seqlens)

    def repack(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, packed_ids: torch.Tensor,
               packed_token_type_ids: torch.Tensor | None, cu_seqlens: torch.Tensor) -> None:
        """Pack the last call's inputs again, into other buffers (its seqlens are kept on the device)."""
        pack_padded_inputs(input_ids, token_type_ids, self._last_seqlens[:input_ids.shape[0]], packed_ids,
                           packed_token_type_ids, cu_seqlens)

    def _seqlens_for(self, batch: int) -> torch.Tensor:
        """A reused [>= batch] buffer: the previous call's pack, its last reader, was enqueued on this
        stream before this call's stats kernel."""
        if self._seqlens.numel() < batch:
            self._seqlens = torch.empty(2 * batch, dtype=torch.int32, device=self.device)
        return self._seqlens
