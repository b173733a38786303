"""LayerNorm and skip LayerNorm kernels against a float64 PyTorch reference."""
from __future__ import annotations

import pytest
import torch
from _packing import random_lengths

from padfree import ops
from padfree.ops import InputError

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
# 384 (MiniLM, bge-small): 48 vectors in 16-bit types, two slots per lane, 96 in fp32, three;
# 520: 65 vectors in 16-bit types, a warp row with a partly filled third slot (768 fills it)
HIDDENS = [8, 384, 520, 768, 1024, 4096, 8192]
GUARD_ROWS = 2  # poisoned rows after the output: the kernel must not write past its rows


def total_tokens(gen: torch.Generator, batch: int, max_seqlen: int) -> int:
    """Tokens of a packed batch with lengths in [1, max_seqlen], including 1 and max_seqlen."""
    return int(random_lengths(gen, batch, max_seqlen).sum())


def reference(v: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    v = v.double()
    mean = v.mean(-1, keepdim=True)
    var = ((v - mean) ** 2).mean(-1, keepdim=True)
    return (v - mean) / torch.sqrt(var + eps) * gamma.double() + beta.double()


def random_inputs(gen, rows, hidden, dtype, n=1):
    """n activations [rows, hidden] (off-centre, so the mean matters) and gamma, beta, bias [hidden]."""
    xs = [(torch.randn(rows, hidden, generator=gen) * 2 + 0.5).to(dtype).cuda() for _ in range(n)]
    gamma = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype).cuda()
    beta = (0.1 * torch.randn(hidden, generator=gen)).to(dtype).cuda()
    bias = (0.5 * torch.randn(hidden, generator=gen)).to(dtype).cuda()
    return xs, gamma, beta, bias


def poisoned_out(rows, hidden, dtype):
    buffer = torch.full((rows + GUARD_ROWS, hidden), float("nan"), dtype=dtype, device="cuda")
    return buffer, buffer[:rows]


def assert_matches(out, ref, dtype, buffer):
    torch.cuda.synchronize()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    assert torch.isnan(buffer[out.shape[0]:]).all(), "kernel wrote past its rows"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("batch, max_seqlen", [(1, 1), (1, 128), (7, 33), (128, 64)])
def test_layernorm(seed, dtype, hidden, batch, max_seqlen):
    gen = torch.Generator().manual_seed(seed)
    rows = total_tokens(gen, batch, max_seqlen)
    (x,), gamma, beta, _ = random_inputs(gen, rows, hidden, dtype)
    eps = 1e-5
    buffer, out = poisoned_out(rows, hidden, dtype)
    result = ops.layernorm(x, gamma, beta, eps=eps, out=out)
    assert result is out
    assert_matches(out, reference(x, gamma, beta, eps), dtype, buffer)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("with_bias, with_residual", [(True, True), (False, True), (True, False)])
# (256, 64): ~8K rows, past a wave of blocks at full occupancy (the kernel's streaming form)
@pytest.mark.parametrize("batch, max_seqlen", [(1, 1), (13, 100), (128, 32), (256, 64)])
def test_skip_layernorm(seed, dtype, hidden, with_bias, with_residual, batch, max_seqlen):
    gen = torch.Generator().manual_seed(seed)
    rows = total_tokens(gen, batch, max_seqlen)
    (x, residual), gamma, beta, bias = random_inputs(gen, rows, hidden, dtype, n=2)
    bias = bias if with_bias else None
    residual = residual if with_residual else None
    eps = 1e-12
    buffer, out = poisoned_out(rows, hidden, dtype)
    ops.skip_layernorm(x, residual, gamma, beta, bias=bias, eps=eps, out=out)
    summed = (x.double() + (residual.double() if with_residual else 0)
              + (bias.double() if with_bias else 0))
    assert_matches(out, reference(summed, gamma, beta, eps), dtype, buffer)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [768, 4096])
