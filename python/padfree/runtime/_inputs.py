"""Turns what a caller hands Runtime.run (a list of token sequences, or a padded batch with its
attention mask, as lists, numpy arrays or torch tensors) into one packed host batch, and refuses
input the kernels must never see: an id outside the vocabulary would make the embedding gather read
out of bounds, a right-padded or holed mask would pack the wrong tokens."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..ops._tensors import INT32_MAX, InputError
from . import _sequences
from .backends.base import Limits

try:
    from .. import _hostpack  # python/csrc/hostpack.cpp
except ImportError:  # built without Python's development headers: the Python path does the same work
    _hostpack = None

_INT64_MAX = np.iinfo(np.int64).max


@dataclass
class HostBatch:
    """All sequences end to end on the host.

    input_ids: int64 [T] (int32 where the compiled packer wrote it); token_type_ids: like input_ids, or
    None; lengths: int64 [B] (all >= 1); padded_width: the S that padded outputs get (the input's width
    for a padded batch, the longest sequence for a list); mask: bool [B, S] of the padded input, None
    for a list; cu_seqlens: int64 [B + 1], [0, cumsum(lengths)] (computed when not given).
    """
    input_ids: np.ndarray
    token_type_ids: np.ndarray | None
    lengths: np.ndarray
    padded_width: int
    mask: np.ndarray | None = None
    cu_seqlens: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self):
        # every run reads it (chunks, staging, outputs): computed here, where a cached_property
        # took a lock on each first read (Python 3.11)
        if self.cu_seqlens is None:
            self.cu_seqlens = np.zeros(len(self.lengths) + 1, dtype=np.int64)
            np.cumsum(self.lengths, out=self.cu_seqlens[1:])

    def locate(self, token: int) -> tuple[int, int]:
        """(sequence, position) of a packed token index, for error messages."""
        seq = int(np.searchsorted(self.cu_seqlens, token, side="right")) - 1
        return seq, int(token - self.cu_seqlens[seq])


def _to_numpy(x: Any, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.bfloat16:  # numpy has no bfloat16; only reached to refuse it below
            x = x.float()
        return x.cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x)
    except ValueError as e:  # ragged nested lists
        raise InputError(f"{name}: cannot be read as an array ({e}); a ragged batch is passed as a list of"
                         " sequences without attention_mask") from None


def _ints(x: Any, name: str) -> np.ndarray:
    """x as an int64 array; refuses floats and bools rather than rounding or reinterpreting them."""
    a = _to_numpy(x, name)
    if a.dtype.kind not in "iu":
        raise InputError(f"{name}: expected integer token ids, got dtype {a.dtype}")
    if a.dtype.kind == "u" and a.size and a.max() > _INT64_MAX:
        raise InputError(f"{name}: id {a.max()} is out of range")
    return a.astype(np.int64, copy=False)


def _is_sequence_list(batch: Any) -> bool:
    return isinstance(batch, Sequence) and not isinstance(batch, (str, bytes))


def from_sequences(batch: Sequence, token_type_ids: Sequence | None) -> HostBatch:
    if len(batch) == 0:
        raise InputError("empty batch: pass at least one sequence")
    if isinstance(batch[0], (int, np.integer)):
        raise InputError("batch: expected a list of token sequences, got a flat list of ids;"
                         " for one sequence pass [ids]")
    packed = _sequences.pack(batch)
    if packed is not None:
        ids, lengths = packed
        types = _packed_types(token_type_ids, lengths)
        if types is not False:
            return HostBatch(ids, types, lengths, int(lengths.max()))
    seqs = []
    for i, seq in enumerate(batch):
        a = _to_numpy(seq, f"sequence {i}")
        if a.ndim != 1:
            raise InputError(f"sequence {i}: expected a 1-D sequence of ids, got shape {list(a.shape)}")
        if a.size == 0:  # before the dtype check: np.asarray([]) is float64
            raise InputError(f"sequence {i} is empty: every sequence needs at least one token")
        seqs.append(_ints(a, f"sequence {i}"))
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    types = None
    if token_type_ids is not None:
        if not _is_sequence_list(token_type_ids) or len(token_type_ids) != len(seqs):
            raise InputError(f"token_type_ids: expected a list of {len(seqs)} sequences, one per input"
                             " sequence")
        types = []
        for i, t in enumerate(token_type_ids):
            a = _ints(t, f"token_type_ids[{i}]")
            if a.shape != (lengths[i],):
                raise InputError(f"token_type_ids[{i}]: expected {lengths[i]} ids like sequence {i},"
                                 f" got shape {list(a.shape)}")
            types.append(a)
        types = np.concatenate(types)
    return HostBatch(np.concatenate(seqs), types, lengths, int(lengths.max()))


def _packed_types(token_type_ids: Sequence | None, lengths: np.ndarray) -> np.ndarray | None | bool:
    """The token types packed like the ids (None where none were given), or False where the
    per-sequence path must look at them (it raises with the sequence's index)."""
    if token_type_ids is None:
        return None
    if not _is_sequence_list(token_type_ids) or len(token_type_ids) != len(lengths):
        return False
    packed = _sequences.pack(token_type_ids)
    if packed is None or not np.array_equal(packed[1], lengths):
        return False
    return packed[0]


def from_padded(input_ids: Any, attention_mask: Any | None, token_type_ids: Any | None) -> HostBatch:
    ids = _ints(input_ids, "input_ids")
    if ids.ndim != 2:
        raise InputError(f"input_ids: a padded batch is [batch, seq], got shape {list(ids.shape)};"
                         " a list of sequences is passed as a Python list")
    if ids.shape[0] == 0:
        raise InputError("empty batch: pass at least one sequence")
    if ids.shape[1] == 0:
        raise InputError("input_ids has width 0: every sequence needs at least one token")
    if attention_mask is None:
        mask = np.ones(ids.shape, dtype=bool)
        lengths = np.full(ids.shape[0], ids.shape[1], dtype=np.int64)
    else:
        mask, lengths = _mask(attention_mask, ids.shape)
    if not lengths.all():
        raise InputError(f"sequence {np.flatnonzero(lengths == 0)[0]} is empty (its attention_mask row is"
                         " all zeros)")
    types = None
    if token_type_ids is not None:
        t = _ints(token_type_ids, "token_type_ids")
        if t.shape != ids.shape:
            raise InputError(f"token_type_ids: expected shape {list(ids.shape)} like input_ids,"
                             f" got {list(t.shape)}")
        types = t.reshape(-1) if attention_mask is None else t[mask]
    packed = ids.reshape(-1) if attention_mask is None else ids[mask]
    return HostBatch(packed, types, lengths, int(ids.shape[1]), mask)


def _mask(attention_mask: Any, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(the mask as bool [B, S], its row lengths as int64 [B]); refuses values other than 0 and 1 and
    rows that are not left-aligned (ones then zeros)."""
    m = _to_numpy(attention_mask, "attention_mask")
    if m.dtype.kind not in "biu":
        raise InputError(f"attention_mask: expected an integer or bool mask, got dtype {m.dtype}")
    if m.shape != shape:
        raise InputError(f"attention_mask: expected shape {list(shape)} like input_ids, got {list(m.shape)}")
    if m.dtype.kind != "b":
        if m.view(f"u{m.itemsize}").max() > 1:  # negatives wrap to huge unsigned values
            raise InputError("attention_mask: expected only 0 and 1")
        m = m.astype(bool)
    # A row's length is where its first zero sits (argmin of a bool row; a row of ones has none). Every
    # row holds at least that many ones, so the lengths add up to the mask's count of ones exactly when
    # no row has a one after its first zero: right padding checked in two cheap passes, where row sums
    # and a comparison of neighbours took four (the host checks are on every call's path).
    first_zero = m.argmin(axis=1)
    lengths = np.where(m[:, 0] & (first_zero == 0), shape[1], first_zero)
    if int(lengths.sum()) != np.count_nonzero(m):
        bad = np.flatnonzero(m.sum(axis=1) != lengths)
        raise InputError(f"attention_mask row {bad[0]} is not left-aligned (ones then zeros); padfree needs"
                         " right padding, as tokenizers with padding_side='right' produce")
    return m, lengths


def to_host_batch(batch: Any, attention_mask: Any | None = None,
                  token_type_ids: Any | None = None) -> HostBatch:
    """One packed HostBatch from any accepted form; raises InputError for malformed input.

    A Mapping (an HF tokenizer's BatchEncoding) supplies input_ids, attention_mask and token_type_ids.
    A 2-D numpy array or torch tensor, or any batch given with an attention_mask, is a padded batch
    (no mask: every position is a token, as in HF). Any other sequence is a list of token sequences.
    """
    if isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise InputError(f"batch: a mapping needs 'input_ids', got keys {sorted(batch)}")
        for key, given in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if given is not None and batch.get(key) is not None:
                raise InputError(f"{key} given both inside the batch mapping and as an argument")
        attention_mask = attention_mask if attention_mask is not None else batch.get("attention_mask")
        token_type_ids = token_type_ids if token_type_ids is not None else batch.get("token_type_ids")
        batch = batch["input_ids"]
    if attention_mask is not None or isinstance(batch, (np.ndarray, torch.Tensor)):
        return from_padded(batch, attention_mask, token_type_ids)
    if not _is_sequence_list(batch):
        raise InputError(f"batch: expected a list of token sequences or a padded [batch, seq] array,"
                         f" got {type(batch).__name__}")
    return from_sequences(batch, token_type_ids)


def checked_host_batch(batch: Any, attention_mask: Any | None, token_type_ids: Any | None,
                       limits: Limits) -> HostBatch:
    """to_host_batch() then validate(): one packed batch within the backend's limits, or InputError.

    A list of sequences is packed by the compiled packer where it is built (padfree._hostpack: ids
    copied to int32 and checked in one pass; at 128 sequences a quarter to a third of the Python path's
    time, which converts, concatenates and checks in several passes); whatever it does not take
    (another form, or any error, which it never words) goes the Python path, which accepts the batch
    or names what is wrong."""
    host = _compiled(batch, token_type_ids, limits) if attention_mask is None else None
    if host is None:
        host = to_host_batch(batch, attention_mask, token_type_ids)
        validate(host, limits)
    return host


def _compiled(batch: Any, token_type_ids: Any | None, limits: Limits) -> HostBatch | None:
    if _hostpack is None or type(batch) not in (list, tuple):
        return None
    pad_id = -1 if limits.position_pad_id is None else limits.position_pad_id
    max_len = _longest_allowed(limits)
    packed = _hostpack.pack(batch, _id_bound(limits.vocab_size), pad_id, max_len)
    if packed is None:
        return None
    types = None
    if token_type_ids is not None:
        typed = (None if limits.type_vocab_size == 0 or type(token_type_ids) not in (list, tuple) else
                 _hostpack.pack(token_type_ids, _id_bound(limits.type_vocab_size), -1, max_len))
        if typed is None or typed[1] != packed[1]:  # cu_seqlens differ: a length differs
            return None
        types = np.frombuffer(typed[0], dtype=np.int32)
    ids, cu_seqlens, lengths, longest = packed
    return HostBatch(np.frombuffer(ids, dtype=np.int32), types, np.frombuffer(lengths, dtype=np.int64), longest,
                     cu_seqlens=np.frombuffer(cu_seqlens, dtype=np.int64))


def validate(batch: HostBatch, limits: Limits) -> None:
    """Raise InputError where the batch breaks the backend's limits (lengths and id ranges)."""
    _check_lengths(batch, limits)
    _check_range(batch, batch.input_ids, limits.vocab_size, "token id", "vocab_size")
    if limits.position_pad_id is not None:
        check_no_pad_id(batch, limits.position_pad_id)
    if batch.token_type_ids is not None:
        if limits.type_vocab_size == 0:
            raise InputError("token_type_ids given, but this model has no token type embeddings")
        _check_range(batch, batch.token_type_ids, limits.type_vocab_size, "token type id",
                     "type_vocab_size")


def _longest_allowed(limits: Limits) -> int:
    """The most tokens one sequence may have: a chunk holds at least one whole sequence."""
    return min(limits.max_seqlen, limits.max_tokens)


def _check_lengths(batch: HostBatch, limits: Limits) -> None:
    too_long = np.flatnonzero(batch.lengths > _longest_allowed(limits))
    if too_long.size:
        i = too_long[0]
        raise InputError(f"sequence {i} has {batch.lengths[i]} tokens, more than this model serves"
                         f" (max_seqlen {limits.max_seqlen}, max_tokens {limits.max_tokens});"
                         " truncate it")


def check_no_pad_id(batch: HostBatch, pad_id: int) -> None:
    """RoBERTa-style models number positions around the padding id (HF counts only other tokens, so
    every token after it moves by one); padfree numbers a sequence's tokens in order. Rather than
    answer differently from HF, a sequence holding that id is refused."""
    where = np.flatnonzero(batch.input_ids == pad_id)
    if where.size:
        seq, pos = batch.locate(int(where[0]))
        raise InputError(f"token id {pad_id} (the padding id) at sequence {seq}, position {pos}: this model numbers"
                         " positions around the padding id, so a sequence may not hold it; remove it, or mark"
                         " padding with attention_mask instead")


def _id_bound(size: int | None) -> int:
    """The exclusive upper bound of valid ids for a table of `size` rows. Ids travel to the device as
    int32: without a known table size, an id past int32 would wrap into a valid-looking one instead of
    being refused."""
    return INT32_MAX + 1 if size is None else min(size, INT32_MAX + 1)


def _check_range(batch: HostBatch, values: np.ndarray, size: int | None, what: str, limit_name: str):
    upper = _id_bound(size)
    if not values.size or (values.min() >= 0 and values.max() < upper):
        return
    where = np.flatnonzero((values < 0) | (values >= upper))
    seq, pos = batch.locate(int(where[0]))
    bound = (f"in [0, 2**31) (ids are int32; this model records no {limit_name})" if size is None
             else f"in [0, {upper}) ({limit_name})")
    raise InputError(f"{what} {values[where[0]]} at sequence {seq}, position {pos}: expected {bound}")
