"""The decode program (padfree.ops.DecodeProgram): a decoder's few-row step as one cooperative kernel.

Each operation is the device code of its own kernel, so a program must give what the calls one by one
give: bit for bit where the calls run the attention unsplit (caches up to 64 positions), to rounding
where a call splits a longer cache over CTAs and the program does not. A race between phases (a grid
barrier missing or too weak) shows as a mismatch. Outputs are NaN-poisoned first. The C ABI's
refusals need no GPU.
"""
from __future__ import annotations

import ctypes

import pytest
import torch

from padfree import _lib
from padfree.ops import DecodeProgram, InputError, cross_attention, decode_linear, decoder_self_attention
from padfree.ops.decode_program import MAX_OPS, DecodeOp, new_barrier

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _layer(gen, hidden, ffn, dtype):
    def w(*shape, scale=None):
        scale = scale or shape[-1] ** -0.5
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)

    def ln():
        return (1 + 0.1 * w(hidden, scale=1.0), 0.1 * w(hidden, scale=1.0), 1e-5)
    return dict(ln1=ln(), qkv=w(3 * hidden, hidden), qkv_b=w(3 * hidden, scale=0.1), o=w(hidden, hidden),
                o_b=w(hidden, scale=0.1), ln2=ln(), q=w(hidden, hidden), q_b=w(hidden, scale=0.1),
                co=w(hidden, hidden), co_b=w(hidden, scale=0.1), ln3=ln(), fc1=w(ffn, hidden), fc1_b=w(ffn, scale=0.1),
                fc2=w(hidden, ffn), fc2_b=w(hidden, scale=0.1))


def _step(ops, x, layers, state, pre_ln):
    """One decoder step in logits_few_rows' order, through `ops` (the module's calls or a program)."""
    linear, self_attn, cross = ops
    def enter(x, ln, pending, weight, **kw):
        """(the sublayer's first linear layer, its residual): pre-LN normalizes x with ln; post-LN applies
        the previous sublayer's pending LayerNorm and keeps its output as the residual."""
        if pre_ln:
            return linear(x, weight, ln=ln, **kw), x
        if pending is None:
            return linear(x, weight, **kw), x
        normed = torch.empty_like(x)
        return linear(x, weight, ln=pending, x_norm_out=normed, **kw), normed

    pending = None
    for i, p in enumerate(layers):
        qkv, res = enter(x, p["ln1"], pending, p["qkv"])
        o = self_attn(qkv, state["k"][i], state["v"][i], state["indir"], state["step"], state["heads"],
                      qkv_bias=p["qkv_b"])
        x = linear(o, p["o"], p["o_b"], residual=res)
        pending = p["ln1"]
        q, res = enter(x, p["ln2"], pending, p["q"])
        c = cross(q, state["kv"][i], state["cu_seqlens"], state["max_seqlen"], state["beams"], state["heads"],
                  q_bias=p["q_b"])
        x = linear(c, p["co"], p["co_b"], residual=res)
        pending = p["ln2"]
        h, res = enter(x, p["ln3"], pending, p["fc1"], bias=p["fc1_b"], activation="relu" if pre_ln else "silu")
        x = linear(h, p["fc2"], p["fc2_b"], residual=res)
        pending = p["ln3"]
    return x, pending


def _state(gen, batch, beams, heads, head_dim, max_len, step, lengths, layers, dtype):
    rows, hidden = batch * beams, heads * head_dim
    cache = [torch.randn(rows, heads, max_len, head_dim, device="cuda", generator=gen).to(dtype)
             for _ in range(2 * layers)]
    total = sum(lengths)
    return dict(k=cache[:layers], v=cache[layers:], heads=heads, beams=beams,
                indir=torch.randint(0, rows, (rows, max_len), device="cuda", generator=gen, dtype=torch.int32),
                step=torch.tensor([step], dtype=torch.int32, device="cuda"),
                kv=[torch.randn(total, 2 * hidden, device="cuda", generator=gen).to(dtype) for _ in range(layers)],
                cu_seqlens=torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                                        device="cuda"),
                max_seqlen=max(lengths))


def _clone(state):
    return {k: [t.clone() for t in v] if isinstance(v, list) else v for k, v in state.items()}


CASES = [  # batch, beams, heads, head_dim, max_len, step, source lengths, pre_ln
    (1, 4, 4, 64, 64, 37, [29], True),       # 1x4, NLLB-style pre-LN
    (2, 4, 2, 128, 48, 0, [5, 17], False),   # 2x4, Marian-style post-LN, step 0, head_dim 128
    (8, 1, 4, 64, 64, 63, [1, 2, 3, 4, 5, 6, 7, 64], True),   # 8x1 greedy rows, the cache's last slot
    (1, 1, 4, 64, 64, 11, [40], False),      # one row
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES,
                         ids=lambda c: "b{}x{}_h{}x{}_L{}_s{}_{}".format(*c[:6], "pre" if c[7] else "post"))
