"""Sentence embeddings on the PyTorch path: pooling per sequence on the encoder's packed rows against
sentence-transformers' pooling of the padded batch (export.sentence.sentence_model computes it as
sentence-transformers does), in float32; on the CPU through the encoder's composition with the
kernels' torch references, on the GPU through padfree.ops.sequence_pool. SentenceTransformer objects
are read where sentence-transformers is installed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from _encoder_models import ARCHS, cpu_encoder, make_model, random_batch, rel_err  # noqa: E402

from padfree.export.sentence import SentenceConfig, sentence_model  # noqa: E402
from padfree.ops import InputError  # noqa: E402
from padfree.torch import UnsupportedModelError, from_hf  # noqa: E402
from padfree.torch.sentence import of_model as sentence_of  # noqa: E402

MODES = ["cls", "mean", "max"]


def st_style(model, pooling: str, normalize: bool):
    """sentence-transformers' Transformer + Pooling (+ Normalize) over `model`, as a torch module."""
    return sentence_model(model, SentenceConfig(Path(), pooling, normalize))


def st_reference(model, pooling, normalize, ids, mask, type_ids, device="cpu"):
    reference = st_style(model.to(device=device, dtype=torch.float32), pooling, normalize)
    with torch.no_grad():
        return reference(ids.to(device), mask.to(device), None if type_ids is None else type_ids.to(device))[
            "sentence_embedding"]


# ---- CPU: the composition ------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("pooling", MODES)
@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "l2"])
def test_pooled_encoder_matches_sentence_transformers_pooling_on_cpu(arch, pooling, normalize, seed):
    rng = np.random.default_rng(seed)
    model = make_model(arch, hidden=64, heads=2, layers=3, seed=seed)
    ids, mask, type_ids = random_batch(model, 6, 48, rng, types=arch in ("bert", "electra", "albert"))
    encoder = cpu_encoder(model, dtype=torch.float32, pooling=pooling, normalize=normalize)
    assert encoder.output_names == ["sentence_embedding"] and not encoder.has_pooler
    out = encoder(ids, mask, type_ids)
    assert set(out.keys()) == {"sentence_embedding"}
    assert rel_err(out.sentence_embedding, st_reference(model, pooling, normalize, ids, mask, type_ids)) < 1e-5
    # the packed entry gives the same rows, sequence by sequence
    valid = mask.bool()
    cu = torch.nn.functional.pad(valid.sum(1).cumsum(0), (1, 0)).int()
    packed = encoder.forward_packed(ids[valid].int(), cu, int(valid.sum(1).max()),
                                    None if type_ids is None else type_ids[valid].int())
    assert list(packed) == ["sentence_embedding"]
    assert torch.equal(packed["sentence_embedding"], out.sentence_embedding)


def test_sentence_models_bring_their_pooling(seed):
    bert = make_model("bert", hidden=64, seed=seed)
    model = st_style(bert, "max", True)
    assert sentence_of(model, None, None) == (bert, "max", True)
    assert sentence_of(model, "max", True) == (bert, "max", True)
    with pytest.raises(InputError, match="pooling='mean', but the sentence model SentenceModel has pooling 'max'"):
        sentence_of(model, "mean", None)
    with pytest.raises(InputError, match="normalize=False, but"):
        sentence_of(model, None, False)
    assert sentence_of(bert, "cls", None) == (bert, "cls", False)
    assert sentence_of(bert, None, None) == (bert, None, False)
    with pytest.raises(InputError, match="pooling: expected one of cls, mean, max or None, got 'sum'"):
        sentence_of(bert, "sum", None)
    with pytest.raises(InputError, match="normalize=True needs a pooling"):
        sentence_of(bert, None, True)


def st_modules():
    """sentence-transformers' module classes (moved in version 6; skips without the package)."""
    pytest.importorskip("sentence_transformers")
    import importlib
    try:
        return importlib.import_module("sentence_transformers.sentence_transformer.modules")
    except ImportError:
        return importlib.import_module("sentence_transformers.models")


def st_model(tmp_path, arch: str, pooling: str, normalize: bool, seed: int):
    """A SentenceTransformer over a saved random-weight encoder (skips without sentence-transformers)."""
    modules = st_modules()
    import sentence_transformers as st
    from _tokenizers import write_wordpiece

    folder = tmp_path / f"{arch}-{pooling}"
    model = make_model(arch, hidden=64, layers=2, seed=seed)
    model.save_pretrained(folder)
    write_wordpiece(folder)
    parts = [modules.Transformer(str(folder)), modules.Pooling(64, pooling_mode=pooling)]
    return st.SentenceTransformer(modules=parts + ([modules.Normalize()] if normalize else []), device="cpu").eval()


@pytest.mark.parametrize("pooling, normalize", [("mean", True), ("cls", False), ("max", True)])
def test_sentence_transformer_objects_are_read(tmp_path, pooling, normalize, seed):
    st = st_model(tmp_path, "bert", pooling, normalize, seed)
    encoder, mode, norm = sentence_of(st, None, None)
    assert encoder is st[0].auto_model and (mode, norm) == (pooling, normalize)
    rng = np.random.default_rng(seed)
    ids, mask, _ = random_batch(encoder, 5, 24, rng)
    with torch.no_grad():
        want = st({"input_ids": ids, "attention_mask": mask})["sentence_embedding"]
    got = cpu_encoder(encoder, dtype=torch.float32, pooling=mode, normalize=norm)(ids, mask).sentence_embedding
    assert rel_err(got, want) < 1e-5


