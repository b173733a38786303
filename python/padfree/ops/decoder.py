"""One decoding step's attention (kernels/decoder/): masked self-attention over the K/V cache through
the beam search's cache indirection, and cross-attention over the packed encoder output.

Rows are hypotheses: rows = batch * num_beams, row r belongs to source r // num_beams. Both calls
run on torch's current stream without synchronizing; the step is a device scalar, so one captured
CUDA graph replays every step.
"""
from __future__ import annotations

import ctypes
import functools
import math

import torch

from ._tensors import (
    DTYPE_CODES,
    InputError,
    call_kernel,
    check,
    check_aligned,
    check_float,
    check_int32,
    device_capability,
    dtype_code,
    output,
    ptr,
    stream_handle,
)
from .fragments import FRAGMENTS_IN_FEATURES, FRAGMENTS_MAX_ROWS, FragmentWeight, fragments_fit

HEAD_DIMS = (64, 128)  # the head sizes kernels/decoder instantiates


def _scale(softmax_scale, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise InputError(f"softmax_scale: expected a finite positive number, got {softmax_scale!r}")
    return float(softmax_scale)


def _head_dim(width: int, num_heads: int, name: str) -> int:
    if width % num_heads:
        raise InputError(f"{name}: width {width} is not num_heads * head_dim for num_heads={num_heads}")
    head_dim = width // num_heads
    if head_dim not in HEAD_DIMS:
        raise InputError(f"{name}: head_dim {head_dim} is not built (supported: 64, 128)")
    return head_dim


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


@functools.lru_cache(maxsize=256)
def _workspace_bytes(name: str, device: int, rows: int, num_heads: int, head_dim: int, positions: int) -> int:
    # device: kept in the key, though the size no longer depends on the GPU (padfree.h)
    from .. import _lib
    del device
    value = ctypes.c_int64()
    _lib.call(name, rows, num_heads, head_dim, positions, ctypes.byref(value))
    return value.value


def _workspace(workspace, name, device, rows, num_heads, head_dim, positions):
    """(tensor, bytes): the caller's uint8 workspace, else a fresh one of the size the ABI asks for
    (None where the call runs unsplit). torch's allocator orders its reuse on the stream."""
    if workspace is not None:
        check(workspace, "workspace", dtype=torch.uint8, shape=(None,), device=device)
        check_aligned(workspace, "workspace")
        return workspace, workspace.numel()
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index == torch.cuda.current_device():
        size = _workspace_bytes(name, index, rows, num_heads, head_dim, positions)
    else:
        with torch.cuda.device(device):
            size = _workspace_bytes(name, index, rows, num_heads, head_dim, positions)
    if size == 0:
        return None, 0
    return torch.empty(size, dtype=torch.uint8, device=device), size


def decoder_self_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           cache_indir: torch.Tensor, step: torch.Tensor, num_heads: int,
                           qkv_bias: torch.Tensor | None = None, softmax_scale: float | None = None,
                           out: torch.Tensor | None = None, *, workspace: torch.Tensor | None = None,
                           state_ready: bool = False) -> torch.Tensor:
    """One decoding step of masked self-attention over the K/V cache.

    qkv:         [rows, 3 * hidden] this step's fused Q | K | V projection (bias not yet added)
    k_cache, v_cache: [rows, H, L, D], qkv's dtype; this step's K and V (bias added) are written at
                 [r, :, step, :]
    cache_indir: int32 [rows, L]: for t < step, the row whose cache slot holds position t of row r's
                 history (position step is r's own)
    step:        int32 CUDA tensor [1], 0 <= step < L (a device value: not checked here; the kernel
                 clamps it)
    qkv_bias:    [3 * hidden] or None. softmax_scale: defaults to 1 / sqrt(D).
    workspace:   uint8 CUDA scratch for the split-K partials, or None (allocated per call where the
                 sizes call for splits). Any size: a smaller one means fewer splits. Pass one to keep
                 allocations out of a CUDA-graph capture.
    state_ready: True promises that no kernel still running on the stream writes step, cache_indir or
                 the caches' positions before step (a CUDA graph of one decode step, replayed once per
                 step): the kernel reads them before its programmatic-dependent-launch wait. A broken
                 promise gives wrong results, never an access outside a tensor.
    Returns out [rows, hidden]: softmax over positions 0..step of q . k, times v.
    """
    check(qkv, "qkv", shape=(None, None))
    dtype = dtype_code(qkv, "qkv")
    check_aligned(qkv, "qkv")
    rows, width = qkv.shape
    num_heads = check_int32(num_heads, "num_heads", minimum=1)
    if width % 3:
        raise InputError(f"qkv: width {width} is not 3 * hidden")
    hidden = width // 3
    head_dim = _head_dim(hidden, num_heads, "qkv")
    check_float(k_cache, "k_cache", like=qkv, shape=(rows, num_heads, None, head_dim))
    max_len = k_cache.shape[2]
    if max_len < 1:
        raise InputError("k_cache: expected a capacity L >= 1")
    check_float(v_cache, "v_cache", like=qkv, shape=(rows, num_heads, max_len, head_dim))
    check(cache_indir, "cache_indir", dtype=torch.int32, shape=(rows, max_len), device=qkv.device)
    check(step, "step", dtype=torch.int32, shape=(1,), device=qkv.device)
    check_float(qkv_bias, "qkv_bias", like=qkv, shape=(width,), optional=True)
    scale = _scale(softmax_scale, head_dim)
    out = output(out, (rows, hidden), qkv)
    for name, other in (("qkv", qkv), ("k_cache", k_cache), ("v_cache", v_cache)):
        if _overlaps(out, other):
            raise InputError(f"out: must not overlap {name}")
    if _overlaps(k_cache, v_cache):
        raise InputError("k_cache: must not overlap v_cache")
    if rows == 0:
        return out
    ws, ws_bytes = _workspace(workspace, "padfree_decoder_self_attention_workspace_size", qkv.device, rows,
                              num_heads, head_dim, max_len)
    call_kernel("padfree_decoder_self_attention", qkv.device, ptr(qkv), ptr(qkv_bias), ptr(k_cache), ptr(v_cache),
                ptr(cache_indir), ptr(step), int(bool(state_ready)), rows, num_heads, head_dim, max_len, scale,
                ptr(ws), ws_bytes, dtype, ptr(out),
                stream_handle(qkv.device))
    return out


