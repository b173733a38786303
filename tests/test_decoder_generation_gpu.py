"""padfree.generation on the GPU: the decoder kernels against the torch reference (same contract, outputs
poisoned first), then generation with the kernels against HF generate in float32 (token parity, as the
CPU tests) and float16 (the share of sequences equal to HF float32's, printed as "fp16 share").
Marked gpu: skipped with a reason where there is no CUDA device or kernel library (conftest.py).
A kernel the library does not provide yet is skipped by name (dispatch reports the reference for it).
"""
from __future__ import annotations

import gc
import os
import sys

import pytest
import torch

import padfree.torch as pt
from padfree.generation import reference_ops
from padfree.generation.dispatch import DecoderOps

sys.path.insert(0, os.path.dirname(__file__))
from _seq2seq import FAMILIES, build, hf_generate, random_sources  # noqa: E402
from test_decoder_generation import assert_beam_parity, assert_greedy_parity, fill_value  # noqa: E402

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# head_dim 64: a size every attention kernel is built for
GPU_MODEL = dict(d_model=128, heads=2, ffn=256)


@pytest.fixture(autouse=True)
def _exact_fp32():
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def kernel(name: str):
    ops = DecoderOps(torch.device("cuda"), 64)
    if ops.sources[name] != "kernel":
        pytest.skip(f"{name}: {ops.sources[name]}")
    return getattr(ops, name)


