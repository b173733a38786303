"""The C ABI refuses bad arguments with a status and a last-error text, before touching the GPU.

Runs without a GPU (CI): every call below has at least one invalid argument, so no kernel is ever
launched and the fake device addresses are never dereferenced. Skips where the library is not built
or was deliberately built without a family (PADFREE_KERNEL_FAMILIES); a stale library fails.
"""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from padfree import _lib, env

try:
    _LIB = _lib.load()
    _SKIP = None
except Exception as e:  # noqa: BLE001 - the skip reason
    _LIB, _SKIP = None, f"kernel library not built/loadable here: {e}"

pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")

A = 0x10000  # a 16-byte aligned fake device address (never dereferenced)
M = A + 4  # misaligned
F32, F16, BF16 = 0, 1, 2
INVALID = _lib.STATUS_INVALID_ARGUMENT


_CAPI_SOURCES = Path(__file__).resolve().parent.parent / "plugins" / "capi"


def _family(name: str) -> str:
    """The kernel family (plugins/capi/<family>_capi.cpp) that defines C ABI function `name`."""
    for source in sorted(_CAPI_SOURCES.glob("*_capi.cpp")):
        if re.search(rf"\b{name}\s*\(", source.read_text()):
            return source.stem.removesuffix("_capi")
    return "unknown"


def _built_families() -> set[str] | None:
    """The families the library was deliberately built with: $PADFREE_KERNEL_FAMILIES, else the
    PADFREE_KERNEL_FAMILIES of the CMake cache beside the library; None where that is every family."""
    listed = env.raw("PADFREE_KERNEL_FAMILIES")
    if listed is None:
        for folder in Path(_LIB._name).resolve().parents[:3]:
            cache = folder / "CMakeCache.txt"
            if cache.is_file():
                found = re.search(r"^PADFREE_KERNEL_FAMILIES:\w+=(.*)$", cache.read_text(), re.MULTILINE)
                listed = found.group(1) if found else ""
                break
    families = {f.strip() for f in (listed or "").split(";") if f.strip()}
    return families or None


def raw(name: str, *args) -> tuple[int, str]:
    """Status and last error of one call, through the same signatures as the bindings."""
    try:
        fn = getattr(_LIB, name)
    except AttributeError:
        family, built = _family(name), _built_families()
        if built is not None and family not in built:
            pytest.skip(f"{_LIB._name} was built with PADFREE_KERNEL_FAMILIES={';'.join(sorted(built))},"
                        f" without {family}")
        pytest.fail(f"{_LIB._name} has no {name}, yet its build includes the {family} family: the library is"
                    " stale. Rebuild it: `CUDACXX=/usr/local/cuda/bin/nvcc pip install -e . --no-deps"
                    " --no-build-isolation` (or `cmake --build` its build directory)", pytrace=False)
    fn.argtypes = _lib._SIGNATURES[name]
    fn.restype = ctypes.c_int
    status = fn(*args)
    return status, (_LIB.padfree_last_error() or b"").decode()


def expect_invalid(name: str, args: tuple, *fragments: str) -> None:
    status, message = raw(name, *args)
    assert status == INVALID, f"{name}{args}: status {status}, message {message!r}"
    for fragment in fragments:
        assert fragment in message, f"{name}: {fragment!r} not in {message!r}"
    with pytest.raises(_lib.KernelArgumentError, match=re.escape(fragments[0])):
        _lib.call(name, *args)


