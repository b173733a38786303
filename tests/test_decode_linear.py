"""decode_linear (padfree.ops): a decode step's few-row linear layer with its input LayerNorm, bias,
activation and residual, against a float64 torch reference on fresh random data, outputs poisoned first.
Shapes cover every row count the kernels take (1 to 8 in one block's tiles: the instantiations 1, 2, 4 on
CUDA cores, 8 on tensor cores in float16 / bfloat16 and CUDA cores in float32; 9 to 64 on a cluster's
tensor cores in float16 / bfloat16: 16, 32 and 64 staged rows, partly filled), output
widths that leave a partial tile (features past N never written), the widths of Marian (512, 2048) and
NLLB (1024, 4096) and a vocabulary projection (many tiles per block). The fragment-order kernel
(1 to 64 rows, weights from fragment_layout) the same way, and its layout against a torch permutation."""
from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (decode_linear)", allow_module_level=True)

from padfree.ops import FragmentWeight, InputError, decode_linear, fragment_layout  # noqa: E402
from padfree.ops.decoder import decode_linear_fits, decode_linear_streams  # noqa: E402
from padfree.ops.fragments import fragments_fit  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# relative error of a row against the float64 reference: float32 accumulates in a different order; the
# half types round the LayerNorm output (as a LayerNorm kernel's output is) and the result
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
ACTS = {None: lambda y: y, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"), "silu": torch.nn.functional.silu}


def reference(x, w, bias, residual, ln, act, dtype):
    h = x.double()
    if ln is not None:
        gamma, beta, eps = ln
        h = torch.nn.functional.layer_norm(h, (h.shape[-1],), gamma.double(), beta.double(), eps)
        h = h.to(dtype).double()      # the LayerNorm's output is rounded to the dtype, as HF's is
    y = h @ w.double().t()
    if bias is not None:
        y = y + bias.double()
    y = ACTS[act](y)
    if residual is not None:
        y = y + residual.double()
    return y, (h if ln is not None else None)


def run(seed, dtype, rows, k, n, *, bias, residual, ln, act, side=False, fragments=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, k, generator=g, device="cuda").to(dtype) * 2 + 0.5
    w = (torch.randn(n, k, generator=g, device="cuda") / math.sqrt(k)).to(dtype)
    b = torch.randn(n, generator=g, device="cuda").to(dtype) if bias else None
    r = torch.randn(rows, n, generator=g, device="cuda").to(dtype) if residual else None
    norm = None
    if ln:
        norm = (1 + 0.2 * torch.randn(k, generator=g, device="cuda")).to(dtype), \
               (0.1 * torch.randn(k, generator=g, device="cuda")).to(dtype), 1e-5
    out = torch.full((rows, n), float("nan"), dtype=dtype, device="cuda")
    normed = torch.full((rows, k), float("nan"), dtype=dtype, device="cuda") if side else None
    decode_linear(x, fragment_layout(w) if fragments else w, b, r, ln=norm, activation=act, out=out,
                  x_norm_out=normed)
    ref, ref_norm = reference(x, w, b, r, norm, act, dtype)
    assert not out.isnan().any(), "an output element was not written"
    err = ((out.double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)).max().item()
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"
    if side:
        assert not normed.isnan().any()
        # the same LayerNorm to the dtype's rounding (float32 statistics against float64's)
        torch.testing.assert_close(normed.double(), ref_norm, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
# 520: in_features not a multiple of 32 (the tensor-core loop's last chunk partly past the row)
@pytest.mark.parametrize("k,n", [(512, 1536), (1024, 4096), (4096, 1024), (64, 37), (512, 58101), (520, 100)])
def test_decode_linear_matches_float64(seed, dtype, rows, k, n):
    if k * (1 << (rows - 1).bit_length()) * (4 if dtype == torch.float32 else 2) > 96 * 1024:
        pytest.skip("beyond the staged rows x in_features (the caller runs a GEMM)")
    run(seed, dtype, rows, k, n, bias=True, residual=False, ln=False, act=None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", list(ACTS), ids=str)
@pytest.mark.parametrize("rows", [4, 8])   # 16-bit types: CUDA cores, then tensor cores (5-8 rows)
def test_decode_linear_fused_layernorm_activation(seed, dtype, act, rows):
    run(seed, dtype, rows, 1024, 4096, bias=True, residual=False, ln=True, act=act)


HALF = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("rows", [9, 16, 17, 32, 40, 64])
@pytest.mark.parametrize("k,n", [(512, 1536), (1024, 4096), (4096, 1024), (2048, 512), (128, 37), (512, 58101),
                                 (768, 3072)])   # BART-base: a slice of 24 vectors, not a divisor of the block
def test_decode_linear_tensor_cores_match_float64(seed, dtype, rows, k, n):
    if not decode_linear_fits(rows, k, dtype, ln=False):
        pytest.skip("beyond the tensor-core kernel's staged rows x in_features (the caller runs a GEMM)")
    run(seed, dtype, rows, k, n, bias=True, residual=False, ln=False, act=None)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("act", list(ACTS), ids=str)
@pytest.mark.parametrize("rows", [12, 64])
def test_decode_linear_tensor_cores_fused_layernorm_activation_residual(seed, dtype, act, rows):
    run(seed, dtype, rows, 1024, 3072, bias=True, residual=True, ln=True, act=act, side=True)
    run(seed + 1, dtype, rows, 512, 2048, bias=False, residual=False, ln=True, act=act)


# the cluster's tensor cores (48 rows) and the fragment kernel (4, 16 rows) with out as the residual
@pytest.mark.parametrize("rows, fragments", [(48, False), (4, True), (16, True), (64, True)],
                         ids=["cluster", "fragments4", "fragments16", "fragments64"])
def test_decode_linear_tensor_cores_residual_in_place(seed, rows, fragments):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, 1024, generator=g, device="cuda").half()
    w = (torch.randn(1024, 1024, generator=g, device="cuda") / 32).half()
    acc = torch.randn(rows, 1024, generator=g, device="cuda").half()
    expected = acc.double() + x.double() @ w.double().t()
    decode_linear(x, fragment_layout(w) if fragments else w, residual=acc, out=acc)
    torch.testing.assert_close(acc.double(), expected, rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_linear_residual_and_side_output(seed, dtype):
    run(seed, dtype, 4, 512, 512, bias=True, residual=True, ln=True, act=None, side=True)
    run(seed + 1, dtype, 7, 512, 512, bias=False, residual=True, ln=False, act=None)
    run(seed + 2, dtype, 8, 1024, 512, bias=True, residual=True, ln=True, act="relu", side=True)


def test_decode_linear_residual_in_place(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(4, 512, generator=g, device="cuda")
    w = torch.randn(256, 512, generator=g, device="cuda") / 20
    acc = torch.randn(4, 256, generator=g, device="cuda")
    expected = acc.double() + x.double() @ w.double().t()
    decode_linear(x, w, residual=acc, out=acc)
    torch.testing.assert_close(acc.double(), expected, rtol=1e-5, atol=1e-5)


def test_decode_linear_refuses_bad_input():
    x = torch.zeros(4, 512, device="cuda")
    w = torch.zeros(64, 512, device="cuda")
    with pytest.raises(InputError, match="rows"):
        decode_linear(torch.zeros(9, 512, device="cuda"), w)     # float32 past 8 rows: no tensor-core path
    with pytest.raises(InputError, match="rows"):
        decode_linear(torch.zeros(65, 512, device="cuda").half(), w.half())
    with pytest.raises(InputError, match="multiple of 128"):
        decode_linear(torch.zeros(9, 520, device="cuda").half(), torch.zeros(64, 520, device="cuda").half())
    with pytest.raises(InputError, match="use a GEMM"):   # 64 rows of 8192 do not fit shared memory
        decode_linear(torch.zeros(64, 8192, device="cuda").half(), torch.zeros(64, 8192, device="cuda").half())
    with pytest.raises(InputError, match="weight"):
        decode_linear(x, torch.zeros(64, 256, device="cuda"))
    with pytest.raises(InputError, match="activation"):
        decode_linear(x, w, activation="tanh")
    with pytest.raises(InputError, match="x_norm_out"):
        decode_linear(x, w, x_norm_out=torch.zeros(4, 512, device="cuda"))
    with pytest.raises(InputError, match="overlap"):
        decode_linear(x, torch.zeros(512, 512, device="cuda"), out=x)
    with pytest.raises(InputError, match="dtype"):
        decode_linear(x, w.half())
    wide = 16384 + 8   # 1 row staged fits, the LayerNorm's gamma and beta beside it do not
    with pytest.raises(InputError, match="with ln"):
        decode_linear(torch.zeros(1, wide, device="cuda"), torch.zeros(8, wide, device="cuda"),
                      ln=(torch.ones(wide, device="cuda"), torch.zeros(wide, device="cuda"), 1e-5))
    gamma = torch.ones(513, device="cuda")[1:]   # 4 bytes past an allocation: the kernel reads 16-byte vectors
    with pytest.raises(InputError, match="ln gamma"):
        decode_linear(x, w, ln=(gamma, torch.zeros(512, device="cuda"), 1e-5))


# ---- the fragment-order kernel (weights from fragment_layout) ----------------------------------------

def fragment_reference(w):
    """fragment_layout's order by torch's view and permute: [N/16][K/16][lane (g, t)][8], element j = 2 *
    register + e of lane (g, t): feature g + 8 * (register % 2), k = 8 * (register // 2) + 2t + e."""
    n, k = w.shape
    # w[tile, fh, g, step, kh, t, e] -> [tile, step, g, t, kh, fh, e]
    return w.view(n // 16, 2, 8, k // 16, 2, 4, 2).permute(0, 3, 2, 5, 4, 1, 6).reshape(n // 16, k // 16, 32, 8)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("k,n", [(128, 16), (512, 1536), (1024, 3072)])
def test_fragment_layout_matches_the_permutation(seed, dtype, k, n):
    w = torch.randn(n, k, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda").to(dtype)
    frag = fragment_layout(w)
    assert isinstance(frag, FragmentWeight) and frag.shape == (n, k)
    assert torch.equal(frag.data, fragment_reference(w))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 12, 16])   # 9-16: a second row tile
# Marian's, NLLB's and BART-base's widths (768: 6 mma steps a warp, not a multiple of the 16 in flight),
# and a padded vocabulary projection (3632 blocks: many more than resident)
@pytest.mark.parametrize("k,n", [(512, 1536), (1024, 4096), (4096, 1024), (2048, 512), (768, 3072), (512, 58112)])
def test_decode_linear_fragments_match_float64(seed, dtype, rows, k, n):
    run(seed, dtype, rows, k, n, bias=True, residual=False, ln=False, act=None, fragments=True)



def _sm90():
    return torch.cuda.get_device_capability() >= (9, 0)


# The vocabulary projection's stream kernel (decode_linear_stream.cu: 1-16 rows, out_features from 32768
# and a multiple of 16, the nn.Linear weight by bulk copies onto tensor cores): Marian's, BART's and NLLB's
# padded vocabularies (more tiles than warps or blocks: slots refilled many times), 32784 (tiles not a
# multiple of the warps), every width it is built for (past 8 rows up to 1024), with and without the
# LayerNorm and the bias; 9-16 rows in two row tiles, partly filled. Past 16 rows the cluster kernel runs
# (decode_linear_streams says no), checked the same way.
STREAM_SHAPES = [(512, 58112), (768, 50304), (1024, 32784), (1024, 256256), (1536, 32768), (2048, 32784)]


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17])
@pytest.mark.parametrize("k,n", STREAM_SHAPES)
def test_decode_linear_stream_matches_float64(seed, dtype, rows, k, n):
    if not _sm90():
        pytest.skip("the stream kernel runs on sm_90+ (bulk copies)")
    if rows > 8 and k > 1024:
        pytest.skip("past 8 rows the stream kernel takes in_features up to 1024 (the tensor-core kernel runs)")
    run(seed, dtype, rows, k, n, bias=(rows % 2 == 1), residual=False, ln=True, act=None, side=(rows % 8 == 3))
    run(seed + 1, dtype, rows, k, n, bias=(rows % 2 == 0), residual=False, ln=False, act=None)


@pytest.mark.parametrize("rows, kernel", [(4, "decode_linear_stream_kernel"),
                                          (13, "decode_linear_stream_rows_kernel")])
def test_decode_linear_stream_is_the_kernel_that_runs(seed, rows, kernel):
    """The shapes above reach the stream kernels (else they tested the CUDA-core or cluster kernel), where
    decode_linear_streams says they do."""
    if not _sm90():
        pytest.skip("the stream kernel runs on sm_90+ (bulk copies)")
    from torch.profiler import ProfilerActivity, profile
    assert decode_linear_streams(rows, 1024, 32784, torch.float16)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(seed, torch.float16, rows, 1024, 32784, bias=False, residual=False, ln=True, act=None)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert any(kernel + "<" in name for name in names), sorted(set(names))[:20]


def test_decode_linear_streams_says_where():
    """The C ABI's rules: rows 1-16, out_features from 32768 and a multiple of 16, the widths it is built
    for (1536 and 2048 up to 8 rows), 16-bit types, sm_90."""
    on = _sm90()
    assert decode_linear_streams(1, 1024, 256256, torch.float16) == on
    assert decode_linear_streams(16, 512, 58112, torch.bfloat16) == on
    assert decode_linear_streams(8, 2048, 32768, torch.float16) == on
    assert not decode_linear_streams(9, 2048, 32768, torch.float16)
    assert not decode_linear_streams(17, 1024, 256256, torch.float16)
    assert not decode_linear_streams(4, 1024, 32767 + 1 - 16, torch.float16)   # below 32768
    assert not decode_linear_streams(4, 1024, 58101, torch.float16)            # not a multiple of 16
    assert not decode_linear_streams(4, 1000, 58112, torch.float16)
    assert not decode_linear_streams(4, 1024, 58112, torch.float32)


# 17-64 rows: a cluster of 2 (up to 32 rows) or 4 blocks sharing the rows, partly filled ones; widths up to
# what a cluster's rows fit (3072 at 32 rows, 1536 at 64), 1040 features (a block's second tile past
# them), a padded vocabulary projection (many clusters)
MANY_ROWS = [(rows, k, n) for rows in (17, 24, 32, 33, 47, 64)
             for k, n in ((512, 1536), (1024, 4096), (768, 3072), (1024, 1040), (512, 58112), (1536, 1024),
                          (2048, 512), (3072, 1024))
             if k <= (3072 if rows <= 32 else 1536)]


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("rows,k,n", MANY_ROWS)
def test_decode_linear_fragments_many_rows_match_float64(seed, dtype, rows, k, n):
    run(seed, dtype, rows, k, n, bias=True, residual=True, ln=False, act=None, fragments=True)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("act", list(ACTS), ids=str)
@pytest.mark.parametrize("rows", [1, 4, 8, 11, 16, 29, 40, 64])
def test_decode_linear_fragments_fused_layernorm_activation_residual(seed, dtype, act, rows):
    run(seed, dtype, rows, 1024, 3072, bias=True, residual=True, ln=True, act=act, side=True, fragments=True)
    run(seed + 1, dtype, rows, 512, 2048, bias=False, residual=False, ln=True, act=act, fragments=True)


# the LayerNorm's two paths in the fragment kernel: rows normalized on their way from registers into
# shared memory (768, 1024, 1536 wide at up to 8 rows; 768 and 1024 at 9-16) or staged first and
# normalized there (1536 at 9-16 rows, 2048, 4096); NLLB's own widths (1024, and its fc2's 4096) included
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 13, 16])
@pytest.mark.parametrize("k", [768, 1024, 1536, 2048, 4096])
def test_decode_linear_fragments_layernorm_widths(seed, dtype, rows, k):
    run(seed, dtype, rows, k, 1024, bias=True, residual=True, ln=True, act="relu", side=True, fragments=True)


