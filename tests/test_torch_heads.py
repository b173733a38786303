"""Task heads on the PyTorch path (padfree.torch.heads): sequence classification on each sequence's
first row, token classification and question answering on every packed row, against HF eager in
float32 at 12 layers with every weight drawn (head biases too), through from_hf's HF-style call,
forward_packed and Runtime.run. On the CPU through the encoder's composition with the kernels' torch
references, on the GPU through the kernels (with and without CUDA graphs). Per-token outputs are
compared at real positions and must be exact zeros at padded ones (HF leaves values there)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from _encoder_models import cpu_encoder, random_batch, randomize_parameters, rel_err  # noqa: E402

from padfree.torch import UnsupportedModelError, from_hf  # noqa: E402
from padfree.torch.weights import extract  # noqa: E402

HIDDEN, HEADS, LABELS = 64, 2, 5
TASKS = {"seq": "ForSequenceClassification", "token": "ForTokenClassification", "qa": "ForQuestionAnswering"}
CONFIGS = {
    "bert": ("BertConfig", "Bert", dict(type_vocab_size=2)),
    "roberta": ("RobertaConfig", "Roberta", dict(type_vocab_size=1, pad_token_id=1, max_position_embeddings=98)),
    "distilbert": ("DistilBertConfig", "DistilBert",
                   dict(dim=HIDDEN, n_heads=HEADS, n_layers=12, hidden_dim=4 * HIDDEN)),
    "electra": ("ElectraConfig", "Electra", dict(embedding_size=32, type_vocab_size=2)),
}
# (family, task) pairs on the CPU: every head of BERT, and the other families' own head structures
CASES = [("bert", "seq"), ("bert", "token"), ("bert", "qa"), ("roberta", "seq"), ("roberta", "token"),
         ("distilbert", "seq"), ("distilbert", "qa"), ("electra", "seq"), ("electra", "token")]


def head_model(family: str, task: str, seed: int, layers: int = 12):
    """A random-weight HF task model (every parameter drawn: biases, LayerNorm affines, the head), eager."""
    config_cls, prefix, fields = CONFIGS[family]
    common = dict(vocab_size=151, max_position_embeddings=96, attn_implementation="eager",
                  num_labels=2 if task == "qa" else LABELS)  # HF splits qa_outputs into start and end
    if family != "distilbert":
        common.update(hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=4 * HIDDEN,
                      num_hidden_layers=layers)
    config = getattr(transformers, config_cls)(**{**common, **fields})
    torch.manual_seed(seed)
    model = getattr(transformers, prefix + TASKS[task])(config).eval()
    return randomize_parameters(model, seed, bias_scale=0.3)  # head biases large enough that a dropped one shows


def batch_for(model, rng, batch=6, width=64):
    types = getattr(model.config, "type_vocab_size", 0) > 1
    return random_batch(model, batch, width, rng, types=types)


def hf_outputs(model, ids, mask, type_ids, device="cpu"):
    ref = model.to(device=device, dtype=torch.float32)
    kwargs = {} if type_ids is None else {"token_type_ids": type_ids.to(device)}
    with torch.no_grad():
        out = ref(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
    names = ["start_logits", "end_logits"] if "start_logits" in out else ["logits"]
    return {n: out[n].cpu() for n in names}


def float32_tolerance(model, ids, mask, type_ids, want, floor=1e-5):
    """{name: tolerance} for a float32 comparison with HF's float32 outputs `want`: the floor, or three
    times HF float32's own error against a float64 run of the same model where that is larger. A
    logit vector whose norm is small against the activations it comes from (QA start logits on some
    draws) carries float32 rounding of ~1e-5 relative in HF itself, and any other summation order
    lands as far on the other side of the float64 value."""
    reference = copy.deepcopy(model).to(dtype=torch.float64)
    kwargs = {} if type_ids is None else {"token_type_ids": type_ids}
    with torch.no_grad():
        exact = reference(input_ids=ids, attention_mask=mask, **kwargs)
    valid = mask.bool()
    per_token = "logits" not in want or want["logits"].dim() == 3
    pick = (lambda t: t[valid]) if per_token else (lambda t: t)
    return {n: max(floor, 3 * rel_err(pick(want[n]), pick(exact[n]))) for n in want}


def check_against_hf(got, want, mask, per_sequence, tol):
    """got / want: {name: tensor}; per-token outputs [B, S, ...] padded with zeros where mask is 0.
    tol: one tolerance, or {name: tolerance}."""
    valid = mask.bool().cpu()
    assert set(got) == set(want)
    for name, ref in want.items():
        tol_name = tol[name] if isinstance(tol, dict) else tol
        out = got[name].cpu()
        assert out.shape == ref.shape, name
        if per_sequence:
            assert rel_err(out, ref) < tol_name, name
        else:
            assert (out[~valid] == 0).all(), f"{name}: padded positions must be exact zeros"
            assert rel_err(out[valid], ref[valid]) < tol_name, name


def packed(ids, mask, type_ids, device="cpu"):
    valid = mask.bool()
    cu = torch.nn.functional.pad(valid.sum(1).cumsum(0), (1, 0)).int()
    types = None if type_ids is None else type_ids[valid].int().to(device)
    return ids[valid].int().to(device), cu.to(device), int(valid.sum(1).max()), types


# ---- CPU: the composition ---------------------------------------------------------------------------

@pytest.mark.parametrize("family, task", CASES)
def test_head_matches_hf_in_float32_on_cpu(family, task, seed):
    rng = np.random.default_rng(seed)
    model = head_model(family, task, seed)
    ids, mask, type_ids = batch_for(model, rng)
    want = hf_outputs(model, ids, mask, type_ids)
    encoder = cpu_encoder(model, dtype=torch.float32)
    assert encoder.output_names == list(want) and not encoder.has_pooler
    assert encoder.per_sequence_outputs == ({"logits"} if task == "seq" else set())
    out = encoder(ids, mask, type_ids)
    tol = float32_tolerance(model, ids, mask, type_ids, want)
    check_against_hf({n: out[n] for n in want}, want, mask, task == "seq", tol)
    # packed: per-sequence rows [B, ...] or per-token rows [T, ...], the same values
    got = encoder.forward_packed(*packed(ids, mask, type_ids))
    valid = mask.bool()
    assert list(got) == list(want)
    for name, t in got.items():
        assert torch.equal(t, out[name] if task == "seq" else out[name][valid])


@pytest.mark.parametrize("family, task", [("bert", "seq"), ("bert", "token"), ("bert", "qa"), ("distilbert", "seq")])
def test_head_through_the_runtime_on_cpu(family, task, seed):
    """Runtime.run shapes a head's outputs by what the backend declares: text classification's
    logits one row per sequence, token classification's one row per token (both named logits)."""
    from padfree.runtime import Runtime

    rng = np.random.default_rng(seed)
    model = head_model(family, task, seed, layers=3)
    ids, mask, type_ids = batch_for(model, rng, batch=5, width=40)
    want = hf_outputs(model, ids, mask, type_ids)
    tol = float32_tolerance(model, ids, mask, type_ids, want)
    runtime = Runtime(cpu_encoder(model, dtype=torch.float32), max_batch=2)  # several chunks
    valid = mask.bool()
    sequences = [row[m].tolist() for row, m in zip(ids, valid)]
    types = None if type_ids is None else [row[m].tolist() for row, m in zip(type_ids, valid)]
    got = runtime.run(sequences, token_type_ids=types)
    if task == "seq":
        assert got["logits"].shape == (5, LABELS) and rel_err(got["logits"], want["logits"]) < tol["logits"]
    else:
        for name, ref in want.items():
            assert [t.shape[0] for t in got[name]] == valid.sum(1).tolist()
            assert rel_err(torch.cat(got[name]), ref[valid]) < tol[name]
    padded = runtime.run(ids, attention_mask=mask, token_type_ids=type_ids, padded=True)
    check_against_hf({n: padded[n] for n in want}, want, mask, task == "seq", tol)


