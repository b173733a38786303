"""generate()'s inputs -> validated source token lists, and the memory check before any GPU work.

Everything here runs on the host on small data (token ids), before the encoder allocates anything,
so that a bad call fails with an InputError that names what was expected and found.
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import numpy as np
import torch

from .._lib import PadfreeError
from ..ops._tensors import InputError
from .decoder import cache_bytes, token_bucket
from .dispatch import DECODE_GEMM_ROWS, FRAGMENT_STEP_ROWS
from .encoder import PackedSources
from .weights import Seq2SeqWeights

__all__ = ["source_lists", "packed_sources", "check_lengths", "check_source_lengths", "estimate_bytes",
           "free_device_bytes", "fits", "check_memory", "DeviceSources", "DevicePacker"]


def source_lists(input_ids, attention_mask=None) -> list[list[int]]:
    """The sources as lists of token ids.

    input_ids: int tensor [batch, S] (with attention_mask [batch, S] of ones then zeros: right padding,
    as the Marian/M2M100/BART tokenizers pad; without a mask every token is a source token, as HF's
    encoder-decoder generate reads it), or a list of token-id lists (no mask).
    """
    if isinstance(input_ids, (list, tuple)):
        if attention_mask is not None:
            raise InputError("attention_mask: give it with a padded input_ids tensor, not with a list of token lists")
        sources = []
        for i, source in enumerate(input_ids):
            if hasattr(source, "tolist"):
                source = source.tolist()
            if not isinstance(source, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                              for t in source):
                raise InputError(f"input_ids[{i}]: expected a list of int token ids, got {source!r:.80}")
            sources.append(list(source))
    elif isinstance(input_ids, torch.Tensor):
        ids, mask, lengths = _padded_tensor(input_ids, attention_mask)
        rows = ids.tolist()
        sources = rows if mask is None else [row[:n] for row, n in zip(rows, lengths)]
    else:
        raise InputError(f"input_ids: expected a tensor [batch, seq_len] or a list of token-id lists, got "
                         f"{type(input_ids).__name__}")
    _check_not_empty([len(s) for s in sources])
    return sources


def _padded_tensor(input_ids: torch.Tensor, attention_mask) -> tuple[np.ndarray, np.ndarray | None, list[int]]:
    """A padded input_ids tensor checked: (its ids on the host, its mask as bools or None, each row's
    length). The mask must be ones then zeros (right padding). numpy on the host: a torch op costs several
    times a numpy call's host time, and these run on every call before its first GPU work."""
    if input_ids.dim() != 2 or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise InputError(f"input_ids: expected an integer tensor [batch, seq_len], got {input_ids.dtype} "
                         f"{list(input_ids.shape)}")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor)
                                       or attention_mask.shape != input_ids.shape):
        raise InputError(f"attention_mask: expected a tensor of input_ids' shape {list(input_ids.shape)}, "
                         f"got {getattr(attention_mask, 'shape', type(attention_mask).__name__)}")
    ids = input_ids.detach().cpu().numpy()
    if attention_mask is None:
        return ids, None, [ids.shape[1]] * ids.shape[0]
    mask = attention_mask.detach().cpu().numpy() != 0
    lengths = mask.sum(axis=1)
    prefix = np.arange(mask.shape[1])[None, :] < lengths[:, None]
    if not np.array_equal(mask, prefix):
        row = int(np.flatnonzero((mask != prefix).any(axis=1))[0])
        raise InputError(f"attention_mask: row {row} is not ones followed by zeros; padfree packs right-padded "
                         f"inputs (tokenizer padding_side='right'); left padding shifts HF's positions")
    return ids, mask, lengths.tolist()


def _check_not_empty(lengths: list[int]) -> None:
    if not lengths:
        raise InputError("input_ids: the batch is empty; give at least one source")
    for i, n in enumerate(lengths):
        if n == 0:
            raise InputError(f"input_ids[{i}]: the source is empty (no token; an all-zero attention_mask row); every "
                             f"source needs at least one token")