def test_in_place(seed, dtype, hidden):
    """out may alias x (layernorm) or x / residual (skip): same result as a separate output."""
    gen = torch.Generator().manual_seed(seed)
    (x, residual), gamma, beta, bias = random_inputs(gen, 300, hidden, dtype, n=2)
    expected_ln = ops.layernorm(x, gamma, beta)
    expected_skip = ops.skip_layernorm(x, residual, gamma, beta, bias=bias)
    a = x.clone()
    ops.layernorm(a, gamma, beta, out=a)
    x1, r1 = x.clone(), residual.clone()
    ops.skip_layernorm(x1, r1, gamma, beta, bias=bias, out=x1)
    x2, r2 = x.clone(), residual.clone()
    ops.skip_layernorm(x2, r2, gamma, beta, bias=bias, out=r2)
    torch.cuda.synchronize()
    assert torch.equal(a, expected_ln)
    assert torch.equal(x1, expected_skip) and torch.equal(r1, residual)
    assert torch.equal(r2, expected_skip) and torch.equal(x2, x)


@pytest.mark.gpu
@pytest.mark.parametrize("skip", [False, True])
def test_rows_last_first(seed, skip):
    """A tensor larger than half the L2 (100 MB, more than half of any current GPU's L2) is taken last
    row first (common.cuh: rows_last_first); every row, the first and last included, must be right."""
    gen = torch.Generator().manual_seed(seed)
    rows, hidden, dtype = 65536, 768, torch.float16
    (x,), gamma, beta, bias = random_inputs(gen, rows, hidden, dtype)
    buffer, out = poisoned_out(rows, hidden, dtype)
    if skip:
        ops.skip_layernorm(x, None, gamma, beta, bias=bias, out=out)
        ref = reference(x.double() + bias.double(), gamma, beta, 1e-12)
    else:
        ops.layernorm(x, gamma, beta, out=out)
        ref = reference(x, gamma, beta, 1e-12)
    assert_matches(out, ref, dtype, buffer)


def prefetch_spans(device="cuda"):
    """A 5 MB range and views of it at odd offsets and sizes (a kernel prefetches any range's 16-byte
    aligned interior), with a copy to show that prefetching writes nothing."""
    weights = torch.randint(0, 256, (5 << 20,), dtype=torch.uint8, device=device)
    return weights, weights.clone(), [weights, weights[1:4097], weights[3:10], weights[:0]]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 300, 9000])  # one block, one wave, the streaming form
def test_l2_prefetch_changes_no_result(seed, dtype, rows):
    gen = torch.Generator().manual_seed(seed)
    (x,), gamma, beta, bias = random_inputs(gen, rows, 768, dtype)
    expected = ops.skip_layernorm(x, None, gamma, beta, bias=bias)
    weights, before, spans = prefetch_spans()
    for span in spans:
        buffer, out = poisoned_out(rows, 768, dtype)
        ops.skip_layernorm(x, None, gamma, beta, bias=bias, out=out, prefetch=span)
        torch.cuda.synchronize()
        assert torch.equal(out, expected) and torch.isnan(buffer[rows:]).all()
    assert torch.equal(weights, before)


@pytest.mark.gpu
def test_l2_prefetch_must_be_a_contiguous_tensor_on_the_device():
    x = torch.randn(4, 768, device="cuda", dtype=torch.float16)
    w = torch.ones(768, device="cuda", dtype=torch.float16)
    with pytest.raises(InputError, match="prefetch: expected a contiguous tensor"):
        ops.skip_layernorm(x, None, w, w, prefetch=torch.ones(64, 64, device="cuda").t())
    with pytest.raises(InputError, match="prefetch: expected a CUDA tensor"):
        ops.skip_layernorm(x, None, w, w, prefetch=torch.ones(64))


