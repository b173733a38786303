"""ELECTRA (embeddings projected to the hidden size) and ALBERT (factorized embeddings, layers shared
across groups) in padfree.torch, at real depth (12 layers) against HF eager in float32: on the CPU
through the encoder's composition with the kernels' torch references, on the GPU through the kernels.
Padded rows are checked to be exact zeros; configurations padfree cannot run are refused by name."""
from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from _encoder_models import (  # noqa: E402
    check_padded_output,
    cpu_encoder,
    hf_reference,
    random_batch,
    randomize_parameters,
)

from padfree.torch import UnsupportedModelError, from_hf  # noqa: E402
from padfree.torch.weights import albert_schedule, extract  # noqa: E402

HIDDEN, HEADS = 128, 2
# name -> (config class, model class, config fields): 12 layers, hidden 128, embedding size 64
FAMILIES = {
    "electra": ("ElectraConfig", "ElectraModel", dict(embedding_size=64)),
    "electra-unfactorized": ("ElectraConfig", "ElectraModel", dict(embedding_size=HIDDEN)),
    "albert": ("AlbertConfig", "AlbertModel", dict(embedding_size=64)),  # one group, one layer: 12 passes
    "albert-2x2": ("AlbertConfig", "AlbertModel", dict(embedding_size=64, num_hidden_groups=2, inner_group_num=2)),
    # 12 passes over 5 groups: HF's int(i / (12 / 5)) gives groups of 3, 2, 3, 2, 2 passes
    "albert-5-groups": ("AlbertConfig", "AlbertModel", dict(embedding_size=64, num_hidden_groups=5)),
}


def family_model(name: str, seed: int, layers: int = 12, model_cls: str | None = None, **over):
    """A random-weight model of `name` (every parameter drawn: biases and LayerNorm affines too), HF eager."""
    config_cls, default_cls, fields = FAMILIES[name]
    config = getattr(transformers, config_cls)(
        vocab_size=211, max_position_embeddings=96, type_vocab_size=2, hidden_size=HIDDEN,
        num_attention_heads=HEADS, intermediate_size=4 * HIDDEN, num_hidden_layers=layers,
        attn_implementation="eager", **{**fields, **over})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls or default_cls)(config).eval()
    return randomize_parameters(model, seed)


def batch_for(model, rng, batch=6, width=80):
    return random_batch(model, batch, width, rng, types=True)


# ---- CPU: the composition at real depth -----------------------------------------------------------

@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_matches_hf_in_float32_on_cpu(name, seed):
    rng = np.random.default_rng(seed)
    model = family_model(name, seed)
    ids, mask, type_ids = batch_for(model, rng)
    ref_hidden, ref_pooled = hf_reference(model, ids, mask, type_ids, "cpu", torch.float32)
    out = cpu_encoder(model, dtype=torch.float32)(ids, mask, type_ids)
    check_padded_output(out, ref_hidden, ref_pooled, mask, 1e-5)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_matches_hf_in_float64_on_cpu(name, seed):
    """The composition exactly: float64 on both sides leaves only rounding (a wrong pass order, group
    or projection would be far above it)."""
    rng = np.random.default_rng(seed)
    model = family_model(name, seed)
    ids, mask, type_ids = batch_for(model, rng)
    out = cpu_encoder(model)(ids, mask, type_ids)
    ref_hidden, ref_pooled = hf_reference(model, ids, mask, type_ids, "cpu", torch.float64)
    check_padded_output(out, ref_hidden, ref_pooled, mask, 1e-10)


