"""padfree.generation refuses what it does not implement, by name, and bad input before any device work."""
from __future__ import annotations

import copy
import os
import sys
import warnings

import pytest
import torch

import padfree.torch as pt
from padfree.generation import UnsupportedOptionError, inputs
from padfree.ops import InputError
from padfree.torch import UnsupportedModelError

sys.path.insert(0, os.path.dirname(__file__))
from _seq2seq import build, config_for, model_class, random_sources  # noqa: E402

_CACHE: dict = {}


def generator(family: str = "marian"):
    if family not in _CACHE:
        model = build(family)
        _CACHE[family] = (model, pt.from_hf(model, dtype=torch.float32, device="cpu"))
    return _CACHE[family]


def sources(model, count=3):
    return random_sources(model.config, count, seed=2)


@pytest.mark.parametrize("option,value", [
    ("typical_p", 0.5), ("min_p", 0.1), ("epsilon_cutoff", 0.01), ("eta_cutoff", 0.01), ("top_h", 0.5),
])
def test_sampling_only_options_are_refused_when_sampling(option, value):
    model, gen = generator()
    with pytest.raises(UnsupportedOptionError, match=option):
        gen.generate(sources(model), do_sample=True, max_new_tokens=3, **{option: value})


@pytest.mark.parametrize("option,value", [
    ("encoder_repetition_penalty", 1.3), ("encoder_no_repeat_ngram_size", 2), ("suppress_tokens", [5]),
    ("begin_suppress_tokens", [5]), ("exponential_decay_length_penalty", (3, 1.1)), ("renormalize_logits", True),
    ("remove_invalid_values", True), ("sequence_bias", [[[5], -1.0]]), ("max_time", 1.0), ("guidance_scale", 2.0),
    ("num_beam_groups", 2), ("diversity_penalty", 0.5), ("penalty_alpha", 0.6), ("stop_strings", ["x"]),
    ("token_healing", True), ("decoder_input_ids", torch.tensor([[96, 5]])), ("encoder_outputs", object()),
    ("logits_processor", [object()]), ("stopping_criteria", [object()]), ("streamer", object()),
    ("assistant_model", object()), ("prefix_allowed_tokens_fn", lambda b, ids: [1]), ("not_an_option", 3),
])
def test_unimplemented_options_are_refused_by_name(option, value):
    model, gen = generator()
    with pytest.raises(UnsupportedOptionError, match=option):
        gen.generate(sources(model), max_new_tokens=3, **{option: value})


def test_refused_extra_outputs_and_combinations():
    model, gen = generator()
    src = sources(model)
    for option in ("output_attentions", "output_hidden_states", "output_logits"):
        with pytest.raises(UnsupportedOptionError, match=option):
            gen.generate(src, max_new_tokens=3, return_dict_in_generate=True, **{option: True})
    with pytest.raises(UnsupportedOptionError, match="beam sampling"):
        gen.generate(src, do_sample=True, num_beams=2, max_new_tokens=3)
    with pytest.raises(UnsupportedOptionError, match="output_scores"):
        gen.generate(src, max_new_tokens=3, return_dict_in_generate=True, output_scores=True)
    with pytest.raises(UnsupportedOptionError, match="forced_eos_token_id"):
        gen.generate(src, max_new_tokens=3, forced_eos_token_id=[0, 5])
    with pytest.raises(UnsupportedOptionError, match="eos_token_id"):
        gen.generate(src, num_beams=16, max_new_tokens=3, eos_token_id=[0, 5, 6, 7])


def test_options_a_model_config_carries_are_refused_at_load():
    """Refusal covers the model's generation_config, not only keywords, and happens in from_hf."""
    model, _ = generator()
    model = copy.deepcopy(model)
    model.generation_config.suppress_tokens = [4]
    with pytest.raises(UnsupportedOptionError, match="suppress_tokens"):
        pt.from_hf(model, dtype=torch.float32, device="cpu")          # refused at load, by name
    model.generation_config.suppress_tokens = None
    model.generation_config.num_beam_groups = 2
    with pytest.raises(UnsupportedModelError, match="num_beam_groups"):
        pt.from_hf(model, dtype=torch.float32, device="cpu")


def test_options_without_effect_and_sampling_options_without_sampling_are_accepted():
    """HF ignores temperature/top_k/top_p without do_sample, and cache choices change no output."""
    model, gen = generator()
    src = sources(model)
    base = gen.generate(src, max_new_tokens=4)
    same = gen.generate(src, max_new_tokens=4, temperature=0.5, top_k=3, top_p=0.5, use_cache=True,
                        cache_implementation="static", typical_p=0.5, synced_gpus=False)
    assert torch.equal(base, same)


