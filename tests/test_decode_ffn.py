"""decode_ffn (padfree.ops): a decode step's whole FFN sublayer in one kernel (LayerNorm, fc1, activation,
fc2, residual), against a float64 torch reference on fresh random data, outputs poisoned first. Shapes:
every row count it takes (1 to 8), Marian's and NLLB's widths, narrow widths whose split leaves blocks
with one fc2 feature and blocks with no fc1 features, pre-LN (residual x), post-LN (residual LN(x)), no
LayerNorm; repeated calls and CUDA-graph replays (the grid barrier's counters are reused), and the
two-layer decode_linear path it replaces."""
from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (decode_ffn)", allow_module_level=True)

from padfree.ops import InputError, decode_ffn, decode_linear  # noqa: E402
from padfree.ops.decoder import decode_ffn_fits, decode_ffn_workspace  # noqa: E402

if not decode_ffn_fits(4, 512, 2048, torch.float16):
    pytest.skip("decode_ffn needs compute capability 9.0+ (this GPU: "
                f"{torch.cuda.get_device_capability()})", allow_module_level=True)

DTYPES = [torch.float16, torch.bfloat16]
# relative error of a row against the float64 reference: the LayerNorm output and fc1's output are
# rounded to the dtype (as the two layers' outputs are), the sums accumulate in float32
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2}
ACTS = {None: lambda y: y, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"), "silu": torch.nn.functional.silu}


def make(seed, dtype, rows, hidden, ffn, *, bias=True, ln=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g, device="cuda")  # noqa: E731
    x = (r(rows, hidden) * 2 + 0.5).to(dtype)
    w1 = (r(ffn, hidden) / math.sqrt(hidden)).to(dtype)
    w2 = (r(hidden, ffn) / math.sqrt(ffn)).to(dtype)
    b1 = r(ffn).to(dtype) if bias else None
    b2 = r(hidden).to(dtype) if bias else None
    norm = ((1 + 0.2 * r(hidden)).to(dtype), (0.1 * r(hidden)).to(dtype), 1e-5) if ln else None
    return x, w1, b1, w2, b2, norm


def reference(x, w1, b1, w2, b2, norm, act, residual, residual_normalized, dtype):
    h = x.double()
    if norm is not None:
        gamma, beta, eps = norm
        h = torch.nn.functional.layer_norm(h, (h.shape[-1],), gamma.double(), beta.double(), eps).to(dtype).double()
    y = h @ w1.double().t()
    if b1 is not None:
        y = y + b1.double()
    y = ACTS[act](y).to(dtype).double()          # fc1's output, rounded as a layer's output is
    y = y @ w2.double().t()
    if b2 is not None:
        y = y + b2.double()
    if residual_normalized:
        y = y + h
    elif residual is not None:
        y = y + residual.double()
    return y


def check_rows(out, ref, dtype):
    assert not out.isnan().any(), "an output element was not written"
    err = ((out.double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)).max().item()
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


def run(seed, dtype, rows, hidden, ffn, *, act="relu", bias=True, ln=True, residual="x", normalized=False):
    x, w1, b1, w2, b2, norm = make(seed, dtype, rows, hidden, ffn, bias=bias, ln=ln)
    res = {"x": x, None: None, "other": torch.randn(rows, hidden, device="cuda").to(dtype)}[residual]
    out = torch.full((rows, hidden), float("nan"), dtype=dtype, device="cuda")
    decode_ffn(x, w1, b1, w2, b2, residual=res, ln=norm, activation=act, residual_normalized=normalized, out=out)
    check_rows(out, reference(x, w1, b1, w2, b2, norm, act, res, normalized, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("hidden,ffn", [(512, 2048), (1024, 4096), (96, 160), (4096, 96)])
def test_decode_ffn_matches_float64(seed, dtype, rows, hidden, ffn):
    run(seed, dtype, rows, hidden, ffn)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", list(ACTS))
def test_decode_ffn_activations_post_ln_and_no_bias(seed, dtype, act):
    run(seed, dtype, 4, 512, 2048, act=act, residual=None, normalized=True)    # post-LN: LN(x) the residual
    run(seed + 1, dtype, 3, 1024, 4096, act=act, bias=False, residual="other")
    run(seed + 2, dtype, 4, 256, 1024, act=act, ln=False, residual=None)


def test_decode_ffn_repeats_and_replays(seed):
    """The grid barrier's arrival count carries over: calls one after another, and a captured graph
    replayed on new inputs, each give the reference's result."""
    dtype, rows, hidden, ffn = torch.float16, 4, 1024, 4096
    x, w1, b1, w2, b2, norm = make(seed, dtype, rows, hidden, ffn)
    workspace = decode_ffn_workspace(rows, ffn, dtype, x.device)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        out = decode_ffn(x, w1, b1, w2, b2, residual=x, ln=norm, activation="relu", workspace=workspace)
        check_rows(out, reference(x, w1, b1, w2, b2, norm, "relu", x, False, dtype), dtype)
    out = torch.empty_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        decode_ffn(x, w1, b1, w2, b2, residual=x, ln=norm, activation="relu", workspace=workspace, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        check_rows(out, reference(x, w1, b1, w2, b2, norm, "relu", x, False, dtype), dtype)
    grid = workspace[1].item() // 6       # 3 calls, 3 replays
    assert workspace[1].item() == 6 * grid and grid > 0, "each launch's blocks arrived at the barrier once each"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_ffn_equals_two_decode_linear_calls(seed, dtype):
    """The kernel it replaces in the step: LN + fc1 + activation, then fc2 + residual, each a decode_linear;
    the same to the dtype's rounding (both round the LayerNorm and fc1's outputs, the sums' order differs)."""
    x, w1, b1, w2, b2, norm = make(seed, dtype, 4, 1024, 4096)
    fused = decode_ffn(x, w1, b1, w2, b2, residual=x, ln=norm, activation="relu")
    two = decode_linear(decode_linear(x, w1, b1, ln=norm, activation="relu"), w2, b2, residual=x)
    err = ((fused.double() - two.double()).norm(dim=-1) / two.double().norm(dim=-1)).max().item()
    assert err < TOLERANCE[dtype], f"relative difference {err:.2e}"


def test_decode_ffn_refuses_bad_input():
    x, w1, b1, w2, b2, norm = make(0, torch.float16, 4, 512, 2048)
    with pytest.raises(InputError, match="1 to 8 rows"):
        decode_ffn(torch.zeros(9, 512, device="cuda").half(), w1, b1, w2, b2)
    with pytest.raises(InputError, match="float16 / bfloat16"):
        decode_ffn(x.float(), w1.float(), None, w2.float(), None)
    with pytest.raises(InputError, match="multiples of 32"):
        decode_ffn(torch.zeros(4, 520, device="cuda").half(), torch.zeros(2048, 520, device="cuda").half(), None,
                   torch.zeros(520, 2048, device="cuda").half(), None)
    assert not decode_ffn_fits(4, 2048, 8192, torch.float16)     # a block's slices past shared memory
    with pytest.raises(InputError, match="run the two layers as decode_linear"):
        decode_ffn(torch.zeros(4, 2048, device="cuda").half(), torch.zeros(8192, 2048, device="cuda").half(), None,
                   torch.zeros(2048, 8192, device="cuda").half(), None)
    with pytest.raises(InputError, match="w2"):
        decode_ffn(x, w1, b1, w2.t().contiguous(), b2)
    with pytest.raises(InputError, match="residual_normalized"):
        decode_ffn(x, w1, b1, w2, b2, residual_normalized=True)
    with pytest.raises(InputError, match="activation"):
        decode_ffn(x, w1, b1, w2, b2, activation="tanh")
    with pytest.raises(InputError, match="overlap"):
        decode_ffn(x, w1, b1, w2, b2, out=x)
    with pytest.raises(InputError, match="workspace h"):
        decode_ffn(x, w1, b1, w2, b2, workspace=(torch.empty(2, 2048, device="cuda").half(),
                                                  torch.zeros(1, dtype=torch.int64, device="cuda")))
    with pytest.raises(InputError, match="workspace barrier"):
        decode_ffn(x, w1, b1, w2, b2, workspace=(torch.empty(4, 2048, device="cuda").half(),
                                                  torch.zeros(2, dtype=torch.int32, device="cuda")))
