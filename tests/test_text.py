"""Text in, on the CPU: `padfree export` keeps the tokenizer and configs beside the ONNX,
`Runtime(OUT).tokenize / encode` and `padfree run OUT --text / --text-file` run an export folder end to
end on ONNX Runtime (its plugin nodes through their references), against HF: the tokenizer with
padding and the HF model in float32 torch, mean pooling computed here as sentence-transformers pools.
Random-weight models built from configs, a WordPiece tokenizer written by the test (no model hub).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx_graphsurgeon")
pytest.importorskip("onnxruntime")

import torch  # noqa: E402
from _tokenizers import WORDS, write_wordpiece  # noqa: E402
from test_export_sentence import sentence_dir  # noqa: E402

from padfree.export import models, text_files  # noqa: E402
from padfree.export.pipeline import export  # noqa: E402
from padfree.runtime import InputError, Runtime  # noqa: E402
from padfree.runtime._text import TextError  # noqa: E402

LIMIT = 20   # the sentence model's max_seq_length (its position table serves 128)
RTOL, ATOL = 1e-5, 1e-6  # float32: a 2-layer model, packed on ONNX Runtime vs padded in torch


def random_texts(rng, count, longest=LIMIT - 2):
    """Texts of 0..longest known words (special tokens make it +2), mixed case and edge spaces, the
    empty text and one at exactly the limit included."""
    words = [w for w in WORDS if not w.startswith("##")]
    lengths = rng.integers(1, longest + 1, count)
    lengths[:2] = [0, longest]
    texts = []
    for n in lengths:
        picked = [str(w) for w in rng.choice(words, n)]
        if n and rng.random() < 0.5:
            picked[0] = picked[0].capitalize()
        texts.append(" " * int(rng.integers(0, 2)) + " ".join(picked) + " " * int(rng.integers(0, 2)))
    return texts


def hf_embeddings(folder: Path, texts, *, lower=False, truncate_to=None, normalize=False):
    """sentence-transformers' computation, written out: strip (+ lowercase), HF tokenizer with padding,
    the HF model in float32, mean over valid tokens, optional L2 normalization."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder)).float().eval()
    texts = [t.strip().lower() if lower else t.strip() for t in texts]
    batch = tokenizer(texts, padding=True, truncation=truncate_to is not None, max_length=truncate_to,
                      return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return (torch.nn.functional.normalize(pooled, p=2, dim=1) if normalize else pooled).numpy()


@pytest.fixture(scope="module")
def sentence(tmp_path_factory):
    """A sentence-transformers directory (mean pooling, no Normalize module, lowercasing, max_seq_length
    LIMIT, a case-sensitive tokenizer: the lowercasing shows) and its export."""
    root = tmp_path_factory.mktemp("sentence")
    st = sentence_dir(root / "st", "mean", normalize=False)
    write_wordpiece(st, lowercase=False)
    (st / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": LIMIT, "do_lower_case": True}))
    export(st, root / "out")
    return st, root / "out"


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """An HF BertModel directory with its tokenizer, exported as feature-extraction in both I/O forms."""
    root = tmp_path_factory.mktemp("plain")
    config_cls, model_cls, fields = models.BUILTIN["tiny-bert"]
    models.build(config_cls, model_cls, seed=3, **fields).save_pretrained(root / "hf")
    write_wordpiece(root / "hf")
    export(root / "hf", root / "out")
    export(root / "hf", root / "padded", io="padded")
    return root / "hf", root / "out"


# ---- the export folder -----------------------------------------------------------------------------

def test_export_keeps_the_text_side(sentence):
    st, out = sentence
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "config.json", "sentence_bert_config.json"):
        assert (out / name).read_bytes() == (st / name).read_bytes(), name
    assert (out / "1_Pooling" / "config.json").read_bytes() == (st / "1_Pooling" / "config.json").read_bytes()
    modules = json.loads((out / "modules.json").read_text())
    layout = [(m["type"].rsplit(".", 1)[-1], m["path"]) for m in modules]
    assert layout == [("Transformer", ""), ("Pooling", "1_Pooling")]
    report = json.loads((out / "report.json").read_text())
    assert sorted(report["text_files"]) == sorted(["tokenizer.json", "tokenizer_config.json", "vocab.txt",
                                                   "config.json", "sentence_bert_config.json", "modules.json",
                                                   "1_Pooling/config.json"])
    assert not [p for p in out.rglob("*") if p.name.startswith(".padfree-partial")]


def test_text_files_of_a_previous_export_go_and_a_model_directory_is_left_alone(sentence, tmp_path):
    st, out = sentence
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    text_files.remove_previous(copy, [])            # the next export (a built-in) has no text side
    assert not any((copy / name).exists() for name in text_files.written_names())
    assert (copy / "model.padfree.onnx").is_file()   # (the export's own removal takes the rest)
    # exporting into the source directory, or into another HF model directory: their files stay
    before = {p.name: p.read_bytes() for p in st.iterdir() if p.is_file()}
    text_files.remove_previous(st, [st])
    assert text_files.copy(st, [st], sentence=True) == []
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"weights")
    (hf / "vocab.txt").write_text("its own\n")
    text_files.remove_previous(hf, [st])
    assert text_files.copy(hf, [st], sentence=True) == []
    assert (hf / "vocab.txt").read_text() == "its own\n"
    assert {p.name: p.read_bytes() for p in st.iterdir() if p.is_file()} == before