def test_a_missing_function_fails_unless_its_family_was_left_out(tmp_path, monkeypatch):
    """A stale library must not turn these tests into silent skips; a deliberate subset may."""
    class Library:  # a library without any ABI function, built in tmp_path
        _name = str(tmp_path / "libpadfree_kernels.so")

    def outcome(name: str) -> tuple[str, str]:
        try:
            raw(name)
        except (pytest.fail.Exception, pytest.skip.Exception) as e:
            return ("fail" if isinstance(e, pytest.fail.Exception) else "skip"), str(e)
        return "ran", ""

    monkeypatch.setitem(globals(), "_LIB", Library())
    monkeypatch.delenv("PADFREE_KERNEL_FAMILIES", raising=False)
    kind, message = outcome("padfree_attention_varlen")
    assert kind == "fail" and "stale" in message and "pip install -e ." in message
    (tmp_path / "CMakeCache.txt").write_text("PADFREE_KERNEL_FAMILIES:STRING=padding;layernorm\n")
    assert outcome("padfree_attention_varlen") == (
        "skip", f"{Library._name} was built with PADFREE_KERNEL_FAMILIES=layernorm;padding, without attention")
    assert outcome("padfree_skip_layernorm")[0] == "fail"  # its family was built: stale
    monkeypatch.setenv("PADFREE_KERNEL_FAMILIES", "attention")
    assert outcome("padfree_attention_varlen")[0] == "fail"
    assert outcome("padfree_bias_gelu")[0] == "skip"


def test_versions_and_status_strings():
    assert _LIB.padfree_abi_version() == _lib.ABI_VERSION
    assert _LIB.padfree_version()
    assert _LIB.padfree_status_string(0) == b"ok"
    assert _LIB.padfree_status_string(INVALID) == b"invalid argument"
    assert _LIB.padfree_status_string(99) == b"unknown status"


def _args(defaults: dict, over: dict) -> tuple:
    """The arguments of one call in the C signature's order (defaults' order, `over` applied), then the
    stream (None)."""
    return tuple({**defaults, **over}.values()) + (None,)


# ---- padding -------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    ((None, 4, A, None), ["seqlens is NULL"]),
    ((A, 4, None, None), ["cu_seqlens is NULL"]),
    ((A, -1, A, None), ["batch must be >= 0", "-1"]),
])
def test_cu_seqlens_from_seqlens_refuses(args, fragments):
    expect_invalid("padfree_cu_seqlens_from_seqlens", args, *fragments)


@pytest.mark.parametrize("args, fragments", [
    ((None, 2, 8, A, None, None), ["mask is NULL"]),
    ((A, 2, 8, None, None, None), ["cu_seqlens is NULL"]),
    ((A, -3, 8, A, None, None), ["batch must be >= 0"]),
    ((A, 2, -8, A, None, None), ["padded_seqlen must be >= 0", "-8"]),
])
def test_cu_seqlens_from_mask_refuses(args, fragments):
    expect_invalid("padfree_cu_seqlens_from_mask", args, *fragments)


@pytest.mark.parametrize("name, src, dst", [("padfree_remove_padding", "padded", "packed"),
                                            ("padfree_rebuild_padding", "packed", "padded")])
@pytest.mark.parametrize("case", ["src_null", "dst_null", "cu_null", "batch", "total", "seqlen", "row_bytes",
                                  "overflow"])
def test_padding_copies_refuse(name, src, dst, case):
    args = {"src": A, "cu": A, "batch": 2, "total": 16, "seqlen": 8, "row_bytes": 16, "dst": A}
    fragments = {
        "src_null": (("src", None), [f"{src} is NULL"]),
        "dst_null": (("dst", None), [f"{dst} is NULL"]),
        "cu_null": (("cu", None), ["cu_seqlens is NULL"]),
        "batch": (("batch", -1), ["batch must be >= 0"]),
        "total": (("total", -1), ["total_tokens must be >= 0", "-1"]),
        "seqlen": (("seqlen", -1), ["padded_seqlen must be >= 0"]),
        "row_bytes": (("row_bytes", 0), ["row_bytes must be >= 1"]),
        "overflow": (("row_bytes", 2**62), ["overflows int64"]),
    }[case]
    (key, value), expected = fragments
    args[key] = value
    order = ("src", "cu", "batch", "total", "seqlen", "row_bytes", "dst")
    expect_invalid(name, tuple(args[k] for k in order) + (None,),
                   *expected)


# ---- attention -----------------------------------------------------------------------------------

def _attention_args(**over):
    return _args(dict(qkv=A, bias=A, cu=A, batch=2, total=32, max_seqlen=16, heads=2, head_dim=64, scale=0.125,
                      flags=0, dtype=F16, out=A), over)