@pytest.mark.parametrize("num_beams", [0, 17])
def test_num_beams_out_of_range(num_beams):
    model, gen = generator()
    with pytest.raises((InputError, ValueError), match="num_beams"):
        gen.generate(sources(model), num_beams=num_beams, max_new_tokens=3)


def test_hf_validation_errors_come_through():
    model, gen = generator()
    with pytest.raises(ValueError, match="num_return_sequences"):
        gen.generate(sources(model), num_beams=2, num_return_sequences=3, max_new_tokens=3)
    with pytest.raises(ValueError, match="num_return_sequences"):
        gen.generate(sources(model), num_return_sequences=2, max_new_tokens=3)   # greedy
    with pytest.raises(ValueError, match="early_stopping"):
        gen.generate(sources(model), num_beams=2, early_stopping="sometimes", max_new_tokens=3)
    with pytest.raises(ValueError, match="max_length"):
        gen.generate(sources(model), max_length=1)


def test_bad_inputs_fail_before_device_work(monkeypatch):
    model, gen = generator()
    calls = []
    import padfree.generation.generator as generator_module
    monkeypatch.setattr(generator_module, "encode", lambda *a, **k: calls.append(1))
    vocab = model.config.vocab_size
    cases = [
        ([[5, 6], []], "empty"),
        ([], "empty"),
        ([[5, vocab]], "outside the vocabulary"),
        ([[5, -1]], "outside the vocabulary"),
        ([[5] * 65], "position table"),
        ([["a"]], "list of int"),
        ("text", "tensor"),
        (torch.ones(2, 3), "integer tensor"),
    ]
    for value, message in cases:
        with pytest.raises(InputError, match=message):
            gen.generate(value, max_new_tokens=3)
    with pytest.raises(InputError, match="position table"):
        gen.generate([[5, 6]], max_new_tokens=70)
    with pytest.raises(InputError, match="ones followed by zeros"):
        gen.generate(torch.tensor([[5, 6, 7]]), attention_mask=torch.tensor([[0, 1, 1]]), max_new_tokens=3)
    with pytest.raises(InputError, match="empty"):
        gen.generate(torch.tensor([[5, 6, 7]]), attention_mask=torch.tensor([[0, 0, 0]]), max_new_tokens=3)
    with pytest.raises(InputError, match="bad_words_ids"):
        gen.generate([[5]], max_new_tokens=3, bad_words_ids=[[vocab + 3]])
    with pytest.raises(InputError, match="seed"):
        gen.generate([[5]], max_new_tokens=3, do_sample=True, seed="x")
    assert calls == []


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_a_padded_tensor_packs_as_its_source_lists(seed, dtype):
    """packed_sources on a padded tensor (packed by its mask, checked on the packed ids) against the list path
    (source_lists, then PackedSources.from_lists): the same ids, cu_seqlens and lengths; pad positions
    holding ids outside the vocabulary are not sources and are not refused."""
    from padfree.generation.encoder import PackedSources
    model, gen = generator()
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 20, (7,), generator=g)
    ids = torch.randint(3, model.config.vocab_size, (7, int(lengths.max())), generator=g).to(dtype)
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    ids[mask == 0] = -7       # never read: outside the mask
    packed = inputs.packed_sources(ids, mask, gen.weights, 30)
    listed = PackedSources.from_lists(inputs.source_lists(ids, mask), "cpu")
    assert packed.ids.dtype == torch.long and torch.equal(packed.ids, listed.ids)
    assert torch.equal(packed.cu_seqlens, listed.cu_seqlens) and packed.lengths == listed.lengths
    unmasked = inputs.packed_sources(ids[:, :1].abs(), None, gen.weights, 30)
    assert unmasked.lengths == [1] * 7 and torch.equal(unmasked.ids, ids[:, 0].abs().long())


def test_a_padded_tensor_is_refused_as_its_source_lists_are(seed):
    """Each bad tensor input gets the list path's message, naming the same source."""
    model, gen = generator()
    vocab = model.config.vocab_size
    ids = torch.full((3, 6), 5)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    for row, col, bad in [(1, 3, vocab), (2, 0, -1), (0, 5, vocab + 9)]:
        wrong = ids.clone()
        wrong[row, col] = bad
        with pytest.raises(InputError, match=rf"input_ids\[{row}\]: token id {bad} is outside the vocabulary"):
            inputs.packed_sources(wrong, mask, gen.weights, 10)
        with pytest.raises(InputError, match=rf"input_ids\[{row}\]: token id {bad} is outside the vocabulary"):
            gen.generate(wrong, attention_mask=mask, max_new_tokens=3)
    long_ids = torch.full((2, 70), 5)
    long_mask = torch.ones(2, 70, dtype=torch.long)
    long_mask[0, 60:] = 0
    with pytest.raises(InputError, match=r"input_ids\[1\]: 70 tokens, but the model's position table holds 64"):
        inputs.packed_sources(long_ids, long_mask, gen.weights, 10)
    with pytest.raises(InputError, match=r"input_ids\[1\]: the source is empty"):
        inputs.packed_sources(ids, torch.tensor([[1] * 6, [0] * 6, [1] * 6]), gen.weights, 10)
    with pytest.raises(InputError, match="the batch is empty"):
        inputs.packed_sources(torch.zeros(0, 4, dtype=torch.long), None, gen.weights, 10)
    with pytest.raises(InputError, match="max_length=100"):
        inputs.packed_sources(ids, mask, gen.weights, 100)


