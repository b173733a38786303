"""padfree.generation on the CPU (torch reference ops), float32, against Hugging Face's generate.

Each family's tiny random model (tests/_seq2seq.py: decisive, eos at mixed lengths) generates from
sources of mixed lengths. Greedy must match HF token for token. Beam search must match token for
token, with sequences_scores within 1e-4, for every returned hypothesis whose score is more than
1e-4 from its neighbours' in HF's ranking; hypotheses closer than that are near-ties (float rounding
may order them either way), counted and printed ("near-ties: ..."), and bounded.
Then the reference ops against a float64 recomputation of each contract function, outputs poisoned.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import padfree.torch as pt
from padfree.generation import reference_ops

sys.path.insert(0, os.path.dirname(__file__))
from _seq2seq import FAMILIES, build, hf_generate, random_sources  # noqa: E402

TOL = 1e-4
_MODELS: dict = {}


def model_and_generator(family: str, layers: tuple[int, int] = (2, 2), **kw):
    key = (family, layers, tuple(sorted(kw.items())))
    if key not in _MODELS:
        model = build(family, layers=layers, **kw)
        _MODELS[key] = (model, pt.from_hf(model, dtype=torch.float32, device="cpu"))
    return _MODELS[key]


def sources_for(model, count: int = 8, seed: int = 5):
    return random_sources(model.config, count, seed=seed)


def _pad_to(t: torch.Tensor, width: int, fill: int) -> torch.Tensor:
    if t.shape[1] >= width:
        return t
    return torch.cat([t, torch.full((t.shape[0], width - t.shape[1]), fill, dtype=t.dtype)], dim=1)


def assert_greedy_parity(ref: torch.Tensor, out: torch.Tensor) -> None:
    assert out.dtype == torch.long
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.equal(out, ref), f"\nHF:\n{ref}\npadfree:\n{out}"


def assert_beam_parity(ref, out, batch: int, returned: int, fill: int, label: str = "") -> int:
    """Token and score parity per returned hypothesis outside near-ties; returns the near-tie count."""
    assert out.sequences.shape[0] == ref.sequences.shape[0] == batch * returned
    width = max(ref.sequences.shape[1], out.sequences.shape[1])
    rs = _pad_to(ref.sequences, width, fill).view(batch, returned, width)
    ps = _pad_to(out.sequences, width, fill).view(batch, returned, width)
    rsc, psc = ref.sequences_scores.view(batch, returned), out.sequences_scores.view(batch, returned)
    near = 0
    for b in range(batch):
        for i in range(returned):
            neighbours = [j for j in (i - 1, i + 1) if 0 <= j < returned]
            if any(abs(float(rsc[b, i] - rsc[b, j])) <= TOL for j in neighbours):
                near += 1
                continue
            assert torch.equal(rs[b, i], ps[b, i]), f"{label} source {b} rank {i}:\nHF {rs[b, i]}\npf {ps[b, i]}"
            assert abs(float(rsc[b, i] - psc[b, i])) < TOL, f"{label} source {b} rank {i}: {rsc[b, i]} vs {psc[b, i]}"
    if near == 0:
        assert ref.sequences.shape == out.sequences.shape
    print(f"near-ties {label}: {near} of {batch * returned} hypotheses")
    assert near <= batch * returned // 4, f"{near} near-ties: the test model is not decisive enough"
    return near


def fill_value(model) -> int:
    gc = model.generation_config
    pad = gc.pad_token_id if gc.pad_token_id is not None else gc.eos_token_id
    return pad if pad else gc.eos_token_id


def beam_both(model, gen, sources, **options):
    options = dict(return_dict_in_generate=True, output_scores=True, **options)
    return hf_generate(model, sources, **options), gen.generate(sources, **options)


# ---------------------------------------------------------------- greedy and beam parity per family

@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_hf(family):
    model, gen = model_and_generator(family)
    sources = sources_for(model)
    ref = hf_generate(model, sources, max_new_tokens=12)
    assert_greedy_parity(ref, gen.generate(sources, max_new_tokens=12))


@pytest.mark.parametrize("family", FAMILIES)
def test_beam4_matches_hf(family):
    model, gen = model_and_generator(family)
    sources = sources_for(model)
    ref, out = beam_both(model, gen, sources, num_beams=4, num_return_sequences=4, max_new_tokens=12)
    assert_beam_parity(ref, out, len(sources), 4, fill_value(model), f"{family} beam4")
    # the default num_return_sequences=1 output: the best hypothesis, HF's shape
    ref1, out1 = beam_both(model, gen, sources, num_beams=4, max_new_tokens=12)
    assert_beam_parity(ref1, out1, len(sources), 1, fill_value(model), f"{family} beam4 top1")


@pytest.mark.parametrize("family,layers", [("marian", (6, 6)), ("m2m100", (12, 12))])
def test_deep_models_match_hf(family, layers):
    model, gen = model_and_generator(family, layers=layers)
    sources = sources_for(model, count=6)
    assert_greedy_parity(hf_generate(model, sources, max_new_tokens=10), gen.generate(sources, max_new_tokens=10))
    ref, out = beam_both(model, gen, sources, num_beams=4, num_return_sequences=2, max_new_tokens=10)
    assert_beam_parity(ref, out, len(sources), 2, fill_value(model), f"{family} {layers}")


def test_tensor_input_with_attention_mask_and_return_types():
    from transformers.generation.utils import GenerateBeamEncoderDecoderOutput, GenerateEncoderDecoderOutput

    from padfree.generation.inputs import padded_batch
    model, gen = model_and_generator("bart")
    sources = sources_for(model, count=5)
    ids, mask = padded_batch(sources, model.config.pad_token_id)
    plain = gen.generate(ids, attention_mask=mask, max_new_tokens=8)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, gen.generate(sources, max_new_tokens=8))
    out = gen.generate(ids, mask, max_new_tokens=8, return_dict_in_generate=True)
    assert isinstance(out, GenerateEncoderDecoderOutput) and torch.equal(out.sequences, plain)
    out = gen.generate(ids, mask, num_beams=3, max_new_tokens=8, return_dict_in_generate=True)
    assert isinstance(out, GenerateBeamEncoderDecoderOutput) and out.sequences_scores is None
    out = gen.generate(ids, mask, num_beams=3, max_new_tokens=8, return_dict_in_generate=True, output_scores=True)
    assert out.sequences_scores.shape == (5,) and out.sequences_scores.dtype == torch.float32


@pytest.mark.parametrize("num_beams", [1, 4])
def test_batch_invariance(num_beams):
    """A source's output does not depend on the other sources of its batch (trailing fill aside)."""
    model, gen = model_and_generator("m2m100")
    sources = sources_for(model, count=6, seed=11)
    fill = fill_value(model)
    together = gen.generate(sources, num_beams=num_beams, max_new_tokens=10)
    for i in (0, 3, 5):
        alone = gen.generate([sources[i]], num_beams=num_beams, max_new_tokens=10)[0]
        row = together[i]
        assert torch.equal(row[:alone.shape[0]], alone) and bool((row[alone.shape[0]:] == fill).all())
    reordered = gen.generate(sources[::-1], num_beams=num_beams, max_new_tokens=10)
    assert torch.equal(reordered.flip(0), together)