def test_mutated_heads_fail_the_comparison(seed):
    """A wrong bias or a dropped activation in the head is far outside the tolerance the tests use."""
    rng = np.random.default_rng(seed)
    for family, task in (("bert", "seq"), ("bert", "token"), ("distilbert", "seq"), ("electra", "seq")):
        model = head_model(family, task, seed, layers=2)
        ids, mask, type_ids = batch_for(model, rng, batch=4, width=24)
        want = hf_outputs(model, ids, mask, type_ids)["logits"]
        valid = mask.bool()
        for mutate in ("bias", "activation"):
            encoder = cpu_encoder(model, dtype=torch.float32)
            layers = encoder.head.layers
            if mutate == "bias":
                layers[-1].bias += 0.1
            elif len(layers) > 1:
                layers[0].activation = None
            else:
                continue
            got = encoder(ids, mask, type_ids).logits
            err = rel_err(got, want) if task == "seq" else rel_err(got[valid], want[valid])
            assert err > 1e-3, (family, task, mutate, err)


def test_heads_padfree_cannot_run_are_refused_by_name(seed):
    model = head_model("bert", "seq", seed, layers=1)
    model.classifier = torch.nn.Sequential(torch.nn.Linear(HIDDEN, LABELS))
    with pytest.raises(UnsupportedModelError, match="BertForSequenceClassification: classification head Sequential"):
        extract(model, torch.float32, torch.device("cpu"))
    electra = head_model("electra", "seq", seed, layers=1)
    electra.classifier.activation = torch.nn.SiLU()
    with pytest.raises(UnsupportedModelError, match="classifier.activation: activation SiLU is not supported"):
        extract(electra, torch.float32, torch.device("cpu"))


