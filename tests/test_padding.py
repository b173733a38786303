"""Prefix-sum packing kernels against PyTorch references: cu_seqlens from lengths and masks,
remove/rebuild padding for any row size and alignment, and the host-side pack helpers."""
from __future__ import annotations

import pytest
import torch
from _packing import cu_of, random_lengths

from padfree import _lib, ops
from padfree.ops import InputError
from padfree.ops.padding import pack_from_mask, pack_from_seqlens

POISON_INT = -7


def left_aligned_mask(lengths, padded_seqlen):
    return (torch.arange(padded_seqlen)[None, :] < lengths[:, None]).to(torch.int32)


def stream():
    return torch.cuda.current_stream().cuda_stream


# ---- cu_seqlens ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 2, 31, 128, 1023, 1024, 1025, 5000])
def test_cu_seqlens_from_seqlens(seed, batch):
    gen = torch.Generator().manual_seed(seed)
    lengths = random_lengths(gen, batch, 512)
    seqlens = lengths.to(torch.int32).cuda()
    out = torch.full((batch + 1,), POISON_INT, dtype=torch.int32, device="cuda")
    _lib.call("padfree_cu_seqlens_from_seqlens", seqlens.data_ptr(), batch, out.data_ptr(), stream())
    assert torch.equal(out.cpu(), cu_of(lengths))
    assert torch.equal(ops.cu_seqlens_from_seqlens(seqlens).cpu(), cu_of(lengths))


@pytest.mark.gpu
def test_negative_lengths_count_as_zero():
    seqlens = torch.tensor([3, -4, 2, 0, 5], dtype=torch.int32, device="cuda")
    assert ops.cu_seqlens_from_seqlens(seqlens).cpu().tolist() == [0, 3, 3, 5, 5, 10]