@pytest.mark.parametrize("over, fragments", [
    (dict(dtype=3), ["unknown dtype code", "3"]),
    (dict(batch=-1), ["batch must be in [0, 65535]", "-1"]),
    (dict(batch=65536), ["batch must be in [0, 65535]"]),
    (dict(total=-1), ["total_tokens must be >= 0", "-1"]),
    (dict(total=-1, batch=0), ["total_tokens must be >= 0"]),
    (dict(heads=0), ["num_heads must be in [1, 65535]"]),
    (dict(head_dim=0), ["head_dim must be positive"]),
    (dict(scale=0.0), ["softmax_scale must be finite and positive"]),
    (dict(scale=float("nan")), ["softmax_scale must be finite and positive"]),
    (dict(max_seqlen=0), ["max_seqlen must be >= 1"]),
    (dict(qkv=None), ["qkv, cu_seqlens and out must not be null"]),
    (dict(cu=None), ["qkv, cu_seqlens and out must not be null"]),
    (dict(out=None), ["qkv, cu_seqlens and out must not be null"]),
    (dict(qkv=M), ["qkv and out must be 16-byte aligned"]),
    (dict(out=M), ["qkv and out must be 16-byte aligned"]),
    (dict(bias=A + 2), ["qkv_bias must be 4-byte aligned"]),
    (dict(cu=A + 2), ["cu_seqlens must be 4-byte aligned"]),
])
def test_attention_refuses(over, fragments):
    expect_invalid("padfree_attention_varlen", _attention_args(**over), *fragments)


@pytest.mark.parametrize("over, fragment", [
    (dict(head_dim=16), "head_dim 16 is not built"),
    (dict(head_dim=96), "head_dim 96 is not built"),
    (dict(flags=2), "unknown flags"),
])
def test_attention_unsupported(over, fragment):
    status, message = raw("padfree_attention_varlen", *_attention_args(**over))
    assert status == _lib.STATUS_UNSUPPORTED and fragment in message, (status, message)
    with pytest.raises(_lib.KernelUnsupportedError, match=re.escape(fragment)):
        _lib.call("padfree_attention_varlen", *_attention_args(**over))


def test_attention_head_dims_match_kernel_sizes():
    """padfree.kernel_sizes (what the exporter, the engine builder and padfree.torch refuse by) lists
    exactly the head_dims the library accepts; batch 0 makes the accepted ones no work."""
    from padfree import kernel_sizes
    accepted = [d for d in range(1, 513)
                if raw("padfree_attention_varlen", *_attention_args(batch=0, head_dim=d))[0] == 0]
    assert tuple(accepted) == kernel_sizes.ATTENTION_HEAD_DIMS


def test_attention_with_no_sequences_is_no_work():
    """batch 0 (an empty bucket) returns before any pointer is looked at or any kernel launched."""
    status, message = raw("padfree_attention_varlen", *_attention_args(batch=0, qkv=None, cu=None, out=None))
    assert status == 0, message


# ---- layernorm -----------------------------------------------------------------------------------

def _layernorm_args(**over):
    return _args(dict(x=A, gamma=A, beta=A, rows=4, hidden=768, eps=1e-5, dtype=F16, out=A), over)


@pytest.mark.parametrize("over, fragments", [
    (dict(x=None), ["x is NULL"]),
    (dict(gamma=None), ["gamma is NULL"]),
    (dict(beta=None), ["beta is NULL"]),
    (dict(out=None), ["out is NULL"]),
    (dict(x=M), ["x must be 16-byte aligned"]),
    (dict(out=M), ["out must be 16-byte aligned"]),
    (dict(rows=-1), ["rows must be >= 0"]),
    (dict(hidden=12), ["hidden must be a positive multiple of 8", "12"]),
    (dict(hidden=0), ["hidden must be a positive multiple of 8"]),
    (dict(hidden=8200), ["hidden must be <= 8192", "8200"]),
    (dict(eps=-1.0), ["eps must be finite and >= 0"]),
    (dict(eps=float("nan")), ["eps must be finite and >= 0"]),
    (dict(dtype=7), ["dtype must be", "7"]),
])
def test_layernorm_refuses(over, fragments):
    expect_invalid("padfree_layernorm", _layernorm_args(**over), *fragments)


