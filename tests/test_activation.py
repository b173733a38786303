"""Bias + GELU kernel (erf and tanh forms) against a float64 PyTorch reference."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from padfree import ops
from padfree.ops import InputError

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
GUARD_ROWS = 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [8, 768, 3072, 4104])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("rows", [1, 129, 4096])
def test_bias_gelu(seed, dtype, cols, approximate, with_bias, rows):
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(rows, cols, generator=gen)).to(dtype).cuda()
    bias = torch.randn(cols, generator=gen).to(dtype).cuda() if with_bias else None
    buffer = torch.full((rows + GUARD_ROWS, cols), float("nan"), dtype=dtype, device="cuda")
    out = ops.bias_gelu(x, bias, approximate=approximate, out=buffer[:rows])
    ref = F.gelu(x.double() + (bias.double() if with_bias else 0), approximate=approximate)
    torch.cuda.synchronize()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    assert torch.isnan(buffer[rows:]).all(), "kernel wrote past its rows"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place(seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(300, 3072, generator=gen).to(dtype).cuda()
    bias = torch.randn(3072, generator=gen).to(dtype).cuda()
    expected = ops.bias_gelu(x, bias)
    ops.bias_gelu(x, bias, out=x)
    torch.cuda.synchronize()
    assert torch.equal(x, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("case, message", [
    ("cols", "multiple of 8"),
    ("approximate", "approximate"),
    ("bias_shape", "bias: expected shape"),
    ("bias_dtype", "bias: expected dtype"),
    ("misaligned", "16-byte aligned"),
    ("int", "x: expected dtype"),
])
def test_bad_input(case, message):
    x = torch.randn(4, 64, device="cuda", dtype=torch.float16)
    bias = torch.zeros(64, device="cuda", dtype=torch.float16)
    kwargs = {}
    if case == "cols":
        x, bias = x[:, :60].contiguous(), bias[:60].contiguous()
    elif case == "approximate":
        kwargs["approximate"] = "erf"
    elif case == "bias_shape":
        bias = torch.zeros(72, device="cuda", dtype=torch.float16)
    elif case == "bias_dtype":
        bias = bias.float()
    elif case == "misaligned":
        x = torch.randn(4 * 64 + 1, device="cuda", dtype=torch.float16)[1:].view(4, 64)
    elif case == "int":
        x = torch.ones(4, 64, device="cuda", dtype=torch.int64)
    with pytest.raises(InputError, match=message):
        ops.bias_gelu(x, bias, **kwargs)


def test_cpu_tensor_is_refused():
    with pytest.raises(InputError, match="CUDA tensor"):
        ops.bias_gelu(torch.randn(2, 8))
