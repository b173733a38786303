"""padfree.ops.attention_varlen against a float64 per-sequence softmax(Q K^T * scale) V."""
from __future__ import annotations

import math
import random

import pytest
import torch

from padfree._lib import KernelUnsupportedError
from padfree.ops import InputError, attention_varlen

# ||out - ref|| / ||ref|| per sequence; fp32 runs on CUDA cores (no TF32 anywhere).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BUCKET_ROWS = 5  # rows past cu_seqlens[-1], as CUDA-graph bucketing leaves them


def reference(qkv, bias, lengths, num_heads, scale, causal=False):
    """float64, one sequence at a time: [T, 3*H] -> [T, H]."""
    x = qkv.double()
    if bias is not None:
        x = x + bias.double()
    head_dim = x.shape[1] // (3 * num_heads)
    outs, start = [], 0
    for n in lengths:
        q, k, v = x[start:start + n].view(n, 3, num_heads, head_dim).permute(1, 2, 0, 3)
        scores = q @ k.transpose(1, 2) * scale
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1), -math.inf)
        outs.append((scores.softmax(-1) @ v).permute(1, 0, 2).reshape(n, num_heads * head_dim))
        start += n
    return torch.cat(outs) if outs else x.new_zeros(0, num_heads * head_dim)


def make_lengths(rng, batch, max_seqlen, zeros=0):
    """Uniform in [1, max], with 1 and max always present when batch allows, and `zeros` empty
    sequences at random places (never reaching the kernel from users, but from bucketing)."""
    lengths = [rng.randint(1, max_seqlen) for _ in range(batch)]
    lengths[rng.randrange(batch)] = max_seqlen
    if batch > 1:
        lengths[(lengths.index(max_seqlen) + 1) % batch] = 1
    for _ in range(zeros):
        lengths.insert(rng.randrange(len(lengths) + 1), 0)
    return lengths


def run_case(seed, dtype, head_dim, num_heads, lengths, max_seqlen, *, bias=True, causal=False, scale=None,
             key_growth=0.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    width = 3 * num_heads * head_dim
    # N(0, 1) entries give scores of std ~1 after the 1/sqrt(d) scale: a softmax that is neither
    # uniform nor one-hot, so both the max tracking and the weighting are exercised.
    qkv = torch.randn(total + BUCKET_ROWS, width, device="cuda", generator=gen).to(dtype)
    if key_growth:  # K rows scaled by 1 + key_growth * (position / length): later keys score higher
        position = torch.cat([torch.arange(n, device="cuda") / max(n - 1, 1) for n in lengths])
        keys = qkv[:total].view(total, 3, num_heads, head_dim)[:, 1]
        keys.mul_((1 + key_growth * position).to(dtype)[:, None, None])
    qkv_bias = (0.5 * torch.randn(width, device="cuda", generator=gen)).to(dtype) if bias else None
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).cuda()
    out = torch.full((total + BUCKET_ROWS, num_heads * head_dim), math.nan, dtype=dtype, device="cuda")
    result = attention_varlen(qkv, cu, max_seqlen, num_heads, qkv_bias, softmax_scale=scale, out=out,
                              causal=causal)
    assert result is out
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    ref = reference(qkv[:total], qkv_bias, lengths, num_heads, scale, causal)
    assert torch.isnan(out[total:]).all(), "rows past cu_seqlens[batch] were written"
    got = out[:total].double()
    assert not torch.isnan(got).any(), "some rows of a sequence were not written"
    start = 0
    for i, n in enumerate(lengths):
        if n:
            diff = (got[start:start + n] - ref[start:start + n]).norm() / ref[start:start + n].norm()
            assert diff <= TOLERANCE[dtype], f"sequence {i} (length {n}): relative error {diff:.3g}"
        start += n
    return out


# (batch, max_seqlen): edge lengths, both sides of the kernel switch (128: resident -> tiled),
# lengths that end mid-tile and on tile edges, batches from 1 to 128.
SHAPES = [(1, 1), (5, 7), (3, 64), (128, 128), (16, 129), (7, 512), (4, 513), (2, 1100)]