def _skip_args(**over):
    return _args(dict(x=A, residual=A, bias=None, gamma=A, beta=A, rows=4, hidden=1024, eps=1e-12, prefetch=None,
                      prefetch_bytes=0, dtype=BF16, out=A), over)


@pytest.mark.parametrize("over, fragments", [
    (dict(residual=M), ["residual must be 16-byte aligned"]),
    (dict(bias=M), ["bias must be 16-byte aligned"]),
    (dict(hidden=4), ["hidden must be a positive multiple of 8"]),
    (dict(hidden=16384), ["hidden must be <= 8192"]),
    (dict(rows=-5), ["rows must be >= 0"]),
    (dict(dtype=-1), ["dtype must be"]),
    (dict(prefetch_bytes=-16), ["l2_prefetch_bytes must be >= 0"]),
    (dict(prefetch_bytes=4096), ["l2_prefetch is NULL but l2_prefetch_bytes is 4096"]),
])
def test_skip_layernorm_refuses(over, fragments):
    expect_invalid("padfree_skip_layernorm", _skip_args(**over), *fragments)


# ---- embedding -----------------------------------------------------------------------------------

def _embedding_args(**over):
    return _args(dict(ids=A, types=None, cu=A, batch=2, total=10, word=A, vocab=100, pos=A, max_pos=64, offset=0,
                      type_emb=None, type_vocab=0, gamma=A, beta=A, hidden=64, eps=1e-12, prefetch=None,
                      prefetch_bytes=0, dtype=F32, out=A), over)


@pytest.mark.parametrize("over, fragments", [
    (dict(ids=None), ["input_ids is NULL"]),
    (dict(cu=None), ["cu_seqlens is NULL"]),
    (dict(word=None), ["word_emb is NULL"]),
    (dict(pos=M), ["position_emb must be 16-byte aligned"]),
    (dict(total=-1), ["total_tokens must be >= 0"]),
    (dict(batch=0), ["batch must be >= 1"]),
    (dict(vocab=0), ["vocab_size must be >= 1"]),
    (dict(max_pos=0), ["max_positions must be >= 1"]),
    (dict(offset=-2), ["position_offset must be >= 0"]),
    (dict(type_emb=A, type_vocab=0), ["type_vocab_size must be >= 1"]),
    (dict(hidden=100), ["hidden must be a positive multiple of 8", "100"]),
    (dict(hidden=9000), ["hidden must be <= 8192"]),
    (dict(dtype=3), ["dtype must be"]),
    # gamma and beta: both (LayerNorm) or neither (no LayerNorm), never one
    (dict(gamma=None), ["gamma and beta must both be given (LayerNorm) or both be NULL", "gamma NULL and beta given"]),
    (dict(beta=None), ["gamma and beta must both be given (LayerNorm) or both be NULL", "gamma given and beta NULL"]),
    (dict(gamma=M), ["gamma must be 16-byte aligned"]),
    (dict(gamma=None, beta=M), ["gamma and beta must both be given"]),
    # the NULL pair passes its check: the next refusal is the one reported
    (dict(gamma=None, beta=None, hidden=100), ["hidden must be a positive multiple of 8"]),
    (dict(gamma=None, beta=None, eps=-1.0), ["eps must be finite and >= 0"]),
])
def test_embedding_layernorm_refuses(over, fragments):
    expect_invalid("padfree_embedding_layernorm", _embedding_args(**over), *fragments)


# ---- activation ----------------------------------------------------------------------------------

def _gelu_args(**over):
    return _args(dict(x=A, bias=A, rows=4, cols=3072, approximate=0, dtype=F16, out=A), over)


