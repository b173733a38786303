"""Sentence embeddings on the PyTorch path (padfree.torch.sentence): the pooling on packed rows against
a per-sequence float64 loop, and a sentence-transformers directory end to end through
Runtime(SentenceEncoder).encode against the padded sentence model (encoder + pooling in torch, as
sentence-transformers computes them) in float64. CPU: the encoder runs with the kernels' plain-torch
references (tests/_encoder_models.py); GPU (-m gpu): from_hf of the sentence model on padfree's kernels."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _encoder_models import cpu_encoder  # noqa: E402
from _tokenizers import WORDS, write_wordpiece  # noqa: E402

from padfree.runtime import Runtime  # noqa: E402
from padfree.torch.sentence import POOLING_MODES, SentenceEncoder, pool_packed, sentence_pooling  # noqa: E402


def reference_pool(hidden: torch.Tensor, lengths: list[int], mode: str, normalize: bool) -> torch.Tensor:
    """Each sequence's rows on their own, in float64."""
    rows, start = [], 0
    for n in lengths:
        seq = hidden[start:start + n].double()
        rows.append(seq[0] if mode == "cls" else seq.mean(0) if mode == "mean" else seq.max(0).values)
        start += n
    pooled = torch.stack(rows)
    if normalize:
        pooled = pooled / pooled.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return pooled


@pytest.mark.parametrize("mode", POOLING_MODES)
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_pool_packed_matches_each_sequence_pooled_alone(mode, normalize, dtype, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=7).tolist()
    lengths[0], lengths[-1] = 1, 40                       # the edge lengths, every time
    hidden = torch.from_numpy(rng.normal(size=(sum(lengths), 24)) * 3).to(dtype)
    cu = torch.tensor(np.concatenate(([0], np.cumsum(lengths))), dtype=torch.int32)
    got = pool_packed(hidden, cu, mode, normalize)
    assert got.dtype == torch.float32 and got.shape == (len(lengths), 24)
    # float32 accumulation of the rows as given: only float32 rounding separates it from float64
    torch.testing.assert_close(got.double(), reference_pool(hidden, lengths, mode, normalize), rtol=1e-5, atol=1e-6)


def test_pool_packed_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="pooling must be one of"):
        pool_packed(torch.zeros(3, 4), torch.tensor([0, 3], dtype=torch.int32), "weightedmean", False)


def _texts(rng, count, longest=30):
    words = [w for w in WORDS if not w.startswith("##")]
    lengths = rng.integers(1, longest + 1, count)
    lengths[0] = longest
    return [" ".join(str(w) for w in rng.choice(words, n)) for n in lengths]


@pytest.mark.parametrize("pooling, normalize", [("mean", True), ("cls", False), ("max", True), ("mean", False)])
def test_runtime_encode_on_the_pytorch_path_matches_the_padded_sentence_model(tmp_path, pooling, normalize, seed):
    pytest.importorskip("onnx_graphsurgeon")          # test_export_sentence's module needs it
    import transformers
    from test_export_sentence import sentence_dir

    from padfree.export import models

    st = sentence_dir(tmp_path / "st", pooling, normalize)
    write_wordpiece(st)
    model, _ = models.load(str(st))
    assert sentence_pooling(model) == (pooling, normalize)
    encoder = SentenceEncoder(cpu_encoder(model.encoder), pooling, normalize)
    assert not encoder.encoder.has_pooler            # export.models drops BERT's pooler: never run
    rt = Runtime(encoder, max_batch=4)                # 11 texts: three chunks
    assert rt.output_names == ["sentence_embedding"]
    texts = _texts(np.random.default_rng(seed), 11)
    got = rt.encode(texts, batch_size=8)             # the tokenizer found through the model's folder
    assert got.dtype == torch.float32 and got.shape == (11, model.config.hidden_size)

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(st))
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = model.double()(batch["input_ids"], batch["attention_mask"])["sentence_embedding"]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_sentence_encoder_refuses_an_unknown_pooling():
    with pytest.raises(ValueError, match="pooling must be one of"):
        SentenceEncoder(object(), "lasttoken", False)


def test_only_a_sentence_model_has_a_sentence_pooling():
    import transformers
    model = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                                                           intermediate_size=32))
    assert sentence_pooling(model) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-4), (torch.float16, 1e-2)])
def test_gpu_from_hf_of_a_sentence_model_encodes_as_the_padded_model(tmp_path, dtype, rtol, seed):
    pytest.importorskip("onnx_graphsurgeon")
    import transformers
    from test_export_sentence import sentence_dir

    from padfree.export import models
    from padfree.torch import from_hf

    st = sentence_dir(tmp_path / "st", "mean", True)
    write_wordpiece(st)
    model, _ = models.load(str(st))
    encoder = from_hf(model, dtype=dtype, device="cuda")
    assert isinstance(encoder, SentenceEncoder) and not encoder.encoder.has_pooler
    texts = _texts(np.random.default_rng(seed), 37)
    got = Runtime(encoder).encode(texts, batch_size=16)
    assert got.is_cuda and got.dtype == torch.float32
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(st))
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            want = model.float().cuda()(batch["input_ids"].cuda(), batch["attention_mask"].cuda())["sentence_embedding"]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    err = float((got - want).norm() / want.norm())
    assert err < rtol, err
