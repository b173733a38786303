"""The searches' per-step bookkeeping (kernels/decoding/search.cu): beam search with Hugging Face's
rules and greedy search, one kernel each per step, on torch's current stream without synchronizing.
The state tensors are the caller's (padfree.generation's BeamSearch / SingleSearch), updated in place."""
from __future__ import annotations

import ctypes
import functools
import math

import torch

from ._tensors import InputError, call_kernel, check, check_aligned, ptr, stream_handle

MAX_BEAMS = 16   # kernels/decoding/search.h: kBeamSearchMaxBeams
MAX_KEEP = 64    # kBeamSearchMaxKeep (= the top-k kernel's largest k)
EARLY_STOPPING = {False: 0, True: 1, "never": 2}


@functools.lru_cache(maxsize=64)
def beam_search_workspace(batch: int, num_beams: int, max_length: int, indir_len: int) -> tuple[int, int]:
    """(bytes, offset of the 16 counter bytes that must be zero before the first step)."""
    from .. import _lib
    nbytes, offset = ctypes.c_int64(), ctypes.c_int64()
    _lib.call("padfree_beam_search_workspace_size", batch, num_beams, max_length, indir_len, ctypes.byref(nbytes),
              ctypes.byref(offset))
    return nbytes.value, offset.value


def new_beam_search_workspace(batch: int, num_beams: int, max_length: int, indir_len: int,
                              device: torch.device) -> torch.Tensor:
    """A zeroed workspace for beam_search_step (the kernel keeps its counters zero between steps)."""
    nbytes, _ = beam_search_workspace(batch, num_beams, max_length, indir_len)
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)


def beam_search_step(cand_scores: torch.Tensor, cand_ids: torch.Tensor, eos_ids: torch.Tensor | None,
                     running: torch.Tensor, running_scores: torch.Tensor, pool: torch.Tensor,
                     pool_scores: torch.Tensor, pool_lengths: torch.Tensor, pool_finished: torch.Tensor,
                     improvable: torch.Tensor, done: torch.Tensor, next_tokens: torch.Tensor, parents: torch.Tensor,
                     step: torch.Tensor, *, length_penalty: float, early_stopping: bool | str,
                     workspace: torch.Tensor, cache_indir: torch.Tensor | None = None) -> None:
    """One step of HF's beam search for every source (padfree.h: padfree_beam_search_step).

    cand_scores fp32 / cand_ids int32 [batch * num_beams, keep] (log_softmax_topk's output, the running
    scores added); running, pool int64 [batch, num_beams, max_length]; running_scores, pool_scores fp32
    [batch, num_beams]; pool_lengths int64 [batch, num_beams]; pool_finished bool [batch, num_beams] and
    improvable bool [batch] (or both int32 0/1, as PadfreeBeamSearchStep carries them); done bool [1];
    next_tokens int64 [rows]; parents int32 [rows]; step int32 [1]; eos_ids int32 [n] or None;
    cache_indir int32 [rows, L >= max_length - 1] or None: reordered in place, and then the step is
    advanced too (a caller without an indirection reorders and advances itself).
    """
    check(running, "running", dtype=torch.int64, shape=(None, None, None))
    batch, beams, max_length = running.shape
    device = running.device
    rows = batch * beams
    if not 1 <= beams <= MAX_BEAMS:
        raise InputError(f"running: num_beams must be in [1, {MAX_BEAMS}], got {beams}")
    if max_length < 2:
        raise InputError(f"running: max_length must be >= 2, got {max_length}")
    check(cand_scores, "cand_scores", dtype=torch.float32, shape=(rows, None), device=device)
    keep = cand_scores.shape[1]
    if not beams <= keep <= MAX_KEEP:
        raise InputError(f"cand_scores: keep must be in [num_beams, {MAX_KEEP}], got {keep}")
    check(cand_ids, "cand_ids", dtype=torch.int32, shape=(rows, keep), device=device)
    check(eos_ids, "eos_ids", dtype=torch.int32, shape=(None,), device=device, optional=True)
    check(pool, "pool", dtype=torch.int64, shape=(batch, beams, max_length), device=device)
    for t, name in ((running_scores, "running_scores"), (pool_scores, "pool_scores")):
        check(t, name, dtype=torch.float32, shape=(batch, beams), device=device)
    check(pool_lengths, "pool_lengths", dtype=torch.int64, shape=(batch, beams), device=device)
    # flags as torch.bool, or int32 0/1 as the TensorRT plugin carries them (both the same type)
    check(pool_finished, "pool_finished", dtype=(torch.bool, torch.int32), shape=(batch, beams), device=device)
    check(improvable, "improvable", dtype=pool_finished.dtype, shape=(batch,), device=device)
    check(done, "done", dtype=torch.bool, shape=(1,), device=device)
    check(next_tokens, "next_tokens", dtype=torch.int64, shape=(rows,), device=device)
    check(parents, "parents", dtype=torch.int32, shape=(rows,), device=device)
    check(step, "step", dtype=torch.int32, shape=(1,), device=device)
    check(cache_indir, "cache_indir", dtype=torch.int32, shape=(rows, None), device=device, optional=True)
    indir_len = 0 if cache_indir is None else cache_indir.shape[1]
    if cache_indir is not None and indir_len < max_length - 1:
        raise InputError(f"cache_indir: expected at least max_length - 1 = {max_length - 1} columns, got {indir_len}")
    if early_stopping not in EARLY_STOPPING or isinstance(early_stopping, int) and not isinstance(early_stopping, bool):
        raise InputError(f"early_stopping: expected True, False or 'never', got {early_stopping!r}")
    if not isinstance(length_penalty, (int, float)) or not math.isfinite(length_penalty):
        raise InputError(f"length_penalty: expected a finite number, got {length_penalty!r}")
    check(workspace, "workspace", dtype=torch.uint8, shape=(None,), device=device)
    check_aligned(workspace, "workspace")
    need, _ = beam_search_workspace(batch, beams, max_length, indir_len)
    if workspace.numel() < need:
        raise InputError(f"workspace: expected at least {need} bytes, got {workspace.numel()}")
    if batch == 0:
        return
    num_eos = 0 if eos_ids is None else eos_ids.numel()
    call_kernel("padfree_beam_search_step", device, ptr(cand_scores), ptr(cand_ids), keep,
                ptr(eos_ids) if num_eos else None, num_eos, ptr(running), ptr(running_scores), ptr(pool),
                ptr(pool_scores), ptr(pool_lengths), ptr(pool_finished), ptr(improvable),
                pool_finished.element_size(), ptr(done), ptr(next_tokens), ptr(parents), ptr(cache_indir),
                indir_len, ptr(step), batch, beams, max_length, float(length_penalty),
                EARLY_STOPPING[early_stopping], int(cache_indir is not None), ptr(workspace), workspace.numel(),
                stream_handle(device))


