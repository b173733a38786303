"""padfree.torch.weights and from_hf's refusals (CPU): weight extraction and merging, and the models,
configurations and sizes the encoder refuses."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _encoder_models import ARCHS, REFERENCE_OPS, make_model  # noqa: E402

from padfree.ops import InputError  # noqa: E402
from padfree.torch import PadfreeEncoder, UnsupportedModelError, from_hf  # noqa: E402
from padfree.torch.weights import extract  # noqa: E402

# ---- CPU: weight extraction -----------------------------------------------------------------------

def test_extract_bert_merges_qkv_and_keeps_layout():
    model = make_model("bert", hidden=64, heads=4, layers=3)
    w = extract(model, torch.float32, torch.device("cpu"))
    att = model.encoder.layer[1].attention.self
    assert (w.architecture, w.num_heads, w.head_dim, len(w.layers)) == ("bert", 4, 16, 3)
    assert torch.equal(w.layers[1].qkv_weight, torch.cat([att.query.weight, att.key.weight, att.value.weight]))
    assert torch.equal(w.layers[1].qkv_bias, torch.cat([att.query.bias, att.key.bias, att.value.bias]))
    assert w.position_offset == 0 and w.max_seqlen == 64
    assert w.type_vocab_size == 3 and w.pooler_weight is not None
    assert w.activation == "erf"


@pytest.mark.parametrize("arch", ARCHS)
def test_extract_places_each_layers_projections_in_one_buffer(arch):
    """QKV, out, up, down back to back (each 256-byte aligned) in the order a forward reads them, so
    that the spans a LayerNorm prefetches (attention_projections, ffn_projections) cover them."""
    model = make_model(arch, hidden=64, heads=4, layers=2)
    w = extract(model, torch.float16, torch.device("cpu"))
    for lw in w.layers:
        parts = (lw.qkv_weight, lw.out_weight, lw.up_weight, lw.down_weight)
        base = parts[0].untyped_storage().data_ptr()
        assert all(p.untyped_storage().data_ptr() == base and (p.data_ptr() - base) % 256 == 0 for p in parts)
        assert [p.data_ptr() for p in parts] == sorted(p.data_ptr() for p in parts)
        for span, (first, last) in ((lw.attention_projections, parts[:2]), (lw.ffn_projections, parts[2:])):
            assert span.data_ptr() == first.data_ptr() and span.is_contiguous()
            assert span.data_ptr() + span.nbytes == last.data_ptr() + last.nbytes
    up = {"distilbert": lambda: model.transformer.layer[0].ffn.lin1,
          "albert": lambda: model.encoder.albert_layer_groups[0].albert_layers[0].ffn}.get(
        arch, lambda: model.encoder.layer[0].intermediate.dense)()
    assert torch.equal(w.layers[0].up_weight, up.weight.half())


def test_extract_roberta_positions_and_distilbert_without_types_or_pooler():
    roberta = extract(make_model("roberta", hidden=64), torch.float16, torch.device("cpu"))
    assert roberta.architecture == "roberta"
    assert roberta.position_offset == 2 and roberta.max_seqlen == 64
    assert roberta.word_embeddings.dtype == torch.float16
    distil = extract(make_model("distilbert", hidden=64), torch.float32, torch.device("cpu"))
    assert distil.architecture == "distilbert"
    assert distil.token_type_embeddings is None and distil.pooler_weight is None and distil.type_vocab_size == 0


def test_extract_task_model_uses_base_model():
    config = make_model("bert", hidden=64).config
    task = transformers.BertForSequenceClassification(config).eval()
    w = extract(task, torch.float32, torch.device("cpu"))
    assert torch.equal(w.word_embeddings, task.bert.embeddings.word_embeddings.weight)


@pytest.mark.parametrize("change, message", [
    (dict(hidden_act="quick_gelu"), "activation"),
    (dict(is_decoder=True), "decoder"),
    (dict(position_embedding_type="relative_key"), "position_embedding_type"),
])
def test_extract_refuses_unsupported_configs(change, message):
    model = make_model("bert", hidden=64)
    for key, value in change.items():
        setattr(model.config, key, value)
    with pytest.raises(UnsupportedModelError, match=message):
        extract(model, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("shape, message", [
    (dict(hidden=36, heads=4), "not a multiple of 8"),  # head_dim 9: the LayerNorm kernels need 8 | hidden
    (dict(hidden=64, layers=0), "no encoder layers"),
])
def test_extract_refuses_unsupported_shapes(shape, message):
    with pytest.raises(UnsupportedModelError, match=message):
        extract(make_model("bert", **shape), torch.float32, torch.device("cpu"))


def test_extract_refuses_other_architectures():
    with pytest.raises(UnsupportedModelError):
        extract(torch.nn.Linear(4, 4), torch.float32, torch.device("cpu"))


def test_unknown_gemm_search_is_refused():
    weights = extract(make_model("bert", hidden=64), torch.float64, torch.device("cpu"))
    with pytest.raises(InputError, match="gemm_search"):
        PadfreeEncoder(weights, ops=REFERENCE_OPS, use_epilogue=False, gemm_search="fastest")


def test_from_hf_refuses_cpu_and_bad_dtype():
    model = make_model("bert", hidden=64)
    with pytest.raises(InputError, match="CUDA"):
        from_hf(model, device="cpu")
    with pytest.raises(InputError, match="dtype"):
        from_hf(model, dtype=torch.int8)


@pytest.mark.parametrize("hidden, heads, problem", [(64, 4, "head_dim 16 is not built"),
                                                     (192, 2, "head_dim 96 is not built"),
                                                     (128, 2, None), (256, 2, None)])
def test_kernel_sizes_refuse_what_has_no_attention_kernel(hidden, heads, problem):
    """extract leaves head_dim to the caller (the CPU tests run head_dim 16 on reference ops);
    from_hf, which runs the real kernels, refuses what they are not built for."""
    from padfree.torch.weights import check_kernel_sizes
    weights = extract(make_model("bert", hidden=hidden, heads=heads), torch.float32, torch.device("cpu"))
    if problem is None:
        check_kernel_sizes(weights)
    else:
        with pytest.raises(UnsupportedModelError, match=f"{heads} heads x {hidden // heads}: {problem}"):
            check_kernel_sizes(weights)


@pytest.mark.gpu
def test_from_hf_refuses_head_dim_without_kernels():
    with pytest.raises(UnsupportedModelError, match="head_dim 16 is not built"):
        from_hf(make_model("bert", hidden=64, heads=4), dtype=torch.float16)
