"""The encoder on a decode state's bucket rows (padfree.generation.encoder_graph, what the CUDA graph
runs), against the encoder on the sources' rows only, on the CPU in float32 (torch reference ops).

Each family (its own position scheme: Marian's, learned with an offset, fairseq's that skip pad
tokens) at 12 encoder layers, sources of mixed lengths (some with pad ids inside), buckets from the
fullest call to the emptiest one the bucket takes (the most filler rows). The sources' rows must match;
every filler row must be finite (a NaN there could reach a source through a masked tile). The bucket's ids
and cu_seqlens, computed from a packer's output as the graph computes them on the device, must be
bucket_inputs' (below: the same values built on the host from the packed sources); the position rows,
computed from those alone as the graph does, must be the sources' own (encoder.source_position_rows) and
a pad token's at position 0 on the fillers.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

import padfree.torch as pt
from padfree.generation.decoder import seqlen_bucket, token_bucket
from padfree.generation.encoder import PackedSources, encode, encode_rows, source_position_rows
from padfree.generation.encoder_graph import (
    bucket_floor,
    bucket_from_packed,
    bucket_position_rows,
    filler_count,
)

sys.path.insert(0, os.path.dirname(__file__))
from _seq2seq import FAMILIES, build, random_sources  # noqa: E402

# a pad token at position 0, per position scheme (HF: Marian's sinusoid row 0, BART's learned table 2 rows
# past the position, M2M100's padding_idx row for any pad)
FILLER_ROW = {"marian": lambda pad: 0, "learned": lambda pad: 2, "fairseq": lambda pad: pad}


def bucket_inputs(weights, sources: PackedSources, tokens: int, max_seqlen: int,
                  fillers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's inputs on a bucket's rows built on the host, the reference for bucket_from_packed:
    ids int64 [tokens] (the fillers' rows pad), and cu_seqlens int32 [batch + 1 + fillers] (the sources',
    then the fillers' bounds)."""
    total = sources.total_tokens
    assert total <= tokens and sources.max_seqlen <= max_seqlen and total + fillers * max_seqlen >= tokens
    ids = torch.full((tokens,), weights.pad_token_id, dtype=torch.long)
    ids[:total] = sources.ids
    bounds = [min(total + k * max_seqlen, tokens) for k in range(1, fillers + 1)]
    return ids, torch.tensor(sources.cu_seqlens.tolist() + bounds, dtype=torch.int32)


def test_bucket_floor_is_the_fewest_tokens_of_the_bucket():
    for tokens in sorted({token_bucket(t) for t in range(1, 5000)}):
        floor = bucket_floor(tokens)
        assert token_bucket(floor) == tokens
        assert floor == 1 or token_bucket(floor - 1) < tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_bucket_rows_match_the_sources_rows(family):
    model = build(family, layers=(12, 2), max_positions=128)
    gen = pt.from_hf(model, dtype=torch.float32, device="cpu")
    pad = model.config.pad_token_id
    gen_rng = torch.Generator().manual_seed(11)
    cases = []
    for count, longest in ((1, 12), (3, 40), (9, 20)):
        sources = random_sources(model.config, count, seed=count, min_len=1, max_len=longest)
        cases.append(sources)
    # a pad id inside a source (fairseq positions skip it)
    cases.append([[5, pad, 7, 9], [8, 8, pad]])
    # the emptiest call of a bucket: its floor, so the fillers cover the most rows
    floor = bucket_floor(token_bucket(70))
    cases.append([[int(t) for t in torch.randint(3, 90, (n,), generator=gen_rng)] for n in (floor - 40, 40)])
    for sources in cases:
        packed = PackedSources.from_lists(sources, torch.device("cpu"))
        tokens, max_seqlen = token_bucket(packed.total_tokens), seqlen_bucket(packed.max_seqlen)
        fillers = filler_count(tokens, packed.batch, max_seqlen)
        ids, cu = bucket_inputs(gen.weights, packed, tokens, max_seqlen, fillers)
        assert int(cu[-1]) == tokens and bool((cu[1:] - cu[:-1]).le(max_seqlen).all())
        total = packed.total_tokens
        # what the graph computes from a packer's output (int32 ids, anything past the total): the same
        ids_in = torch.full((tokens,), -7, dtype=torch.int32)
        ids_in[:total] = packed.ids.int()
        got_ids, got_cu = torch.full((tokens,), -1, dtype=torch.long), torch.full_like(cu, -1)
        bucket_from_packed(ids_in, packed.cu_seqlens, torch.arange(tokens, dtype=torch.int32),
                           torch.arange(1, fillers + 1, dtype=torch.int32) * max_seqlen, pad, got_ids, got_cu)
        assert torch.equal(got_ids, ids) and torch.equal(got_cu, cu), f"{family} {packed.lengths}"
        rows = bucket_position_rows(gen.weights, ids, cu, packed.batch)
        # the sources' rows where the eager encoder reads them, every filler's pad at position 0
        assert torch.equal(ids[:total], packed.ids) and bool((ids[total:] == pad).all())
        assert torch.equal(rows[:total], source_position_rows(gen.weights, packed)), f"{family} {packed.lengths}"
        assert bool((rows[total:] == FILLER_ROW[gen.weights.spec.positions](pad)).all())
        with torch.inference_mode():
            want = encode(gen.weights, gen.ops, packed)
            got = torch.full((tokens, want.shape[1]), float("nan"))
            got[:] = encode_rows(gen.weights, gen.ops, ids, rows, cu, max_seqlen)
        scale = want.abs().max().item()
        err = (got[:total] - want).abs().max().item()
        assert err <= 1e-5 * max(1.0, scale), f"{family} lengths {packed.lengths}: {err}"
        assert bool(torch.isfinite(got[total:]).all()), f"{family}: a filler row is not finite"