@pytest.mark.parametrize("over, fragments", [
    (dict(x=None), ["x is NULL"]),
    (dict(out=None), ["out is NULL"]),
    (dict(bias=M), ["bias must be 16-byte aligned"]),
    (dict(rows=-1), ["rows must be >= 0"]),
    (dict(cols=0), ["cols must be a positive multiple of 8"]),
    (dict(cols=3070), ["cols must be a positive multiple of 8", "3070"]),
    (dict(approximate=2), ["approximate must be 0 (erf) or 1 (tanh)"]),
    (dict(dtype=9), ["dtype must be"]),
])
def test_bias_gelu_refuses(over, fragments):
    expect_invalid("padfree_bias_gelu", _gelu_args(**over), *fragments)


# ---- sentence pooling ----------------------------------------------------------------------------

def _pool_args(**over):
    return _args(dict(x=A, cu=A, batch=4, total=64, hidden=768, mode=1, normalize=1, dtype=F16, out=A), over)


@pytest.mark.parametrize("over, fragments", [
    (dict(x=None), ["x is NULL"]),
    (dict(x=M), ["x must be 16-byte aligned"]),
    (dict(out=None), ["out is NULL"]),
    (dict(out=M), ["out must be 16-byte aligned"]),
    (dict(cu=None), ["cu_seqlens is NULL"]),
    (dict(cu=A + 2), ["cu_seqlens must be 4-byte aligned"]),
    (dict(batch=-1), ["batch must be >= 0", "-1"]),
    (dict(total=-1), ["total_tokens must be >= 0", "-1"]),
    (dict(hidden=0), ["hidden must be a positive multiple of 8", "0"]),
    (dict(hidden=12), ["hidden must be a positive multiple of 8", "12"]),
    (dict(hidden=8200), ["hidden must be <= 8192", "8200"]),
    (dict(mode=3), ["mode must be 0 (cls), 1 (mean) or 2 (max)", "3"]),
    (dict(mode=-1), ["mode must be 0 (cls), 1 (mean) or 2 (max)"]),
    (dict(normalize=2), ["normalize must be 0 or 1", "2"]),
    (dict(dtype=3), ["dtype must be"]),
])
def test_sequence_pool_refuses(over, fragments):
    expect_invalid("padfree_sequence_pool", _pool_args(**over), *fragments)


def test_last_error_is_replaced_by_the_next_failure():
    raw("padfree_layernorm", *_layernorm_args(hidden=12))
    _, message = raw("padfree_bias_gelu", *_gelu_args(approximate=5))
    assert "approximate" in message and "hidden" not in message


# ---- model inputs --------------------------------------------------------------------------------

def _stats_args(**over):
    return _args(dict(mask=A, mask_bytes=8, ids=A, types=None, id_bytes=8, batch=4, width=16, vocab=100,
                      type_vocab=2, forbidden=-1, seqlens=A, stats=A, host_stats=None), over)


@pytest.mark.parametrize("over, fragments", [
    (dict(ids=None), ["input_ids is NULL"]),
    (dict(seqlens=None), ["seqlens is NULL"]),
    (dict(stats=None), ["stats is NULL"]),
    (dict(mask_bytes=2), ["mask_bytes must be 1 (bool, uint8), 4 (int32) or 8 (int64)", "2"]),
    (dict(id_bytes=2), ["id_bytes must be 4 (int32) or 8 (int64)", "2"]),
    (dict(batch=0), ["batch must be >= 1"]),
    (dict(width=0), ["padded_seqlen must be >= 1"]),
    (dict(batch=65536, width=65536), ["batch * padded_seqlen must be <= 2^31 - 1"]),
    (dict(vocab=-1), ["vocab_size must be >= 0"]),
    (dict(type_vocab=-2), ["type_vocab_size must be >= 0"]),
    (dict(forbidden=-2), ["forbidden_id must be >= -1", "-2"]),
])
def test_padded_input_stats_refuses(over, fragments):
    expect_invalid("padfree_padded_input_stats", _stats_args(**over), *fragments)


def _pack_inputs_args(**over):
    return _args(dict(ids=A, types=None, id_bytes=8, seqlens=A, batch=4, width=16, cu_capacity=4,
                      packed_capacity=64, packed_ids=A, packed_types=None, cu=A), over)


