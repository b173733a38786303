"""From a decoding step's logits to hypotheses (kernels/decoding/): the fused bias + log-softmax +
processors + top-k over vocabularies up to 256k, and the beam reorder of the cache indirection.
Both run on torch's current stream without synchronizing."""
from __future__ import annotations

import ctypes
import functools
import math

import torch

from ._tensors import (
    InputError,
    call_kernel,
    check,
    check_aligned,
    check_float,
    check_int32,
    dtype_code,
    ptr,
    stream_handle,
)

MAX_K = 64                # kernels/decoding/logits.h: kLogitsTopkMaxK
MAX_SPECIAL_IDS = 2048    # penalty_ids and banned_ids columns together (kLogitsTopkMaxSpecialIds)
MAX_ROWS = 65535          # a grid dimension of the first stage


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def beam_reorder_cache_indir(cache_indir: torch.Tensor, parents: torch.Tensor, step: torch.Tensor,
                             out: torch.Tensor) -> torch.Tensor:
    """out[r, t] = cache_indir[parents[r], t] for t < step, out[r, step] = parents[r].

    cache_indir, out: int32 [rows, L], not overlapping (ping-pong two buffers); parents: int32 [rows]
    (each in [0, rows): a device value, clamped by the kernel); step: int32 CUDA tensor [1]. Positions
    past step are not written.
    """
    check(cache_indir, "cache_indir", dtype=torch.int32, shape=(None, None))
    rows, max_len = cache_indir.shape
    device = cache_indir.device
    if max_len < 1:
        raise InputError("cache_indir: expected a capacity L >= 1")
    check(parents, "parents", dtype=torch.int32, shape=(rows,), device=device)
    check(step, "step", dtype=torch.int32, shape=(1,), device=device)
    check(out, "out", dtype=torch.int32, shape=(rows, max_len), device=device)
    if _overlaps(out, cache_indir):
        raise InputError("out: must not overlap cache_indir (other rows still read the rows it would write)")
    if max_len % 4 == 0:  # moved as 16-byte vectors
        check_aligned(cache_indir, "cache_indir")
        check_aligned(out, "out")
    if rows:
        call_kernel("padfree_beam_reorder_cache_indir", device, ptr(cache_indir), ptr(parents), ptr(step), rows,
                    max_len, ptr(out), stream_handle(device))
    return out


@functools.lru_cache(maxsize=256)
def _workspace_bytes(rows: int, vocab: int, k: int) -> int:
    from .. import _lib
    value = ctypes.c_int64()
    _lib.call("padfree_logits_topk_workspace_size", rows, vocab, k, ctypes.byref(value))
    return value.value


def _ids(t: torch.Tensor | None, name: str, rows: int, device: torch.device) -> int:
    """Columns of an optional int32 [rows, n] id tensor (0 where None)."""
    if t is None:
        return 0
    check(t, name, dtype=torch.int32, shape=(rows, None), device=device)
    return t.shape[1]