def packed_sources(input_ids, attention_mask, weights: Seq2SeqWeights, max_length: int) -> PackedSources:
    """source_lists, check_lengths and PackedSources.from_lists in one: the sources packed on the host
    (the same checks and messages). A padded tensor is packed by its mask (`ids[mask]`: the rows'
    prefixes in order) and checked on the packed ids, without a Python list per source: on the device
    machines' hosts the lists took 140-220 us of a call before its first GPU work."""
    if not isinstance(input_ids, torch.Tensor):
        sources = source_lists(input_ids, attention_mask)
        check_lengths(sources, weights, max_length)
        return PackedSources.from_lists(sources, "cpu")
    ids, mask, lengths = _padded_tensor(input_ids, attention_mask)
    _check_not_empty(lengths)
    packed = (ids.reshape(-1) if mask is None else ids[mask]).astype(np.int64)
    ends = list(itertools.accumulate(lengths))
    low, high = int(packed.min()), int(packed.max())
    vocab = weights.source_vocab_size
    if low < 0 or high >= vocab:        # the first source holding an id outside, named as check_lengths names it
        i = bisect.bisect_right(ends, int(np.flatnonzero((packed < 0) | (packed >= vocab))[0]))
        source = packed[ends[i] - lengths[i]:ends[i]]
        _check_vocab(i, int(source.min()), int(source.max()), vocab)
    _check_positions(lengths, weights.encoder.max_positions, weights.decoder.max_positions, max_length)
    return PackedSources(torch.from_numpy(packed), torch.tensor([0, *ends], dtype=torch.int32), lengths)


@dataclass
class DeviceSources:
    """A padded batch packed on its device (DevicePacker): ids int32 [>= total_tokens] and cu_seqlens int32
    [>= batch + 1] there (a packer's buffers, valid until its next call), the sizes on the host."""
    ids: torch.Tensor
    cu_seqlens: torch.Tensor
    batch: int
    total_tokens: int
    max_seqlen: int


class DevicePacker:
    """A generator's route for a padded batch already on its CUDA device: padfree.ops.PaddedInputPacker checks
    every row there (mask values and right padding, empty rows, ids within the source vocabulary) and packs
    into buffers of its own; the host reads back flags, total and longest, not the batch. Where the
    routine host checks would have something to say (a flag, a source longer than the position table), or
    the packer does not take the tensors (their dtype or layout), it returns None and generate() takes the
    host route (packed_sources), which raises with the exact message or packs what the packer refused.
    Why: the host route reads both tensors back and checks and packs them in Python, ~0.5-1 ms of a call
    on the device machines' hosts before the GPU's first work (docs/KERNELS.md)."""

    def __init__(self, weights: Seq2SeqWeights, device: torch.device):
        self.weights, self.device = weights, device
        self._packer = None
        self._ids = torch.empty(0, dtype=torch.int32, device=device)
        self._cu = torch.empty(1, dtype=torch.int32, device=device)

    def __call__(self, input_ids, attention_mask, max_length: int) -> DeviceSources | None:
        if not (isinstance(input_ids, torch.Tensor) and input_ids.is_cuda and input_ids.dim() == 2
                and input_ids.device == self.device and input_ids.numel() > 0):
            return None
        if attention_mask is not None and not (isinstance(attention_mask, torch.Tensor)
                                               and attention_mask.device == input_ids.device
                                               and attention_mask.shape == input_ids.shape):
            return None
        batch, width = input_ids.shape
        if self._ids.numel() < batch * width or self._cu.numel() < batch + 1:
            # room for every position of the largest batch yet, so a pack is never cut (a new buffer also
            # drops the packer's plans, made for the old one)
            self._ids = torch.empty(max(batch * width, 2 * self._ids.numel()), dtype=torch.int32, device=self.device)
            self._cu = torch.empty(max(batch + 1, 2 * self._cu.numel()), dtype=torch.int32, device=self.device)
        try:
            if self._packer is None:
                from ..ops.inputs import PaddedInputPacker
                self._packer = PaddedInputPacker(self.device, self.weights.source_vocab_size, 0)
            flags, total, longest = self._packer(input_ids, attention_mask, None, self._ids, None, self._cu)
        except (InputError, PadfreeError):    # a dtype, layout or size the kernels do not take
            return None
        limit = self.weights.encoder.max_positions
        if flags or (limit is not None and longest > limit):
            return None
        _check_positions([longest], limit, self.weights.decoder.max_positions, max_length)
        return DeviceSources(self._ids, self._cu, batch, total, longest)


