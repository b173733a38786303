"""Embedding + LayerNorm kernel on packed tokens against a float64 PyTorch reference."""
from __future__ import annotations

import pytest
import torch
from _packing import cu_of, random_lengths

from padfree import ops
from padfree.ops import InputError

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
VOCAB, TYPE_VOCAB = 1000, 2
GUARD_ROWS = 2


def tables(gen, hidden, max_positions, dtype):
    def t(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(*shape, generator=gen)).to(dtype).cuda()
    return dict(word=t(VOCAB, hidden), position=t(max_positions, hidden, scale=0.5),
                type=t(TYPE_VOCAB, hidden, scale=0.2), gamma=t(hidden, scale=0.1, shift=1.0),
                beta=t(hidden, scale=0.1))


def reference(ids, types, lengths, tabs, position_offset, eps, with_types, layernorm=True):
    """float64 on the GPU. Positions restart at position_offset in every sequence; ids are clamped
    as the kernel does. layernorm False: the sum itself (Marian, M2M100)."""
    cu = cu_of(lengths).long().cuda()
    seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths).cuda()
    t = torch.arange(int(lengths.sum()), device="cuda")
    positions = (position_offset + t - cu[seq]).clamp(0, tabs["position"].shape[0] - 1)
    v = tabs["word"].double()[ids.long().clamp(0, VOCAB - 1)]
    v = v + tabs["position"].double()[positions]
    if with_types:
        v = v + tabs["type"].double()[types.long().clamp(0, TYPE_VOCAB - 1)]
    if not layernorm:
        return v
    mean = v.mean(-1, keepdim=True)
    var = ((v - mean) ** 2).mean(-1, keepdim=True)
    return (v - mean) / torch.sqrt(var + eps) * tabs["gamma"].double() + tabs["beta"].double()


def run(ids, types, cu, tabs, position_offset, eps, with_types, rows, layernorm=True):
    dtype, hidden = tabs["word"].dtype, tabs["word"].shape[1]
    buffer = torch.full((rows + GUARD_ROWS, hidden), float("nan"), dtype=dtype, device="cuda")
    out = ops.embedding_layernorm(
        ids, cu, tabs["word"], tabs["position"], tabs["gamma"] if layernorm else None,
        tabs["beta"] if layernorm else None, eps=eps,
        token_type_ids=types if with_types else None,
        token_type_embeddings=tabs["type"] if with_types else None,
        position_offset=position_offset, out=buffer[:rows])
    torch.cuda.synchronize()
    assert torch.isnan(buffer[rows:]).all(), "kernel wrote past its rows"
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [8, 384, 520, 768, 1024, 4096, 8192])  # 384, 520: see test_layernorm
@pytest.mark.parametrize("batch, max_seqlen", [(1, 1), (1, 512), (9, 77), (128, 128)])
# layernorm False: no gamma, beta (Marian: offset 0; M2M100: padding_idx + 1), the sum rounded once
@pytest.mark.parametrize("position_offset, with_types, layernorm",
                         [(0, True, True), (2, False, True), (0, False, False), (2, True, False)])
def test_embedding_layernorm(seed, dtype, hidden, batch, max_seqlen, position_offset, with_types, layernorm):
    gen = torch.Generator().manual_seed(seed)
    lengths = random_lengths(gen, batch, max_seqlen)
    rows = int(lengths.sum())
    tabs = tables(gen, hidden, max_seqlen + position_offset, dtype)
    ids = torch.randint(0, VOCAB, (rows,), generator=gen, dtype=torch.int32).cuda()
    types = torch.randint(0, TYPE_VOCAB, (rows,), generator=gen, dtype=torch.int32).cuda()
    eps = 1e-12
    out = run(ids, types, cu_of(lengths).cuda(), tabs, position_offset, eps, with_types, rows, layernorm)
    tol = TOLERANCE[dtype]
    want = reference(ids, types, lengths, tabs, position_offset, eps, with_types, layernorm)
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
    if not layernorm:
        # The sum in fp32, rounded to the dtype once: within half a unit in the last place of the exact
        # sum, plus the fp32 adds' error (2^-24 of the partial sums, twice) and the subnormal spacing.
        # Rounding after each add (the dtype's own arithmetic) breaks this bound.
        info = torch.finfo(dtype)
        magnitude = reference(ids, types, lengths, {k: v.abs() for k, v in tabs.items()}, position_offset, eps,
                              with_types, layernorm=False)
        bound = 0.5 * info.eps * want.abs() + 2.0 ** -22 * magnitude + info.tiny * info.eps
        assert ((out.double() - want).abs() <= bound).all(), "not the fp32 sum rounded once"


@pytest.mark.gpu
@pytest.mark.parametrize("batch, max_seqlen", [(1, 128), (64, 512)])
def test_l2_prefetch_changes_no_result(seed, batch, max_seqlen):
    from test_layernorm import prefetch_spans
    gen = torch.Generator().manual_seed(seed)
    lengths = random_lengths(gen, batch, max_seqlen)
    rows = int(lengths.sum())
    tabs = tables(gen, 768, max_seqlen, torch.float16)
    ids = torch.randint(0, VOCAB, (rows,), generator=gen, dtype=torch.int32).cuda()
    cu = cu_of(lengths).cuda()
    expected = ops.embedding_layernorm(ids, cu, tabs["word"], tabs["position"], tabs["gamma"], tabs["beta"])
    weights, before, spans = prefetch_spans()
    for span in spans:
        out = ops.embedding_layernorm(ids, cu, tabs["word"], tabs["position"], tabs["gamma"], tabs["beta"],
                                      prefetch=span)
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
    assert torch.equal(weights, before)