# ---------------------------------------------------------------- options against HF

BEAM_OPTIONS = [
    ("marian", dict(num_beams=4, num_return_sequences=3)),
    ("bart", dict(num_beams=5, num_return_sequences=5)),
    ("marian", dict(num_beams=4, early_stopping=True)),
    ("bart", dict(num_beams=4, early_stopping=True, num_return_sequences=4)),
    ("m2m100", dict(num_beams=4, early_stopping=False, length_penalty=2.0, num_return_sequences=2)),
    ("mbart", dict(num_beams=4, early_stopping="never", num_return_sequences=4)),
    ("marian", dict(num_beams=4, early_stopping="never", length_penalty=2.0, num_return_sequences=2)),
    ("bart", dict(num_beams=4, early_stopping="never", length_penalty=-0.5, num_return_sequences=2)),
    ("m2m100", dict(num_beams=4, length_penalty=0.0, num_return_sequences=2)),
    ("mbart", dict(num_beams=3, min_new_tokens=6, num_return_sequences=3)),
    ("marian", dict(num_beams=4, no_repeat_ngram_size=2, num_return_sequences=2)),
    ("m2m100", dict(num_beams=4, repetition_penalty=1.5, num_return_sequences=2)),
    ("bart", dict(num_beams=4, bad_words_ids=[[5], [6, 7], [9, 10, 11]], num_return_sequences=2)),
    ("mbart", dict(num_beams=4, forced_bos_token_id=7, num_return_sequences=2)),
    ("m2m100", dict(num_beams=4, forced_eos_token_id=2, max_new_tokens=6, num_return_sequences=2)),
    ("marian", dict(num_beams=2, max_length=9)),
    ("bart", dict(num_beams=16, num_return_sequences=2)),
]


