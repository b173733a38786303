"""Tasks of an encoder export, with optimum's names, and the head each one runs on packed rows.

A task fixes the transformers class that loads the checkpoint (so the head's weights are read, not
dropped) and the exported outputs, named as Hugging Face names them:

| task | loaded as | outputs |
|---|---|---|
| feature-extraction | AutoModel | last_hidden_state (+ pooler_output where the model has a pooler) |
| text-classification | AutoModelForSequenceClassification | logits [B, num_labels] |
| token-classification | AutoModelForTokenClassification | logits [T, num_labels] |
| question-answering | AutoModelForQuestionAnswering | start_logits [T], end_logits [T] |
| sentence-similarity | a sentence-transformers directory (export.sentence) | sentence_embedding [B, H] |

By default the task is read from config.json's `architectures` (BertForSequenceClassification ->
text-classification, ...); an architecture without one of these heads (BertModel, BertForMaskedLM,
BertForPreTraining) exports as feature-extraction; a sentence-transformers directory (modules.json)
as sentence-similarity.
"""
from __future__ import annotations

from .errors import ExportError

FEATURE_EXTRACTION = "feature-extraction"
TEXT_CLASSIFICATION = "text-classification"
TOKEN_CLASSIFICATION = "token-classification"
QUESTION_ANSWERING = "question-answering"
SENTENCE_SIMILARITY = "sentence-similarity"
TASKS = (FEATURE_EXTRACTION, TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, QUESTION_ANSWERING, SENTENCE_SIMILARITY)

AUTO_CLASS = {FEATURE_EXTRACTION: "AutoModel", TEXT_CLASSIFICATION: "AutoModelForSequenceClassification",
              TOKEN_CLASSIFICATION: "AutoModelForTokenClassification",
              QUESTION_ANSWERING: "AutoModelForQuestionAnswering"}
# the head's outputs, by their HF names (feature-extraction's depend on the pooler: see output_names)
OUTPUTS = {TEXT_CLASSIFICATION: ("logits",), TOKEN_CLASSIFICATION: ("logits",),
           QUESTION_ANSWERING: ("start_logits", "end_logits"), SENTENCE_SIMILARITY: ("sentence_embedding",)}
# task -> the suffix of its transformers class (BertForSequenceClassification, ...)
HEAD_SUFFIX = {TEXT_CLASSIFICATION: "ForSequenceClassification", TOKEN_CLASSIFICATION: "ForTokenClassification",
               QUESTION_ANSWERING: "ForQuestionAnswering"}
_SUFFIX = {suffix: task for task, suffix in HEAD_SUFFIX.items()}


def check(task: str | None) -> None:
    if task is not None and task not in TASKS:
        raise ExportError(f"unknown task {task!r}; padfree exports: {', '.join(TASKS)}")


def from_architectures(architectures) -> str:
    """The task of a config's `architectures` list (feature-extraction when none names a head)."""
    found = {task for arch in architectures or () for suffix, task in _SUFFIX.items() if arch.endswith(suffix)}
    if len(found) > 1:
        raise ExportError(f"config.json's architectures {list(architectures)} name several tasks"
                          f" ({', '.join(sorted(found))}): choose one with --task")
    return found.pop() if found else FEATURE_EXTRACTION


def of_model(model) -> str:
    """The task of an already loaded HF model object, by its class."""
    from .sentence import of_model as sentence_of

    if sentence_of(model) is not None:
        return SENTENCE_SIMILARITY
    name = type(model).__name__
    return next((task for suffix, task in _SUFFIX.items() if name.endswith(suffix)), FEATURE_EXTRACTION)


def encoder(model):
    """The encoder (BertModel, RobertaModel, ...) of a model with or without a task head."""
    from .sentence import of_model as sentence_of

    if sentence_of(model) is not None:
        return model.encoder
    base = getattr(model, "base_model", model)
    return base if base is not None else model


def output_names(model, task: str) -> list[str]:
    if task == FEATURE_EXTRACTION:
        return ["last_hidden_state"] + (["pooler_output"] if getattr(model, "pooler", None) is not None else [])
    return list(OUTPUTS[task])