def test_unused_head_weights_are_refused_unless_allowed(seed):
    config = head_model("bert", "seq", seed, layers=1).config
    mlm = transformers.BertForMaskedLM(config).eval()
    with pytest.raises(UnsupportedModelError, match="BertForMaskedLM: .*allow_unused_weights=True"):
        extract(mlm, torch.float32, torch.device("cpu"))
    weights = extract(mlm, torch.float32, torch.device("cpu"), allow_unused_weights=True)
    assert weights.head is None and torch.equal(weights.word_embeddings, mlm.bert.embeddings.word_embeddings.weight)
    # the base model alone carries no head: nothing is left unused
    assert extract(mlm.bert, torch.float32, torch.device("cpu")).head is None


def test_sentence_pooling_of_a_task_model_is_refused_unless_allowed(seed):
    if not torch.cuda.is_available():
        pytest.skip("from_hf places weights on a CUDA device")
    model = head_model("bert", "seq", seed, layers=1)
    with pytest.raises(UnsupportedModelError, match="pooling='mean' makes a sentence model"):
        from_hf(model, dtype=torch.float32, pooling="mean")
    assert from_hf(model, dtype=torch.float32, pooling="mean", allow_unused_weights=True).output_names == [
        "sentence_embedding"]


# ---- GPU: the kernels ---------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("family, task", CASES)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_head_matches_hf_on_gpu(family, task, graphs, seed, no_tf32):
    from padfree.runtime import Runtime

    rng = np.random.default_rng(seed)
    model = head_model(family, task, seed)
    ids, mask, type_ids = batch_for(model, rng, batch=7, width=80)
    want = hf_outputs(model, ids, mask, type_ids, "cuda")
    encoder = from_hf(model, dtype=torch.float32, use_graphs=graphs)
    cuda_types = None if type_ids is None else type_ids.cuda()
    for _ in range(2):  # with graphs, the second call replays the first's graph
        out = encoder(ids.cuda(), mask.cuda(), cuda_types)
        check_against_hf({n: out[n] for n in want}, want, mask, task == "seq", 1e-4)
    got = Runtime(encoder).run(ids, attention_mask=mask, token_type_ids=type_ids, padded=True)
    check_against_hf({n: got[n] for n in want}, want, mask, task == "seq", 1e-4)
    half = from_hf(model, dtype=torch.float16, use_graphs=graphs)(ids.cuda(), mask.cuda(), cuda_types)
    check_against_hf({n: half[n] for n in want}, want, mask, task == "seq", 2e-2)