@pytest.mark.parametrize("family,options", BEAM_OPTIONS, ids=[f"{f}-{'-'.join(f'{k}={v}' for k, v in o.items())}"
                                                              for f, o in BEAM_OPTIONS])
def test_beam_options_match_hf(family, options):
    model, gen = model_and_generator(family)
    sources = sources_for(model, count=6, seed=3)
    options = {"max_new_tokens": 10, **options}
    if "max_length" in options:
        options.pop("max_new_tokens")
    ref, out = beam_both(model, gen, sources, **options)
    assert_beam_parity(ref, out, len(sources), options.get("num_return_sequences", 1), fill_value(model),
                       f"{family} {options}")


def test_early_stopping_and_length_penalty_grid_matches_hf():
    """Every early_stopping (True / False / "never") with length_penalty 1, 2 and -0.5 on the model whose
    hypotheses end earliest; HF's outputs differ across the grid, so the parity is not vacuous."""
    model, gen = model_and_generator("bart")
    sources = sources_for(model, count=6, seed=3)
    distinct = set()
    for early in (True, False, "never"):
        for penalty in (1.0, 2.0, -0.5):
            options = dict(num_beams=4, num_return_sequences=2, max_new_tokens=10, early_stopping=early,
                           length_penalty=penalty)
            ref, out = beam_both(model, gen, sources, **options)
            assert_beam_parity(ref, out, len(sources), 2, fill_value(model), f"bart grid {early} {penalty}")
            distinct.add((tuple(ref.sequences.shape), tuple(ref.sequences.flatten().tolist())))
    assert len(distinct) >= 4


GREEDY_OPTIONS = [
    ("marian", dict(min_new_tokens=7)),
    ("bart", dict(min_length=5, max_length=11)),
    ("m2m100", dict(no_repeat_ngram_size=2)),
    ("mbart", dict(no_repeat_ngram_size=1)),
    ("marian", dict(repetition_penalty=1.8)),
    ("bart", dict(repetition_penalty=0.7)),
    ("m2m100", dict(bad_words_ids=[[80], [27, 27], [5, 6, 7]])),
    ("mbart", dict(forced_bos_token_id=9, forced_eos_token_id=2, max_new_tokens=5)),
    ("marian", dict(max_new_tokens=1)),
    ("bart", dict(eos_token_id=[2, 83], max_new_tokens=12)),
]


@pytest.mark.parametrize("family,options", GREEDY_OPTIONS, ids=[f"{f}-{'-'.join(f'{k}={v}' for k, v in o.items())}"
                                                                for f, o in GREEDY_OPTIONS])