# The head_dim values the kernels are built for (padfree.kernel_sizes), with a head count each: 12 x 32
# is MiniLM's / bge-small's (hidden 384), 3 x 64 an odd count, 2 x 128 the largest.
HEAD_DIMS = [32, 64, 128]
HEADS = {32: 12, 64: 3, 128: 2}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("batch,max_seqlen", SHAPES)
def test_matches_reference(seed, dtype, head_dim, batch, max_seqlen):
    rng = random.Random(seed)
    lengths = make_lengths(rng, batch, max_seqlen)
    run_case(seed, dtype, head_dim, HEADS[head_dim], lengths, max_seqlen)


# Every tensor-core kernel on the same cases: by default the device picks one (wgmma on compute
# capability 9.0, mma.sync elsewhere); PADFREE_ATTENTION_PATH forces each ("tma": the wgmma kernel
# loading by tensor copies; "held": that with its bias in registers, the default at head_dim 32 and 64).
KERNEL_PATH_SHAPES = [(1, 1), (5, 7), (3, 64), (16, 129), (7, 512), (2, 1100)]


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["resident", "tiled", "wgmma", "tma", "held"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("batch,max_seqlen", KERNEL_PATH_SHAPES)
def test_each_kernel_path(monkeypatch, seed, path, dtype, head_dim, causal, batch, max_seqlen):
    if path == "resident" and max_seqlen > 128:
        pytest.skip("the resident kernel holds at most 128 keys")
    if path in ("wgmma", "tma", "held") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma runs on compute capability 9.0 only")
    if path in ("tma", "held") and head_dim == 128:
        pytest.skip("the wgmma kernel loads by tensor copies at head_dim 32 and 64 only")
    monkeypatch.setenv("PADFREE_ATTENTION_PATH", path)
    rng = random.Random(seed)
    run_case(seed, dtype, head_dim, 2, make_lengths(rng, batch, max_seqlen), max_seqlen, causal=causal)


# The grid orders (attention.h: AttentionGridOrder) the launcher picks by waves and QKV size, each
# forced on every tensor-core path's default: the same CTAs in another order, so the same output.
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("batch,max_seqlen", [(5, 7), (16, 129), (7, 512), (2, 1100)])
def test_grid_orders_agree(monkeypatch, seed, head_dim, causal, batch, max_seqlen):
    lengths = make_lengths(random.Random(seed), batch, max_seqlen, zeros=1)
    outs = []
    for order in ("heads", "tiles", "sequences"):
        monkeypatch.setenv("PADFREE_ATTENTION_ORDER", order)
        outs.append(run_case(seed, torch.float16, head_dim, 3, lengths, max_seqlen, causal=causal))
    for o in outs[1:]:  # the rows past the sequences stay NaN in each
        torch.testing.assert_close(o, outs[0], rtol=0, atol=0, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [32, 64])
def test_long_sequence(seed, dtype, head_dim):
    run_case(seed, dtype, head_dim, 2, [4096, 3001], 4096)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("max_seqlen", [100, 300, 700])
def test_zero_length_sequences_and_no_bias(seed, dtype, head_dim, max_seqlen):
    rng = random.Random(seed)
    lengths = make_lengths(rng, 6, max_seqlen, zeros=3) + [0, 0]  # bucket padding repeats the end
    run_case(seed, dtype, head_dim, 4, lengths, max_seqlen, bias=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("max_seqlen", [1, 37, 128, 200, 1000])
def test_causal(seed, dtype, head_dim, max_seqlen):
    rng = random.Random(seed)
    run_case(seed, dtype, head_dim, 2, make_lengths(rng, 4, max_seqlen), max_seqlen, causal=True)


# Scores that keep growing along the keys (std ~1 at the first key, ~9 at the last): each key tile
# raises the running maximum by several units, so the rescaling of O and the row sums after the
# first tile is exercised, which N(0, 1) scores (a maximum that settles in the first tiles) barely do.
@pytest.mark.gpu
@pytest.mark.parametrize("path", [None, "tiled", "wgmma", "tma", "held"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("max_seqlen", [300, 1100])
def test_scores_growing_along_the_keys(monkeypatch, seed, path, dtype, head_dim, causal, max_seqlen):
    if path is not None:
        if dtype == torch.float32:
            pytest.skip("fp32 has one kernel")
        if path in ("wgmma", "tma", "held") and torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("wgmma runs on compute capability 9.0 only")
        monkeypatch.setenv("PADFREE_ATTENTION_PATH", path)
    lengths = make_lengths(random.Random(seed), 5, max_seqlen)
    run_case(seed, dtype, head_dim, 2, lengths, max_seqlen, causal=causal, key_growth=8.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax_scale(seed, dtype):
    rng = random.Random(seed)
    run_case(seed, dtype, 64, 2, make_lengths(rng, 3, 300), 300, scale=0.37)


@pytest.mark.gpu
def test_max_seqlen_larger_than_longest(seed):
    # A graph bucket's max_seqlen may exceed every actual length: only more tiles exit early.
    run_case(seed, torch.float16, 64, 2, [5, 60], 1024)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("max_seqlen", [100, 300])
def test_cu_seqlens_past_total_tokens_stays_in_bounds(seed, dtype, head_dim, max_seqlen):
    """cu_seqlens[-1] > qkv's rows (an inconsistent caller): a sequence is cut at the last row and
    attends over what is left, later ones do no work, and nothing outside qkv / out is touched."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    num_heads = 2
    lengths = [max_seqlen // 3, max_seqlen, max_seqlen]
    fits = [lengths[0], max_seqlen // 2 + 1, 0]  # the second cut inside (not at) a key tile
    total = sum(fits)
    width = 3 * num_heads * head_dim
    # qkv between rows of other data: K/V read past total_tokens would change the cut sequence.
    qkv_rows = torch.randn(BUCKET_ROWS + total + BUCKET_ROWS, width, device="cuda", generator=gen).to(dtype)
    qkv = qkv_rows[BUCKET_ROWS:BUCKET_ROWS + total]
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).cuda()
    out_rows = torch.full((BUCKET_ROWS + total + BUCKET_ROWS, num_heads * head_dim), math.nan, dtype=dtype,
                          device="cuda")
    out = attention_varlen(qkv, cu, max_seqlen, num_heads, out=out_rows[BUCKET_ROWS:BUCKET_ROWS + total])
    torch.cuda.synchronize()
    assert torch.isnan(out_rows[:BUCKET_ROWS]).all(), "rows before out were written"
    assert torch.isnan(out_rows[BUCKET_ROWS + total:]).all(), "rows past total_tokens were written"
    ref = reference(qkv, None, fits, num_heads, 1.0 / math.sqrt(head_dim))
    got = out.double()
    assert not torch.isnan(got).any(), "some rows that fit were not written"
    start = 0
    for i, n in enumerate(fits[:2]):
        diff = (got[start:start + n] - ref[start:start + n]).norm() / ref[start:start + n].norm()
        assert diff <= TOLERANCE[dtype], f"sequence {i} ({n} of {lengths[i]} rows fit): relative error {diff:.3g}"
        start += n


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [32, 128])
@pytest.mark.parametrize("max_seqlen", [128, 400, 2000])
def test_deterministic(seed, head_dim, max_seqlen):
    # Same inputs, bitwise the same result: a missing barrier would show up as a moving error.
    rng = random.Random(seed)
    lengths = make_lengths(rng, 8, max_seqlen)
    first = run_case(seed, torch.bfloat16, head_dim, 4, lengths, max_seqlen)
    second = run_case(seed, torch.bfloat16, head_dim, 4, lengths, max_seqlen)
    torch.testing.assert_close(first, second, rtol=0, atol=0, equal_nan=True)


@pytest.mark.gpu
def test_allocates_out_on_current_stream(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(10, 3 * 2 * 64, device="cuda", generator=gen, dtype=torch.float16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = attention_varlen(qkv, cu, 6, 2)
    stream.synchronize()
    ref = reference(qkv, None, [4, 6], 2, 1 / 8)
    assert out.shape == (10, 128) and out.dtype == torch.float16
    assert (out.double() - ref).norm() / ref.norm() <= TOLERANCE[torch.float16]


def _valid_args(device="cuda", dtype=torch.float16, num_heads=2, head_dim=64):
    qkv = torch.randn(6, 3 * num_heads * head_dim, device=device).to(dtype)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32, device=device)
    return qkv, cu


def test_cpu_tensors_are_refused():
    qkv, cu = _valid_args(device="cpu")
    with pytest.raises(InputError, match="CUDA"):
        attention_varlen(qkv, cu, 4, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["int_dtype", "width", "cu_dtype", "cu_shape", "cu_empty", "bias_shape",
                                  "bias_dtype", "out_shape", "out_dtype", "out_aliases", "strided",
                                  "max_seqlen", "max_seqlen_past_int32", "max_seqlen_bool", "num_heads",
                                  "scale", "dim3"])
def test_bad_inputs_raise_input_error(case):
    qkv, cu = _valid_args()
    kwargs = dict(qkv=qkv, cu_seqlens=cu, max_seqlen=4, num_heads=2)
    if case == "int_dtype":
        kwargs["qkv"] = qkv.to(torch.int32)
    elif case == "width":
        kwargs["qkv"] = qkv[:, :-8].contiguous()  # 376 is not 3 * 2 * head_dim
    elif case == "cu_dtype":
        kwargs["cu_seqlens"] = cu.long()
    elif case == "cu_shape":
        kwargs["cu_seqlens"] = cu.view(1, 3)
    elif case == "cu_empty":
        kwargs["cu_seqlens"] = cu[:1]
    elif case == "bias_shape":
        kwargs["qkv_bias"] = torch.zeros(64, device="cuda", dtype=qkv.dtype)
    elif case == "bias_dtype":
        kwargs["qkv_bias"] = torch.zeros(qkv.shape[1], device="cuda", dtype=torch.float32)
    elif case == "out_shape":
        kwargs["out"] = torch.empty(6, 64, device="cuda", dtype=qkv.dtype)
    elif case == "out_dtype":
        kwargs["out"] = torch.empty(6, 128, device="cuda", dtype=torch.bfloat16)
    elif case == "out_aliases":
        kwargs["out"] = qkv.view(-1)[: 6 * 128].view(6, 128)
    elif case == "strided":
        kwargs["qkv"] = torch.randn(6, 2 * qkv.shape[1], device="cuda", dtype=qkv.dtype)[:, ::2]
    elif case == "max_seqlen":
        kwargs["max_seqlen"] = 0
    elif case == "max_seqlen_past_int32":  # ctypes would pass it modulo 2**32, as 5
        kwargs["max_seqlen"] = 2**32 + 5
    elif case == "max_seqlen_bool":
        kwargs["max_seqlen"] = True
    elif case == "num_heads":
        kwargs["num_heads"] = 0
    elif case == "scale":
        kwargs["softmax_scale"] = math.inf
    elif case == "dim3":
        kwargs["qkv"] = qkv.view(6, 3, 128)
    with pytest.raises(InputError):
        attention_varlen(**kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [16, 96, 256])
def test_unsupported_head_dim(head_dim):
    qkv, cu = _valid_args(head_dim=head_dim)
    with pytest.raises(KernelUnsupportedError, match="head_dim"):
        attention_varlen(qkv, cu, 4, 2)


@pytest.mark.gpu
def test_cu_seqlens_on_another_device_is_refused():
    qkv, cu = _valid_args()
    with pytest.raises(InputError):
        attention_varlen(qkv, cu.cpu(), 4, 2)
