"""Task heads in the export (padfree export --task): the checkpoint's head is exported on packed rows
and the rewrite matches the plain export of the same task on ONNX Runtime (CPU); weights a task
would leave unused are refused unless asked for."""
from __future__ import annotations

import json

import onnx
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx_graphsurgeon")
pytest.importorskip("onnxruntime")
pytest.importorskip("polygraphy")

from padfree.export import models, tasks  # noqa: E402
from padfree.export.compare import compare  # noqa: E402
from padfree.export.errors import ExportError  # noqa: E402
from padfree.export.exporter import export_onnx  # noqa: E402
from padfree.export.rewrite import rewrite  # noqa: E402

_EXPORTS: dict[tuple[str, str], onnx.ModelProto] = {}
HEADS = [tasks.TEXT_CLASSIFICATION, tasks.TOKEN_CLASSIFICATION, tasks.QUESTION_ANSWERING]


def exported(name: str, task: str) -> onnx.ModelProto:
    if (name, task) not in _EXPORTS:
        model, _ = models.load(name, task=task)
        assert tasks.of_model(model) == task
        _EXPORTS[name, task] = export_onnx(model, name)
    return _EXPORTS[name, task]


def dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


# packed-form output shapes per task (num_labels 3, QA's 2 split into start / end)
PACKED_SHAPES = {tasks.TEXT_CLASSIFICATION: {"logits": ["batch", 3]},
                 tasks.TOKEN_CLASSIFICATION: {"logits": ["total_tokens", 3]},
                 tasks.QUESTION_ANSWERING: {"start_logits": ["total_tokens"], "end_logits": ["total_tokens"]}}


@pytest.mark.parametrize("io", ["packed", "padded"])
@pytest.mark.parametrize("task", HEADS)
@pytest.mark.parametrize("name", ["tiny-bert", "tiny-roberta"])
def test_task_heads_fuse_fully_and_match_the_plain_export(name, task, io):
    reference = exported(name, task)
    assert [o.name for o in reference.graph.output] == list(tasks.OUTPUTS[task])
    meta = {p.key: p.value for p in reference.metadata_props}
    assert meta["padfree.task"] == task
    rewritten, report = rewrite(reference, io=io)
    assert not report.unmatched
    shapes = {o.name: dims(o) for o in rewritten.graph.output}
    if io == "packed":
        assert shapes == PACKED_SHAPES[task]
    else:  # the padded form keeps the plain export's shapes
        assert shapes == {o.name: dims(o) for o in reference.graph.output}
    ok, results, data = compare(rewritten, reference, batch=5, max_seqlen=24, seed=3)
    assert ok, results
    assert {r.name for r in results} == set(tasks.OUTPUTS[task])
    if io == "padded" and task != tasks.TEXT_CLASSIFICATION:  # token outputs: zeros in padded rows
        assert all(r.padding_max == 0.0 for r in results)


# ELECTRA (embeddings projected to the hidden size) and ALBERT (shared layers): their own heads
FAMILY_HEADS = {"ElectraConfig": ("Electra", dict(embedding_size=64)),
                "AlbertConfig": ("Albert", dict(embedding_size=64, num_hidden_groups=2, inner_group_num=2))}


@pytest.mark.parametrize("task", HEADS)
@pytest.mark.parametrize("config_cls", list(FAMILY_HEADS))
def test_electra_and_albert_heads_fuse_fully_and_match(config_cls, task):
    prefix, extra = FAMILY_HEADS[config_cls]
    fields = dict(vocab_size=512, max_position_embeddings=128, hidden_size=128, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=256, num_labels=2 if task == tasks.QUESTION_ANSWERING else 3,
                  **extra)
    model = models.build(config_cls, prefix + tasks.HEAD_SUFFIX[task], **fields)
    assert tasks.of_model(model) == task
    reference = export_onnx(model, prefix)
    rewritten, report = rewrite(reference)
    assert not report.unmatched
    assert {o.name: dims(o) for o in rewritten.graph.output} == PACKED_SHAPES[task]
    ok, results, _ = compare(rewritten, reference, batch=5, max_seqlen=24, seed=3)
    assert ok, results


def test_task_of_architectures():
    assert tasks.from_architectures(["BertForSequenceClassification"]) == tasks.TEXT_CLASSIFICATION
    assert tasks.from_architectures(["RobertaForTokenClassification"]) == tasks.TOKEN_CLASSIFICATION
    assert tasks.from_architectures(["BertForQuestionAnswering"]) == tasks.QUESTION_ANSWERING
    for plain in (["BertModel"], ["BertForMaskedLM"], [], None):
        assert tasks.from_architectures(plain) == tasks.FEATURE_EXTRACTION
    with pytest.raises(ExportError, match="several tasks"):
        tasks.from_architectures(["BertForSequenceClassification", "BertForQuestionAnswering"])
    with pytest.raises(ExportError, match="unknown task"):
        tasks.check("fill-mask")