def _flat_table(t: torch.Tensor | None, name: str, dims: int) -> torch.Tensor | None:
    """A per-step table [steps, rows(, Q)] as the rows of all its steps (checked as such by the caller)."""
    if t is None:
        return None
    if t.dim() != dims:
        raise InputError(f"{name}: with step, expected a table of {dims} dimensions, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise InputError(f"{name}: with step, the table must be contiguous")
    return t.view(-1, t.shape[2]) if dims == 3 else t.view(-1)


def log_softmax_topk(logits: torch.Tensor, k: int, bias: torch.Tensor | None = None,
                     beam_scores: torch.Tensor | None = None, banned_ids: torch.Tensor | None = None,
                     penalty_ids: torch.Tensor | None = None, repetition_penalty: float = 1.0,
                     forced_ids: torch.Tensor | None = None, out_scores: torch.Tensor | None = None,
                     out_ids: torch.Tensor | None = None, normalize: bool = True, *,
                     workspace: torch.Tensor | None = None,
                     step: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best scores of each row, with HF's processors, reading the logits once.

    Per row r: x = float(logits[r]) + float(bias); s = log_softmax(x) (s = x where normalize=False:
    HF's greedy and sampling paths process raw logits); then, in HF's order, the repetition penalty
    at penalty_ids[r] (s < 0 ? s * p : s / p, once per distinct id), -inf at banned_ids[r], and where
    forced_ids[r] >= 0, 0 at that id and -inf elsewhere; then s += beam_scores[r].

    logits:      [rows, V] float32/float16/bfloat16, V up to 256k (rows <= 65535)
    bias:        [V] logits' dtype, or None (Marian's final_logits_bias)
    beam_scores: fp32 [rows] or None
    penalty_ids, banned_ids: int32 [rows, P], [rows, Q] (-1 = unused; P + Q <= 2048), or None
    forced_ids:  int32 [rows] (-1 = not forced), or None
    step:        int32 [1] on the device, or None; given, banned_ids and forced_ids are tables over steps,
                 [steps, rows, Q] and [steps, rows], read at row step (clamped to [0, steps - 1]) by the
                 kernel itself: a captured decode step needs no gather of its step's lists
    k:           1 <= k <= min(64, V)
    Returns (scores fp32 [rows, k], ids int32 [rows, k]): descending, ties to the smaller id.
    """
    check(logits, "logits", shape=(None, None))
    dtype = dtype_code(logits, "logits")
    check_aligned(logits, "logits")
    rows, vocab = logits.shape
    device = logits.device
    if rows > MAX_ROWS:
        raise InputError(f"logits: at most {MAX_ROWS} rows, got {rows}")
    vocab = check_int32(vocab, "logits: vocabulary (last dimension)", minimum=1)
    k = check_int32(k, "k", minimum=1)
    if k > min(MAX_K, vocab):
        raise InputError(f"k: expected 1 <= k <= min({MAX_K}, vocab={vocab}), got {k}")
    check_float(bias, "bias", like=logits, shape=(vocab,), optional=True)
    check(beam_scores, "beam_scores", dtype=torch.float32, shape=(rows,), device=device, optional=True)
    num_penalty = _ids(penalty_ids, "penalty_ids", rows, device)
    num_steps = 0
    if step is not None:
        check(step, "step", dtype=torch.int32, shape=(1,), device=device)
        tables = [t for t in (banned_ids, forced_ids) if t is not None]
        if not tables:
            raise InputError("step: given without a banned_ids or forced_ids table to index")
        # each table is checked below as one step's lists of num_steps * rows rows
        banned_flat, forced_flat = _flat_table(banned_ids, "banned_ids", 3), _flat_table(forced_ids, "forced_ids", 2)
        num_steps = tables[0].shape[0]
        if num_steps < 1 or any(t.shape[0] != num_steps for t in tables):
            raise InputError("step: banned_ids [steps, rows, Q] and forced_ids [steps, rows] need the same "
                             f"number of steps >= 1, got shapes {[tuple(t.shape) for t in tables]}")
        banned_ids, forced_ids = banned_flat, forced_flat
    table_rows = rows * max(num_steps, 1)
    num_banned = _ids(banned_ids, "banned_ids", table_rows, device)
    if num_penalty + num_banned > MAX_SPECIAL_IDS:
        raise InputError(f"penalty_ids and banned_ids: at most {MAX_SPECIAL_IDS} columns together, got "
                         f"{num_penalty} + {num_banned}")
    check(forced_ids, "forced_ids", dtype=torch.int32, shape=(table_rows,), device=device, optional=True)
    if isinstance(repetition_penalty, bool) or not isinstance(repetition_penalty, (int, float)) \
            or not math.isfinite(repetition_penalty) or repetition_penalty <= 0:
        raise InputError(f"repetition_penalty: expected a finite positive number, got {repetition_penalty!r}")
    if not isinstance(normalize, bool):
        raise InputError(f"normalize: expected a bool, got {normalize!r}")
    if out_scores is None:
        out_scores = torch.empty(rows, k, dtype=torch.float32, device=device)
    check(out_scores, "out_scores", dtype=torch.float32, shape=(rows, k), device=device)
    if out_ids is None:
        out_ids = torch.empty(rows, k, dtype=torch.int32, device=device)
    check(out_ids, "out_ids", dtype=torch.int32, shape=(rows, k), device=device)
    if _overlaps(out_scores, out_ids):
        raise InputError("out_scores: must not overlap out_ids")
    if rows == 0:
        return out_scores, out_ids
    need = _workspace_bytes(rows, vocab, k)
    if workspace is None:
        workspace = torch.empty(need, dtype=torch.uint8, device=device)
    check(workspace, "workspace", dtype=torch.uint8, shape=(None,), device=device)
    check_aligned(workspace, "workspace")
    if workspace.numel() < need:
        raise InputError(f"workspace: expected at least {need} bytes, got {workspace.numel()}")
    call_kernel("padfree_logits_topk", device, ptr(logits), ptr(bias), ptr(beam_scores), ptr(penalty_ids),
                num_penalty, float(repetition_penalty), ptr(banned_ids), num_banned, ptr(forced_ids), ptr(step),
                num_steps, rows, vocab, k, int(normalize), ptr(workspace), workspace.numel(), dtype, ptr(out_scores),
                ptr(out_ids), stream_handle(device))
    return out_scores, out_ids