def test_greedy_options_match_hf(family, options):
    model, gen = model_and_generator(family)
    sources = sources_for(model, count=6, seed=3)
    options = {"max_new_tokens": 10, **options}
    if "max_length" in options:
        options.pop("max_new_tokens")
    assert_greedy_parity(hf_generate(model, sources, **options), gen.generate(sources, **options))


def test_generation_config_is_read_like_hf():
    """The model's generation_config supplies defaults (here num_beams, length_penalty, no_repeat_ngram_size,
    max_length) exactly as HF reads them; keywords override."""
    model, _ = model_and_generator("bart")
    import copy
    model = copy.deepcopy(model)
    model.generation_config.num_beams = 3
    model.generation_config.length_penalty = 1.5
    model.generation_config.no_repeat_ngram_size = 3
    model.generation_config.max_length = 9
    gen = pt.from_hf(model, dtype=torch.float32, device="cpu")
    sources = sources_for(model, count=5, seed=8)
    for options in ({}, {"num_beams": 1}, {"max_new_tokens": 4}):
        assert_greedy_parity(hf_generate(model, sources, **options), gen.generate(sources, **options))


# ---------------------------------------------------------------- sampling

def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model, gen = model_and_generator("marian")
    sources = sources_for(model, count=5)
    a = gen.generate(sources, do_sample=True, top_k=20, temperature=1.3, top_p=0.9, seed=123, max_new_tokens=10)
    b = gen.generate(sources, do_sample=True, top_k=20, temperature=1.3, top_p=0.9, seed=123, max_new_tokens=10)
    assert torch.equal(a, b)
    greedy = gen.generate(sources, max_new_tokens=10)
    assert torch.equal(gen.generate(sources, do_sample=True, top_k=1, seed=5, max_new_tokens=10), greedy)
    torch.manual_seed(7)
    c = gen.generate(sources, do_sample=True, max_new_tokens=10)          # seed drawn from torch's RNG
    torch.manual_seed(7)
    assert torch.equal(c, gen.generate(sources, do_sample=True, max_new_tokens=10))
    many = gen.generate(sources, do_sample=True, num_return_sequences=3, seed=1, max_new_tokens=10)
    assert many.shape[0] == 15


def test_full_vocabulary_sampling_matches_hf_on_cpu():
    """top_k=0 samples the whole row with the same generator stream as HF's global one."""
    model, gen = model_and_generator("bart")
    sources = sources_for(model, count=4)
    options = dict(do_sample=True, top_k=0, temperature=0.8, top_p=0.95, max_new_tokens=8)
    torch.manual_seed(99)
    ref = hf_generate(model, sources, **options)
    assert_greedy_parity(ref, gen.generate(sources, seed=99, **options))


# ---------------------------------------------------------------- reference ops vs float64

def _poison(shape, dtype=torch.float32):
    value = float("nan") if dtype.is_floating_point else -7
    return torch.full(shape, value, dtype=dtype)


def _attend64(q, keys, values):
    """q [H, D], keys/values [n, H, D] float64 -> [H*D]."""
    scores = torch.einsum("hd,nhd->hn", q, keys)
    return torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), values).reshape(-1)