def cross_attention(q: torch.Tensor, kv_mem: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                    num_beams: int, num_heads: int, q_bias: torch.Tensor | None = None,
                    softmax_scale: float | None = None, out: torch.Tensor | None = None, *,
                    workspace: torch.Tensor | None = None) -> torch.Tensor:
    """One decoding step of cross-attention over the packed encoder output.

    q:          [rows, hidden], rows = batch * num_beams (q_bias [hidden] or None)
    kv_mem:     [T, 2 * hidden] packed source rows, K block | V block, bias already added
    cu_seqlens: int32 [batch + 1]; row r attends over kv_mem rows cu_seqlens[s] .. cu_seqlens[s+1] - 1,
                s = r // num_beams, read in place by all beams of s. Lengths must be in [1, max_seqlen]:
                the caller checks them (they live on the device); an empty source gives zeros, a longer
                one is cut at max_seqlen.
    workspace:  as for decoder_self_attention.
    kv_mem and cu_seqlens are read before the kernel waits on the previous one (PDL): no kernel still
    running may write them (compute them before the decode steps, as generation does).
    Returns out [rows, hidden].
    """
    check(q, "q", shape=(None, None))
    dtype = dtype_code(q, "q")
    check_aligned(q, "q")
    rows, hidden = q.shape
    num_heads = check_int32(num_heads, "num_heads", minimum=1)
    num_beams = check_int32(num_beams, "num_beams", minimum=1)
    head_dim = _head_dim(hidden, num_heads, "q")
    check_float(kv_mem, "kv_mem", like=q, shape=(None, 2 * hidden))
    check(cu_seqlens, "cu_seqlens", dtype=torch.int32, shape=(None,), device=q.device)
    batch = cu_seqlens.numel() - 1
    if batch < 0:
        raise InputError("cu_seqlens: expected [batch + 1], got an empty tensor")
    if rows != batch * num_beams:
        raise InputError(f"q: expected batch * num_beams = {batch} * {num_beams} = {batch * num_beams} rows, "
                         f"got {rows}")
    max_seqlen = check_int32(max_seqlen, "max_seqlen", minimum=1)
    check_float(q_bias, "q_bias", like=q, shape=(hidden,), optional=True)
    scale = _scale(softmax_scale, head_dim)
    out = output(out, (rows, hidden), q)
    for name, other in (("q", q), ("kv_mem", kv_mem)):
        if _overlaps(out, other):
            raise InputError(f"out: must not overlap {name}")
    if rows == 0:
        return out
    ws, ws_bytes = _workspace(workspace, "padfree_decoder_cross_attention_workspace_size", q.device, rows,
                              num_heads, head_dim, max_seqlen)
    call_kernel("padfree_decoder_cross_attention", q.device, ptr(q), ptr(q_bias), ptr(kv_mem), ptr(cu_seqlens),
                batch, num_beams, kv_mem.shape[0], max_seqlen, num_heads, head_dim, scale,
                ptr(ws), ws_bytes, dtype, ptr(out),
                stream_handle(q.device))
    return out


