"""decode_gemm (padfree.ops.decode_gemm): a decode step's linear layer on Hopper's wgmma with the input's
LayerNorm folded into the weight, against a float64 torch reference of the unfolded layer (LayerNorm,
linear, bias, activation, residual) on fresh random data. Outputs are poisoned first, and the rows past
`rows` of the buffer `out` is a view of must stay as they were. Shapes: every cluster split (in_features
512, 1024, 2048, 4096; 768 and 1536 as slices of six chunks), Marian's and NLLB's widths, 1 to 256 rows
(a 64-row tile a grid row: whole, partial and single-row last tiles)."""
from __future__ import annotations

import math
import os
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (decode_gemm)", allow_module_level=True)

from padfree.ops import InputError  # noqa: E402
from padfree.ops.decode_gemm import decode_gemm, decode_gemm_fits, fold_layernorm  # noqa: E402

if not decode_gemm_fits(64, 1024, 1024, torch.float16, torch.device("cuda")):
    pytest.skip("decode_gemm runs on compute capability 9.0 with the library's sm_90a code",
                allow_module_level=True)

sys.path.insert(0, os.path.dirname(__file__))
from test_decode_linear import (  # noqa: E402
    ACTS,
    HALF,
    TOLERANCE,
    reference as linear_reference,  # noqa: E402
)

# TOLERANCE: the reference rounds the LayerNorm's output to the dtype, as HF's is; decode_gemm rounds the
# folded weight and bias instead


def reference(x, w, bias, residual, ln, act, dtype):
    return linear_reference(x, w, bias, residual, ln, act, dtype)[0]


def run(seed, dtype, rows, k, n, *, bias, residual, ln, act):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, k, generator=g, device="cuda") * 2 + 0.5).to(dtype)
    w = (torch.randn(n, k, generator=g, device="cuda") / math.sqrt(k)).to(dtype)
    b = torch.randn(n, generator=g, device="cuda").to(dtype) if bias else None
    r = torch.randn(rows, n, generator=g, device="cuda").to(dtype) if residual else None
    norm = None
    if ln:
        norm = ((1 + 0.2 * torch.randn(k, generator=g, device="cuda")).to(dtype),
                (0.1 * torch.randn(k, generator=g, device="cuda")).to(dtype), 1e-5)
    buffer = torch.full((rows + 3, n), float("nan"), dtype=dtype, device="cuda")
    out = buffer[:rows]
    decode_gemm(x, fold_layernorm(w, b, norm), residual=r, activation=act, out=out)
    ref = reference(x, w, b, r, norm, act, dtype)
    assert not out.isnan().any(), "an output element was not written"
    assert buffer[rows:].isnan().all(), "a row past `rows` was written"
    err = ((out.double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)).max().item()
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("rows", [1, 9, 16, 17, 40, 64, 65, 129, 200, 256])
@pytest.mark.parametrize("k,n", [(512, 1536), (1024, 3072), (1024, 4096), (4096, 1024), (2048, 512), (768, 3072),
                                 (1536, 64)])
def test_decode_gemm_matches_float64(seed, dtype, rows, k, n):
    run(seed, dtype, rows, k, n, bias=True, residual=False, ln=False, act=None)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("act", list(ACTS), ids=str)
@pytest.mark.parametrize("rows", [12, 64, 161, 256])
def test_decode_gemm_folded_layernorm_activation_residual(seed, dtype, act, rows):
    run(seed, dtype, rows, 1024, 3072, bias=True, residual=True, ln=True, act=act)
    run(seed + 1, dtype, rows, 512, 2048, bias=False, residual=False, ln=True, act=act)
    run(seed + 2, dtype, rows, 4096, 1024, bias=True, residual=True, ln=True, act=act)
    run(seed + 3, dtype, rows, 768, 3072, bias=True, residual=True, ln=True, act=act)   # slices of 6 chunks


def test_decode_gemm_residual_in_place(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(192, 1024, generator=g, device="cuda").half()
    w = (torch.randn(1024, 1024, generator=g, device="cuda") / 32).half()
    b = torch.randn(1024, generator=g, device="cuda").half()
    acc = torch.randn(192, 1024, generator=g, device="cuda").half()
    expected = acc.double() + x.double() @ w.double().t() + b.double()
    decode_gemm(x, fold_layernorm(w, b, None), residual=acc, out=acc)
    torch.testing.assert_close(acc.double(), expected, rtol=4e-3, atol=4e-3)


def test_decode_gemm_refuses_bad_input():
    def zeros(*shape, dtype=torch.float16):
        return torch.zeros(*shape, dtype=dtype, device="cuda")
    for rows, k, n, dtype, what in [(257, 1024, 64, torch.float16, "257 x 1024"),
                                    (4, 1024, 64, torch.float32, "float32"),
                                    (4, 1000, 64, torch.float16, "4 x 1000"), (4, 1024, 40, torch.float16, "-> 40")]:
        with pytest.raises(InputError, match=what):
            decode_gemm(zeros(rows, k, dtype=dtype), fold_layernorm(zeros(n, k, dtype=dtype), None, None))