def test_program_equals_the_calls(seed, dtype, case):
    batch, beams, heads, head_dim, max_len, step, lengths, pre_ln = case
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden, vocab, layers = heads * head_dim, 1000, 3
    params = [_layer(gen, hidden, 4 * hidden, dtype) for _ in range(layers)]
    lm_head = (torch.randn(vocab, hidden, device="cuda", generator=gen) * hidden ** -0.5).to(dtype)
    x0 = torch.randn(batch * beams, hidden, device="cuda", generator=gen).to(dtype)
    state = _state(gen, batch, beams, heads, head_dim, max_len, step, lengths, layers, dtype)
    theirs, ours = _clone(state), _clone(state)

    x, last = _step((decode_linear, decoder_self_attention, cross_attention), x0, params, theirs, pre_ln)
    want = decode_linear(x, lm_head, ln=last)

    program = DecodeProgram(batch * beams, dtype, torch.device("cuda"))
    x, last = _step((program.linear, program.self_attention, program.cross_attention), x0, params, ours, pre_ln)
    got = program.linear(x, lm_head, ln=last, out=torch.full_like(want, float("nan")))
    assert len(program) == 8 * layers + 1
    program.run()
    torch.cuda.synchronize()
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    for name in ("k", "v"):   # the step's K and V, written into every layer's cache
        for a, b in zip(ours[name], theirs[name]):
            assert torch.equal(a, b)


@pytest.mark.gpu
def test_program_of_a_long_cache_matches_the_split_calls(seed):
    """A 1000-position cache: the calls split it over CTAs, the program does not (rounding apart)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    heads, head_dim, max_len, layers = 2, 64, 1024, 2
    params = [_layer(gen, heads * head_dim, 256, torch.float32) for _ in range(layers)]
    x0 = torch.randn(4, heads * head_dim, device="cuda", generator=gen)
    state = _state(gen, 1, 4, heads, head_dim, max_len, 999, [700], layers, torch.float32)
    theirs, ours = _clone(state), _clone(state)
    want, _ = _step((decode_linear, decoder_self_attention, cross_attention), x0, params, theirs, True)
    program = DecodeProgram(4, torch.float32, torch.device("cuda"))
    got, _ = _step((program.linear, program.self_attention, program.cross_attention), x0, params, ours, True)
    program.run()
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_program_replays_in_a_cuda_graph(seed):
    """Captured once, replayed at another step: the same as the calls at that step."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    params = [_layer(gen, 256, 1024, torch.float16) for _ in range(2)]
    x0 = torch.randn(4, 256, device="cuda", generator=gen).half()
    state = _state(gen, 1, 4, 4, 64, 64, 3, [20], 2, torch.float16)
    theirs, ours = _clone(state), _clone(state)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    barrier = new_barrier(torch.device("cuda"))
    with torch.cuda.stream(stream):
        program = DecodeProgram(4, torch.float16, torch.device("cuda"), barrier)
        out, _ = _step((program.linear, program.self_attention, program.cross_attention), x0, params, ours, True)
        with torch.cuda.graph(graph, stream=stream):
            program.run()
    ours["step"].fill_(9)
    theirs["step"].fill_(9)
    graph.replay()
    graph.replay()   # the barrier is left ready for the next launch
    want, _ = _step((decode_linear, decoder_self_attention, cross_attention), x0, params, theirs, True)
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_program_refuses_mixed_rows_and_too_many_operations():
    program = DecodeProgram(4, torch.float32, torch.device("cpu"))
    with pytest.raises(InputError, match="rows"):
        DecodeProgram(9, torch.float32, torch.device("cpu"))
    assert len(program) == 0
    program.run()   # empty: nothing to launch
    assert MAX_OPS == 200


# ---- the C ABI refuses before touching the GPU (fake addresses, never dereferenced) ----------------

A = 0x10000


def _capi_program(ops, count=None, rows=4, dtype=1):
    try:
        lib = _lib.load()
    except Exception as e:  # noqa: BLE001 - the skip reason
        pytest.skip(f"kernel library not loadable here: {e}")
    if not hasattr(lib, "padfree_decode_program"):
        pytest.skip(f"padfree_decode_program not built into {lib._name}")
    array = (DecodeOp * max(1, len(ops)))(*ops)
    status = _lib.function("padfree_decode_program")(ctypes.addressof(array), len(ops) if count is None else count,
                                                     rows, A, dtype, None)
    return status, (lib.padfree_last_error() or b"").decode()


def _linear(**over):
    fields = dict(kind=0, input=A, weight=A, out=A + (1 << 20), in_features=64, out_features=64)
    fields.update(over)
    return DecodeOp(**fields)


def _self(**over):
    fields = dict(kind=1, input=A, out=A, k_cache=A, v_cache=A, cache_indir=A, step=A, num_heads=1, head_dim=64,
                  max_len=16, softmax_scale=0.125)
    fields.update(over)
    return DecodeOp(**fields)


@pytest.mark.parametrize("ops,count,rows,fragment", [
    ([_linear(kind=5)], None, 4, "op 0: kind must be"),
    ([_linear(), _linear(in_features=60)], None, 4, "op 1: decode_linear: in_features"),
    ([_linear(), _self(head_dim=96)], None, 4, "op 1: decoder_self_attention: head_dim 96"),
    ([_linear(out_features=0)], None, 4, "op 0 has 0 rows"),
    ([_linear()], 201, 4, "count must be in [0, 200]"),
    ([_linear()], None, 9, "rows must be in [1, 8]"),
    ([DecodeOp(kind=2, input=A, out=A, kv_mem=A, cu_seqlens=A, batch=3, num_beams=1, total_tokens=8, max_seqlen=8,
               num_heads=1, head_dim=64, softmax_scale=0.125)], None, 4, "op 0 has 3 rows"),
])
def test_capi_program_refuses(ops, count, rows, fragment):
    status, message = _capi_program(ops, count, rows)
    assert status in (_lib.STATUS_INVALID_ARGUMENT, _lib.STATUS_UNSUPPORTED) and fragment in message, message