DECODE_LINEAR_MAX_ROWS = 8                  # kernels/decoder/decode_linear.h: kDecodeLinearMaxRows (CUDA cores)
DECODE_LINEAR_MAX_STAGE_BYTES = 96 * 1024   # kDecodeLinearMaxStageBytes
DECODE_LINEAR_MAX_SHARED_BYTES = 192 * 1024  # kDecodeLinearMaxSharedBytes
DECODE_LINEAR_MMA_MAX_ROWS = 64             # kDecodeLinearMmaMaxRows (tensor cores, 16-bit types)
DECODE_LINEAR_MMA_IN_MULTIPLE = 128         # kDecodeLinearMmaInMultiple
DECODE_LINEAR_MMA_MAX_SHARED_BYTES = 200 * 1024  # kDecodeLinearMmaMaxSharedBytes
DECODE_LINEAR_MMA_MAX_SLICE = 1024          # kDecodeLinearMmaMaxSlice: a block's slice of in_features
DECODE_LINEAR_MMA_MAX_IN = 8 * DECODE_LINEAR_MMA_MAX_SLICE  # split over 8 blocks (a multiple of 256; else 4)
ACTIVATIONS = {None: 0, "none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}


def _mma_split(in_features: int) -> int:
    """decode_linear.h's decode_linear_mma_split: the blocks in_features is split over."""
    return 8 if in_features >= 1024 and in_features % 256 == 0 else 4


def _mma_staged_rows(rows: int) -> int:
    """decode_linear.h's decode_linear_mma_staged_rows: the rows the tensor-core kernel stages."""
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


def decode_linear_mma_shared_bytes(rows: int, in_features: int, ln: bool) -> int:
    """decode_linear.h's decode_linear_mma_bytes at 64 features per block: the tensor-core kernel's shared
    memory where it fits least (it takes more features per block only where they fit)."""
    staged = _mma_staged_rows(rows)
    slice_ = in_features // _mma_split(in_features)
    stats = 4 * DECODE_LINEAR_MMA_MAX_ROWS * 4      # the row statistics: sum, squares, mean, rstd per row
    return (64 + staged) * (slice_ + 8) * 2 + (4 * slice_ if ln else 0) + 64 * staged * 4 + stats


def decode_linear_fits(rows: int, in_features: int, dtype: torch.dtype, ln: bool = True) -> bool:
    """Whether decode_linear takes rows x in_features, with a LayerNorm on x where ln (else the caller runs
    a GEMM): up to 8 rows in one block's tiles (CUDA cores; 5-8 rows of the 16-bit types on tensor cores),
    9 to 64 in the 16-bit types on a thread-block cluster's tensor cores (sm_90+: the current device's)."""
    if rows <= 0 or in_features % 8:
        return False
    if rows <= DECODE_LINEAR_MAX_ROWS:
        staged = 1 << max(0, rows - 1).bit_length()
        element = 4 if dtype == torch.float32 else 2
        return (staged * in_features * element <= DECODE_LINEAR_MAX_STAGE_BYTES
                and (not ln or (staged + 2) * in_features * element <= DECODE_LINEAR_MAX_SHARED_BYTES))
    return (rows <= DECODE_LINEAR_MMA_MAX_ROWS and dtype in (torch.float16, torch.bfloat16)
            and in_features % DECODE_LINEAR_MMA_IN_MULTIPLE == 0
            and in_features // _mma_split(in_features) <= DECODE_LINEAR_MMA_MAX_SLICE
            and torch.cuda.is_available() and device_capability(torch.cuda.current_device()) >= (9, 0)
            and decode_linear_mma_shared_bytes(rows, in_features, ln) <= DECODE_LINEAR_MMA_MAX_SHARED_BYTES)


# Rows x out_features (the rows rounded up to 16, 32 or 64) up to which the tensor-core kernel measured
# faster than cuBLASLt's GEMM with its LayerNorm / bias / residual kernels (H200, each alone in a CUDA
# graph of 20 calls): at 16 rows every width of Marian's and NLLB's layers but 1024 -> 4096 (12.5 us
# against 7.0), at 32 rows up to 1536 features, at 64 rows (5.0-7.0 us against 5.0-5.7) none of them.
# Past it the tensor-core kernel's time grows with the features, cuBLASLt's barely.
DECODE_LINEAR_MMA_PAYS_UP_TO = 16 * 3072


def decode_linear_pays(rows: int, in_features: int, out_features: int, dtype: torch.dtype, ln: bool) -> bool:
    """Whether decode_linear is the faster kernel for this linear layer: it takes the shape
    (decode_linear_fits) and, past 8 rows (tensor cores), the rows x out_features are within
    DECODE_LINEAR_MMA_PAYS_UP_TO, or the layer is a vocabulary projection its stream kernel takes
    (decode_linear_streams; without activation or residual, as an output projection is)."""
    if not decode_linear_fits(rows, in_features, dtype, ln=ln):
        return False
    return (rows <= DECODE_LINEAR_MAX_ROWS or _mma_staged_rows(rows) * out_features <= DECODE_LINEAR_MMA_PAYS_UP_TO
            or decode_linear_streams(rows, in_features, out_features, dtype))


def decode_linear_streams(rows: int, in_features: int, out_features: int, dtype: torch.dtype,
                          device: torch.device | None = None) -> bool:
    """Whether decode_linear streams this projection's weight by bulk copies onto tensor cores on `device`
    (the current CUDA device when None): a vocabulary-sized output of 1-16 rows (padfree.h:
    padfree_decode_linear_streams; the rules are the C ABI's alone), where decode_linear is the faster
    kernel for it at any of those row counts."""
    if dtype not in (torch.float16, torch.bfloat16) or not torch.cuda.is_available():
        return False
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    return _streams(int(rows), int(in_features), int(out_features), DTYPE_CODES[dtype], index)


@functools.cache
def _streams(rows: int, in_features: int, out_features: int, dtype: int, device_index: int) -> bool:
    """padfree_decode_linear_streams on one device (its answer fixed for the process: the device and
    PADFREE_DECODE_LINEAR_STREAM, read once by the library)."""
    from .. import _lib
    streams = ctypes.c_int32(0)
    with torch.cuda.device(device_index):
        status = _lib.load().padfree_decode_linear_streams(rows, in_features, out_features, dtype,
                                                           ctypes.byref(streams))
    return status == 0 and streams.value == 1


def _checked_ln(ln: tuple | None, like: torch.Tensor, width: int) -> tuple:
    """A LayerNorm argument (gamma, beta, eps) or None, checked: (gamma, beta, eps), or (None, None,
    0.0) for None. gamma and beta: like's dtype and device, [width], 16-byte aligned (the kernels read
    them as vectors)."""
    if ln is None:
        return None, None, 0.0
    gamma, beta, eps = ln
    check_float(gamma, "ln gamma", like=like, shape=(width,))
    check_float(beta, "ln beta", like=like, shape=(width,))
    if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise InputError(f"ln eps: expected a finite number >= 0, got {eps!r}")
    return gamma, beta, eps


def decode_linear(x: torch.Tensor, weight: torch.Tensor | FragmentWeight, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None, ln: tuple | None = None, activation: str | None = None,
                  out: torch.Tensor | None = None, x_norm_out: torch.Tensor | None = None) -> torch.Tensor:
    """out = act(LN(x) W^T + bias) + residual for a decode step's few rows (padfree.h: padfree_decode_linear).

    x [rows, in] (decode_linear_fits), weight [out_features, in] (nn.Linear's), bias [out_features], residual
    [rows, out_features] (may be `out`), ln = (gamma, beta, eps) normalizing each x row first,
    activation None / "relu" / "gelu" / "gelu_tanh" / "silu"; x_norm_out [rows, in]: also write LN(x)
    (a post-LN sublayer's residual). One dtype for all; in a multiple of 8.

    weight may be a FragmentWeight (ops.fragments.fragment_layout of it; 1-64 rows of float16 / bfloat16,
    ops.fragments.fragments_fit): the same layer on the fragment-order kernel.
    """
    check_float(x, "x")
    if x.dim() != 2:
        raise InputError(f"x: expected [rows, in_features], got shape {list(x.shape)}")
    rows, in_features = x.shape
    kernel, weight_data = "padfree_decode_linear", weight
    if isinstance(weight, FragmentWeight):
        out_features = weight.shape[0]
        check(weight.data, "weight", dtype=x.dtype, shape=(None, None, 32, 8), device=x.device)
        check_aligned(weight.data, "weight")
        if weight.shape[1] != in_features:
            raise InputError(f"weight: a FragmentWeight of {list(weight.shape)} for x of in_features {in_features}")
        if not fragments_fit(rows, in_features, out_features, x.dtype, x.device, ln=ln is not None):
            raise InputError(f"x: a FragmentWeight takes 1 to {FRAGMENTS_MAX_ROWS} rows in float16 / bfloat16 on "
                             f"compute capability 8.0+ with in_features one of {FRAGMENTS_IN_FEATURES} (and rows x "
                             f"in_features within the GPU's shared memory), got {rows} x {in_features} {x.dtype}; "
                             f"use the nn.Linear weight")
        kernel, weight_data = "padfree_decode_linear_fragments", weight.data
    else:
        check_float(weight, "weight", like=x, shape=(None, in_features))
        out_features = weight.shape[0]
        if not decode_linear_fits(rows, in_features, x.dtype, ln=ln is not None):
            raise InputError(f"x: decode_linear takes 1 to {DECODE_LINEAR_MAX_ROWS} rows with in_features a multiple "
                             f"of 8 and rows x in_features within {DECODE_LINEAR_MAX_STAGE_BYTES} bytes ((rows + 2) x "
                             f"in_features within {DECODE_LINEAR_MAX_SHARED_BYTES} with ln), or up to "
                             f"{DECODE_LINEAR_MMA_MAX_ROWS} rows in float16 / bfloat16 on compute capability 9.0+ with "
                             f"in_features a multiple of {DECODE_LINEAR_MMA_IN_MULTIPLE} up to "
                             f"{DECODE_LINEAR_MMA_MAX_IN} ({DECODE_LINEAR_MMA_MAX_IN // 2} unless a multiple of 256) "
                             f"and their staging within {DECODE_LINEAR_MMA_MAX_SHARED_BYTES} bytes, got {rows} x "
                             f"{in_features} {x.dtype}; use a GEMM")
    check(bias, "bias", dtype=x.dtype, shape=(out_features,), device=x.device, optional=True)
    check(residual, "residual", dtype=x.dtype, shape=(rows, out_features), device=x.device, optional=True)
    if activation not in ACTIVATIONS:
        raise InputError(f"activation: expected one of none, relu, gelu, gelu_tanh, silu, got {activation!r}")
    gamma, beta, eps = _checked_ln(ln, x, in_features)
    if x_norm_out is not None:
        if ln is None:
            raise InputError("x_norm_out: needs ln (it is the LayerNorm's output)")
        check_float(x_norm_out, "x_norm_out", like=x, shape=(rows, in_features))
    out = output(out, (rows, out_features), x)
    if _overlaps(out, x) or (x_norm_out is not None and (_overlaps(x_norm_out, x) or _overlaps(x_norm_out, out))):
        raise InputError("out and x_norm_out must not overlap x or each other")
    call_kernel(kernel, x.device, ptr(x), ptr(weight_data), ptr(bias), ptr(residual), ptr(gamma),
                ptr(beta), float(eps), ACTIVATIONS[activation], rows, in_features, out_features,
                dtype_code(x, "x"), ptr(out), ptr(x_norm_out), stream_handle(x.device))
    return out


def decoder_step_embedding(tokens: torch.Tensor, step: torch.Tensor, word_emb: torch.Tensor, positions: torch.Tensor,
                           embed_scale: float = 1.0, position_offset: int = 0, pad_token: int | None = None,
                           pad_position: int = 0, ln: tuple | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """A decode step's input rows (padfree.h: padfree_decoder_step_embedding):
    LN(word_emb[tokens] * embed_scale + positions[p]), rounded to the dtype after the multiply and the
    add as the model's ops are, p = pad_position where a token is pad_token, else step + position_offset.

    tokens int64 [rows] and step int32 [1] on the device (device values: clamped by the kernel, not
    checked here); word_emb [vocab, hidden], positions [num_positions, hidden], ln = (gamma, beta, eps)
    or None. Returns out [rows, hidden].
    """
    check(tokens, "tokens", dtype=torch.int64, shape=(None,))
    check(step, "step", dtype=torch.int32, shape=(1,), device=tokens.device)
    check_float(word_emb, "word_emb", shape=(None, None))
    if word_emb.device != tokens.device:
        raise InputError(f"word_emb: expected a tensor on {tokens.device}, got {word_emb.device}")
    vocab, hidden = word_emb.shape
    check_float(positions, "positions", like=word_emb, shape=(None, hidden))
    if hidden % 8 or not 8 <= hidden <= 8192 or vocab < 1 or positions.shape[0] < 1:
        raise InputError(f"word_emb / positions: expected hidden a multiple of 8 in [8, 8192] and non-empty tables, "
                         f"got word_emb {list(word_emb.shape)}, positions {list(positions.shape)}")
    if isinstance(embed_scale, bool) or not isinstance(embed_scale, (int, float)) or not math.isfinite(embed_scale):
        raise InputError(f"embed_scale: expected a finite number, got {embed_scale!r}")
    position_offset = check_int32(position_offset, "position_offset", minimum=0)
    pad_position = check_int32(pad_position, "pad_position", minimum=0)
    pad = -1 if pad_token is None else check_int32(pad_token, "pad_token", minimum=0)
    gamma, beta, eps = _checked_ln(ln, word_emb, hidden)
    rows = tokens.shape[0]
    out = output(out, (rows, hidden), word_emb)
    call_kernel("padfree_decoder_step_embedding", tokens.device, ptr(tokens), ptr(step), ptr(word_emb), vocab,
                float(embed_scale), ptr(positions), positions.shape[0], position_offset, pad, pad_position,
                ptr(gamma), ptr(beta), float(eps), rows, hidden, dtype_code(word_emb, "word_emb"), ptr(out),
                stream_handle(tokens.device))
    return out