@pytest.mark.gpu
def test_type_table_without_ids_uses_type_zero(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 3])
    tabs = tables(gen, 64, 8, torch.float32)
    ids = torch.randint(0, VOCAB, (8,), generator=gen, dtype=torch.int32).cuda()
    out = ops.embedding_layernorm(ids, cu_of(lengths).cuda(), tabs["word"], tabs["position"], tabs["gamma"],
                                  tabs["beta"], token_type_embeddings=tabs["type"])
    zeros = torch.zeros(8, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    torch.testing.assert_close(out.double(), reference(ids, zeros, lengths, tabs, 0, 1e-12, True),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_zero_length_sequences_and_out_of_range_ids(seed):
    """Bucket padding repeats cu_seqlens entries (empty sequences): positions still restart per
    sequence. Ids outside the table are clamped, never read out of bounds."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([0, 4, 0, 0, 6, 1, 0])
    rows = int(lengths.sum())
    tabs = tables(gen, 256, 16, torch.float32)
    ids = torch.randint(0, VOCAB, (rows,), generator=gen, dtype=torch.int32)
    ids[0], ids[5], ids[-1] = -7, VOCAB, VOCAB + 12345
    types = torch.randint(0, TYPE_VOCAB, (rows,), generator=gen, dtype=torch.int32)
    types[1] = 9
    ids, types = ids.cuda(), types.cuda()
    out = run(ids, types, cu_of(lengths).cuda(), tabs, 0, 1e-5, True, rows)
    torch.testing.assert_close(out.double(), reference(ids, types, lengths, tabs, 0, 1e-5, True),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("case, message", [
    ("ids_dtype", "input_ids: expected dtype"),
    ("hidden", "multiple of 8"),
    ("table_dtype", "position_embeddings: expected dtype"),
    ("table_width", "position_embeddings: expected shape"),
    ("types_without_table", "token_type_ids"),
    ("types_length", "token_type_ids: expected shape"),
    ("empty_cu", "batch >= 1"),
    ("offset", "position_offset"),
])
def test_bad_input(case, message):
    h = 64
    ids = torch.zeros(6, dtype=torch.int32, device="cuda")
    cu = torch.tensor([0, 2, 6], dtype=torch.int32, device="cuda")
    word = torch.randn(10, h, device="cuda")
    pos = torch.randn(8, h, device="cuda")
    w = torch.ones(h, device="cuda")
    kwargs = {}
    if case == "ids_dtype":
        ids = ids.long()
    elif case == "hidden":
        word, pos = torch.randn(10, 12, device="cuda"), torch.randn(8, 12, device="cuda")
        w = torch.ones(12, device="cuda")
    elif case == "table_dtype":
        pos = pos.half()
    elif case == "table_width":
        pos = torch.randn(8, h + 8, device="cuda")
    elif case == "types_without_table":
        kwargs["token_type_ids"] = ids.clone()
    elif case == "types_length":
        kwargs["token_type_ids"] = ids[:3].clone()
        kwargs["token_type_embeddings"] = torch.randn(2, h, device="cuda")
    elif case == "empty_cu":
        cu = cu[:1].clone()
    elif case == "offset":
        kwargs["position_offset"] = -1
    with pytest.raises(InputError, match=message):
        ops.embedding_layernorm(ids, cu, word, pos, w, w, **kwargs)


@pytest.mark.parametrize("given", ["gamma", "beta"])
def test_gamma_without_beta_is_refused(given):
    """Both (LayerNorm) or neither (the sum itself): checked before the tensors (no GPU needed)."""
    ids, w = torch.zeros(3, dtype=torch.int32), torch.ones(8)
    gamma, beta = (w, None) if given == "gamma" else (None, w)
    with pytest.raises(InputError, match="gamma and beta: give both"):
        ops.embedding_layernorm(ids, torch.tensor([0, 3], dtype=torch.int32), torch.randn(4, 8), torch.randn(4, 8),
                                gamma, beta)


def test_cpu_tensor_is_refused():
    ids = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(InputError, match="CUDA tensor"):
        ops.embedding_layernorm(ids, torch.tensor([0, 3], dtype=torch.int32), torch.randn(4, 8),
                                torch.randn(4, 8), torch.ones(8), torch.zeros(8))


@pytest.mark.parametrize("offset", [2**32 + 2, 2**31, -1, 1.5])
def test_position_offset_outside_int32_is_refused(offset):
    """Checked before the tensors (no GPU needed): 2**32 + 2 would reach the kernel as 2."""
    ids = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(InputError, match="position_offset: expected an int"):
        ops.embedding_layernorm(ids, torch.tensor([0, 3], dtype=torch.int32), torch.randn(4, 8), torch.randn(4, 8),
                                torch.ones(8), torch.zeros(8), position_offset=offset)