def test_sentence_transformer_modules_padfree_cannot_run_are_refused(tmp_path, seed):
    models = st_modules()
    st = st_model(tmp_path, "bert", "mean", False, seed)
    st.append(models.Dense(64, 16))
    with pytest.raises(UnsupportedModelError, match=r"modules \['Transformer', 'Pooling', 'Dense'\]"):
        sentence_of(st, None, None)
    other = st_model(tmp_path / "w", "bert", "mean", False, seed)
    other[1] = models.Pooling(64, pooling_mode="weightedmean")
    with pytest.raises(UnsupportedModelError, match=r"pooling \['weightedmean'\]"):
        sentence_of(other, None, None)


def test_padfree_run_keeps_a_sentence_directory_pooling(tmp_path):
    """`padfree run ST_DIR` serves the sentence model (its pooling and Normalize), not the bare encoder."""
    from test_export_sentence import sentence_dir

    from padfree.commands.run import load_hf_model

    model = load_hf_model(str(sentence_dir(tmp_path / "st", "max", normalize=True)))
    assert sentence_of(model, None, None)[1:] == ("max", True)


# ---- GPU: the kernels ---------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("pooling", MODES)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_sentence_embedding_matches_on_gpu(arch, pooling, graphs, seed, no_tf32):
    """float32: 1e-5 relative to sentence-transformers' pooling of HF float32, mean/max/CLS + L2 norm."""
    rng = np.random.default_rng(seed)
    model = make_model(arch, hidden=128, heads=2, layers=4, positions=128, seed=seed)
    types = arch in ("bert", "electra", "albert")
    encoder = from_hf(st_style(model, pooling, True), dtype=torch.float32, use_graphs=graphs)
    assert encoder.output_names == ["sentence_embedding"]
    for _ in range(2):  # with graphs, the second call replays the first's graph
        ids, mask, type_ids = random_batch(model, 9, 120, rng, types=types)
        want = st_reference(model, pooling, True, ids, mask, type_ids, "cuda")
        got = encoder(ids.cuda(), mask.cuda(), None if type_ids is None else type_ids.cuda()).sentence_embedding
        assert rel_err(got, want) < 1e-5


@pytest.mark.gpu
def test_sentence_encoder_in_fp16_and_through_the_runtime(seed, no_tf32):
    from padfree.runtime import Runtime

    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=384, heads=12, layers=6, positions=256, seed=seed)
    encoder = from_hf(model, dtype=torch.float16, pooling="mean", normalize=True)
    ids, mask, _ = random_batch(model, 16, 150, rng)
    want = st_reference(model, "mean", True, ids, mask, None, "cuda")
    assert rel_err(encoder(ids.cuda(), mask.cuda()).sentence_embedding, want) < 1e-2
    runtime = Runtime(encoder)
    assert runtime.output_names == ["sentence_embedding"]
    sequences = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    got = runtime.run(sequences, output="torch")["sentence_embedding"]
    assert got.shape == (16, 384) and rel_err(got, want) < 1e-2


@pytest.mark.gpu
def test_forward_packed_copies_unless_asked_not_to(seed):
    rng = np.random.default_rng(seed)
    model = make_model("bert", hidden=128, heads=2, positions=128, seed=seed)
    encoder = from_hf(model, dtype=torch.float16, pooling="cls")
    ids, mask, _ = random_batch(model, 5, 64, rng)
    valid = mask.bool()
    cu = torch.nn.functional.pad(valid.sum(1).cumsum(0), (1, 0)).int().cuda()
    packed = ids[valid].int().cuda()
    first = encoder.forward_packed(packed, cu, 64)["sentence_embedding"]
    kept = first.clone()
    view = encoder.forward_packed(packed.flip(0), cu, 64, copy=False)["sentence_embedding"]
    assert torch.equal(first, kept) and not torch.equal(view, kept)


@pytest.mark.gpu
def test_sentence_transformer_on_gpu(tmp_path, seed, no_tf32):
    st = st_model(tmp_path, "roberta", "mean", True, seed)
    encoder = from_hf(st, dtype=torch.float32)
    rng = np.random.default_rng(seed)
    ids, mask, _ = random_batch(st[0].auto_model, 7, 24, rng)
    with torch.no_grad():
        want = st({"input_ids": ids, "attention_mask": mask})["sentence_embedding"]
    assert rel_err(encoder(ids.cuda(), mask.cuda()).sentence_embedding, want) < 1e-5


@pytest.mark.gpu
def test_sentence_directory_encodes_texts_on_the_pytorch_path(tmp_path, seed, no_tf32):
    """A sentence-transformers directory through padfree.export's loader, from_hf and Runtime.encode,
    against its pooling of the padded batch in float32."""
    from _tokenizers import write_wordpiece
    from test_export_sentence import sentence_dir

    from padfree.export import models
    from padfree.runtime import Runtime

    folder = sentence_dir(tmp_path / "st", "mean", normalize=True)
    write_wordpiece(folder)
    model, _ = models.load(str(folder))
    runtime = Runtime(from_hf(model, dtype=torch.float32))
    texts = ["the cat sat on the mat", "a dog", "red blue green house tree bird sings loud", "quiet", "one two"]
    got = runtime.encode(texts, batch_size=2)
    batch = transformers.AutoTokenizer.from_pretrained(str(folder))(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))["sentence_embedding"]
    assert got.shape == want.shape and rel_err(got, want) < 1e-5