@pytest.mark.parametrize("over, fragments", [
    (dict(ids=None), ["input_ids is NULL"]),
    (dict(seqlens=None), ["seqlens is NULL"]),
    (dict(packed_ids=None), ["packed_ids is NULL"]),
    (dict(cu=None), ["cu_seqlens is NULL"]),
    (dict(types=A), ["packed_token_type_ids is NULL while token_type_ids is given"]),
    (dict(cu_capacity=3), ["cu_capacity must be >= batch (4)", "3"]),
    (dict(packed_capacity=-1), ["packed_capacity must be >= 0"]),
    (dict(id_bytes=1), ["id_bytes must be 4 (int32) or 8 (int64)"]),
])
def test_pack_padded_inputs_refuses(over, fragments):
    expect_invalid("padfree_pack_padded_inputs", _pack_inputs_args(**over), *fragments)


def _plan_args(**over):
    return tuple({**dict(mask_bytes=8, id_bytes=8, types=0, batch=4, width=16, vocab=100, type_vocab=2, forbidden=-1,
                         seqlens=A,
                         stats=A, host_stats=None, cu_capacity=4, packed_capacity=64, packed_ids=A,
                         packed_types=None, cu=A), **over}.values())


@pytest.mark.parametrize("over, fragments", [
    (dict(seqlens=None), ["seqlens is NULL"]),
    (dict(stats=None), ["stats is NULL"]),
    (dict(mask_bytes=3), ["mask_bytes must be 1 (bool, uint8), 4 (int32) or 8 (int64)", "3"]),
    (dict(id_bytes=2), ["id_bytes must be 4 (int32) or 8 (int64)"]),
    (dict(batch=0), ["batch must be >= 1"]),
    (dict(cu_capacity=3), ["cu_capacity must be >= batch (4)", "3"]),
    (dict(types=1), ["packed_token_type_ids is NULL while token_type_ids is given"]),
    (dict(packed_ids=None), ["packed_ids is NULL"]),
])
def test_input_plan_create_refuses(over, fragments):
    handle = ctypes.c_void_p()
    status, message = raw("padfree_input_plan_create", *_plan_args(**over), ctypes.byref(handle))
    assert status == INVALID and all(f in message for f in fragments), message
    assert not handle.value, "nothing made"


@pytest.mark.parametrize("plan_over, launch, fragment", [
    (dict(), (None, A, None), "attention_mask must be given exactly where the plan has mask_bytes != 0"),
    (dict(mask_bytes=0), (A, A, None), "attention_mask must be given exactly"),
    (dict(), (A, A, A), "token_type_ids must be given exactly where the plan was made with token types"),
    (dict(types=1, packed_types=A), (A, A, None), "token_type_ids must be given exactly"),
    (dict(), (A, None, None), "input_ids is NULL"),
])
def test_input_plan_launch_refuses_inputs_it_was_not_made_for(plan_over, launch, fragment):
    handle = ctypes.c_void_p()
    assert raw("padfree_input_plan_create", *_plan_args(**plan_over), ctypes.byref(handle))[0] == 0
    try:
        expect_invalid("padfree_input_plan_launch", (handle, *launch, None, None), fragment)
    finally:
        _lib.call("padfree_input_plan_destroy", handle)
    expect_invalid("padfree_input_plan_launch", (None, A, A, None, None, None), "plan is NULL")


