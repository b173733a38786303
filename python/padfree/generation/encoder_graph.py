"""The encoder and the cross-attention K/V of one decode state's bucket, on device tensors only, so that
runner.py can capture them as one CUDA graph.

Why: run eagerly, the encoder is ~10 torch ops and kernel calls a layer, each a round of Python and a
launch, and at small batches the host issues them slower than the GPU runs them; the first decode step
waits for all of them. As one replay per generate() call the host cost no longer grows with depth
(docs/GENERATION.md gives the measured times).

Rules, and why:
- It runs the bucket's rows, not the call's. A replay's shapes are fixed, and a decode state already
  holds cross-attention buffers of `tokens` packed rows for every call whose sources round up to them
  (decoder.token_bucket). The rows past the sources are filler sequences of pad tokens at position 0,
  a fixed count of them per bucket, each at most the bucket's max_seqlen long (trailing ones empty):
  attention_varlen then writes every row, every row the GEMMs and LayerNorms read is finite, and no
  source attends to or from a filler. The decoder's cu_seqlens end at the sources. What it costs:
  the encoder's GEMMs run up to the bucket's rows (at least 64; past 64 tokens under 25 % more than
  the sources', token_bucket's rounding).
- On CUDA with padfree's torch decoder this body runs whether or not graphs are on (use_graphs=False
  runs it eagerly), so a graphed call and an eager one compute the same numbers; the CPU encodes the
  sources' rows only (encoder.encode).
- Its inputs are the sources' packed ids (int32) and cu_seqlens, as a device packer writes them: where
  generate() got its batch as CUDA tensors, copied from the packer's buffers (inputs.DeviceSources:
  nothing of the batch but its three sizes reaches the host); else staged from the host, two copies
  from pinned buffers (written only after the previous call's copies have read them). The bucket's ids
  (pad past the sources), the fillers' bounds and the position-table rows are the body's first work,
  on the device (bucket_from_packed, bucket_position_rows): a few small kernels in the graph instead of tens of
  torch or numpy ops on the host, where the GPU waits for them.
- The position table the body reads is the one it was made with (a fairseq table grows by
  replacement; a captured graph keeps reading the old tensor, which this object holds).
"""
from __future__ import annotations

import functools

import torch

from .decoder import Decoder, token_bucket
from .encoder import encode_rows
from .layers import ensure_position_rows, position_rows

__all__ = ["EncoderGraph", "bucket_floor", "bucket_from_packed", "bucket_position_rows", "filler_count"]


def bucket_floor(tokens: int) -> int:
    """The fewest packed tokens that token_bucket rounds up to `tokens` (a bucket's value)."""
    low, high = 1, tokens
    while low < high:
        mid = (low + high) // 2
        if token_bucket(mid) >= tokens:
            high = mid
        else:
            low = mid + 1
    return low