@pytest.mark.parametrize("device_step", [False, True])
def test_decoder_self_attention_vs_float64(device_step, monkeypatch):
    """device_step: the sync-free path the reference takes for a CUDA step tensor (masked over L)."""
    if device_step:
        monkeypatch.setattr(reference_ops, "_host_step", lambda step: None)
    gen = torch.Generator().manual_seed(0)
    rows, H, D, L, step = 6, 2, 8, 9, 5
    qkv = torch.randn(rows, 3 * H * D, generator=gen)
    bias = torch.randn(3 * H * D, generator=gen)
    k_cache = torch.randn(rows, H, L, D, generator=gen)
    v_cache = torch.randn(rows, H, L, D, generator=gen)
    indir = torch.randint(0, rows, (rows, L), generator=gen, dtype=torch.int32)
    k0, v0 = k_cache.clone(), v_cache.clone()
    out = _poison((rows, H * D))
    reference_ops.decoder_self_attention(qkv, k_cache, v_cache, indir, torch.tensor([step], dtype=torch.int32), H,
                                         qkv_bias=bias, softmax_scale=0.7, out=out)
    x = (qkv.double() + bias.double()).view(rows, 3, H, D)
    for r in range(rows):
        assert torch.allclose(k_cache[r, :, step], x[r, 1].float())
        assert torch.allclose(v_cache[r, :, step], x[r, 2].float())
        keys = torch.stack([k0[int(indir[r, t]), :, t] for t in range(step)] + [x[r, 1].float()]).double()
        values = torch.stack([v0[int(indir[r, t]), :, t] for t in range(step)] + [x[r, 2].float()]).double()
        want = _attend64(x[r, 0] * 0.7, keys, values)
        assert torch.allclose(out[r].double(), want, atol=1e-5), r
    untouched = torch.ones(L, dtype=torch.bool)
    untouched[step] = False
    assert torch.equal(k_cache[:, :, untouched], k0[:, :, untouched])


@pytest.mark.parametrize("device_step", [False, True])
def test_beam_reorder_cache_indir_vs_loop(device_step, monkeypatch):
    if device_step:
        monkeypatch.setattr(reference_ops, "_host_step", lambda step: None)
    gen = torch.Generator().manual_seed(1)
    rows, L, step = 8, 7, 4
    indir = torch.randint(0, rows, (rows, L), generator=gen, dtype=torch.int32)
    parents = torch.randint(0, rows, (rows,), generator=gen, dtype=torch.int32)
    out = _poison((rows, L), torch.int32)
    reference_ops.beam_reorder_cache_indir(indir, parents, torch.tensor([step], dtype=torch.int32), out)
    for r in range(rows):
        for t in range(step):
            assert out[r, t] == indir[parents[r], t]
        assert out[r, step] == parents[r]
    with pytest.raises(ValueError, match="alias"):
        reference_ops.beam_reorder_cache_indir(indir, parents, step, indir)


def test_cross_attention_vs_float64():
    gen = torch.Generator().manual_seed(2)
    lengths, beams, H, D = [3, 1, 6], 2, 2, 8
    T, hidden = sum(lengths), H * D
    cu = torch.tensor([0, 3, 4, 10], dtype=torch.int32)
    q = torch.randn(len(lengths) * beams, hidden, generator=gen)
    q_bias = torch.randn(hidden, generator=gen)
    kv = torch.randn(T, 2 * hidden, generator=gen)
    out = _poison((q.shape[0], hidden))
    reference_ops.cross_attention(q, kv, cu, max(lengths), beams, H, q_bias=q_bias, out=out)
    for r in range(q.shape[0]):
        s = r // beams
        rows = kv[int(cu[s]):int(cu[s + 1])].double()
        keys, values = rows[:, :hidden].view(-1, H, D), rows[:, hidden:].view(-1, H, D)
        want = _attend64((q[r].double() + q_bias.double()).view(H, D) / math.sqrt(D), keys, values)
        assert torch.allclose(out[r].double(), want, atol=1e-5), r