def test_graph_edge_calls_refuse_bad_arguments():
    count, handle = ctypes.c_int32(), ctypes.c_void_p()
    functions = (ctypes.c_void_p * 1)(A)
    expect_invalid("padfree_graph_consumers", (None, None, 0, ctypes.byref(count)), "graph is NULL")
    expect_invalid("padfree_graph_consumers", (A, None, 0, None), "count is NULL")
    expect_invalid("padfree_graph_consumers", (A, None, -1, ctypes.byref(count)), "capacity must be >= 0")
    expect_invalid("padfree_graph_consumers", (A, None, 2, ctypes.byref(count)), "functions is NULL")
    expect_invalid("padfree_probe_delayed_copy", (None, A, 16, A, None), "src and dst must not be NULL")
    expect_invalid("padfree_probe_delayed_copy", (A, A, 16, None, None), "spin_ns is NULL")
    expect_invalid("padfree_probe_delayed_copy", (A, A, 24, A, None), "positive multiple of 16")
    expect_invalid("padfree_probe_delayed_copy", (A, A + 8, 16, A, None), "16-byte aligned")
    expect_invalid("padfree_graph_relax_edges", (None, functions, 1, ctypes.byref(count)), "graph is NULL")
    expect_invalid("padfree_graph_relax_edges", (A, functions, -1, ctypes.byref(count)), "count must be >= 0")
    expect_invalid("padfree_graph_relax_edges", (A, None, 1, ctypes.byref(count)), "functions is NULL")
    expect_invalid("padfree_graph_relax_edges", (A, functions, 1, None), "relaxed is NULL")
    expect_invalid("padfree_graph_remove_zeroing_memsets", (None, A, 512, 256, ctypes.byref(count)), "graph is NULL")
    expect_invalid("padfree_graph_remove_zeroing_memsets", (A, None, 512, 256, ctypes.byref(count)), "base is NULL")
    expect_invalid("padfree_graph_remove_zeroing_memsets", (A, A, 512, 256, None), "removed is NULL")
    for size, slot in ((512, 0), (256, 512), (0, 0)):
        expect_invalid("padfree_graph_remove_zeroing_memsets", (A, A, size, slot, ctypes.byref(count)),
                       "expected 0 < slot_bytes <= bytes")
    expect_invalid("padfree_graph_exec_create", (None, None, 0, ctypes.byref(count), ctypes.byref(handle)),
                   "graph is NULL")
    expect_invalid("padfree_graph_exec_create", (A, None, 1, ctypes.byref(count), ctypes.byref(handle)),
                   "functions is NULL")
    expect_invalid("padfree_graph_exec_create", (A, None, 0, ctypes.byref(count), None), "out is NULL")
    expect_invalid("padfree_graph_exec_launch", (None, None), "exec is NULL")
    assert raw("padfree_graph_exec_destroy", None)[0] == 0


# ---- decode_linear ---------------------------------------------------------------------------------

def _decode_linear_args(**over):
    return _args(dict(x=A, weight=A, bias=None, residual=None, gamma=None, beta=None, eps=1e-5, activation=0,
                      rows=4, in_features=1024, out_features=4096, dtype=F16, out=A, x_norm_out=None),
                 over)


@pytest.mark.parametrize("over, fragments", [
    (dict(rows=65), ["rows must be in [0, 64]", "65"]),
    (dict(rows=9, dtype=F32), ["more than 8 rows run on tensor cores in float16 or bfloat16", "9 rows"]),
    (dict(rows=9, in_features=1000), ["need in_features a multiple of 128, got 1000"]),
    (dict(rows=64, in_features=8192), ["rows x in_features (64 x 8192) takes 281600 bytes", "past the 204800"]),
    # 16 rows of 9216 would fit the shared memory; a block's slice (1152) would not fit its staging loops
    (dict(rows=16, in_features=9216), ["more than 8 rows take in_features up to 8192, got 9216"]),
    # not a multiple of 256: split over 4 blocks, so 4224's slice (1056) is past 1024 too
    (dict(rows=16, in_features=4224), ["take in_features up to 4096 where it is not a multiple of 256, got 4224"]),
    (dict(activation=5), ["activation must be 0 (none)", "5"]),
    (dict(gamma=A), ["ln_gamma and ln_beta come together"]),
    (dict(x_norm_out=A), ["x_norm_out needs ln_gamma/ln_beta"]),
    (dict(rows=8, in_features=8192), ["rows x in_features (8 x 8192) exceeds the 98304 bytes staged"]),
    # one 16392-wide fp32 row fits the stage, the LayerNorm's gamma and beta beside it do not
    (dict(rows=1, in_features=16392, dtype=F32, gamma=A, beta=A),
     ["rows x in_features (1 x 16392) with the LayerNorm's parameters exceeds the 196608 bytes"]),
])
def test_decode_linear_refuses(over, fragments):
    expect_invalid("padfree_decode_linear", _decode_linear_args(**over), *fragments)