@pytest.mark.gpu
def test_large_mean_is_stable(seed):
    """Two-pass statistics: rows with mean 100 and spread 1 keep fp32 accuracy; E[x^2] - E[x]^2 in fp32
    would lose about 1e-3 of the variance to cancellation (1e4 * 2^-23 per term)."""
    gen = torch.Generator().manual_seed(seed)
    x = (100 + torch.randn(64, 1024, generator=gen, dtype=torch.float64)).float().cuda()
    gamma = torch.ones(1024, device="cuda")
    beta = torch.zeros(1024, device="cuda")
    out = ops.layernorm(x, gamma, beta, eps=1e-12)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.double(), reference(x, gamma, beta, 1e-12), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_zero_rows():
    x = torch.empty(0, 768, device="cuda", dtype=torch.float16)
    w = torch.ones(768, device="cuda", dtype=torch.float16)
    assert ops.layernorm(x, w, w).shape == (0, 768)


@pytest.mark.gpu
@pytest.mark.parametrize("case, message", [
    ("hidden_not_multiple", "multiple of 8"),
    ("hidden_too_large", "at most 8192"),
    ("gamma_dtype", "gamma: expected dtype"),
    ("gamma_shape", "gamma: expected shape"),
    ("int_x", "x: expected dtype"),
    ("non_contiguous", "contiguous"),
    ("misaligned", "16-byte aligned"),
    ("residual_shape", "residual: expected shape"),
    ("eps", "eps"),
    ("out_dtype", "out: expected dtype"),
])
def test_bad_input(case, message):
    h = 768
    x = torch.randn(4, h, device="cuda", dtype=torch.float16)
    w = torch.ones(h, device="cuda", dtype=torch.float16)
    kwargs = {}
    if case == "hidden_not_multiple":
        x = torch.randn(4, 12, device="cuda", dtype=torch.float16)
        w = torch.ones(12, device="cuda", dtype=torch.float16)
    elif case == "hidden_too_large":
        x = torch.randn(2, 8200, device="cuda", dtype=torch.float16)
        w = torch.ones(8200, device="cuda", dtype=torch.float16)
    elif case == "gamma_dtype":
        kwargs["gamma"] = w.float()
    elif case == "gamma_shape":
        kwargs["gamma"] = torch.ones(h + 8, device="cuda", dtype=torch.float16)
    elif case == "int_x":
        x = torch.ones(4, h, device="cuda", dtype=torch.int32)
    elif case == "non_contiguous":
        x = torch.randn(h, 4, device="cuda", dtype=torch.float16).t()
    elif case == "misaligned":
        x = torch.randn(4 * h + 1, device="cuda", dtype=torch.float16)[1:].view(4, h)
    elif case == "eps":
        kwargs["eps"] = -1.0
    elif case == "out_dtype":
        kwargs["out"] = torch.empty(4, h, device="cuda", dtype=torch.float32)
    gamma = kwargs.pop("gamma", w)
    with pytest.raises(InputError, match=message):
        if case == "residual_shape":
            ops.skip_layernorm(x, x[:2], gamma, w)
        else:
            ops.layernorm(x, gamma, w, **kwargs)


def test_cpu_tensor_is_refused():
    """Runs without a GPU: the device check comes before any library call."""
    x = torch.randn(4, 768)
    with pytest.raises(InputError, match="CUDA tensor"):
        ops.layernorm(x, torch.ones(768), torch.zeros(768))
    with pytest.raises(InputError, match="CUDA tensor"):
        ops.skip_layernorm(x, x, torch.ones(768), torch.zeros(768))


def test_one_epsilon_rule():
    """Finite and >= 0, as the C ABI's check_eps and the plugins' check_epsilon (the plugin harness
    checks their side): eps 0 is a well defined LayerNorm; 1e39 would reach the kernel as float32 inf."""
    from padfree.ops._tensors import check_eps
    for eps in (0.0, 1e-12, 1.0, 2.0, float(torch.finfo(torch.float32).max)):
        check_eps(eps)
    for eps in (-1e-5, float("nan"), float("inf"), 1e39):
        with pytest.raises(InputError, match="eps: expected a finite float32 value >= 0"):
            check_eps(eps)
