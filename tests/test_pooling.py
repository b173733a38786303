"""Sentence pooling on packed rows (padfree.ops.sequence_pool) against a float64 torch reference: every
mode, with and without L2 normalization, widths from one vector to 8192, edge lengths 1 and max,
empty sequences (bucket padding) and rows past cu_seqlens[-1] that must not be read."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _encoder_models import reference_pool
from _packing import cu_of, random_lengths

from padfree import ops
from padfree.ops import InputError

MODES = ["cls", "mean", "max"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# float32: fp32 sums of up to a few hundred rows; half types: the output's rounding (one ulp)
TOLERANCE = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def packed_rows(gen, lengths, hidden, dtype, extra_rows=0):
    """Random packed rows [T + extra_rows, H] (the extra rows NaN: no sequence may read them)."""
    total = int(lengths.sum())
    x = torch.randn(total + extra_rows, hidden, generator=gen, dtype=torch.float64) * 2 + 0.5
    x[total:] = float("nan")
    return x.to(dtype).cuda()


def check_pooled(got, x, cu, mode, normalize):
    want = reference_pool(x.double().cpu(), cu.cpu(), mode, normalize)
    got = got.double().cpu()
    assert torch.isfinite(got).all()
    if mode != "mean" and not normalize:  # a copy or a maximum of the rows: exact
        assert torch.equal(got, want.to(x.dtype).double())
        return
    scale = want.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
    assert ((got - want).abs() / scale).max() <= TOLERANCE[x.dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "l2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("hidden", [8, 384, 768, 1032, 4096, 8192])
def test_pool_matches_float64_reference(mode, normalize, dtype, hidden, seed):
    gen = torch.Generator().manual_seed(seed)
    for batch, longest in ((1, 1), (5, 64), (33, 300)):
        lengths = random_lengths(gen, batch, longest)
        x = packed_rows(gen, lengths, hidden, dtype, extra_rows=3)
        cu = cu_of(lengths).cuda()
        out = torch.full((batch, hidden), float("nan"), dtype=dtype, device="cuda")
        assert ops.sequence_pool(x, cu, mode, normalize, out=out) is out
        check_pooled(out, x[:int(lengths.sum())], cu, mode, normalize)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_empty_sequences_pool_to_zeros(mode, seed):
    """Bucket padding: empty sequences inside and after the batch (cu_seqlens repeating the total),
    NaN rows after the total that no sequence covers."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([4, 0, 1, 7, 0, 0])
    x = packed_rows(gen, lengths, 256, torch.float16, extra_rows=20)
    cu = cu_of(lengths).cuda()
    out = ops.sequence_pool(x, cu, mode, normalize=True)
    assert (out[lengths == 0] == 0).all()
    check_pooled(out, x[:int(lengths.sum())], cu, mode, True)


@pytest.mark.gpu
def test_rows_are_clamped_to_total_tokens():
    """cu_seqlens reaching past the tensor: sequences are cut at total_tokens (no read outside x)."""
    x = torch.ones(10, 64, dtype=torch.float32, device="cuda")
    cu = torch.tensor([0, 6, 40, 90], dtype=torch.int32, device="cuda")
    out = ops.sequence_pool(x, cu, "mean")
    torch.cuda.synchronize()
    assert out[:2].eq(1).all() and out[2].eq(0).all()


@pytest.mark.gpu
def test_no_rows_and_no_sequences():
    x = torch.empty(0, 64, dtype=torch.float16, device="cuda")
    cu = torch.zeros(4, dtype=torch.int32, device="cuda")
    assert ops.sequence_pool(x, cu, "max").eq(0).all()
    assert ops.sequence_pool(x, cu[:1], "mean").shape == (0, 64)


@pytest.mark.gpu
def test_matches_sentence_transformers_pooling_on_the_padded_batch(seed):
    """The packed pooling equals sentence-transformers' masked pooling of the padded batch (float32)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = random_lengths(gen, 9, 50)
    x = packed_rows(gen, lengths, 128, torch.float32)
    cu = cu_of(lengths).cuda()
    padded = ops.rebuild_padding(x, cu, 50)
    mask = (torch.arange(50)[None, :] < lengths[:, None]).cuda().unsqueeze(-1).float()
    want = {"cls": padded[:, 0], "mean": (padded * mask).sum(1) / mask.sum(1).clamp(min=1e-9),
            "max": padded.masked_fill(mask == 0, torch.finfo(torch.float32).min).max(1).values}
    for mode, expected in want.items():
        torch.testing.assert_close(ops.sequence_pool(x, cu, mode), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ops.sequence_pool(x, cu, mode, normalize=True),
                                   F.normalize(expected, p=2, dim=1), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_bad_arguments_raise_input_error():
    x = torch.randn(8, 64, device="cuda", dtype=torch.float16)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device="cuda")
    with pytest.raises(InputError, match="mode: expected one of cls, mean, max"):
        ops.sequence_pool(x, cu, "sum")
    with pytest.raises(InputError, match=r"x: expected packed rows \[total_tokens, hidden\]"):
        ops.sequence_pool(x.view(2, 4, 64), cu)
    with pytest.raises(InputError, match="multiple of 8"):
        ops.sequence_pool(torch.randn(8, 12, device="cuda"), cu)
    with pytest.raises(InputError, match="cu_seqlens: expected dtype torch.int32"):
        ops.sequence_pool(x, cu.long())
    with pytest.raises(InputError, match=r"out: expected shape \[2, 64\]"):
        ops.sequence_pool(x, cu, out=torch.empty(3, 64, device="cuda", dtype=torch.float16))
    with pytest.raises(InputError, match="out: expected dtype torch.float16"):
        ops.sequence_pool(x, cu, out=torch.empty(2, 64, device="cuda"))


def test_cpu_tensors_and_unknown_modes_are_refused():
    x, cu = torch.randn(8, 64), torch.tensor([0, 3, 8], dtype=torch.int32)
    with pytest.raises(InputError, match="expected a CUDA tensor"):
        ops.sequence_pool(x, cu)
    with pytest.raises(InputError, match="mode: expected one of cls, mean, max, got 'weightedmean'"):
        ops.sequence_pool(x, cu, "weightedmean")