def _saved(tmp_path, model_cls: str, name: str = "tiny-bert"):
    config_cls, _, fields = models.BUILTIN[name]
    model = models.build(config_cls, model_cls, **fields)
    model.save_pretrained(tmp_path)
    return model


def test_the_checkpoint_head_is_the_default_and_unused_weights_are_refused(tmp_path, caplog):
    import logging

    _saved(tmp_path, "BertForSequenceClassification")
    model, description = models.load(str(tmp_path))
    assert type(model).__name__ == "BertForSequenceClassification" and "text-classification" in description
    with pytest.raises(ExportError, match="is a text-classification checkpoint.*--allow-unused-weights"):
        models.load(str(tmp_path), task="feature-extraction")
    with caplog.at_level(logging.WARNING, logger="padfree.export"):
        model, _ = models.load(str(tmp_path), task="feature-extraction", allow_unused_weights=True)
    assert type(model).__name__ == "BertModel" and "--allow-unused-weights" in caplog.text
    with pytest.raises(ExportError, match="its head cannot be exported as token-classification"):
        models.load(str(tmp_path), task="token-classification")
    # a plain encoder checkpoint has no head for a task to read
    _saved(tmp_path / "plain", "BertModel")
    with pytest.raises(ExportError, match="no weights for the token-classification head"):
        models.load(str(tmp_path / "plain"), task="token-classification")


def test_unused_head_weights_of_a_plain_architecture_are_refused(tmp_path):
    """A checkpoint whose config names no head but holds one's weights (an edited config.json)."""
    _saved(tmp_path, "BertForSequenceClassification")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    with pytest.raises(ExportError, match=r"leaves unused \(classifier.bias, classifier.weight\)"):
        models.load(str(tmp_path))


def test_a_masked_lm_checkpoint_needs_allow_unused_weights(tmp_path):
    _saved(tmp_path, "RobertaForMaskedLM", "tiny-roberta")
    with pytest.raises(ExportError, match=r"lm_head\..*--allow-unused-weights"):
        models.load(str(tmp_path))
    model, _ = models.load(str(tmp_path), allow_unused_weights=True)
    assert type(model).__name__ == "RobertaModel" and model.pooler is None


def test_model_objects_keep_their_head(tmp_path):
    from padfree.export.pipeline import _model_object

    config_cls, _, fields = models.BUILTIN["tiny-bert"]
    model = models.build(config_cls, "BertForTokenClassification", **fields)
    assert _model_object(model, None, False) is model
    with pytest.raises(ExportError, match="token-classification model"):
        _model_object(model, "feature-extraction", False)
    assert _model_object(model, "feature-extraction", True) is model.bert


def test_cli_exports_a_classifier_directory_with_its_head(tmp_path, capsys):
    from padfree.cli import main

    _saved(tmp_path / "hf", "RobertaForSequenceClassification", "tiny-roberta")
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "hf"), "-o", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["task"] == "text-classification" and report["complete"]
    assert [o.name for o in onnx.load(out / "model.padfree.onnx").graph.output] == ["logits"]
    assert main(["check", str(out / "model.padfree.onnx"), "--reference", str(out / "model.onnx"),
                 "--batch", "3", "--max-seqlen", "16"]) == 0
    assert "logits" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "hf"), "-o", str(out), "--task", "feature-extraction"]) == 2
    assert "--allow-unused-weights" in capsys.readouterr().err


@pytest.mark.parametrize("model_cls, per_sequence", [("BertForSequenceClassification", True),
                                                     ("BertForTokenClassification", False)])
def test_runtime_serves_a_task_export_folder_per_sequence_or_per_token(tmp_path, model_cls, per_sequence):
    """Both tasks' output is `logits`: the folder backend reads per sequence / per token from the graph's
    output shapes, and the Runtime shapes them so, against the HF model the export was made from."""
    import numpy as np
    import torch
    import transformers

    from padfree.export.pipeline import export
    from padfree.runtime import Runtime

    _saved(tmp_path / "hf", model_cls)
    export(str(tmp_path / "hf"), tmp_path / "out")
    runtime = Runtime(tmp_path / "out")
    assert runtime.per_sequence_outputs == ({"logits"} if per_sequence else set())
    model = getattr(transformers, model_cls).from_pretrained(tmp_path / "hf").eval()
    rng = np.random.default_rng(0)
    sequences = [rng.integers(5, 90, n).tolist() for n in (7, 1, 12)]
    got = runtime.run(sequences)["logits"]
    for i, seq in enumerate(sequences):
        with torch.no_grad():
            want = model(input_ids=torch.tensor([seq])).logits[0]
        row = got[i]
        assert row.shape == want.shape and torch.allclose(row.float(), want, atol=1e-4)