def test_attention_varlen_vs_float64():
    gen = torch.Generator().manual_seed(3)
    H, D = 2, 8
    cu = torch.tensor([0, 4, 5, 12], dtype=torch.int32)  # lengths 4, 1, 7; rows 12, 13 past the last
    qkv = torch.randn(14, 3 * H * D, generator=gen)
    bias = torch.randn(3 * H * D, generator=gen)
    out = _poison((14, H * D))
    reference_ops.attention_varlen(qkv, cu, 7, H, qkv_bias=bias, softmax_scale=1.0, out=out)
    x = (qkv.double() + bias.double()).view(14, 3, H, D)
    for s in range(3):
        a, b = int(cu[s]), int(cu[s + 1])
        for t in range(a, b):
            want = _attend64(x[t, 0], x[a:b, 1], x[a:b, 2])
            assert torch.allclose(out[t].double(), want, atol=1e-5)
    assert out[12:].isnan().all()   # rows past cu_seqlens[-1]: untouched


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_reference_attention_varlen_captures_in_a_cuda_graph():
    """The encoder's reference attention is what the generator runs (and captures) on a GPU without the
    kernel library: no host sync inside it, and the replay equals the eager call."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    H, D = 2, 8
    cu = torch.tensor([0, 4, 5, 12], dtype=torch.int32, device="cuda")
    qkv = torch.randn(12, 3 * H * D, generator=gen, device="cuda")
    want = reference_ops.attention_varlen(qkv, cu, 7, H, softmax_scale=1.0)
    out = torch.full((12, H * D), float("nan"), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        reference_ops.attention_varlen(qkv, cu, 7, H, softmax_scale=1.0, out=out)   # warm-up
    torch.cuda.current_stream().wait_stream(side)
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        reference_ops.attention_varlen(qkv, cu, 7, H, softmax_scale=1.0, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.parametrize("normalize", [True, False])
def test_log_softmax_topk_vs_float64(normalize):
    gen = torch.Generator().manual_seed(4)
    rows, V, k = 5, 50, 7
    logits = torch.randn(rows, V, generator=gen) * 3
    logits[1, 10:20] = 2.5          # ties: smaller id first
    bias = torch.randn(V, generator=gen)
    bias[10:20] = 0.0
    beam_scores = torch.randn(rows, generator=gen)
    banned = torch.tensor([[3, -1], [11, 12], [-1, -1], [0, 49], [7, 7]], dtype=torch.int32)
    penalty = torch.tensor([[1, 2, -1], [10, 13, 40], [5, -1, -1], [-1, -1, -1], [8, 9, 30]], dtype=torch.int32)
    forced = torch.tensor([-1, -1, 17, -1, -1], dtype=torch.int32)
    out_s, out_i = _poison((rows, k)), _poison((rows, k), torch.int32)
    reference_ops.log_softmax_topk(logits, k, bias=bias, beam_scores=beam_scores, banned_ids=banned,
                                   penalty_ids=penalty, repetition_penalty=1.7, forced_ids=forced,
                                   out_scores=out_s, out_ids=out_i, normalize=normalize)
    for r in range(rows):
        x = logits[r].double() + bias.double()
        s = torch.log_softmax(x, dim=0) if normalize else x
        for v in set(penalty[r].tolist()) - {-1}:
            s[v] = s[v] * 1.7 if s[v] < 0 else s[v] / 1.7
        for v in set(banned[r].tolist()) - {-1}:
            s[v] = -math.inf
        if forced[r] >= 0:
            s = torch.full_like(s, -math.inf)
            s[int(forced[r])] = 0.0
        s = s + beam_scores[r].double()
        ranked = sorted(range(V), key=lambda v: (-float(s[v]), v))[:k]
        assert out_i[r].tolist() == ranked, r
        assert torch.allclose(out_s[r].double(), s[ranked], atol=1e-5, rtol=0), r


def test_topk_orders_ties_by_id_including_signed_zero_and_inf():
    s = torch.tensor([[0.0, -0.0, 1.0, -math.inf, 1.0, -math.inf, -0.0]])
    scores, ids = reference_ops.topk_smaller_id_first(s, 7)
    assert ids.tolist() == [[2, 4, 0, 1, 6, 3, 5]]
    assert scores[0, :2].tolist() == [1.0, 1.0]


# ---------------------------------------------------------------- dtype and the benchmark's smoke path

def test_bfloat16_runs_on_cpu():
    model, _ = model_and_generator("mbart")
    gen = pt.from_hf(model, dtype=torch.bfloat16, device="cpu")
    sources = sources_for(model, count=3)
    out = gen.generate(sources, num_beams=2, max_new_tokens=5, return_dict_in_generate=True, output_scores=True)
    assert out.sequences.shape[0] == 3 and torch.isfinite(out.sequences_scores).all()


def test_step_times_are_the_time_between_consecutive_marks():
    """runner.step_times (bench/generate.py's decode step alone): each step's time is its mark's elapsed time
    from the mark before it, after waiting for the last; fewer than two marks time nothing."""
    from padfree.generation.runner import step_times

    class Mark:
        def __init__(self, t):
            self.t, self.waited = t, False

        def elapsed_time(self, other):
            return other.t - self.t

        def synchronize(self):
            self.waited = True

    marks = [Mark(t) for t in (0.0, 0.5, 1.25, 1.5)]
    assert step_times(marks) == [0.5, 0.75, 0.25] and marks[-1].waited
    assert step_times(marks[:1]) == [] and step_times([]) == []


def test_step_marks_record_nothing_on_the_cpu():
    model = build("marian")
    gen = pt.from_hf(model, dtype=torch.float32, device="cpu")
    gen.runner.step_marks = []
    gen.generate(random_sources(model.config, 2, seed=1), max_new_tokens=3)
    assert gen.runner.step_marks == []


def test_bench_generate_quick_runs_on_cpu(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "gen.json"
    proc = subprocess.run([sys.executable, os.path.join(root, "bench", "generate.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json
    report = json.loads(out.read_text())
    assert report["rows"] and all("padfree_ms" in row for row in report["rows"])
    assert report["command"] and report["device"] == "cpu"


def test_bench_generate_refuses_to_time_reference_ops_on_cuda():
    """bench/generate.py stops before timing where an op fell back to its torch reference on CUDA without
    being asked (a library that does not load would be reported as padfree's numbers); asked for
    (PADFREE_GENERATION_TORCH_OPS), allowed (--allow-reference) or on the CPU, it times."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("bench_generate", os.path.join(root, "bench", "generate.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    fallen = {"decode_linear": "kernel", "cross_attention": "reference: kernel library not loadable (x)"}
    with pytest.raises(SystemExit) as stop:
        bench.refuse_reference_ops("nllb", fallen, cuda, allowed=False)
    message = str(stop.value)
    assert "\n" not in message and "cross_attention" in message and "not loadable" in message
    assert "--allow-reference" in message
    with pytest.raises(SystemExit, match="PADFREE_GENERATION_TORCH_OPS"):   # generate_ab.py: no such flag
        bench.refuse_reference_ops("nllb", fallen, cuda, allowed=False, flag=None)
    bench.refuse_reference_ops("nllb", fallen, cuda, allowed=True)
    bench.refuse_reference_ops("nllb", fallen, cpu, allowed=False)
    bench.refuse_reference_ops("nllb", {"cross_attention": "reference: requested"}, cuda, allowed=False)
    assert bench.reference_ops(fallen) == {"cross_attention": fallen["cross_attention"]}


def test_bench_generate_ab_quick_runs_on_cpu(tmp_path):
    """bench/generate_ab.py: both configurations timed per shape, and a variable padfree.env does not define
    refused in one line."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "bench", "generate_ab.py")
    out = tmp_path / "ab.json"
    proc = subprocess.run([sys.executable, script, "--quick", "--b", "PADFREE_FRAGMENT_ROWS=4", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json
    report = json.loads(out.read_text())
    assert report["b"] == {"PADFREE_FRAGMENT_ROWS": "4"} and report["device"] == "cpu" and report["command"]
    assert report["rows"] and all(row["a_ms_per_step"] > 0 and row["b_ms_per_step"] > 0 for row in report["rows"])
    bad = subprocess.run([sys.executable, script, "--quick", "--b", "PADFREE_NO_SUCH=1"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "PADFREE_NO_SUCH=1" in bad.stderr.strip().splitlines()[-1]
