"""padfree.torch on the CPU: the encoder's own logic (the order of operations, bias folding, RoBERTa
positions, packing, bucketing, input validation), run with plain-torch reference ops in float64
against HF eager (tests/_encoder_models.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from _encoder_models import ARCHS, check_padded_output, cpu_encoder, hf_reference, make_model, random_batch  # noqa: E402

from padfree.ops import InputError  # noqa: E402
from padfree.torch.buckets import LRU, MIN_TOKENS, STEPS_PER_OCTAVE, bucket_for, round_batch, round_seqlen, round_tokens  # noqa: E402

# ---- CPU: the encoder's composition with reference ops ------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("batch", [1, 5])  # one sequence: the pooler reads its row 0 in place
def test_composition_matches_hf_on_cpu(arch, act, batch, seed):
    rng = np.random.default_rng(seed)
    model = make_model(arch, hidden=64, heads=2, act=act, seed=seed)
    encoder = cpu_encoder(model)
    ids, mask, type_ids = random_batch(model, batch, 64, rng, types=arch == "bert",
                                       lengths=[int(rng.integers(1, 65))] if batch == 1 else None)
    out = encoder(ids, mask, type_ids)
    ref_hidden, ref_pooled = hf_reference(model, ids, mask, type_ids, "cpu")
    check_padded_output(out, ref_hidden, ref_pooled, mask, 1e-10)


@pytest.mark.parametrize("arch", ARCHS)
def test_list_form_matches_padded_form_on_cpu(arch, seed):
    rng = np.random.default_rng(seed)
    model = make_model(arch, hidden=64, heads=2, seed=seed)
    encoder = cpu_encoder(model)
    ids, mask, _ = random_batch(model, 4, 64, rng)
    sequences = [row[row_mask.bool()].tolist() for row, row_mask in zip(ids, mask)]
    listed = encoder(sequences)
    ref_hidden, ref_pooled = hf_reference(model, ids, mask, None, "cpu")
    width = int(mask.sum(1).max())
    check_padded_output(listed, ref_hidden[:, :width], ref_pooled, mask[:, :width], 1e-10)


def test_probe_picks_kernel_gelu_where_epilogue_differs():
    # on the CPU, _addmm_activation(use_gelu=True) computes the erf form
    from padfree.torch.ffn import epilogue_matches
    cpu = torch.device("cpu")
    assert epilogue_matches("erf", torch.float64, cpu, 16, 64)
    assert not epilogue_matches("tanh", torch.float64, cpu, 16, 64)
    assert epilogue_matches("relu", torch.float64, cpu, 16, 64)


@pytest.mark.parametrize("types", [True, False])
def test_host_packing_fills_a_bucket_buffer(types, seed):
    """Packed ids in sequence order, then zeros (rows of no sequence); cu_seqlens padded with
    repeats of the token count (empty sequences), as the graphs expect."""
    from padfree.torch.inputs import InputBuffer, from_host
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=64)
    ids, mask, type_ids = random_batch(model, 6, 40, rng, types=types)
    batch = from_host(ids, mask, type_ids, cpu_encoder(model).limits)
    t, b = batch.total_tokens, batch.batch
    assert (t, b, batch.max_seqlen, batch.padded_width, batch.token_types) == \
        (int(mask.sum()), 6, int(mask.sum(1).max()), 40, types)
    buf = InputBuffer.new(t + 70, 8, types, torch.device("cpu"))
    buf.flat.fill_(-7)
    batch.fill(buf)
    valid = mask.bool()
    assert torch.equal(buf.input_ids, torch.cat([ids[valid].int(), torch.zeros(70, dtype=torch.int32)]))
    if types:
        assert torch.equal(buf.token_type_ids[:t], type_ids[valid].int())
    assert buf.cu_seqlens.tolist() == [0] + mask.sum(1).cumsum(0).tolist() + [t] * (8 - b)


# ---- CPU: bucketing ---------------------------------------------------------------------------------

def test_round_tokens_grid_bounds_waste():
    previous = 0
    for t in list(range(1, 5000)) + [2**14 - 1, 2**14, 2**14 + 1, 19661, 10**6]:
        r = round_tokens(t)
        assert r >= t and r % 64 == 0 and r >= previous
        if t > MIN_TOKENS * STEPS_PER_OCTAVE:
            assert (r - t) / t <= 1 / STEPS_PER_OCTAVE
        previous = r
    assert round_tokens(1) == 64 and round_tokens(64) == 64 and round_tokens(65) == 128


def test_round_batch_and_seqlen():
    assert [round_batch(b) for b in (1, 2, 3, 5, 16, 17, 128)] == [1, 2, 4, 8, 16, 32, 128]
    assert round_seqlen(1, 512) == 16 and round_seqlen(100, 512) == 128 and round_seqlen(300, 512) == 512
    assert round_seqlen(300, 400) == 400  # capped at the model's maximum, still >= max_seqlen
    with pytest.raises(ValueError):
        round_seqlen(513, 512)
    b = bucket_for(1000, 3, 100, 512, False)
    assert (b.tokens, b.batch, b.max_seqlen, b.token_types) == (1024, 4, 128, False)


def test_lru_evicts_least_recently_used():
    lru = LRU(2)
    assert lru.put("a", 1) == [] and lru.put("b", 2) == []
    assert lru.get("a") == 1            # "b" is now the oldest
    assert lru.put("c", 3) == [2]
    assert lru.keys() == ["a", "c"] and lru.get("b") is None
    big = [1000]
    assert lru.put("d", big) == [1]     # "a" was the oldest
    assert not lru.holds("d", [1000])  # an equal value is not the one held
    assert lru.holds("c", 3) and lru.holds("d", big) and lru.keys() == ["c", "d"]
    assert not lru.holds("a", 1)


def test_median_error_is_robust_and_shrinks_with_samples():
    """The in-forward GEMM choice's noise margin: zero for equal samples, unmoved by one wild sample,
    and half as large for four times the samples of the same spread."""
    from padfree.torch.capture import _median_error
    rng = np.random.default_rng(0)
    assert _median_error([5.0] * 9) == 0
    spread = list(100 + rng.normal(0, 2, 400))
    assert _median_error(spread + [1e6]) == pytest.approx(_median_error(spread + [100.0]), rel=0.05)
    assert _median_error(spread[:100]) == pytest.approx(2 * _median_error(spread), rel=0.25)
    assert 0.1 < _median_error(spread) < 0.2  # ~1.25 * 2 / sqrt(400)


# ---- CPU: input validation (the same checks guard the GPU path) -------------------------------------

@pytest.fixture(scope="module")
def cpu_bert():
    return cpu_encoder(make_model("bert", hidden=64, positions=32))


def test_bad_inputs_raise_input_error(cpu_bert):
    ids = torch.randint(1, 90, (2, 8))
    ones = torch.ones(2, 8, dtype=torch.int64)
    holed = ones.clone()
    holed[1, 3] = 0
    with pytest.raises(InputError, match="left-aligned"):
        cpu_bert(ids, holed)
    empty = ones.clone()
    empty[0] = 0
    with pytest.raises(InputError, match="empty"):
        cpu_bert(ids, empty)
    with pytest.raises(InputError, match="more than"):
        cpu_bert(torch.randint(1, 90, (1, 33)))
    out_of_vocab = ids.clone()
    out_of_vocab[1, 2] = 97
    with pytest.raises(InputError, match="vocab"):
        cpu_bert(out_of_vocab, ones)
    with pytest.raises(InputError, match="type"):
        cpu_bert(ids, ones, torch.full((2, 8), 3))
    with pytest.raises(InputError, match="dtype"):
        cpu_bert(ids.float(), ones)
    with pytest.raises(InputError, match="empty"):
        cpu_bert([[5, 6], []])


def test_forward_packed_checks(cpu_bert):
    ids = torch.tensor([5, 6, 7], dtype=torch.int32)
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    with pytest.raises(InputError, match="int32"):
        cpu_bert.forward_packed(ids.long(), cu, 2)
    with pytest.raises(InputError, match="max_seqlen"):
        cpu_bert.forward_packed(ids, cu, 33)
    with pytest.raises(InputError, match="cu_seqlens"):
        cpu_bert.forward_packed(ids, cu[:1], 2)
    with pytest.raises(InputError, match=r"token_type_ids: expected shape \[3\]"):
        cpu_bert.forward_packed(ids, cu, 2, token_type_ids=cu[:2])
    out = cpu_bert.forward_packed(ids, cu, 2)
    assert out["last_hidden_state"].shape == (3, 64) and out["pooler_output"].shape == (2, 64)
