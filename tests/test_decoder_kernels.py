"""The decoder kernels (padfree.ops.decoder / decoding) against float64 torch references.

Self-attention runs several steps with random beam parents: the kernels keep one cache written once
and reorder an index per position, the reference physically reorders its cache, and both must
attend over the same history. Outputs are NaN-poisoned first, so an unwritten element fails.
"""
from __future__ import annotations

import ctypes
import math

import pytest
import torch

from padfree import _lib
from padfree.ops import InputError, beam_reorder_cache_indir, cross_attention, decoder_self_attention, log_softmax_topk

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# ||out - ref|| / ||ref|| per row; fp32 runs on CUDA cores
TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 1e-2}


def _gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def _rel_rows(got, ref):
    return ((got.double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30))


# ---- self-attention over the cache ----------------------------------------------------------------


class ReferenceCache:
    """float64 K/V per hypothesis [rows, H, L, D], reordered physically on every beam step."""

    def __init__(self, k, v):
        self.k, self.v = k.double().clone(), v.double().clone()

    def step(self, qkv, bias, step, num_heads, scale, dtype):
        rows = qkv.shape[0]
        x = qkv.double() + (bias.double() if bias is not None else 0)
        q, k, v = x.view(rows, 3, num_heads, -1).unbind(1)
        # the cache holds the dtype's rounding of K and V, and so do later steps
        self.k[:, :, step] = k.to(dtype).double()
        self.v[:, :, step] = v.to(dtype).double()
        scores = torch.einsum("rhd,rhtd->rht", q, self.k[:, :, :step + 1]) * scale
        return torch.einsum("rht,rhtd->rhd", scores.softmax(-1), self.v[:, :, :step + 1]).reshape(rows, -1)

    def reorder(self, parents):
        self.k, self.v = self.k[parents.long()].clone(), self.v[parents.long()].clone()


def random_parents(gen, batch, num_beams):
    """Each new hypothesis continues a random beam of its own source, as beam search does."""
    beams = torch.randint(0, num_beams, (batch, num_beams), device="cuda", generator=gen)
    return (beams + torch.arange(batch, device="cuda")[:, None] * num_beams).reshape(-1).to(torch.int32)


def run_self_attention(seed, dtype, *, batch, num_beams, num_heads, head_dim, max_len, start, steps, bias=True,
                       scale=None, state_ready=False):
    """Steps start .. start + steps - 1 with random parents after each; the history before `start` is
    random cache contents under a random indirection (as if earlier steps had run). state_ready: the
    kernel reads the step, the indirection and the cache before its PDL wait, the stream synchronized
    before each call so that the promise holds."""
    gen = _gen(seed)
    rows, hidden = batch * num_beams, num_heads * head_dim
    k_cache = torch.randn(rows, num_heads, max_len, head_dim, device="cuda", generator=gen).to(dtype)
    v_cache = torch.randn(rows, num_heads, max_len, head_dim, device="cuda", generator=gen).to(dtype)
    indir = torch.full((rows, max_len), -5, dtype=torch.int32, device="cuda")
    if start:  # rows of the same source, as beam search leaves them
        source = torch.arange(rows, device="cuda")[:, None] // num_beams * num_beams
        indir[:, :start] = (source + torch.randint(0, num_beams, (rows, start), device="cuda", generator=gen)).int()
    # the reference's own history: what the indirection points at, copied
    t = torch.arange(max_len, device="cuda")
    ref_k = k_cache[indir.clamp(0).long(), :, t[None, :]].permute(0, 2, 1, 3)
    ref_v = v_cache[indir.clamp(0).long(), :, t[None, :]].permute(0, 2, 1, 3)
    ref = ReferenceCache(ref_k, ref_v)
    other = torch.empty_like(indir)
    step_t = torch.empty(1, dtype=torch.int32, device="cuda")
    qkv_bias = (0.5 * torch.randn(3 * hidden, device="cuda", generator=gen)).to(dtype) if bias else None
    use_scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    for step in range(start, start + steps):
        qkv = torch.randn(rows, 3 * hidden, device="cuda", generator=gen).to(dtype)
        step_t.fill_(step)
        out = torch.full((rows, hidden), math.nan, dtype=dtype, device="cuda")
        if state_ready:
            torch.cuda.current_stream().synchronize()
        result = decoder_self_attention(qkv, k_cache, v_cache, indir, step_t, num_heads, qkv_bias,
                                        softmax_scale=scale, out=out, state_ready=state_ready)
        assert result is out
        expected = ref.step(qkv, qkv_bias, step, num_heads, use_scale, dtype)
        assert not torch.isnan(out).any(), f"step {step}: some outputs were not written"
        err = _rel_rows(out, expected).max().item()
        assert err <= TOLERANCE[dtype], f"step {step}: relative error {err:.3g}"
        # this step's K and V, bias added, in the row's own slot
        x = qkv.double() + (qkv_bias.double() if bias else 0)
        k_new = x.view(rows, 3, num_heads, head_dim)[:, 1].to(dtype)
        assert torch.equal(k_cache[:, :, step], k_new), f"step {step}: K not written to the cache"
        parents = random_parents(gen, batch, num_beams)
        other.fill_(-7)
        beam_reorder_cache_indir(indir, parents, step_t, out=other)
        ref.reorder(parents)
        indir, other = other, indir
    return indir