def test_cache_that_does_not_fit_is_refused_before_allocation(monkeypatch):
    model, gen = generator()
    import padfree.generation.generator as generator_module
    calls = []
    monkeypatch.setattr(generator_module, "encode", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(inputs, "free_device_bytes", lambda device: 10_000)
    with pytest.raises(InputError, match="GiB is free"):
        gen.generate(sources(model), num_beams=4, max_new_tokens=30)
    assert calls == []
    needed = inputs.estimate_bytes(gen.weights, 64, 64 * 40, 64, 64 * 4, 64)
    from padfree.generation.decoder import cache_bytes
    assert needed > cache_bytes(gen.weights, 256, 64) > 0


def test_memory_estimate_counts_the_folded_weights_of_pre_ln_steps():
    """A pre-LN 16-bit step of 17-256 rows may make LayerNorm-folded copies of QKV, cross Q and fc1
    (decode_gemm) at its first call: the estimate, an upper one, counts them until they exist wherever
    decode_gemm may run (past 64 rows the device's grid rule decides), and not at other row counts."""
    from padfree.generation.weights import extract
    model = build("m2m100")
    weights = extract(model, pt.from_hf(model, dtype=torch.float32, device="cpu").spec, torch.float16, "cpu")
    folded = sum(w.numel() * 2 + w.shape[0] * 4 for layer in weights.decoder.layers
                 for w in (layer.self_attn.qkv_weight, layer.cross_attn.q_weight, layer.ffn.fc1_weight))
    for rows, counted in ((32, True), (64, True), (256, True), (16, False), (257, False)):
        before = inputs.estimate_bytes(weights, 8, 8 * 20, 20, rows, 30)
        weights.folded = []
        after = inputs.estimate_bytes(weights, 8, 8 * 20, 20, rows, 30)
        weights.folded = None
        assert before - after == (folded if counted else 0), rows


@pytest.mark.parametrize("fits_at_first", [True, False])
def test_free_memory_is_queried_for_a_new_bucket_only(monkeypatch, fits_at_first):
    """A call on a kept bucket's state allocates no decode buffers: no free-memory query. A new bucket's call
    queries once where it fits; where it does not and states are kept, they are given back (Runner.clear)
    and the memory queried again before the call is refused or run."""
    model, gen = generator()
    gen.runner.clear()                                  # (a shared generator: other tests' buckets)
    gen.generate(sources(model), max_new_tokens=3)      # keeps this bucket's state
    assert len(gen.runner.states) == 1
    answers = [1 << 50] if fits_at_first else [10_000, 1 << 50]
    queries, cleared = [], []
    monkeypatch.setattr(inputs, "free_device_bytes", lambda device: queries.append(device) or answers[len(queries) - 1])
    clear = gen.runner.clear
    monkeypatch.setattr(gen.runner, "clear", lambda: cleared.append(1) or clear())
    gen.generate(sources(model), max_new_tokens=3)      # the kept bucket
    assert queries == [] and cleared == []
    out = gen.generate(sources(model), max_new_tokens=4)    # another max_length: a new bucket
    assert out.shape[0] == len(sources(model))
    assert len(queries) == len(answers) and len(cleared) == (0 if fits_at_first else 1)


def _model(family, **overrides):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model_class(family)(config_for(family, **overrides)).eval()


@pytest.mark.parametrize("family,flag,value", [
    ("bart", "normalize_before", True), ("mbart", "normalize_before", False), ("marian", "add_final_layer_norm", True),
    ("bart", "static_position_embeddings", True), ("bart", "add_bias_logits", True),
    ("marian", "normalize_embedding", True),
])
def test_legacy_flags_that_disagree_with_the_class_are_refused(family, flag, value):
    model = _model(family)
    setattr(model.config, flag, value)
    with pytest.raises(UnsupportedModelError, match=flag):
        pt.from_hf(model, dtype=torch.float32, device="cpu")


def test_unsupported_models_and_config_values():
    with pytest.raises(UnsupportedModelError, match="activation_function"):
        pt.from_hf(_model("bart", activation_function="tanh"), dtype=torch.float32, device="cpu")
    from transformers import T5Config, T5ForConditionalGeneration
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                             num_heads=4, decoder_start_token_id=0))
    with pytest.raises(UnsupportedModelError, match="T5ForConditionalGeneration"):
        pt.from_hf(t5, dtype=torch.float32, device="cpu")
    from transformers import BartModel
    with pytest.raises(UnsupportedModelError, match="BartModel"):
        pt.from_hf(BartModel(config_for("bart")), dtype=torch.float32, device="cpu")
    with pytest.raises(UnsupportedModelError, match="programmatic_edges"):
        pt.from_hf(_model("marian"), dtype=torch.float32, device="cpu", programmatic_edges=True)
    with pytest.raises(InputError, match="dtype"):
        pt.from_hf(_model("marian"), dtype=torch.int8, device="cpu")
    with pytest.raises(InputError, match="gemm_search"):
        pt.from_hf(_model("marian"), dtype=torch.float32, device="cpu", gemm_search="fastest")