def tol(dtype):
    return {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decoder_self_attention_kernel(dtype, head_dim):
    fn = kernel("decoder_self_attention")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, H, L = 24, 4, 70
    for step in (0, 1, 37, L - 1):
        qkv = torch.randn(rows, 3 * H * head_dim, device="cuda", generator=gen).to(dtype)
        bias = torch.randn(3 * H * head_dim, device="cuda", generator=gen).to(dtype)
        k = torch.randn(rows, H, L, head_dim, device="cuda", generator=gen).to(dtype)
        v = torch.randn(rows, H, L, head_dim, device="cuda", generator=gen).to(dtype)
        indir = torch.randint(0, rows, (rows, L), device="cuda", generator=gen, dtype=torch.int32)
        step_t = torch.tensor([step], dtype=torch.int32, device="cuda")
        k_ref, v_ref = k.clone(), v.clone()
        want = reference_ops.decoder_self_attention(qkv, k_ref, v_ref, indir, step_t, H, qkv_bias=bias)
        out = torch.full_like(want, float("nan"))
        fn(qkv, k, v, indir, step_t, H, qkv_bias=bias, out=out)
        torch.testing.assert_close(out.float(), want.float(), atol=tol(dtype), rtol=tol(dtype))
        torch.testing.assert_close(k[:, :, step], k_ref[:, :, step], atol=tol(dtype), rtol=0)
        torch.testing.assert_close(v[:, :, step], v_ref[:, :, step], atol=tol(dtype), rtol=0)


def test_beam_reorder_cache_indir_kernel():
    fn = kernel("beam_reorder_cache_indir")
    rows, L = 64, 65
    indir = torch.randint(0, rows, (rows, L), device="cuda", dtype=torch.int32)
    parents = torch.randint(0, rows, (rows,), device="cuda", dtype=torch.int32)
    for step in (0, 5, L - 1):
        step_t = torch.tensor([step], dtype=torch.int32, device="cuda")
        want = reference_ops.beam_reorder_cache_indir(indir, parents, step_t, torch.empty_like(indir))
        out = torch.full_like(indir, -7)
        fn(indir, parents, step_t, out=out)
        assert torch.equal(out[:, :step + 1], want[:, :step + 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_cross_attention_kernel(dtype, head_dim):
    fn = kernel("cross_attention")
    lengths, beams, H = [1, 64, 17, 33, 8], 4, 4
    hidden = H * head_dim
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = torch.randn(len(lengths) * beams, hidden, device="cuda").to(dtype)
    q_bias = torch.randn(hidden, device="cuda").to(dtype)
    kv = torch.randn(sum(lengths), 2 * hidden, device="cuda").to(dtype)
    want = reference_ops.cross_attention(q, kv, cu, max(lengths), beams, H, q_bias=q_bias)
    out = torch.full_like(want, float("nan"))
    fn(q, kv, cu, max(lengths), beams, H, q_bias=q_bias, out=out)
    torch.testing.assert_close(out.float(), want.float(), atol=tol(dtype), rtol=tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,k", [(97, 8), (58101, 32), (256206, 64)])
@pytest.mark.parametrize("normalize", [True, False])
def test_log_softmax_topk_kernel(dtype, vocab, k, normalize):
    fn = kernel("log_softmax_topk")
    rows = 64
    gen = torch.Generator(device="cuda").manual_seed(1)
    logits = (torch.randn(rows, vocab, device="cuda", generator=gen) * 4).to(dtype)
    bias = torch.randn(vocab, device="cuda", generator=gen).to(dtype)
    beam_scores = torch.randn(rows, device="cuda", generator=gen)
    banned = torch.randint(-1, vocab, (rows, 5), device="cuda", generator=gen, dtype=torch.int32)
    penalty = torch.randint(-1, vocab, (rows, 9), device="cuda", generator=gen, dtype=torch.int32)
    penalty = torch.sort(penalty, dim=1).values
    penalty[:, 1:][penalty[:, 1:] == penalty[:, :-1]] = -1
    forced = torch.full((rows,), -1, dtype=torch.int32, device="cuda")
    forced[3] = vocab - 1
    kwargs = dict(bias=bias, beam_scores=beam_scores, banned_ids=banned, penalty_ids=penalty,
                  repetition_penalty=1.3, forced_ids=forced, normalize=normalize)
    want_s, want_i = reference_ops.log_softmax_topk(logits, k, **kwargs)
    out_s = torch.full((rows, k), float("nan"), device="cuda")
    out_i = torch.full((rows, k), -7, dtype=torch.int32, device="cuda")
    fn(logits, k, out_scores=out_s, out_ids=out_i, **kwargs)
    torch.testing.assert_close(out_s, want_s, atol=1e-4, rtol=1e-5)
    # ids equal except where scores tie within rounding (fp16/bf16 logits make exact ties common)
    differ = out_i != want_i
    assert bool((~differ | ((out_s - want_s).abs() < 1e-4)).all())
    assert float(differ.float().mean()) < 0.05


# ---------------------------------------------------------------- generation against HF

def assert_generates_as_hf(model, gen, sources, label: str) -> None:
    """Greedy (16 new tokens) token for token, and beam 4 returning 2 (scores within parity's tolerance),
    equal to HF's generate of `model` in float32."""
    ids_ref = hf_generate(model, sources, max_new_tokens=16).cpu()
    assert_greedy_parity(ids_ref, gen.generate(sources, max_new_tokens=16).cpu())
    options = dict(num_beams=4, num_return_sequences=2, max_new_tokens=16, return_dict_in_generate=True,
                   output_scores=True)
    ref = hf_generate(model, sources, **options)
    out = gen.generate(sources, **options)
    for r in (ref, out):
        r.sequences, r.sequences_scores = r.sequences.cpu(), r.sequences_scores.cpu()
    assert_beam_parity(ref, out, len(sources), 2, fill_value(model), label)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("reference", [False, True], ids=["kernels", "torch-reference-on-cuda"])
def test_fp32_generation_matches_hf(family, reference):
    from padfree.generation import Seq2SeqGenerator
    model = build(family, **GPU_MODEL).to("cuda")
    gen = Seq2SeqGenerator(model, dtype=torch.float32, device="cuda", force_reference_ops=reference)
    assert_generates_as_hf(model, gen, random_sources(model.config, 16, seed=5), f"gpu {family} reference={reference}")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_search_kernels_with_the_plugins_int32_flags_generate_as_hf(family, monkeypatch):
    """The search kernels as TensorRT's PadfreeBeamSearchStep / PadfreeGreedyStep run them (flags int32, as
    plugins carry them; the harness holds each plugin's enqueue to this C ABI call bit for bit) inside the
    PyTorch path's generate: greedy and beam 4 equal HF's in float32."""
    from padfree.generation import Seq2SeqGenerator
    from padfree.generation.beam_search import BeamSearch
    from padfree.generation.sampling import SingleSearch

    converted = []

    def with_int32_flags(cls, names):
        original = cls.__init__

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            if self.kernel is not None:
                for name in names:
                    setattr(self, name, getattr(self, name).to(torch.int32))
                self.reset()
                converted.append(cls.__name__)
        monkeypatch.setattr(cls, "__init__", init)
    with_int32_flags(BeamSearch, ("pool_finished", "improvable"))
    with_int32_flags(SingleSearch, ("unfinished",))

    model = build(family, **GPU_MODEL).to("cuda")
    gen = Seq2SeqGenerator(model, dtype=torch.float32, device="cuda")
    assert_generates_as_hf(model, gen, random_sources(model.config, 16, seed=7), f"gpu int32 flags {family}")
    if not {"BeamSearch", "SingleSearch"} <= set(converted):
        pytest.skip(f"the search kernels did not run (converted: {converted})")


def test_a_head_dim_the_decoder_kernels_lack_runs_the_reference():
    """head_dim 16: the attention kernels refuse it when the decode state asks for their workspace; that
    op runs the torch reference from then on (logged), and generation still matches HF."""
    from padfree.generation import Seq2SeqGenerator
    model = build("marian", d_model=64, heads=4, ffn=128).to("cuda")
    gen = Seq2SeqGenerator(model, dtype=torch.float32, device="cuda")
    sources = random_sources(model.config, 6, seed=3)
    assert_greedy_parity(hf_generate(model, sources, max_new_tokens=12).cpu(),
                         gen.generate(sources, max_new_tokens=12).cpu())
    assert gen.ops.sources["decoder_self_attention"].startswith("reference: kernel refused")


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_few_rows_generation_matches_hf(family):
    """Up to 8 hypotheses per step the decoder's linear layers are decode_linear kernels (LayerNorm, bias,
    activation and residual fused): greedy over 8 sources, beam 4 over 2 and over 1 source, against HF."""
    from padfree.generation import Seq2SeqGenerator
    model = build(family, **GPU_MODEL).to("cuda")
    gen = Seq2SeqGenerator(model, dtype=torch.float32, device="cuda")
    if gen.ops.sources["decode_linear"] != "kernel":
        pytest.skip(f"decode_linear: {gen.ops.sources['decode_linear']}")
    sources = random_sources(model.config, 8, seed=11)
    assert_greedy_parity(hf_generate(model, sources, max_new_tokens=16).cpu(),
                         gen.generate(sources, max_new_tokens=16).cpu())
    assert all(state.decoder.few_rows for state in gen.runner.states.values())
    for count in (2, 1):
        options = dict(num_beams=4, num_return_sequences=2, max_new_tokens=16, return_dict_in_generate=True,
                       output_scores=True)
        ref = hf_generate(model, sources[:count], **options)
        out = gen.generate(sources[:count], **options)
        for r in (ref, out):
            r.sequences, r.sequences_scores = r.sequences.cpu(), r.sequences_scores.cpu()
        assert_beam_parity(ref, out, count, 2, fill_value(model), f"gpu few rows {family} x{count}")
    assert all(state.decoder.few_rows for state in gen.runner.states.values())


def share_equal_to_hf(model, gen, sources, beams: int) -> float:
    """The share of sources whose padfree sequence (16 new tokens) equals HF float32's."""
    ref = hf_generate(model, sources, num_beams=beams, max_new_tokens=16).cpu()
    out = gen.generate(sources, num_beams=beams, max_new_tokens=16).cpu()
    width = max(ref.shape[1], out.shape[1])
    ref, out = (torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill_value(model)) for t in (ref, out))
    return float((ref == out).all(dim=1).float().mean())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_share_equal_to_hf_fp32(family, dtype):
    model = build(family, **GPU_MODEL).to("cuda")
    gen = pt.from_hf(model, dtype=dtype, device="cuda")
    sources = random_sources(model.config, 32, seed=9)
    shares = {beams: share_equal_to_hf(model, gen, sources, beams) for beams in (1, 4)}
    print(f"{dtype} share {family}: greedy {shares[1]:.2f}, beam4 {shares[4]:.2f} of sequences equal to HF fp32")
    assert min(shares.values()) >= 0.5
    # greedy's 32 rows ran on padfree's tensor-core kernels: decode_gemm for pre-LN models, else decode_linear's
    greedy = [state.decoder for state in gen.runner.states.values() if state.decoder.rows == 32]
    if gen.ops.decode_gemm_layers(gen.weights, 32) is not None:
        assert any(decoder.gemm_layers is not None for decoder in greedy)
    elif gen.ops.sources["decode_linear"] == "kernel":
        assert any(decoder.few_rows for decoder in greedy)


@pytest.mark.parametrize("family", FAMILIES)
def test_fragment_steps_share_equal_to_hf_fp32(family, monkeypatch):
    """Steps of 4, 16, 32 and 64 hypotheses with every linear layer the fragment kernel takes on it
    (PADFREE_FRAGMENT_ROWS=64; widths it is built for: d_model 512, FFN 2048; past 16 rows the cluster
    kernel, 64 rows up to 1536 wide), float16 against HF float32 as the test above."""
    monkeypatch.setenv("PADFREE_FRAGMENT_ROWS", "64")
    monkeypatch.setenv("PADFREE_DECODE_GEMM", "0")     # pre-LN steps of 17-64 rows would take decode_gemm
    model = build(family, d_model=512, heads=8, ffn=2048, layers=(6, 6)).to("cuda")
    gen = pt.from_hf(model, dtype=torch.float16, device="cuda")
    if gen.ops.sources["fragment_layout"] != "kernel":
        pytest.skip(f"fragment_layout: {gen.ops.sources['fragment_layout']}")
    for count, beams in ((1, 4), (16, 1), (32, 1), (16, 4)):
        share = share_equal_to_hf(model, gen, random_sources(model.config, count, seed=count + beams), beams)
        print(f"float16 fragments {family} {count}x{beams}: {share:.2f} of sequences equal to HF fp32")
        assert share >= 0.5, f"{count}x{beams}: {share:.2f}"
        rows = count * beams
        assert any(state.decoder.rows == rows and state.decoder.few_rows and state.decoder.fragments
                   for state in gen.runner.states.values()), f"{count}x{beams}: not on the fragment kernel"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_gemm_steps_share_equal_to_hf_fp32(family, dtype, monkeypatch):
    """Steps on decode_gemm (pre-LN: the LayerNorms folded into the weights; post-LN: a skip_layernorm
    kernel closing each sublayer): 16x4, 32x1, 24x4 and 43x3 (past 64 rows: two 64-row tiles, and three
    with a last tile of one row) by default, 1x4 and 4x4 with PADFREE_DECODE_GEMM=1, in the half types
    against HF float32 as the tests above."""
    model = build(family, **GPU_MODEL).to("cuda")
    for forced, shapes in ((None, ((16, 4), (32, 1), (24, 4), (43, 3))), ("1", ((1, 4), (4, 4)))):
        if forced is not None:
            monkeypatch.setenv("PADFREE_DECODE_GEMM", forced)
        gen = pt.from_hf(model, dtype=dtype, device="cuda")
        if gen.ops.sources["decode_gemm"] != "kernel" or gen.ops.decode_gemm_layers(gen.weights, 64) is None:
            pytest.skip(f"decode_gemm does not run here ({gen.ops.sources['decode_gemm']})")
        for count, beams in shapes:
            # a single source is one sequence: 1x4 over four of them, each its own call
            calls = 4 if count == 1 else 1
            share = sum(share_equal_to_hf(model, gen, random_sources(model.config, count, seed=count + beams + i),
                                          beams) for i in range(calls)) / calls
            print(f"{dtype} decode_gemm {family} {count}x{beams}: {share:.2f} of sequences equal to HF fp32")
            assert share >= 0.5, f"{count}x{beams}: {share:.2f}"
            assert any(state.decoder.rows == count * beams and state.decoder.gemm_layers is not None
                       for state in gen.runner.states.values()), f"{count}x{beams}: not on decode_gemm"


@pytest.mark.parametrize("family", ["marian", "m2m100"])
def test_vocabulary_stream_steps_share_equal_to_hf_fp32(family):
    """A vocabulary of 40000 at d_model 512: the LM head on decode_linear's stream kernels at 1x4 (4 rows),
    2x4 (8) and 4x4 (16: the kernel for 9-16 rows), float16 against HF float32."""
    from padfree.ops.decoder import decode_linear_streams
    model = build(family, d_model=512, heads=8, ffn=1024, vocab=40000, layers=(2, 2)).to("cuda")
    gen = pt.from_hf(model, dtype=torch.float16, device="cuda")
    vocab_rows = gen.weights.step_lm_head.shape[0]
    if not decode_linear_streams(4, 512, vocab_rows, torch.float16):
        pytest.skip("decode_linear's stream kernel does not run here (sm_90, the library's kernels)")
    for count, beams in ((1, 4), (2, 4), (4, 4)):
        calls = 4 if count == 1 else 1
        share = sum(share_equal_to_hf(model, gen, random_sources(model.config, count, seed=count + i), beams)
                    for i in range(calls)) / calls
        print(f"float16 stream LM head {family} {count}x{beams}: {share:.2f} of sequences equal to HF fp32")
        assert share >= 0.5, f"{count}x{beams}: {share:.2f}"
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            gen.generate(random_sources(model.config, count, seed=count), num_beams=beams, max_new_tokens=4)
            torch.cuda.synchronize()
        assert any("decode_linear_stream" in e.name for e in prof.events()), f"{count}x{beams}: not streamed"


# ---------------------------------------------------------------- CUDA graphs

def _outputs(gen, sources, **options):
    out = gen.generate(sources, return_dict_in_generate=True, **options)
    scores = getattr(out, "sequences_scores", None)
    return out.sequences.cpu(), None if scores is None else scores.cpu()


@pytest.mark.parametrize("family", ["marian", "m2m100"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_graphs_equal_eager_and_reuse_the_bucket(family, dtype):
    """One CUDA-graph replay per step gives what the same step run eagerly gives, token for token and score
    for score (greedy, beam search with options whose processors read the device step); a second call
    with other sources in the same bucket replays the captured graph instead of capturing again."""
    from padfree.generation.encoder import PackedSources
    from padfree.generation.runner import state_key
    model = build(family, **GPU_MODEL).to("cuda")
    gen = pt.from_hf(model, dtype=dtype, device="cuda")
    first = random_sources(model.config, 16, seed=5)
    # the same lengths in another order with other tokens: another call, the same bucket
    second = [list(reversed(s)) for s in reversed(first)]
    option_sets = [dict(max_new_tokens=16),
                   dict(max_new_tokens=16, no_repeat_ngram_size=2, repetition_penalty=1.3, min_new_tokens=3),
                   dict(num_beams=4, num_return_sequences=2, max_new_tokens=16, output_scores=True),
                   dict(num_beams=4, max_new_tokens=12, no_repeat_ngram_size=2, bad_words_ids=[[5], [6, 7]],
                        forced_bos_token_id=9, forced_eos_token_id=2, output_scores=True)]
    for options in option_sets:
        resolved = gen.resolve(**options)
        keys = {state_key(PackedSources.from_lists(s, torch.device("cpu")), resolved) for s in (first, second)}
        assert len(keys) == 1
        for sources in (first, second):
            gen.use_graphs = True
            captures = gen.runner.captures
            graphed = _outputs(gen, sources, **options)
            state = gen.runner.states[next(iter(keys))]
            assert state.graph is not None and not state.capture_failed, options
            assert state.encoder.graph is not None and not state.encoder.capture_failed, options
            if sources is second:
                assert gen.runner.captures == captures, f"{options}: the bucket's graph was captured again"
            gen.use_graphs = False
            eager = _outputs(gen, sources, **options)
            assert torch.equal(graphed[0], eager[0]), f"{family} {dtype} {options}"
            if graphed[1] is not None:
                assert torch.equal(graphed[1], eager[1]), f"{family} {dtype} {options}"
    gen.use_graphs = True
    # sampling runs the same step eagerly on CUDA (seeded: repeatable)
    a = gen.generate(first, do_sample=True, top_k=20, seed=3, max_new_tokens=8)
    assert torch.equal(a, gen.generate(first, do_sample=True, top_k=20, seed=3, max_new_tokens=8))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_padded_batch_on_the_gpu_is_packed_there_as_on_the_host(family, monkeypatch):
    """generate() on a padded batch of CUDA tensors takes the device route (inputs.DevicePacker: three ints
    read back, none of the batch) and returns what the host route returns for the same sources as lists,
    token for token and score for score, whatever the ids' and the mask's integer dtypes."""
    from padfree.generation import inputs
    from padfree.generation.inputs import padded_batch
    model = build(family, **GPU_MODEL).to("cuda")
    gen = pt.from_hf(model, dtype=torch.float32, device="cuda")
    sources = random_sources(model.config, 5, seed=4, min_len=1, max_len=30)
    ids, mask = padded_batch(sources, model.config.pad_token_id, "cuda")
    host_route = []
    packed_sources = inputs.packed_sources
    monkeypatch.setattr(inputs, "packed_sources", lambda *a, **k: host_route.append(1) or packed_sources(*a, **k))
    options = dict(num_beams=4, max_new_tokens=10, output_scores=True, return_dict_in_generate=True)
    want = gen.generate(sources, **options)
    for id_dtype, mask_dtype in ((torch.int64, torch.int64), (torch.int32, torch.bool), (torch.int64, torch.int32)):
        got = gen.generate(ids.to(id_dtype), mask.to(mask_dtype), **options)
        assert torch.equal(got.sequences, want.sequences), (family, id_dtype, mask_dtype)
        assert torch.equal(got.sequences_scores, want.sequences_scores), (family, id_dtype, mask_dtype)
    assert len(host_route) == 1, "a padded CUDA batch took the host route"


def test_what_the_device_checks_flag_gets_the_host_routes_message():
    """A padded CUDA batch the device's checks flag goes the host route, which names what is wrong, with
    the message a CPU batch gets: an id outside the vocabulary, an empty source, left padding, a source
    longer than the position table. A mask of nonzero values other than 1 is read as the host reads it."""
    from padfree.generation.inputs import padded_batch
    from padfree.ops import InputError
    model = build("marian", **GPU_MODEL).to("cuda")
    gen = pt.from_hf(model, dtype=torch.float32, device="cuda")
    pad, vocab = model.config.pad_token_id, model.config.vocab_size
    ids, mask = padded_batch([[5, 6, 7], [8, 9]], pad, "cuda")
    long_ids, long_mask = padded_batch([[5] * (model.config.max_position_embeddings + 1)], pad, "cuda")
    cases = {"vocabulary": (ids.clone().index_put_((torch.tensor([1]), torch.tensor([0])),
                                                   torch.tensor(vocab + 3, device="cuda")), mask),
             "empty": (ids, mask * torch.tensor([[1], [0]], device="cuda")),
             "left padding": (ids, torch.tensor([[1, 1, 1], [0, 1, 1]], device="cuda")),
             "too long": (long_ids, long_mask)}
    for name, (i, m) in cases.items():
        with pytest.raises(InputError) as on_gpu:
            gen.generate(i, m, max_new_tokens=3)
        with pytest.raises(InputError) as on_cpu:
            gen.generate(i.cpu(), m.cpu(), max_new_tokens=3)
        assert str(on_gpu.value) == str(on_cpu.value), name
    assert torch.equal(gen.generate(ids, mask * 2, max_new_tokens=5), gen.generate(ids, mask, max_new_tokens=5))


def test_step_marks_time_each_decode_step_of_a_call():
    """Runner.step_marks (bench/generate.py's decode step alone): a warm call records one event before its
    loop and one after each step: max_new_tokens positive intervals, together within the call's time."""
    from padfree.generation.runner import step_times
    model = build("marian", **GPU_MODEL).to("cuda")
    gen = pt.from_hf(model, dtype=torch.float16, device="cuda")
    sources = random_sources(model.config, 4, seed=2)
    gen.generate(sources, num_beams=4, min_new_tokens=12, max_new_tokens=12)    # captures the bucket's step
    gen.runner.step_marks = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    gen.generate(sources, num_beams=4, min_new_tokens=12, max_new_tokens=12)
    end.record()
    times = step_times(gen.runner.step_marks)
    assert len(times) == 12 and all(t > 0 for t in times), times
    assert sum(times) < start.elapsed_time(end)
    gen.runner.step_marks = None


@pytest.mark.parametrize("family", FAMILIES)
def test_encoder_graph_equals_the_eager_encoder(family):
    """The state's encoder on its bucket's rows (filler sequences past the sources), captured and
    replayed, against the eager encoder on the sources' rows only (float32, 12 layers): the
    cross-attention K/V every layer's beams read, and cu_seqlens; across calls of one bucket with
    other lengths (the graph replays, the fillers move)."""
    from padfree.generation.encoder import PackedSources, encode
    from padfree.generation.runner import state_key
    model = build(family, layers=(12, 2), **GPU_MODEL).to("cuda")
    gen = pt.from_hf(model, dtype=torch.float32, device="cuda")
    options = gen.resolve(num_beams=2, max_new_tokens=4)
    # one bucket (64 tokens, sources up to 32): nearly full (its last filler empty), then nearly empty
    pool = random_sources(model.config, 8, seed=7, min_len=20, max_len=20)
    calls = [[pool[i][:n] for i, n in enumerate(lengths)]
             for lengths in ([20, 3, 9, 14, 5, 11], [17, 1, 1, 1, 1, 1])]
    keys = {state_key(PackedSources.from_lists(c, torch.device("cpu")), options) for c in calls}
    assert len(keys) == 1
    for sources in calls:
        packed = PackedSources.from_lists(sources, torch.device("cuda"))
        state = gen.runner.state(packed, options)
        for buffer in state.decoder.kv_mem:
            buffer.fill_(float("nan"))
        with torch.inference_mode():
            gen.runner.load(state, packed, lambda p: encode(gen.weights, gen.ops, p))
            want = encode(gen.weights, gen.ops, packed)
        torch.cuda.synchronize()
        assert state.encoder.graph is not None and not state.encoder.capture_failed
        assert torch.equal(state.decoder.cu_seqlens, packed.cu_seqlens)
        n = packed.total_tokens
        for layer, buffer in zip(gen.weights.decoder.layers, state.decoder.kv_mem):
            kv = torch.addmm(layer.cross_attn.kv_bias, want, layer.cross_attn.kv_weight.t())
            err = (buffer[:n] - kv).abs().max().item()
            assert err <= 2e-5 * max(1.0, kv.abs().max().item()), f"{family} {packed.lengths}: {err}"
            assert bool(torch.isfinite(buffer).all()), f"{family}: a filler row's K/V is not finite"


def test_captures_after_every_graph_is_dropped():
    """A bucket captured after every kept graph is gone (clear(), as a generate() short of memory does,
    or the LRU evicting the only one) is captured again and replays, not left eager: a graph pool
    handle whose graphs are all destroyed cannot be captured into again."""
    model = build("m2m100", **GPU_MODEL).to("cuda")
    gen = pt.from_hf(model, dtype=torch.float16, device="cuda", max_graphs=1)
    short, long = random_sources(model.config, 4, seed=1), random_sources(model.config, 24, seed=2)
    want = {id(s): gen.generate(s, num_beams=2, max_new_tokens=8) for s in (short, long)}
    for clear in (True, False, True):
        for sources in (short, long):      # max_graphs=1: each bucket evicts the other's graph
            if clear:
                gen.runner.clear()
            captures = gen.runner.captures
            out = gen.generate(sources, num_beams=2, max_new_tokens=8)
            assert gen.runner.captures == captures + 1
            (state,) = gen.runner.states.values()
            assert state.graph is not None and not state.capture_failed
            assert torch.equal(out, want[id(sources)])


def test_memory_estimate_refuses_what_does_not_fit():
    from padfree.ops import InputError
    model = build("marian", **GPU_MODEL).to("cuda")
    gen = pt.from_hf(model, dtype=torch.float16, device="cuda")
    gc.collect()    # earlier tests' cycles would otherwise be freed by the collections the 400k lists trigger
    before = torch.cuda.memory_allocated()
    with pytest.raises(InputError, match="GiB is free"):
        gen.generate([[5] * 60] * 400_000, num_beams=16, max_new_tokens=60)
    assert torch.cuda.memory_allocated() == before


def test_a_failed_capture_leaves_the_generator_and_torch_usable(monkeypatch):
    """An op that cannot be captured (here the encoder's attention made to read a value on the host, as the
    reference's boolean indexing once did) fails the encoder's capture: the call and every later one run
    eagerly and still generate as HF, no second capture is attempted, and torch's allocator and CUDA RNG
    stay usable (torch leaves a failed capture's pool recording and its RNG in graph mode, where the next
    capture or random op used to fail)."""
    model = build("marian", **GPU_MODEL).to("cuda")
    gen = pt.from_hf(model, dtype=torch.float32, device="cuda")
    attention = gen.ops.attention_varlen

    def syncing(*args, **kwargs):
        out = attention(*args, **kwargs)
        out.sum().item()     # a host sync: illegal while the stream is capturing
        return out

    monkeypatch.setattr(gen.ops, "attention_varlen", syncing)
    sources = random_sources(model.config, 6, seed=11)
    assert_generates_as_hf(model, gen, sources, "marian, capture failed")
    assert not gen.use_graphs and gen.runner.captures == 0
    assert_generates_as_hf(model, gen, random_sources(model.config, 5, seed=12), "marian, after")
    assert torch.isfinite(torch.randn(8, device="cuda")).all()          # the CUDA RNG outside a capture
    graph = torch.cuda.CUDAGraph()                                        # and a capture of one's own
    x = torch.zeros(4, device="cuda")
    with torch.cuda.graph(graph):
        x.add_(1)
    graph.replay()
    assert torch.equal(x.cpu(), torch.ones(4))