@pytest.mark.gpu
@pytest.mark.parametrize("mask_dtype", [torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("batch, padded_seqlen", [(1, 1), (1, 513), (7, 64), (128, 128), (128, 1000)])
def test_cu_seqlens_from_mask(seed, mask_dtype, batch, padded_seqlen):
    gen = torch.Generator().manual_seed(seed)
    lengths = random_lengths(gen, batch, padded_seqlen)
    mask = left_aligned_mask(lengths, padded_seqlen).to(mask_dtype).cuda()
    assert torch.equal(ops.cu_seqlens_from_mask(mask).cpu(), cu_of(lengths))
    cu, total, longest = pack_from_mask(mask)
    assert torch.equal(cu.cpu(), cu_of(lengths))
    assert (total, longest) == (int(lengths.sum()), int(lengths.max()))


def bad_mask(padded_seqlen=16):
    """Rows 1, 3, 4 are invalid: a hole, a value 2, right-aligned padding. Row 5 is all padding
    (valid for the kernel, refused by pack_from_mask)."""
    mask = left_aligned_mask(torch.tensor([3, 5, 16, 4, 4, 0]), padded_seqlen)
    mask[1, 2] = 0
    mask[3, 1] = 2
    mask[4] = mask[4].flip(0)
    return mask


@pytest.mark.gpu
def test_invalid_rows_are_counted():
    mask = bad_mask().cuda()
    cu = torch.full((mask.shape[0] + 1,), POISON_INT, dtype=torch.int32, device="cuda")
    invalid = torch.tensor([5], dtype=torch.int32, device="cuda")  # accumulates: not cleared first
    _lib.call("padfree_cu_seqlens_from_mask", mask.data_ptr(), mask.shape[0], mask.shape[1], cu.data_ptr(),
              invalid.data_ptr(), stream())
    assert int(invalid) == 5 + 3
    assert cu.cpu().tolist()[:3] == [0, 3, 3 + 4]  # lengths count the ones: row 1 has 4


@pytest.mark.gpu
def test_pack_from_mask_names_bad_rows():
    with pytest.raises(InputError, match=r"3 row\(s\).*rows 1, 3, 4"):
        pack_from_mask(bad_mask().cuda())
    empty_row = left_aligned_mask(torch.tensor([3, 0, 2]), 4).cuda()
    with pytest.raises(InputError, match="rows 1 have no tokens"):
        pack_from_mask(empty_row)


@pytest.mark.gpu
def test_pack_from_seqlens(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = random_lengths(gen, 300, 200)
    cu, total, longest = pack_from_seqlens(lengths.tolist(), max_length=200)
    assert torch.equal(cu.cpu(), cu_of(lengths)) and cu.is_cuda
    assert (total, longest) == (int(lengths.sum()), 200)


@pytest.mark.parametrize("seqlens, kwargs, message", [
    ([], {}, "at least one sequence"),
    ([3, 0, 2], {}, "sequences 1 have length < 1"),
    ([3, -1], {}, "length < 1"),
    ([3, 9, 2, 11], {"max_length": 8}, "sequences 1, 3 are longer than the maximum 8"),
])
def test_pack_from_seqlens_refuses(seqlens, kwargs, message):
    """Host-side validation: runs without a GPU."""
    with pytest.raises(InputError, match=message):
        pack_from_seqlens(seqlens, **kwargs)


# ---- remove / rebuild padding --------------------------------------------------------------------

ROW_LAYOUTS = [  # (dtype, trailing shape): row sizes of 1..3072 bytes, every copy unit
    (torch.float16, (768,)),     # 1536 B: 16-byte vectors
    (torch.bfloat16, (4,)),      # 8 B
    (torch.float32, (3,)),       # 12 B: 4-byte units
    (torch.int32, ()),           # 4 B: input ids / masks
    (torch.int64, (2,)),         # 16 B
    (torch.uint8, (5,)),         # 5 B: bytes
    (torch.float32, (2, 384)),   # 3072 B, two trailing axes
]


def poison(shape, dtype):
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    return torch.full(shape, 255 if dtype == torch.uint8 else POISON_INT, dtype=dtype, device="cuda")


def random_rows(gen, shape, dtype):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, 100, shape, generator=gen).to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, trailing", ROW_LAYOUTS)
@pytest.mark.parametrize("batch, padded_seqlen", [(1, 1), (1, 300), (5, 17), (128, 64)])
@pytest.mark.parametrize("empty_sequences", [False, True])
def test_remove_and_rebuild_padding(seed, dtype, trailing, batch, padded_seqlen, empty_sequences):
    gen = torch.Generator().manual_seed(seed)
    lengths = random_lengths(gen, batch, padded_seqlen, low=0 if empty_sequences else 1)
    cu = cu_of(lengths).cuda()
    total = int(lengths.sum())
    padded = random_rows(gen, (batch, padded_seqlen, *trailing), dtype).cuda()
    expected_packed = torch.cat([padded[b, :n] for b, n in enumerate(lengths.tolist())])

    packed = ops.remove_padding(padded, cu, total, out=poison((total, *trailing), dtype))
    torch.cuda.synchronize()
    assert torch.equal(packed, expected_packed)

    rebuilt = ops.rebuild_padding(packed, cu, padded_seqlen, out=poison(padded.shape, dtype))
    valid = left_aligned_mask(lengths, padded_seqlen).bool().cuda()
    torch.cuda.synchronize()
    assert torch.equal(rebuilt[valid], padded[valid])
    assert (rebuilt[~valid] == 0).all(), "padded rows must hold zeros"


@pytest.mark.gpu
@pytest.mark.parametrize("width", [1, 3])
def test_rebuild_padding_narrower_than_sequences_keeps_their_first_rows(seed, width):
    """padded_seqlen below the longest sequence cuts each one to its first rows (width 1: each
    sequence's first token, as the encoder's pooler takes them); empty sequences give zero rows."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([4, 1, 0, 9, 2])
    total = int(lengths.sum())
    packed = random_rows(gen, (total, 24), torch.float16).cuda()
    rebuilt = ops.rebuild_padding(packed, cu_of(lengths).cuda(), width, out=poison((5, width, 24), torch.float16))
    starts = cu_of(lengths)[:-1].tolist()
    for b, (n, start) in enumerate(zip(lengths.tolist(), starts)):
        kept = min(n, width)
        assert torch.equal(rebuilt[b, :kept], packed[start:start + kept]), b
        assert (rebuilt[b, kept:] == 0).all(), b


GUARD_ROWS = 3  # rows on either side of a tensor inside a larger buffer, to catch stray accesses


def untouched(rows):
    """Whether rows still hold poison()'s values."""
    if rows.dtype.is_floating_point:
        return bool(torch.isnan(rows).all())
    return bool((rows == (255 if rows.dtype == torch.uint8 else POISON_INT)).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, trailing", [(torch.float16, (8,)), (torch.uint8, (5,))])
def test_cu_seqlens_past_total_tokens_stays_in_bounds(seed, dtype, trailing):
    """cu_seqlens[-1] > total_tokens (an inconsistent caller): the copies stop at the packed tensor's
    last row, exact up to there, and rebuild fills what it could not copy with zeros."""
    gen = torch.Generator().manual_seed(seed)
    batch, padded_seqlen = 3, 16
    lengths = torch.tensor([5, 11, 16])
    total = 5 + 6  # the first sequence fits, the second is cut after 6 rows, the third is past the end
    cu = cu_of(lengths).cuda()
    padded = random_rows(gen, (batch, padded_seqlen, *trailing), dtype).cuda()
    fits = [min(n, max(total - start, 0)) for n, start in zip(lengths.tolist(), cu_of(lengths)[:-1].tolist())]
    assert fits == [5, 6, 0]

    buffer = poison((GUARD_ROWS + total + GUARD_ROWS, *trailing), dtype)
    packed = ops.remove_padding(padded, cu, total, out=buffer[GUARD_ROWS:GUARD_ROWS + total])
    torch.cuda.synchronize()
    assert untouched(buffer[:GUARD_ROWS]), "rows before packed were written"
    assert untouched(buffer[GUARD_ROWS + total:]), "rows past total_tokens were written"
    assert torch.equal(packed, torch.cat([padded[0, :5], padded[1, :6]]))

    # The packed rows sit between rows of other data: a read past total_tokens would copy them.
    source = random_rows(gen, (GUARD_ROWS + total + GUARD_ROWS, *trailing), dtype).cuda()
    source[GUARD_ROWS:GUARD_ROWS + total] = packed
    rebuilt = ops.rebuild_padding(source[GUARD_ROWS:GUARD_ROWS + total], cu, padded_seqlen,
                                  out=poison(padded.shape, dtype))
    copied = left_aligned_mask(torch.tensor(fits), padded_seqlen).bool().cuda()
    torch.cuda.synchronize()
    assert torch.equal(rebuilt[copied], padded[copied])
    assert (rebuilt[~copied] == 0).all(), "rows not copied must hold zeros"


@pytest.mark.gpu
def test_misaligned_rows_fall_back_to_narrow_copies(seed):
    """A view 4 bytes into its allocation cannot use 16-byte vectors: the copy narrows, stays exact."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([3, 1, 8])
    base = torch.randint(0, 1000, (3 * 8 * 4 + 1,), generator=gen, dtype=torch.int32).cuda()
    padded = base[1:].view(3, 8, 4)
    assert padded.data_ptr() % 16 != 0
    cu = cu_of(lengths).cuda()
    packed = ops.remove_padding(padded, cu, 12, out=poison((12, 4), torch.int32))
    torch.cuda.synchronize()
    assert torch.equal(packed, torch.cat([padded[0, :3], padded[1, :1], padded[2, :8]]))


@pytest.mark.gpu
def test_rebuild_with_no_tokens():
    """A bucket of only empty sequences: all padding."""
    cu = torch.zeros(4, dtype=torch.int32, device="cuda")
    packed = torch.empty(0, 16, device="cuda")
    assert (ops.rebuild_padding(packed, cu, 5, out=poison((3, 5, 16), torch.float32)) == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("case, message", [
    ("cu_dtype", "cu_seqlens: expected dtype"),
    ("batch", "does not match cu_seqlens"),
    ("total", "total_tokens"),
    ("mask_dtype", "attention_mask: expected dtype"),
    ("mask_rank", "attention_mask: expected shape"),
    ("out_shape", "out: expected shape"),
])
def test_bad_input(case, message):
    padded = torch.zeros(2, 4, 8, device="cuda")
    cu = torch.tensor([0, 3, 5], dtype=torch.int32, device="cuda")
    with pytest.raises(InputError, match=message):
        if case == "cu_dtype":
            ops.remove_padding(padded, cu.long(), 5)
        elif case == "batch":
            ops.remove_padding(padded[:1].contiguous(), cu, 5)
        elif case == "total":
            ops.remove_padding(padded, cu, 9)
        elif case == "mask_dtype":
            pack_from_mask(torch.ones(2, 4, device="cuda"))
        elif case == "mask_rank":
            pack_from_mask(torch.ones(2, 4, 1, dtype=torch.int32, device="cuda"))
        elif case == "out_shape":
            ops.rebuild_padding(torch.zeros(5, 8, device="cuda"), cu, 4, out=torch.empty(2, 3, 8, device="cuda"))


def test_cpu_tensor_is_refused():
    with pytest.raises(InputError, match="CUDA tensor"):
        ops.cu_seqlens_from_seqlens(torch.ones(3, dtype=torch.int32))
    with pytest.raises(InputError, match="CUDA tensor"):
        pack_from_mask(torch.ones(2, 3, dtype=torch.int32))


def test_check_int32_refuses_what_ctypes_would_wrap():
    import numpy as np

    from padfree.ops._tensors import check_int32
    assert check_int32(2**31 - 1, "n") == 2**31 - 1
    assert check_int32(np.int64(7), "n") == 7 and type(check_int32(np.int64(7), "n")) is int
    assert check_int32(torch.tensor(3), "n") == 3
    assert check_int32(1, "n", minimum=1) == 1
    for value, message in [(2**32 + 5, r"n: expected an int in \[0, 2\*\*31 - 1\] \(int32\), got 4294967301"),
                           (2**31, "got 2147483648"), (-1, "got -1"), (True, "expected an int, got True"),
                           (3.0, "expected an int, got float"), ("4", "expected an int, got str")]:
        with pytest.raises(InputError, match=message):
            check_int32(value, "n")
    with pytest.raises(InputError, match=r"\[1, 2\*\*31 - 1\]"):
        check_int32(0, "n", minimum=1)


def test_host_ints_past_int32_are_refused_before_the_kernel():
    """Checked before the tensors (so this runs without a GPU): 2**32 + 5 would reach the kernel as 5."""
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    with pytest.raises(InputError, match="padded_seqlen: expected an int in"):
        ops.rebuild_padding(torch.zeros(5, 8), cu, 2**32 + 5)
    with pytest.raises(InputError, match="padded_seqlen: expected an int"):
        ops.rebuild_padding(torch.zeros(5, 8), cu, 4.0)
    with pytest.raises(InputError, match="total_tokens: expected an int in"):
        ops.remove_padding(torch.zeros(2, 4, 8), cu, 2**32 + 5)
