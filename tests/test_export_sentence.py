"""Sentence embeddings (task sentence-similarity): a sentence-transformers directory written by hand
(an HF save_pretrained + modules.json + 1_Pooling/config.json + optionally 2_Normalize) exports
encoder + pooling; the rewrite pools on packed rows and matches the plain export on ONNX Runtime,
and (where sentence-transformers is installed) SentenceTransformer.encode."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx_graphsurgeon")
pytest.importorskip("onnxruntime")
pytest.importorskip("polygraphy")

from padfree.export import models, sentence, tasks  # noqa: E402
from padfree.export.compare import compare, packed_feed  # noqa: E402
from padfree.export.errors import ExportError  # noqa: E402
from padfree.export.pipeline import export  # noqa: E402


def write_tokenizer(folder: Path) -> None:
    from _tokenizers import write_wordpiece
    write_wordpiece(folder)


def sentence_dir(folder: Path, pooling="mean", normalize=True, name="tiny-bert", legacy=False,
                 extra_modules=()) -> Path:
    """A sentence-transformers directory as sentence-transformers saves it, written by hand."""
    config_cls, model_cls, fields = models.BUILTIN[name]
    models.build(config_cls, model_cls, **fields).save_pretrained(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir()
    modules += [{"idx": len(modules), "name": m, "path": m, "type": f"sentence_transformers.models.{m}"}
                for m in extra_modules]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    hidden = fields["hidden_size"]
    if legacy:  # sentence-transformers < 5: one flag per mode
        flags = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens"}
        config = {"word_embedding_dimension": hidden, **{flag: mode == pooling for mode, flag in flags.items()}}
    else:
        config = {"embedding_dimension": hidden, "pooling_mode": pooling, "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    return folder


@pytest.mark.parametrize("pooling, normalize, io, name", [
    ("mean", True, "packed", "tiny-bert"), ("mean", False, "padded", "tiny-roberta"),
    ("cls", True, "padded", "tiny-bert"), ("cls", False, "packed", "tiny-roberta"),
    ("max", True, "packed", "tiny-roberta"), ("max", False, "padded", "tiny-bert")])
def test_sentence_models_pool_on_packed_rows_and_match_the_plain_export(tmp_path, pooling, normalize, io, name):
    result = export(sentence_dir(tmp_path / "st", pooling, normalize, name), tmp_path / "out", io=io)
    report = json.loads(result.report_path.read_text())
    assert report["task"] == tasks.SENTENCE_SIMILARITY and report["complete"]
    rewritten, reference = onnx.load(result.padfree_path), onnx.load(result.model_path)
    assert [o.name for o in rewritten.graph.output] == ["sentence_embedding"]
    assert [o.name for o in reference.graph.output] == ["sentence_embedding"]
    ops = {n.op_type for n in rewritten.graph.node}
    # the segment reduction on packed rows, no padded tensor in between, and BERT's pooler (Tanh) not exported
    assert "Tanh" not in ops and "PadfreeRebuildPadding" not in ops
    assert ("ScatterElements" in ops) == (pooling != "cls")
    ok, results, _ = compare(rewritten, reference, batch=6, max_seqlen=24, seed=1)
    assert ok, results


def test_against_sentence_transformers_encode(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    import onnxruntime as ort

    from padfree.export.reference import with_references

    texts = ["the cat sat on the mat", "a dog", "red blue green house tree bird sings loud", "quiet"]
    for pooling, normalize in (("mean", True), ("max", False), ("cls", True)):
        folder = sentence_dir(tmp_path / pooling, pooling, normalize)
        write_tokenizer(folder)
        want = st.SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)
        result = export(folder, tmp_path / f"out-{pooling}")
        import transformers
        batch = transformers.AutoTokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="np")
        feed = packed_feed({k: np.asarray(v, np.int64) for k, v in batch.items()})
        model = with_references(onnx.load(result.padfree_path))
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (got,) = session.run(["sentence_embedding"], feed)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_sentence_configs_read_and_refused(tmp_path):
    folder = sentence_dir(tmp_path / "legacy", "max", False, legacy=True)
    config = sentence.read(folder)
    assert (config.pooling, config.normalize) == ("max", False)
    model, description = models.load(str(folder))
    assert tasks.of_model(model) == tasks.SENTENCE_SIMILARITY and model.encoder.pooler is None
    assert "max pooling" in description
    with pytest.raises(ExportError, match="not Dense"):
        sentence.read(sentence_dir(tmp_path / "dense", extra_modules=("Dense",)))
    two = sentence_dir(tmp_path / "two")
    (two / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": ["mean", "max"]}))
    with pytest.raises(ExportError, match="pooling \\['mean', 'max'\\]"):
        sentence.read(two)
    plain = sentence_dir(tmp_path / "plain")
    (plain / "modules.json").unlink()
    with pytest.raises(ExportError, match="has no modules.json"):
        models.load(str(plain), task="sentence-similarity")