# 4-warp blocks (layers of more tiles than three quarters of the GPU's 8-warp block slots, at up to 4 rows;
# NLLB's fc1): every in_features they take (512-2048, 8-32 mma steps a warp), the LayerNorm's rows
# normalized from registers (512, 1024) and staged first (1536, 2048), the side output, the activation and
# residual
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("k", [512, 1024, 1536, 2048])
def test_decode_linear_fragments_four_warp_blocks(seed, dtype, rows, k):
    n = 16 * 2 * torch.cuda.get_device_properties(0).multi_processor_count   # every 8-warp block slot
    run(seed, dtype, rows, k, n, bias=True, residual=True, ln=True, act="relu", side=True, fragments=True)
    run(seed + 1, dtype, rows, k, n + 16, bias=False, residual=False, ln=False, act=None, fragments=True)


def test_decode_linear_fragments_refuse_bad_input():
    w = torch.zeros(64, 512, device="cuda").half()
    frag = fragment_layout(w)
    with pytest.raises(InputError, match="FragmentWeight takes 1 to 64 rows"):
        decode_linear(torch.zeros(65, 512, device="cuda").half(), frag)
    # 64 rows of 2048 (a cluster's 256 KB) fit no GPU's shared memory
    wide = fragment_layout(torch.zeros(64, 2048, device="cuda").half())
    assert not fragments_fit(64, 2048, 64, torch.float16)
    with pytest.raises(InputError, match="shared memory"):
        decode_linear(torch.zeros(64, 2048, device="cuda").half(), wide)
    with pytest.raises(InputError, match="in_features 256"):
        decode_linear(torch.zeros(4, 256, device="cuda").half(), frag)
    with pytest.raises(InputError, match="weight"):
        decode_linear(torch.zeros(4, 512, device="cuda").bfloat16(), frag)
    with pytest.raises(InputError, match="multiple of 128"):
        fragment_layout(torch.zeros(64, 520, device="cuda").half())
    with pytest.raises(InputError, match="weight"):
        fragment_layout(torch.zeros(64, 512, device="cuda"))