@pytest.mark.parametrize("layers, groups, inner", [(12, 1, 1), (12, 2, 2), (12, 5, 1), (4, 3, 2), (6, 6, 1)])
def test_albert_layers_are_held_once_and_run_in_hf_order(layers, groups, inner, seed):
    model = family_model("albert", seed, layers=layers, num_hidden_groups=groups, inner_group_num=inner)
    weights = extract(model, torch.float32, torch.device("cpu"))
    schedule = albert_schedule(layers, groups)
    assert len(weights.layers) == layers * inner and len(weights.distinct_layers) == groups * inner
    for i, lw in enumerate(weights.layers):
        group, j = schedule[i // inner], i % inner
        hf = model.encoder.albert_layer_groups[group].albert_layers[j]
        assert torch.equal(lw.up_weight, hf.ffn.weight)
        assert lw is weights.layers[(i // inner) * inner + j]  # shared: the same object, one copy
    assert len({lw.qkv_weight.data_ptr() for lw in weights.layers}) == groups * inner


def test_task_models_run_their_heads(seed):
    """ELECTRA's and ALBERT's task models run their heads (ALBERT's classifier over its pooler) on the
    packed rows, against HF in float64; per-token outputs are zeros at padded positions."""
    rng = np.random.default_rng(seed)
    for name, cls, outputs in (("electra", "ElectraForSequenceClassification", ["logits"]),
                               ("albert", "AlbertForSequenceClassification", ["logits"]),
                               ("albert", "AlbertForTokenClassification", ["logits"]),
                               ("albert-2x2", "AlbertForQuestionAnswering", ["start_logits", "end_logits"])):
        model = family_model(name, seed, layers=3, model_cls=cls)
        ids, mask, type_ids = batch_for(model, rng, batch=3, width=20)
        encoder = cpu_encoder(model)
        assert encoder.output_names == outputs
        out = encoder(ids, mask, type_ids)
        with torch.no_grad():
            want = model.double()(input_ids=ids, attention_mask=mask, token_type_ids=type_ids)
        valid = mask.bool()
        for key in outputs:
            if "Sequence" in cls:
                assert out[key].shape == want[key].shape and (out[key] - want[key]).abs().max() < 1e-10
            else:
                assert (out[key][~valid] == 0).all() and (out[key][valid] - want[key][valid]).abs().max() < 1e-10


def test_albert_pooler_and_electra_without_pooler(seed):
    assert extract(family_model("electra", seed, layers=1), torch.float32, torch.device("cpu")).pooler_weight is None
    albert = family_model("albert", seed, layers=1)
    weights = extract(albert, torch.float32, torch.device("cpu"))
    assert torch.equal(weights.pooler_weight, albert.pooler.weight)
    assert weights.architecture == "albert" and weights.embedding_size == 64


@pytest.mark.parametrize("name, over, pattern", [
    ("electra", dict(embedding_size=60), "embedding size 60 is not a multiple of 8"),
    ("albert", dict(embedding_size=36), "embedding size 36 is not a multiple of 8"),
    ("albert", dict(hidden_act="silu"), "hidden activation 'silu' is not supported"),
    ("electra", dict(position_embedding_type="relative_key"), "position_embedding_type='relative_key'"),
])
def test_configurations_it_cannot_run_are_refused_by_name(name, over, pattern, seed):
    with pytest.raises(UnsupportedModelError, match=pattern):
        extract(family_model(name, seed, layers=2, **over), torch.float32, torch.device("cpu"))


def test_albert_with_groups_missing_is_refused(seed):
    model = family_model("albert-2x2", seed, layers=4)
    del model.encoder.albert_layer_groups[1]
    with pytest.raises(UnsupportedModelError, match="num_hidden_groups=2 but the model holds 1 layer groups"):
        extract(model, torch.float32, torch.device("cpu"))


# ---- GPU: the kernels ---------------------------------------------------------------------------------

GPU_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_family_matches_hf_on_gpu(name, dtype, graphs, seed, no_tf32):
    rng = np.random.default_rng(seed)
    model = family_model(name, seed)
    encoder = from_hf(model, dtype=dtype, use_graphs=graphs)
    ids, mask, type_ids = batch_for(model, rng, batch=7, width=96)
    ref_hidden, ref_pooled = hf_reference(model, ids, mask, type_ids, "cuda", torch.float32)
    for _ in range(2):  # with graphs, the second call replays (speculatively) the first's graph
        block = torch.empty(2**26, device="cuda")  # NaN in the allocator's free blocks: unwritten buffers show
        block.fill_(float("nan"))
        del block
        out = encoder(ids.cuda(), mask.cuda(), type_ids.cuda())
        check_padded_output(out, ref_hidden, ref_pooled, mask, GPU_TOLERANCE[dtype])