def padded_batch(sources: list[list[int]], pad: int, device: str | torch.device = "cpu"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """HF-style right-padded input_ids and attention_mask (int64 [batch, longest]) of token lists: what
    HF's generate takes, the inverse of source_lists."""
    width = max(map(len, sources))
    ids = torch.full((len(sources), width), pad, dtype=torch.long)
    mask = torch.zeros(len(sources), width, dtype=torch.long)
    for i, s in enumerate(sources):
        ids[i, :len(s)], mask[i, :len(s)] = torch.tensor(s, dtype=torch.long), 1
    return ids.to(device), mask.to(device)


def check_lengths(sources: list[list[int]], weights: Seq2SeqWeights, max_length: int) -> None:
    """Token ids inside the source vocabulary, sources and the decoder within their position tables."""
    check_source_lengths(sources, weights.source_vocab_size, weights.encoder.max_positions,
                         weights.decoder.max_positions, max_length)


def check_source_lengths(sources: list[list[int]], vocab: int, encoder_positions: int | None,
                         decoder_positions: int | None, max_length: int) -> None:
    """check_lengths from the sizes alone (a backend without torch weights: padfree.runtime's ONNX
    Runtime generator). A position limit of None: the table grows on demand (no limit)."""
    for i, source in enumerate(sources):
        _check_vocab(i, min(source), max(source), vocab)
    _check_positions([len(s) for s in sources], encoder_positions, decoder_positions, max_length)


def _check_vocab(i: int, low: int, high: int, vocab: int) -> None:
    """Source i's smallest and largest id inside [0, vocab)."""
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise InputError(f"input_ids[{i}]: token id {bad} is outside the vocabulary [0, {vocab})")


def _check_positions(lengths: list[int], encoder_positions: int | None, decoder_positions: int | None,
                     max_length: int) -> None:
    """The sources (their lengths) and max_length within the encoder's and the decoder's position tables."""
    limit = encoder_positions
    longest = max(lengths)
    if limit is not None and longest > limit:
        i = lengths.index(longest)
        raise InputError(f"input_ids[{i}]: {longest} tokens, but the model's position table holds {limit} "
                         f"(max_position_embeddings); truncate the source")
    limit = decoder_positions
    if limit is not None and max_length - 1 > limit:
        raise InputError(f"max_length={max_length}: the decoder reads positions up to {max_length - 2}, but its "
                         f"position table holds {limit} (max_position_embeddings); lower max_new_tokens/max_length")


def estimate_bytes(weights: Seq2SeqWeights, batch: int, total_tokens: int, max_seqlen: int, rows: int,
                   capacity: int, fragment_rows: int = FRAGMENT_STEP_ROWS) -> int:
    """An upper estimate of the device memory one generate() call allocates besides the weights: K/V caches,
    the packed cross-attention memory, encoder activations, one step's logits and their fp32 copies, and
    (once, at up to fragment_rows rows: DecoderOps.fragment_step_rows) the layers' weights in fragment order,
    or (once, pre-LN at DECODE_GEMM_ROWS) the LayerNorm-folded copies decode_gemm reads.
    The packed rows are the decode state's bucket (token_bucket), which the memory and, on CUDA, the
    encoder's graph hold."""
    element = torch.empty((), dtype=weights.dtype).element_size()
    hidden = weights.decoder.hidden
    layers = len(weights.decoder.layers)
    ffn = max(layer.ffn.fc1_weight.shape[0] for layer in weights.encoder.layers + weights.decoder.layers)
    vocab = weights.target_vocab_size
    caches = cache_bytes(weights, rows, capacity)
    tokens = token_bucket(total_tokens)
    memory = layers * tokens * 2 * hidden * element
    encoder = tokens * (3 * hidden + ffn + 2 * hidden) * element * 2
    attention = batch * weights.encoder.num_heads * max_seqlen * max_seqlen * 4 * 2
    step = rows * vocab * (element + 4 * 4) + rows * (3 * hidden + ffn) * element * 2
    # a few-row step's first call lays the layers' weights out in fragment order (weights.fragments), once
    fragments = 0
    if rows <= fragment_rows and weights.fragments is None and element == 2:
        fragments = sum(w.numel() * element for w in weights.step_linear_weights())
    # a pre-LN step of DECODE_GEMM_ROWS folds the LayerNorms into copies of the weights after them
    # (weights.folded: QKV, cross Q, fc1, and their column sums in float32), once; counted wherever it may
    # (past 64 rows the device's grid rule decides: DecoderOps.decode_gemm_layers)
    folded = 0
    if (DECODE_GEMM_ROWS[0] <= rows <= DECODE_GEMM_ROWS[1] and weights.spec.pre_ln and weights.folded is None
            and element == 2):
        folded = sum(w.numel() * element + w.shape[0] * 4 for layer in weights.decoder.layers
                     for w in (layer.self_attn.qkv_weight, layer.cross_attn.q_weight, layer.ffn.fc1_weight))
    return caches + memory + encoder + attention + step + fragments + folded


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory on a CUDA device (None on the CPU: no check there)."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[0]


def fits(needed: int, free: int | None) -> bool:
    return free is None or needed <= 0.9 * free


def check_memory(needed: int, device: torch.device, free: int | None) -> None:
    if not fits(needed, free):
        raise InputError(f"this call needs about {needed / 2**30:.2f} GiB on {device} (K/V caches, cross-attention "
                         f"memory, activations) but {free / 2**30:.2f} GiB is free; lower the batch, num_beams or "
                         f"max_new_tokens")