# ---- Runtime.encode / tokenize ----------------------------------------------------------------------

def test_encode_matches_hf_mean_pooling_in_order(sentence, seed):
    st, out = sentence
    texts = random_texts(np.random.default_rng(seed), 11)
    rt = Runtime(str(out), max_batch=3)         # chunks of 3 inside batches of 4
    want = hf_embeddings(st, texts, lower=True)
    got = rt.encode(texts, batch_size=4)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.shape == (11, want.shape[1])
    np.testing.assert_allclose(got.numpy(), want, rtol=RTOL, atol=ATOL)
    got = rt.encode(texts[::-1], batch_size=5, normalize=True, output="numpy")
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got, hf_embeddings(st, texts[::-1], lower=True, normalize=True), rtol=RTOL, atol=ATOL)
    # the tokens are the tokenizer's, unpadded: [CLS] ... [SEP] of each text as given (stripped, lowercased)
    ids = rt.tokenize(texts)
    reference = write_wordpiece(st / "again", lowercase=False)
    assert ids == [reference(t.strip().lower())["input_ids"] for t in texts]
    assert len(ids[0]) == 2 and len(ids[1]) == LIMIT


def test_encode_refuses_long_texts_naming_the_limit_unless_truncated(sentence, seed):
    st, out = sentence
    rng = np.random.default_rng(seed)
    texts = random_texts(rng, 4) + random_texts(rng, 2, longest=2 * LIMIT)[1:]
    rt = Runtime(str(out))
    with pytest.raises(InputError, match=f"text 4 has {2 * LIMIT + 2} tokens, more than this model's limit of {LIMIT}"
                       " \\(max_seq_length in sentence_bert_config.json\\); shorten it, or pass truncate=True"):
        rt.encode(texts, batch_size=2)
    got = rt.encode(texts, truncate=True, output="numpy")
    np.testing.assert_allclose(got, hf_embeddings(st, texts, lower=True, truncate_to=LIMIT), rtol=RTOL, atol=ATOL)


def test_encode_input_errors(sentence):
    _, out = sentence
    rt = Runtime(str(out))
    for texts, message in (([], "no texts: pass at least one string"),
                           ("the cat", "got one string; for one text pass \\[text\\]"),
                           (["the cat", 3], "text 1: expected a str, got int"), (7, "got int")):
        with pytest.raises(InputError, match=message):
            rt.encode(texts)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        rt.encode(["the cat"], batch_size=0)


def test_a_missing_tokenizer_says_where_it_looked_and_what_to_do(sentence, tmp_path):
    st, out = sentence
    bare = tmp_path / "bare"
    shutil.copytree(out, bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (bare / name).unlink()
    rt = Runtime(str(bare))
    with pytest.raises(TextError, match=f"no tokenizer found for this model \\(looked in {bare}\\); give one with"
                       " tokenizer=DIR"):
        rt.encode(["the cat"])
    with pytest.raises(TextError, match="no tokenizer files there"):
        Runtime(str(bare), tokenizer=tmp_path).tokenize(["the cat"])
    want = Runtime(str(out)).encode(["the cat sat", "a dog"])   # the tokenizer given instead
    torch.testing.assert_close(Runtime(str(bare), tokenizer=st).encode(["the cat sat", "a dog"]), want)


@pytest.mark.parametrize("io", ["packed", "padded"])
def test_run_and_tokenize_on_a_model_without_pooling(plain, seed, io):
    """feature-extraction: per-token outputs of tokenized texts against the HF model; encode() says
    what it needs."""
    import transformers

    hf, out = plain
    out = out if io == "packed" else out.parent / "padded"
    texts = random_texts(np.random.default_rng(seed), 6, longest=40)
    rt = Runtime(str(out), max_tokens=64)
    got = rt.run(rt.tokenize(texts))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf))
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = transformers.AutoModel.from_pretrained(str(hf)).float().eval()(**batch)
    lengths = batch["attention_mask"].sum(1).tolist()
    assert [len(h) for h in got["last_hidden_state"]] == lengths
    for i, n in enumerate(lengths):
        torch.testing.assert_close(got["last_hidden_state"][i], want.last_hidden_state[i, :n], rtol=RTOL, atol=1e-5)
    torch.testing.assert_close(got["pooler_output"], want.pooler_output, rtol=RTOL, atol=1e-5)
    with pytest.raises(TextError, match="this model has none \\(its outputs: last_hidden_state, pooler_output\\):"
                       " export a sentence-transformers directory"):
        rt.encode(texts)