SELF_CASES = [
    # batch, num_beams, heads, head_dim, max_len, start, steps
    (1, 1, 8, 64, 16, 0, 4),         # step 0 onwards, one hypothesis
    (2, 4, 8, 64, 64, 61, 3),        # Marian-sized, up to step L-1
    (1, 16, 16, 64, 256, 30, 3),     # 16 beams (NLLB-600M heads)
    (16, 16, 16, 64, 96, 40, 2),     # 256 rows: unsplit
    (64, 4, 12, 128, 48, 40, 2),     # 3072 (row, head) items, head_dim 128: the 64-register variant
    (1, 2, 2, 128, 1024, 1020, 4),   # few rows, long cache: split over many CTAs, to L-1
    (3, 1, 4, 128, 300, 150, 2),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", SELF_CASES, ids=lambda c: "b{}x{}_h{}x{}_L{}_s{}".format(*c[:6]))
@pytest.mark.parametrize("state_ready", [False, True], ids=["after_wait", "state_ready"])
def test_self_attention_over_reordered_steps(seed, dtype, case, state_ready):
    batch, num_beams, heads, head_dim, max_len, start, steps = case
    run_self_attention(seed, dtype, batch=batch, num_beams=num_beams, num_heads=heads, head_dim=head_dim,
                       max_len=max_len, start=start, steps=steps, state_ready=state_ready)


@pytest.mark.gpu
def test_self_attention_without_bias_and_folded_scale(seed):
    run_self_attention(seed, torch.float16, batch=2, num_beams=2, num_heads=8, head_dim=64, max_len=40, start=3,
                       steps=3, bias=False, scale=1.0)


@pytest.mark.gpu
def test_self_attention_is_deterministic_and_graph_capturable(seed):
    """One captured graph replays every step (step is a device scalar): bitwise as eager calls. The
    graph's call reads its state before the PDL wait (state_ready: a replay starts after the previous
    one ended), the eager calls after it."""
    gen = _gen(seed)
    rows, heads, head_dim, max_len = 4, 8, 64, 128
    hidden = heads * head_dim
    qkvs = [torch.randn(rows, 3 * hidden, device="cuda", generator=gen).half() for _ in range(5)]
    caches = [torch.zeros(rows, heads, max_len, head_dim, device="cuda", dtype=torch.float16) for _ in range(4)]
    indir = torch.zeros(rows, max_len, dtype=torch.int32, device="cuda")
    eager = []
    step = torch.zeros(1, dtype=torch.int32, device="cuda")
    for qkv in qkvs:
        eager.append(decoder_self_attention(qkv, caches[0], caches[1], indir, step, heads).clone())
        step += 1
    static_qkv = torch.empty_like(qkvs[0])
    step.zero_()
    out = torch.empty(rows, hidden, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the graph
        decoder_self_attention(static_qkv, caches[2], caches[3], indir, step, heads, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    caches[2].zero_()
    caches[3].zero_()
    # preallocated: nothing is allocated inside the capture (also with PYTORCH_NO_CUDA_MEMORY_CACHING)
    workspace = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    one = torch.ones(1, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decoder_self_attention(static_qkv, caches[2], caches[3], indir, step, heads, out=out, workspace=workspace,
                               state_ready=True)
        step.add_(one)
    step.zero_()
    for qkv, expected in zip(qkvs, eager):
        static_qkv.copy_(qkv)
        graph.replay()
        assert torch.equal(out, expected)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])


# ---- beam reorder ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("max_len", [1, 7, 64, 130])
def test_beam_reorder_cache_indir(seed, max_len):
    gen = _gen(seed)
    rows = 12
    indir = torch.randint(0, rows, (rows, max_len), device="cuda", generator=gen, dtype=torch.int32)
    parents = torch.randint(0, rows, (rows,), device="cuda", generator=gen, dtype=torch.int32)
    for step in sorted({0, max_len // 2, max_len - 1}):
        out = torch.full_like(indir, -7)
        beam_reorder_cache_indir(indir, parents, torch.tensor([step], dtype=torch.int32, device="cuda"), out)
        expected = indir[parents.long()].clone()
        expected[:, step] = parents
        assert torch.equal(out[:, :step + 1], expected[:, :step + 1])
        assert (out[:, step + 1:] == -7).all(), "positions past step were written"


# ---- cross-attention ------------------------------------------------------------------------------


def cross_reference(q, q_bias, kv, lengths, num_beams, num_heads, scale):
    rows, hidden = q.shape
    x = q.double() + (q_bias.double() if q_bias is not None else 0)
    outs, start = [], 0
    for s, n in enumerate(lengths):
        k, v = kv[start:start + n].double().view(n, 2, num_heads, hidden // num_heads).unbind(1)  # [n, H, D]
        qs = x[s * num_beams:(s + 1) * num_beams].view(num_beams, num_heads, -1)
        scores = torch.einsum("bhd,nhd->bhn", qs, k) * scale
        outs.append(torch.einsum("bhn,nhd->bhd", scores.softmax(-1), v).reshape(num_beams, hidden))
        start += n
    return torch.cat(outs)


CROSS_CASES = [
    # lengths, num_beams, heads, head_dim, max_seqlen
    ([1], 1, 8, 64, 1),                    # source length 1
    ([5, 1, 37], 4, 8, 64, 37),            # Marian
    ([17, 200], 16, 16, 64, 200),          # 16 beams, NLLB heads
    ([512, 3, 100], 1, 16, 64, 1024),      # max_seqlen past the longest; few rows: split
    ([1000, 999], 2, 2, 128, 1000),        # long sources over many splits
    ([64] * 16, 16, 16, 64, 64),           # 256 rows
    ([64] * 64, 4, 16, 64, 64),            # 256 rows of 4 beams (NLLB 64x4): beams path; rows: the 64-register variant
    ([20] * 64, 4, 12, 128, 20),           # the 64-register variant, head_dim 128
    ([40, 9], 6, 4, 128, 64),              # 6 beams, head_dim 128
    ([700, 20], 4, 16, 64, 700),           # 4 beams, few rows over long sources: split
    ([300, 7, 64], 3, 8, 64, 300),         # 3 beams
    ([65, 0, 1, 128, 64], 5, 16, 64, 128), # an empty source; 65 and 128 keys: two passes of 64
    ([33] * 40, 2, 8, 64, 33),             # 2 beams, 320 (source, head) items: the beams path by default
]

# the cross-attention's paths (PADFREE_CROSS_ATTENTION_PATH): the kernel's own choice, the beams of a
# source together on tensor cores wherever that path runs (16-bit, head_dim 64, 2-16 beams), a warp
# per row and head
CROSS_PATHS = ["auto", "beams", "rows"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CROSS_CASES, ids=lambda c: f"n{len(c[0])}x{c[1]}_h{c[2]}x{c[3]}_max{c[4]}")
@pytest.mark.parametrize("path", CROSS_PATHS)
def test_cross_attention(seed, dtype, case, path, monkeypatch):
    lengths, num_beams, heads, head_dim, max_seqlen = case
    if path != "auto":
        monkeypatch.setenv("PADFREE_CROSS_ATTENTION_PATH", path)
    gen = _gen(seed)
    hidden = heads * head_dim
    total = sum(lengths)
    rows = len(lengths) * num_beams
    q = torch.randn(rows, hidden, device="cuda", generator=gen).to(dtype)
    kv = torch.randn(total, 2 * hidden, device="cuda", generator=gen).to(dtype)
    q_bias = (0.5 * torch.randn(hidden, device="cuda", generator=gen)).to(dtype)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).cuda()
    out = torch.full((rows, hidden), math.nan, dtype=dtype, device="cuda")
    assert cross_attention(q, kv, cu, max_seqlen, num_beams, heads, q_bias, out=out) is out
    ref = cross_reference(q, q_bias, kv, lengths, num_beams, heads, 1.0 / math.sqrt(head_dim))
    assert not torch.isnan(out).any()
    err = _rel_rows(out, ref).max().item()
    assert err <= TOLERANCE[dtype], f"relative error {err:.3g}"


# ---- log-softmax top-k ----------------------------------------------------------------------------


def topk_reference(logits, bias, beam_scores, penalty_ids, p, banned_ids, forced_ids, normalize):
    """float64 scores [rows, V] after HF's processors, in the contract's order."""
    x = logits.double() + (bias.double() if bias is not None else 0)
    s = x.log_softmax(-1) if normalize else x.clone()
    rows, vocab = s.shape
    for r in range(rows):
        if penalty_ids is not None:
            ids = penalty_ids[r][(penalty_ids[r] >= 0) & (penalty_ids[r] < vocab)].long().unique()
            vals = s[r, ids]
            s[r, ids] = torch.where(vals < 0, vals * p, vals / p)
        if banned_ids is not None:
            ids = banned_ids[r][(banned_ids[r] >= 0) & (banned_ids[r] < vocab)].long()
            s[r, ids] = -math.inf
        if forced_ids is not None and 0 <= int(forced_ids[r]) < vocab:
            f = int(forced_ids[r])
            s[r] = -math.inf
            s[r, f] = 0
    if beam_scores is not None:
        s = s + beam_scores.double()[:, None]
    return s


def check_topk(scores, ids, ref, k, *, exact_ids=False, atol=2e-4):
    rows, vocab = ref.shape
    assert scores.shape == (rows, k) and ids.shape == (rows, k)
    assert not torch.isnan(scores).any(), "some scores were not written"
    assert ((ids >= 0) & (ids < vocab)).all(), "ids out of range (or not written)"
    # the reference order: descending, ties to the smaller id (a stable sort of ids in order)
    ref_vals, ref_ids = torch.sort(-ref, dim=-1, stable=True)
    ref_vals, ref_ids = -ref_vals[:, :k], ref_ids[:, :k]
    got = scores.double()
    torch.testing.assert_close(got, ref_vals, atol=atol, rtol=1e-6)
    torch.testing.assert_close(ref.gather(1, ids.long()), got, atol=atol, rtol=1e-6)
    for r in range(rows):
        assert len(set(ids[r].tolist())) == k, f"row {r}: repeated ids"
    assert (got[:, 1:] <= got[:, :-1]).all(), "scores not descending"
    same = got[:, 1:] == got[:, :-1]
    assert (ids[:, 1:][same] > ids[:, :-1][same]).all(), "a tie not in id order"
    if exact_ids:
        assert torch.equal(ids.long(), ref_ids)


def run_topk(seed, dtype, rows, vocab, k, *, bias=True, beams=True, penalty=0, banned=0, forced=False,
             normalize=True, p=1.3, ties=False):
    gen = _gen(seed)
    if ties:  # few distinct values: thousands of exact ties per chunk
        logits = torch.randint(0, 4, (rows, vocab), device="cuda", generator=gen).to(dtype)
    else:
        logits = (3 * torch.randn(rows, vocab, device="cuda", generator=gen)).to(dtype)
    b = (0.5 * torch.randn(vocab, device="cuda", generator=gen)).to(dtype) if bias and not ties else None
    bs = torch.randn(rows, device="cuda", generator=gen) if beams else None
    x = logits.double() + (b.double() if b is not None else 0)
    penalty_ids = banned_ids = forced_ids = None
    if penalty:  # the current best ids, repeated and padded with -1, and random ones
        penalty_ids = torch.randint(0, vocab, (rows, penalty), device="cuda", generator=gen, dtype=torch.int32)
        top = x.topk(min(k, vocab), dim=-1).indices.int()
        n = min(penalty // 2, top.shape[1])
        penalty_ids[:, :n] = top[:, :n]
        penalty_ids[:, n:n + 2] = penalty_ids[:, :2]
        penalty_ids[:, -1] = -1
    if banned:
        banned_ids = torch.randint(0, vocab, (rows, banned), device="cuda", generator=gen, dtype=torch.int32)
        banned_ids[:, 0] = x.argmax(-1).int()  # the best one is banned
        banned_ids[:, -1] = -1
    if forced:
        forced_ids = torch.full((rows,), -1, dtype=torch.int32, device="cuda")
        forced_ids[::2] = torch.randint(0, vocab, (len(forced_ids[::2]),), device="cuda", generator=gen).int()
        forced_ids[0] = vocab - 1
    out_scores = torch.full((rows, k), math.nan, device="cuda")
    out_ids = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
    scores, ids = log_softmax_topk(logits, k, bias=b, beam_scores=bs, banned_ids=banned_ids, penalty_ids=penalty_ids,
                                   repetition_penalty=p, forced_ids=forced_ids, out_scores=out_scores,
                                   out_ids=out_ids, normalize=normalize)
    assert scores is out_scores and ids is out_ids
    ref = topk_reference(logits, b, bs, penalty_ids, p, banned_ids, forced_ids, normalize)
    check_topk(scores, ids, ref, k, exact_ids=ties)


TOPK_SHAPES = [  # rows, vocab, k; a vocab that is a multiple of 8 takes the aligned stage 1 (rows in registers)
    (1, 256206, 1), (4, 256206, 8), (64, 256206, 32), (4, 58101, 64), (16, 50265, 10), (3, 100, 5),
    (2, 64, 64), (5, 4097, 16), (64, 256256, 8), (3, 58112, 32), (2, 4104, 16), (7, 8192, 4),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,vocab,k", TOPK_SHAPES)
def test_log_softmax_topk(seed, dtype, rows, vocab, k):
    run_topk(seed, dtype, rows, vocab, k)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,vocab,k", [(2, 256206, 32), (16, 58101, 64), (3, 4097, 8), (16, 58112, 64)])
def test_log_softmax_topk_ties_to_smaller_id(seed, rows, vocab, k):
    run_topk(seed, torch.float16, rows, vocab, k, ties=True)
    run_topk(seed, torch.float32, rows, vocab, k, ties=True, beams=False, normalize=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("normalize", [True, False], ids=["log_softmax", "raw"])
@pytest.mark.parametrize("rows,vocab,k", [(4, 256206, 8), (32, 58101, 32), (2, 300, 4), (4, 256256, 8),
                                           (3, 4104, 16)])
def test_log_softmax_topk_processors(seed, dtype, normalize, rows, vocab, k):
    run_topk(seed, dtype, rows, vocab, k, penalty=24, banned=9, forced=True, normalize=normalize, p=1.7)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [58101, 58112])  # the realigning and the aligned stage 1
def test_log_softmax_topk_many_processed_ids(seed, vocab):
    run_topk(seed, torch.float16, 4, vocab, 16, penalty=1500, banned=548)


@pytest.mark.gpu
@pytest.mark.parametrize("banned", [1, 3, 31, 33, 200])
@pytest.mark.parametrize("k", [8, 64])
def test_log_softmax_topk_processed_ids_crowding_one_chunk(seed, banned, k):
    # the row's best logits all in one chunk and all banned or penalised: stage 1's candidate bound must
    # count them (each can be the maximum of a thread) and still keep k candidates of that chunk
    gen = _gen(seed)
    rows, vocab = 4, 58112
    logits = torch.randn(rows, vocab, device="cuda", generator=gen)
    logits[:, 4096:4096 + 4096] += 20.0                       # chunk 1 holds every top-k candidate
    order = logits[:, 4096:8192].argsort(dim=-1, descending=True).int() + 4096
    banned_ids = order[:, :banned].contiguous()               # its best `banned` ids
    penalty_ids = order[:, banned:banned + 5].contiguous()    # and the next few, penalised
    logits = logits.half()
    scores, ids = log_softmax_topk(logits, k, banned_ids=banned_ids, penalty_ids=penalty_ids, repetition_penalty=3.0)
    ref = topk_reference(logits, None, None, penalty_ids, 3.0, banned_ids, None, True)
    check_topk(scores, ids, ref, k)


@pytest.mark.gpu
@pytest.mark.parametrize("at", [0, 3, 6, 9, -2], ids=lambda a: f"step{a}")
def test_log_softmax_topk_reads_per_step_tables_at_the_step(seed, at):
    # banned [steps, rows, Q] and forced [steps, rows] tables read at the device step (clamped to the
    # tables): the same scores and ids as this step's lists passed directly, and the float64 reference's
    gen = _gen(seed)
    steps, rows, vocab, k = 7, 6, 58101, 8
    logits = (3 * torch.randn(rows, vocab, device="cuda", generator=gen)).half()
    banned = torch.randint(0, vocab, (steps, rows, 3), device="cuda", generator=gen, dtype=torch.int32)
    banned[:, :, 0] = logits.float().argmax(-1).int()          # every step bans the best id
    banned[::2, :, 1] = -1
    forced = torch.full((steps, rows), -1, dtype=torch.int32, device="cuda")
    forced[1::3, ::2] = torch.randint(0, vocab, (len(range(1, steps, 3)), rows // 2), device="cuda",
                                      generator=gen, dtype=torch.int32)
    step = torch.tensor([at], dtype=torch.int32, device="cuda")
    row = min(max(at, 0), steps - 1)
    got = log_softmax_topk(logits, k, banned_ids=banned, forced_ids=forced, step=step,
                           out_scores=torch.full((rows, k), math.nan, device="cuda"))
    want = log_softmax_topk(logits, k, banned_ids=banned[row].contiguous(), forced_ids=forced[row].contiguous())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check_topk(*got, topk_reference(logits, None, None, None, 1.0, banned[row], forced[row], True), k)


@pytest.mark.gpu
def test_log_softmax_topk_step_tables_refused():
    logits = torch.zeros(4, 1000, device="cuda")
    step = torch.zeros(1, dtype=torch.int32, device="cuda")
    with pytest.raises(InputError, match="without a banned_ids or forced_ids table"):
        log_softmax_topk(logits, 4, step=step)
    with pytest.raises(InputError, match="table of 3 dimensions"):
        log_softmax_topk(logits, 4, banned_ids=torch.zeros(4, 2, dtype=torch.int32, device="cuda"), step=step)
    with pytest.raises(InputError, match="same number of steps"):
        log_softmax_topk(logits, 4, banned_ids=torch.zeros(5, 4, 2, dtype=torch.int32, device="cuda"),
                         forced_ids=torch.zeros(6, 4, dtype=torch.int32, device="cuda"), step=step)
    with pytest.raises(InputError, match="forced_ids"):
        log_softmax_topk(logits, 4, forced_ids=torch.zeros(5, 3, dtype=torch.int32, device="cuda"), step=step)
    with pytest.raises(InputError, match="step"):
        log_softmax_topk(logits, 4, forced_ids=torch.zeros(5, 4, dtype=torch.int32, device="cuda"),
                         step=step.long())


@pytest.mark.gpu
def test_greedy(seed):
    gen = _gen(seed)
    logits = torch.randn(8, 256206, device="cuda", generator=gen, dtype=torch.float16)
    scores, ids = log_softmax_topk(logits, 1, normalize=False)
    assert torch.equal(ids[:, 0].long(), logits.float().argmax(-1))
    assert torch.equal(scores[:, 0], logits.float().max(-1).values)


@pytest.mark.gpu
def test_log_softmax_topk_on_a_misaligned_row_view_refused():
    logits = torch.randn(2, 1001, device="cuda")[:, 1:]
    with pytest.raises(InputError, match="contiguous"):
        log_softmax_topk(logits, 4)


# ---- input validation -----------------------------------------------------------------------------


@pytest.mark.gpu
def test_decoder_inputs_refused():
    d = "cuda"
    qkv = torch.zeros(4, 3 * 512, device=d, dtype=torch.float16)
    kc = torch.zeros(4, 8, 16, 64, device=d, dtype=torch.float16)
    vc = torch.zeros_like(kc)
    indir = torch.zeros(4, 16, dtype=torch.int32, device=d)
    step = torch.zeros(1, dtype=torch.int32, device=d)
    with pytest.raises(InputError, match="head_dim 96"):
        decoder_self_attention(torch.zeros(4, 3 * 768, device=d, dtype=torch.float16), kc, vc, indir, step, 8)
    with pytest.raises(InputError, match="k_cache"):
        decoder_self_attention(qkv, kc.float(), vc, indir, step, 8)
    with pytest.raises(InputError, match="v_cache"):
        decoder_self_attention(qkv, kc, vc[:, :, :8].contiguous(), indir, step, 8)
    with pytest.raises(InputError, match="cache_indir"):
        decoder_self_attention(qkv, kc, vc, indir.long(), step, 8)
    with pytest.raises(InputError, match="step"):
        decoder_self_attention(qkv, kc, vc, indir, torch.zeros(1, dtype=torch.int64, device=d), 8)
    with pytest.raises(InputError, match="step"):
        decoder_self_attention(qkv, kc, vc, indir, 3, 8)
    with pytest.raises(InputError, match="softmax_scale"):
        decoder_self_attention(qkv, kc, vc, indir, step, 8, softmax_scale=math.inf)
    with pytest.raises(InputError, match="overlap"):
        decoder_self_attention(qkv, kc, vc, indir, step, 8, out=kc.view(-1)[:4 * 512].view(4, 512))
    q = torch.zeros(4, 512, device=d, dtype=torch.float16)
    kv = torch.zeros(10, 1024, device=d, dtype=torch.float16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=d)
    with pytest.raises(InputError, match="batch \\* num_beams"):
        cross_attention(q, kv, cu, 6, 3, 8)
    with pytest.raises(InputError, match="kv_mem"):
        cross_attention(q, kv[:, :512].contiguous(), cu, 6, 2, 8)
    with pytest.raises(InputError, match="max_seqlen"):
        cross_attention(q, kv, cu, 0, 2, 8)
    with pytest.raises(InputError, match="out"):
        beam_reorder_cache_indir(indir, torch.zeros(4, dtype=torch.int32, device=d), step, indir)


@pytest.mark.gpu
def test_topk_inputs_refused():
    logits = torch.zeros(4, 1000, device="cuda", dtype=torch.float16)
    ids = torch.zeros(4, 3, dtype=torch.int32, device="cuda")
    for bad in (0, 65):
        with pytest.raises(InputError, match="k:"):
            log_softmax_topk(logits, bad)
    with pytest.raises(InputError, match="k:"):
        log_softmax_topk(torch.zeros(4, 10, device="cuda"), 11)
    with pytest.raises(InputError, match="bias"):
        log_softmax_topk(logits, 4, bias=torch.zeros(1000, device="cuda"))
    with pytest.raises(InputError, match="beam_scores"):
        log_softmax_topk(logits, 4, beam_scores=torch.zeros(4, device="cuda", dtype=torch.float16))
    with pytest.raises(InputError, match="banned_ids"):
        log_softmax_topk(logits, 4, banned_ids=ids.long())
    with pytest.raises(InputError, match="at most 2048"):
        log_softmax_topk(logits, 4, penalty_ids=torch.zeros(4, 2000, dtype=torch.int32, device="cuda"),
                         banned_ids=torch.zeros(4, 49, dtype=torch.int32, device="cuda"))
    with pytest.raises(InputError, match="repetition_penalty"):
        log_softmax_topk(logits, 4, repetition_penalty=0.0)
    with pytest.raises(InputError, match="forced_ids"):
        log_softmax_topk(logits, 4, forced_ids=ids)
    with pytest.raises(InputError, match="out_scores"):
        log_softmax_topk(logits, 4, out_scores=torch.zeros(4, 4, device="cuda", dtype=torch.float16))


def test_cpu_tensors_refused():
    """Validation before anything reaches a GPU (runs without one)."""
    x = torch.zeros(4, 3 * 512)
    with pytest.raises(InputError, match="CUDA"):
        decoder_self_attention(x, x, x, x, x, 8)
    with pytest.raises(InputError, match="CUDA"):
        cross_attention(x, x, x, 4, 1, 8)
    with pytest.raises(InputError, match="CUDA"):
        log_softmax_topk(x, 4)
    with pytest.raises(InputError, match="CUDA"):
        beam_reorder_cache_indir(x.int(), x, x, x)


# ---- the step embedding -------------------------------------------------------------------------

EMBED_CASES = [  # the families' position rules (generation/layers.py: step_position_args), LayerNorm
    ("marian", dict(position_offset=0), False),
    ("bart", dict(position_offset=2), True),                                  # layernorm_embedding
    ("fairseq", dict(position_offset=2, pad_token=1, pad_position=1), False),  # M2M100, pad id 1
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family,rule,with_ln", EMBED_CASES, ids=[c[0] for c in EMBED_CASES])
def test_decoder_step_embedding(seed, dtype, family, rule, with_ln):
    """Against the model's own ops in its dtype (scale and add rounded as HF does): equal without a
    LayerNorm; with one, within the dtype's tolerance of float64. Pad tokens read the padding row
    (fairseq), ids past the table are clamped, the output is NaN-poisoned first."""
    from padfree.ops import decoder_step_embedding
    gen = _gen(seed)
    rows, vocab, hidden, num_positions, step, scale = 12, 500, 256, 70, 37, 22.627416997969522
    emb = torch.randn(vocab, hidden, device="cuda", generator=gen).to(dtype)
    pos = torch.randn(num_positions, hidden, device="cuda", generator=gen).to(dtype)
    tokens = torch.randint(2, vocab, (rows,), device="cuda", generator=gen)
    tokens[3] = 1                      # a pad id (fairseq: the padding row; else an ordinary id)
    tokens[5] = vocab + 7              # past the table: clamped to its last row
    ln = None
    if with_ln:
        ln = ((1 + 0.1 * torch.randn(hidden, device="cuda", generator=gen)).to(dtype),
              (0.1 * torch.randn(hidden, device="cuda", generator=gen)).to(dtype), 1e-5)
    out = torch.full((rows, hidden), float("nan"), device="cuda", dtype=dtype)
    got = decoder_step_embedding(tokens, torch.tensor([step], dtype=torch.int32, device="cuda"), emb, pos,
                                 embed_scale=scale, ln=ln, out=out, **rule)
    ids = tokens.clamp(max=vocab - 1)
    row = torch.full_like(tokens, step + rule["position_offset"])
    if "pad_token" in rule:
        row = torch.where(tokens == rule["pad_token"], rule["pad_position"], row)
    x = emb[ids] * scale + pos[row]    # the model's ops: each result rounded to the dtype
    if not with_ln:
        assert torch.equal(got, x)
        return
    ref = torch.nn.functional.layer_norm(x.double(), (hidden,), ln[0].double(), ln[1].double(), ln[2])
    assert _rel_rows(got, ref).max() < TOLERANCE[dtype]


@pytest.mark.gpu
def test_decoder_step_embedding_refuses():
    from padfree.ops import decoder_step_embedding
    emb = torch.zeros(10, 64, device="cuda", dtype=torch.float16)
    step = torch.zeros(1, dtype=torch.int32, device="cuda")
    tokens = torch.zeros(4, dtype=torch.int64, device="cuda")
    with pytest.raises(InputError, match="tokens"):
        decoder_step_embedding(tokens.int(), step, emb, emb)
    with pytest.raises(InputError, match="positions"):
        decoder_step_embedding(tokens, step, emb, emb[:, :32].contiguous())
    with pytest.raises(InputError, match="hidden a multiple of 8"):
        decoder_step_embedding(tokens, step, emb[:, :60].contiguous(), emb[:, :60].contiguous())


# ---- the C ABI refuses before touching the GPU (fake addresses, never dereferenced) ----------------

A = 0x10000
M = A + 4


def _capi(name, *args):
    try:
        lib = _lib.load()
    except Exception as e:  # noqa: BLE001 - the skip reason
        pytest.skip(f"kernel library not loadable here: {e}")
    if not hasattr(lib, name):
        pytest.skip(f"{name} not built into {lib._name}")
    fn = _lib.function(name)
    status = fn(*args)
    return status, (lib.padfree_last_error() or b"").decode()


@pytest.mark.parametrize("over,fragment,status", [
    ({"head_dim": 96}, "head_dim 96", _lib.STATUS_UNSUPPORTED),
    ({"num_heads": 0}, "num_heads", _lib.STATUS_INVALID_ARGUMENT),
    ({"max_len": 0}, "max_len", _lib.STATUS_INVALID_ARGUMENT),
    ({"rows": 40_000_000}, "rows x num_heads", _lib.STATUS_INVALID_ARGUMENT),   # x 8 heads: past the grid
    ({"scale": -1.0}, "softmax_scale", _lib.STATUS_INVALID_ARGUMENT),
    ({"qkv": M}, "qkv must be 16-byte aligned", _lib.STATUS_INVALID_ARGUMENT),
    ({"step": 0}, "step", _lib.STATUS_INVALID_ARGUMENT),
    ({"state_ready": 2}, "state_ready", _lib.STATUS_INVALID_ARGUMENT),
    ({"dtype": 7}, "dtype", _lib.STATUS_INVALID_ARGUMENT),
])
def test_capi_self_attention_refuses(over, fragment, status):
    a = dict(qkv=A, bias=None, k=A, v=A, indir=A, step=A, state_ready=0, rows=4, num_heads=8, head_dim=64, max_len=16,
             scale=0.125, ws=None, ws_bytes=0, dtype=1, out=A, stream=None)
    a.update(over)
    got, message = _capi("padfree_decoder_self_attention", *a.values())
    assert got == status and fragment in message, message


@pytest.mark.parametrize("over,fragment", [
    ({"k": 0}, "k must be"), ({"k": 65}, "k must be"), ({"vocab": 10, "k": 11}, "k must be"),
    ({"rows": 70000}, "rows"), ({"num_penalty": 2000, "num_banned": 49}, "num_penalty + num_banned"),
    ({"penalty": 0.0}, "repetition_penalty"), ({"logits": M}, "logits must be 16-byte aligned"),
    ({"ws_bytes": 16}, "workspace too small"), ({"normalize": 2}, "normalize"),
    ({"step": A, "num_steps": 0}, "num_steps"),
])
def test_capi_logits_topk_refuses(over, fragment):
    a = dict(logits=A, bias=None, bs=None, pen=None, num_penalty=0, penalty=1.0, ban=None, num_banned=0,
             forced=None, step=None, num_steps=0, rows=4, vocab=1000, k=4, normalize=1, ws=A, ws_bytes=1 << 30,
             dtype=1, scores=A, ids=A, stream=None)
    if over.get("num_penalty"):
        a.update(pen=A, ban=A)
    a.update(over)
    got, message = _capi("padfree_logits_topk", *a.values())
    assert got == _lib.STATUS_INVALID_ARGUMENT and fragment in message, message


@pytest.mark.parametrize("over,fragment", [
    ({"gamma": M, "beta": A}, "ln_gamma must be 16-byte aligned"),    # read as 16-byte vectors
    ({"gamma": A, "beta": M}, "ln_beta must be 16-byte aligned"),
    ({"gamma": A, "beta": A, "x_norm": A + (1 << 22) + 4}, "x_norm_out must be 16-byte aligned"),  # written so
    ({"bias": A + 1}, "bias and residual must be aligned to the dtype"),
])
def test_capi_decode_linear_refuses(over, fragment):
    a = dict(x=A, weight=A, bias=None, residual=None, gamma=None, beta=None, eps=1e-5, act=0, rows=4, k=512,
             n=64, dtype=1, out=A + (1 << 20), x_norm=None, stream=None)
    a.update(over)
    got, message = _capi("padfree_decode_linear", *a.values())
    assert got == _lib.STATUS_INVALID_ARGUMENT and fragment in message, message


def test_capi_workspace_sizes():
    size = ctypes.c_int64(-1)
    status, message = _capi("padfree_logits_topk_workspace_size", 4, 256206, 8, ctypes.byref(size))
    assert status == 0 and size.value >= 4 * 63 * (8 + 8 * 8), message
    status, message = _capi("padfree_decoder_cross_attention_workspace_size", 256, 16, 64, 512, ctypes.byref(size))
    assert status == 0 and size.value == 0, "256 rows x 16 heads fill the GPU: no split"
    status, _ = _capi("padfree_decoder_self_attention_workspace_size", 1, 8, 64, 0, ctypes.byref(size))
    assert status == _lib.STATUS_INVALID_ARGUMENT
    status, _ = _capi("padfree_beam_reorder_cache_indir", A, A, A, 4, 16, A + 64, None)
    assert status == _lib.STATUS_INVALID_ARGUMENT  # overlapping out