def greedy_step(cand_ids: torch.Tensor, eos_ids: torch.Tensor | None, sequences: torch.Tensor,
                next_tokens: torch.Tensor, generated: torch.Tensor, unfinished: torch.Tensor, done: torch.Tensor,
                step: torch.Tensor, *, pad_token_id: int, advance: bool = True) -> None:
    """One step of greedy search's bookkeeping (padfree.h: padfree_greedy_step).

    cand_ids int32 [rows, 1] or [rows] (the top-1 ids); sequences int64 [rows, max_length]; next_tokens,
    generated int64 [rows]; unfinished bool [rows] (or int32 0/1); done bool [1]; step int32 [1]; eos_ids
    int32 [n] or None (no eos: rows never finish)."""
    check(sequences, "sequences", dtype=torch.int64, shape=(None, None))
    rows, max_length = sequences.shape
    device = sequences.device
    if max_length < 2:
        raise InputError(f"sequences: max_length must be >= 2, got {max_length}")
    check(cand_ids, "cand_ids", dtype=torch.int32, device=device)
    if cand_ids.numel() != rows:
        raise InputError(f"cand_ids: expected {rows} ids (one per row), got {cand_ids.numel()}")
    check(eos_ids, "eos_ids", dtype=torch.int32, shape=(None,), device=device, optional=True)
    for t, name in ((next_tokens, "next_tokens"), (generated, "generated")):
        check(t, name, dtype=torch.int64, shape=(rows,), device=device)
    # flags as torch.bool, or int32 0/1 as PadfreeGreedyStep carries them
    check(unfinished, "unfinished", dtype=(torch.bool, torch.int32), shape=(rows,), device=device)
    check(done, "done", dtype=torch.bool, shape=(1,), device=device)
    check(step, "step", dtype=torch.int32, shape=(1,), device=device)
    if rows == 0:
        return
    num_eos = 0 if eos_ids is None else eos_ids.numel()
    call_kernel("padfree_greedy_step", device, ptr(cand_ids), ptr(eos_ids) if num_eos else None, num_eos,
                ptr(sequences), ptr(next_tokens), ptr(generated), ptr(unfinished), unfinished.element_size(),
                ptr(done), ptr(step), rows, max_length, int(pad_token_id), int(advance), stream_handle(device))