def test_against_sentence_transformers_encode(sentence):
    st_module = pytest.importorskip("sentence_transformers")
    st, out = sentence
    texts = ["The cat sat on the mat", "a dog", "red blue green house tree bird sings loud", "quiet", ""]
    want = st_module.SentenceTransformer(str(st), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(Runtime(str(out)).encode(texts, output="numpy"), want, rtol=RTOL, atol=ATOL)


# ---- padfree run --text / --text-file ---------------------------------------------------------------

def test_cli_run_texts(sentence, tmp_path, capsys):
    from padfree.cli import main

    st, out = sentence
    texts = ["the cat sat on the mat", "a dog", "red blue green house tree bird sings loud"]
    assert main(["run", str(out), "--text", texts[0], "--text", texts[1], "--text", texts[2],
                 "-o", str(tmp_path / "a.npz")]) == 0
    assert "sentence_embedding: [3, 128] float32" in capsys.readouterr().out
    want = hf_embeddings(st, texts, lower=True)
    np.testing.assert_allclose(np.load(tmp_path / "a.npz")["sentence_embedding"], want, rtol=RTOL, atol=ATOL)
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    assert main(["run", str(out), "--text-file", str(tmp_path / "texts.txt"), "-o", str(tmp_path / "b.npz")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "b.npz")["sentence_embedding"], want, rtol=RTOL, atol=ATOL)
    long = " ".join(["cat"] * LIMIT)
    assert main(["run", str(out), "--text", long, "--truncate", "-o", str(tmp_path / "c.npz")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "c.npz")["sentence_embedding"],
                               hf_embeddings(st, [long], lower=True, truncate_to=LIMIT), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("args, lines, message", [
    (["--text", " ".join(["cat"] * LIMIT)], None,
     f"bad input: text 0 has {LIMIT + 2} tokens, more than this model's limit of {LIMIT}"),
    (["--text-file", "{file}"], "the cat\n\na dog\n", "line 2 is blank; give one text per line"),
    (["--text-file", "{file}"], "", "holds no text"),
    (["--random", "2,8", "--truncate"], None, "--truncate applies to texts"),
    (["--random", "2,8", "--tokenizer", "{dir}"], None, "--tokenizer applies to texts"),
    (["--text", "a", "--tokenizer", "{dir}"], None, "no tokenizer files there"),
])
def test_cli_run_text_errors_are_one_line(sentence, tmp_path, capsys, args, lines, message):
    from padfree.cli import main

    _, out = sentence
    if lines is not None:
        (tmp_path / "t.txt").write_text(lines)
    args = [a.format(file=tmp_path / "t.txt", dir=tmp_path) for a in args]
    assert main(["run", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("padfree run: error: ") and message in err and "\n" not in err


def test_where_the_tokenizer_is_looked_for(plain, tmp_path):
    """Beside an engine file, in an export folder, in the HF directory a PyTorch-path model came from."""
    from types import SimpleNamespace

    from _runtime_double import ToyBackend

    from padfree._lib import PadfreeError
    from padfree.runtime._text import candidate_folders

    hf, out = plain
    assert candidate_folders(str(out / "model.engine"), None) == [out]
    assert candidate_folders(str(out), None) == [out]
    backend = ToyBackend(max_seqlen=128, vocab_size=512)
    backend.encoder = SimpleNamespace(config=SimpleNamespace(_name_or_path=str(hf)))  # as from_hf keeps it
    rt = Runtime(backend)
    want = write_wordpiece(tmp_path / "tok")(["the cat sat", "a dog"])["input_ids"]
    assert rt.tokenize(["the cat sat", "a dog"]) == want and all(1 not in ids for ids in want)   # no [UNK]
    with pytest.raises(TextError, match="looked in nowhere"):
        Runtime(ToyBackend()).tokenize(["the cat"])
    with pytest.raises(PadfreeError, match="is a folder but not a padfree export"):
        Runtime(str(tmp_path))


def test_a_text_classification_export_answers_per_sequence(tmp_path):
    """text-classification's logits have one row per sequence: the export folder's backend declares it
    (from the graph's output shapes), so run() returns one row per sequence, not per token."""
    export("tiny-bert", tmp_path, task="text-classification")
    rt = Runtime(str(tmp_path))
    out = rt.run([[101, 7, 8, 102], [101, 9, 102], [101, 5, 6, 7, 8, 102]])
    assert out["logits"].dim() == 2 and out["logits"].shape[0] == 3      # one row per sequence, not per token