@pytest.mark.parametrize("over, fragments", [
    (dict(dtype=F32), ["decode_linear_fragments: float16 or bfloat16, got float32"]),
    (dict(rows=65), ["decode_linear_fragments: rows must be in [0, 64], got 65"]),
    (dict(in_features=1000), ["in_features must be one of 512, 768, 1024, 1536, 2048, 3072, 4096, got 1000"]),
    (dict(in_features=1152), ["in_features must be one of 512", "got 1152"]),   # a multiple of 128 not built
    (dict(out_features=1000), ["out_features must be a multiple of 16, got 1000"]),
    (dict(activation=5), ["decode_linear_fragments: activation must be 0 (none)", "5"]),
    (dict(gamma=A), ["decode_linear_fragments: ln_gamma and ln_beta come together"]),
    (dict(x_norm_out=A), ["decode_linear_fragments: x_norm_out needs ln_gamma/ln_beta"]),
])
def test_decode_linear_fragments_refuses(over, fragments):
    expect_invalid("padfree_decode_linear_fragments", _decode_linear_args(**over), *fragments)


@pytest.mark.parametrize("over, fragments", [
    (dict(dtype=F32), ["decode_linear_fragment_layout: float16 or bfloat16 weights, got float32"]),
    (dict(in_features=520), ["in_features must be a positive multiple of 128, got 520"]),
    (dict(out_features=40), ["out_features must be a multiple of 16, got 40"]),
    (dict(out=A), ["decode_linear_fragment_layout: out must not overlap weight"]),
])
def test_decode_linear_fragment_layout_refuses(over, fragments):
    args = dict(weight=A, out_features=64, in_features=128, dtype=F16, out=A + 0x100000, stream=None)
    args.update(over)
    expect_invalid("padfree_decode_linear_fragment_layout", tuple(args.values()), *fragments)


# ---- decode_gemm -----------------------------------------------------------------------------------

def _decode_gemm_args(**over):
    return _args(dict(x=A, weight=A, bias=None, residual=None, ln_colsum=None, eps=1e-5, activation=0, rows=64,
                      in_features=1024, out_features=3072, dtype=F16, out=A + 0x1000000), over)


@pytest.mark.parametrize("over, fragments", [
    (dict(dtype=F32), ["decode_gemm: float16 or bfloat16 (tensor cores), got float32; use a GEMM"]),
    (dict(rows=257), ["decode_gemm: rows must be in [0, 256], got 257"]),
    (dict(in_features=1000), ["in_features must be a multiple of 64 that 1, 2, 4 or 8 blocks split", "got 1000"]),
    (dict(in_features=8192), ["slices of at most 512 (up to 4096), got 8192"]),
    (dict(out_features=40), ["out_features must be a multiple of 32, got 40"]),
    (dict(activation=5), ["decode_gemm: activation must be 0 (none)", "5"]),
    (dict(ln_colsum=A, eps=-1.0), ["eps"]),
])
def test_decode_gemm_refuses(over, fragments):
    expect_invalid("padfree_decode_gemm", _decode_gemm_args(**over), *fragments)


def test_decode_gemm_is_refused_as_unsupported_without_hopper():
    """Shapes it takes, no rows (launches nothing): OK on compute capability 9.0 with the library's sm_90a
    code, else PADFREE_ERROR_UNSUPPORTED by name, the caller's signal to run a GEMM."""
    status, message = raw("padfree_decode_gemm", *_decode_gemm_args(rows=0))
    if status == 0:
        pytest.skip("this GPU runs decode_gemm")
    assert status == _lib.STATUS_UNSUPPORTED and "decode_gemm: needs compute capability 9.0" in message, message


def test_decode_linear_past_8_rows_refused_without_clusters():
    import torch
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0):
        pytest.skip("this GPU runs thread-block clusters")
    expect_invalid("padfree_decode_linear", _decode_linear_args(rows=16),
                   "more than 8 rows need compute capability 9.0 or newer")