@pytest.mark.parametrize("gemm_search", ["none", "exhaustive"])
def test_gemm_search_reaches_the_decode_states(gemm_search):
    """from_hf's gemm_search is the generator's: each bucket's decoder tunes its output projection's GEMM
    by it (on the CPU nothing is tuned: torch's call, the same tokens as HF)."""
    model = _model("marian")
    gen = pt.from_hf(model, dtype=torch.float32, device="cpu", gemm_search=gemm_search)
    src = random_sources(model.config, 2, seed=3)
    from _seq2seq import hf_generate
    assert torch.equal(gen.generate(src, max_new_tokens=4), hf_generate(model, src, max_new_tokens=4))
    states = list(gen.runner.states.values())
    assert states and all(state.decoder.gemm_search == gemm_search for state in states)


def test_supported_config_variants_load():
    """Flags that are supported in both settings: separate (untied) embeddings, scale_embedding either way,
    Marian with its own decoder vocabulary."""
    for family, overrides in (("bart", dict(tie_word_embeddings=False, scale_embedding=True)),
                              ("m2m100", dict(scale_embedding=False)),
                              ("marian", dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=97))):
        model = _model(family, **overrides)
        gen = pt.from_hf(model, dtype=torch.float32, device="cpu")
        src = random_sources(model.config, 2, seed=1)
        from _seq2seq import hf_generate
        assert torch.equal(gen.generate(src, max_new_tokens=4), hf_generate(model, src, max_new_tokens=4))


def test_ops_dispatch_reports_the_reference_on_cpu():
    _, gen = generator()
    assert all(source.startswith("reference") for source in gen.ops.sources.values())
    assert "cpu" in repr(gen)


def test_resolved_options_are_kept_only_while_the_config_holds_its_values():
    """generate()'s keywords resolve once per set (values and types) while the generator's
    generation_config is unchanged; a changed config, changed in place or not, resolves again, and a
    refused call is refused every time."""
    import dataclasses

    from padfree.generation.generator import _keywords_key
    from padfree.generation.options import resolve_options
    model, _ = generator()
    gen = pt.from_hf(model, dtype=torch.float32, device="cpu")

    def fresh(**kw):
        return resolve_options(gen.generation_config, gen.config, gen.weights.target_vocab_size, None, **kw)

    first = gen.resolve(num_beams=4, max_new_tokens=9)
    assert gen.resolve(max_new_tokens=9, num_beams=4) is first
    assert first == fresh(num_beams=4, max_new_tokens=9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.num_beams = 2
    gen.generation_config.no_repeat_ngram_size = 2
    second = gen.resolve(num_beams=4, max_new_tokens=9)
    assert second is not first and second.no_repeat_ngram_size == 2 == fresh(num_beams=4).no_repeat_ngram_size
    gen.generation_config.bad_words_ids = [[5]]
    third = gen.resolve(num_beams=4, max_new_tokens=9)
    gen.generation_config.bad_words_ids[0].append(6)          # in place: the kept copy still says [[5]]
    fourth = gen.resolve(num_beams=4, max_new_tokens=9)
    assert fourth is not third and fourth == fresh(num_beams=4, max_new_tokens=9) != third
    assert _keywords_key({"early_stopping": 1}) != _keywords_key({"early_stopping": True})
    assert _keywords_key({"max_new_tokens": 9}) != _keywords_key({"max_new_tokens": 9.0})
    assert _keywords_key({"x": object()}) is None
    for _ in range(2):
        with pytest.raises(UnsupportedOptionError, match="typical_p"):
            gen.resolve(do_sample=True, typical_p=0.5)
