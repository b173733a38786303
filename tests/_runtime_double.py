"""The Runtime's backend test double (ToyBackend) and its independent reference, shared by the
runtime's CPU tests (test_runtime*.py, test_run_cli.py); a tiny random BERT and its plain ONNX export
for the polygraphy tests.

ToyBackend's per-token function has an answer computed here from the unpacked sequences alone.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from padfree.runtime import Limits

VOCAB, TYPES, MAX_SEQLEN, HIDDEN = 100, 3, 24, 5


def token_value(ids, positions, types, hidden=HIDDEN):
    """out[t, h] of ToyBackend: exact in float32 for these ranges."""
    ids, positions, types = (np.asarray(x, dtype=np.float64)[..., None] for x in (ids, positions, types))
    return ids + 128.0 * positions + 16384.0 * types + 0.25 * np.arange(hidden)


def expected_sequence(ids, types=None):
    ids = np.asarray(ids)
    types = np.zeros_like(ids) if types is None else np.asarray(types)
    return token_value(ids, np.arange(len(ids)), types)


def expected_pooler(ids):
    ids = np.asarray(ids, dtype=np.float64)
    return ids.sum() + len(ids) * np.arange(HIDDEN)


class ToyBackend:
    """The backend protocol on the CPU. It checks every call against the contract, records the
    chunk sizes, and returns its outputs in one static NaN-poisoned buffer that the next call
    overwrites, as a CUDA-graph replay does: the Runtime must copy them out."""

    output_names = ["last_hidden_state", "pooler_output"]
    device = "cpu"

    def __init__(self, max_tokens=64, max_batch=8, max_seqlen=MAX_SEQLEN, type_vocab_size=TYPES,
                 position_bug=0, vocab_size=VOCAB):
        self.limits = Limits(max_tokens=max_tokens, max_batch=max_batch, max_seqlen=max_seqlen,
                             vocab_size=vocab_size, type_vocab_size=type_vocab_size, dtype=torch.float32)
        self.calls: list[tuple[int, int]] = []
        self._tokens = torch.empty(max_tokens, HIDDEN)
        self._pooled = torch.empty(max_batch, HIDDEN)
        self.position_bug = position_bug  # a wrong backend, to show the comparisons can fail

    def execute_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, stream):
        assert stream is None
        for t in (input_ids, cu_seqlens) + ((token_type_ids,) if token_type_ids is not None else ()):
            assert t.dtype == torch.int32 and t.dim() == 1 and t.is_contiguous()
        T, B = input_ids.numel(), cu_seqlens.numel() - 1
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        assert 1 <= B <= self.limits.max_batch and 1 <= T <= self.limits.max_tokens
        assert cu_seqlens[0] == 0 and cu_seqlens[-1] == T and min(lengths) >= 1
        assert max_seqlen == max(lengths) <= self.limits.max_seqlen
        if token_type_ids is not None:
            assert token_type_ids.numel() == T
        self.calls.append((B, T))
        positions = np.concatenate([np.arange(n) for n in lengths]) + self.position_bug
        types = np.zeros(T) if token_type_ids is None else token_type_ids.numpy()
        self._tokens.fill_(float("nan"))
        self._pooled.fill_(float("nan"))
        self._tokens[:T] = torch.from_numpy(token_value(input_ids.numpy(), positions, types))
        for b in range(B):
            self._pooled[b] = torch.from_numpy(expected_pooler(input_ids[cu_seqlens[b]:cu_seqlens[b + 1]].numpy()))
        return {"last_hidden_state": self._tokens[:T], "pooler_output": self._pooled[:B]}


def random_sequences(rng, batch, max_len=MAX_SEQLEN, with_edges=True, type_vocab=TYPES):
    lengths = rng.integers(1, max_len + 1, size=batch)
    if with_edges and batch >= 2:
        lengths[rng.choice(batch, 2, replace=False)] = [1, max_len]
    return ([rng.integers(0, VOCAB, size=n) for n in lengths],
            [rng.integers(0, type_vocab, size=n) for n in lengths])


def pad(seqs, width=None, fill=0):
    width = width or max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), fill, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return ids, mask


def as_numpy(x):
    return x.numpy() if isinstance(x, torch.Tensor) else x


def check_per_sequence(out, seqs, types=None):
    hidden = out["last_hidden_state"]
    assert len(hidden) == len(seqs)
    for i, s in enumerate(seqs):
        want = expected_sequence(s, None if types is None else types[i])
        np.testing.assert_array_equal(as_numpy(hidden[i]), want.astype(np.float32))
    pooled = as_numpy(out["pooler_output"])
    np.testing.assert_array_equal(pooled, np.stack([expected_pooler(s) for s in seqs]).astype(np.float32))


def check_padded(out, seqs, width, types=None):
    hidden = as_numpy(out["last_hidden_state"])
    assert hidden.shape == (len(seqs), width, HIDDEN)
    for i, s in enumerate(seqs):
        want = expected_sequence(s, None if types is None else types[i])
        np.testing.assert_array_equal(hidden[i, :len(s)], want.astype(np.float32))
        assert (hidden[i, len(s):] == 0).all(), f"padding rows of sequence {i} are not zero"
    np.testing.assert_array_equal(as_numpy(out["pooler_output"]),
                                  np.stack([expected_pooler(s) for s in seqs]).astype(np.float32))


def padded_feeds(rng, iterations=3, batch=4, with_types=True, type_vocab=TYPES):
    feeds = []
    for _ in range(iterations):
        seqs, types = random_sequences(rng, batch, type_vocab=type_vocab)
        ids, mask = pad(seqs, MAX_SEQLEN)
        feed = OrderedDict(input_ids=ids, attention_mask=mask)
        if with_types:
            feed["token_type_ids"] = pad(types, MAX_SEQLEN)[0]
        feeds.append(feed)
    return feeds


def tiny_bert(seed):
    """padfree.export's built-in tiny BERT (head_dim 64, 128 positions), every parameter random."""
    from padfree.export.models import BUILTIN, build

    config_cls, model_cls, fields = BUILTIN["tiny-bert"]
    return build(config_cls, model_cls, seed=seed, attn_implementation="eager", **fields)


def export_onnx(model, path):
    """The plain model.onnx of padfree.export (inputs input_ids, attention_mask, token_type_ids)."""
    import onnx

    from padfree.export.exporter import export_onnx as export

    onnx.save(export(model), str(path))
    return path