def filler_count(tokens: int, batch: int, max_seqlen: int) -> int:
    """Filler sequences of up to max_seqlen rows that cover a bucket of `tokens` rows past the fewest source
    tokens it holds (token_bucket's floor, and at least one token a source)."""
    return -(-(tokens - max(bucket_floor(tokens), batch)) // max_seqlen)


def bucket_from_packed(ids_in: torch.Tensor, cu_in: torch.Tensor, index: torch.Tensor, filler_offsets: torch.Tensor,
                       pad: int, ids: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
    """The encoder's inputs on a bucket's rows from a packer's output, on the tensors' device with no host
    read (the graph's first work): ids [tokens] = ids_in (int32 [tokens], the sources' tokens first) up
    to the total, pad past it; cu_seqlens = cu_in (int32 [batch + 1]) then the fillers' bounds,
    min(total + k * max_seqlen, tokens) for k = 1.. (filler_offsets: k * max_seqlen; index:
    arange(tokens), int32)."""
    batch = cu_in.shape[0] - 1
    total = cu_in[batch]
    ids.copy_(torch.where(index < total, ids_in, pad))
    cu_seqlens[:batch + 1].copy_(cu_in)
    if filler_offsets.numel():
        cu_seqlens[batch + 1:].copy_(torch.clamp_max(total + filler_offsets, ids.shape[0]))


def bucket_position_rows(weights, ids: torch.Tensor, cu_seqlens: torch.Tensor, batch: int) -> torch.Tensor:
    """int64 [tokens]: the position-table row of every bucket row (layers.position_rows: each source token
    at its position in its source; a filler row, past cu_seqlens[batch], as pad at position 0), from device
    tensors only (no host read), so that the encoder's graph computes them (the module docstring says
    why; GENERATION.md has the host times)."""
    spec, pad = weights.spec, weights.pad_token_id
    index = torch.arange(ids.shape[0], device=ids.device)
    starts = cu_seqlens.long()
    # each row's sequence: the last start at or before it (an empty sequence's start equals the next's)
    start = starts[torch.searchsorted(starts, index, right=True) - 1]
    rank = None
    if spec.positions == "fairseq":     # the sequence's non-pad tokens before the row
        nonpad = (ids != pad).long()
        before = torch.cumsum(nonpad, 0) - nonpad
        rank = before - before[start]
    rows = position_rows(spec, pad, index - start, ids, rank)
    return torch.where(index >= starts[batch], _filler_row(spec, pad), rows)


@functools.lru_cache(maxsize=None)
def _filler_row(spec, pad: int) -> int:
    """The position-table row of a filler row (pad at position 0), by position_rows' own rule; worked out
    once per family and pad id, since the eager path (use_graphs=False) builds the rows every call."""
    zero = torch.zeros(1, dtype=torch.long)
    return int(position_rows(spec, pad, zero, torch.full((1,), pad), zero))


class EncoderGraph:
    """One decode state's encoder and cross-attention K/V on its bucket's rows (module docstring)."""

    def __init__(self, weights, ops, decoder: Decoder):
        self.weights, self.ops, self.decoder = weights, ops, decoder
        spec, pad = weights.spec, weights.pad_token_id
        tokens, batch, max_seqlen = decoder.tokens, decoder.batch, decoder.max_seqlen
        self.fillers = filler_count(tokens, batch, max_seqlen)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.capture_failed = False
        device = decoder.device
        # the body's inputs, as a device packer writes them (int32 ids [>= total], the sources' cu_seqlens),
        # and what it makes of them for the encoder: the bucket's ids (pad past the sources) and cu_seqlens
        # with the fillers' bounds (bucket_from_packed)
        self.ids_in = torch.zeros(tokens, dtype=torch.int32, device=device)
        self.cu_in = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        self.ids = torch.zeros(tokens, dtype=torch.long, device=device)
        self.cu_seqlens = torch.zeros(batch + 1 + self.fillers, dtype=torch.int32, device=device)
        self._index = torch.arange(tokens, dtype=torch.int32, device=device)
        self._filler_offsets = torch.arange(1, self.fillers + 1, dtype=torch.int32, device=device) * max_seqlen
        self._staged_ids = torch.zeros(tokens, dtype=torch.int32, pin_memory=True)
        self._staged_cu = torch.zeros(batch + 1, dtype=torch.int32, pin_memory=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        ensure_position_rows(weights.encoder, spec, pad, pad + 2 + max_seqlen)
        self.positions = weights.encoder.positions

    def stage(self, sources) -> None:
        """This call's ids and cu_seqlens into the body's inputs (enqueued copies): from the host
        (PackedSources: pinned buffers, written once the previous call's copies have read them) or from a
        device packer's buffers (inputs.DeviceSources)."""
        d = self.decoder
        if sources.batch != d.batch or sources.total_tokens > d.tokens or sources.max_seqlen > d.max_seqlen:
            raise ValueError("EncoderGraph.stage: the sources do not fit this state's bucket")
        total = sources.total_tokens
        if sources.ids.is_cuda:
            self.ids_in[:total].copy_(sources.ids[:total])
            self.cu_in.copy_(sources.cu_seqlens[:d.batch + 1])
            return
        host = sources.host or sources
        self._copied.synchronize()
        self._staged_ids.numpy()[:total] = host.ids.numpy()
        self._staged_cu.numpy()[:] = host.cu_seqlens.numpy()
        self.ids_in.copy_(self._staged_ids, non_blocking=True)
        self.cu_in.copy_(self._staged_cu, non_blocking=True)
        self._copied.record()

    def body(self) -> None:
        """The encoder over the bucket's rows and the decoder's cross-attention K/V, cu_seqlens and step."""
        d = self.decoder
        bucket_from_packed(self.ids_in, self.cu_in, self._index, self._filler_offsets, self.weights.pad_token_id,
                           self.ids, self.cu_seqlens)
        rows = bucket_position_rows(self.weights, self.ids, self.cu_seqlens, d.batch)
        encoder_out = encode_rows(self.weights, self.ops, self.ids, rows, self.cu_seqlens, d.max_seqlen,
                                  self.positions)
        d.load_memory(encoder_out, self.cu_seqlens[:d.batch + 1])
