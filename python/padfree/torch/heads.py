"""Task heads on the PyTorch path: which head a HF task model carries, read into a short chain of
dense layers that the encoder runs on its packed rows (tasks and output names as padfree.export's).

| model class suffix | task | rows the head reads | outputs |
|---|---|---|---|
| ForSequenceClassification | text-classification | each sequence's first row | logits [B, num_labels] |
| ForTokenClassification | token-classification | every row | logits [T, num_labels] |
| ForQuestionAnswering | question-answering | every row | start_logits [T], end_logits [T] |

Heads are recognised by module structure, as the encoders are (weights.py):
- BERT, ALBERT: the encoder's pooler (dense + tanh), then `classifier`
- RoBERTa, XLM-R (and alike): `classifier.dense` + tanh + `classifier.out_proj`
- ELECTRA: `classifier.dense` + its `activation` (GELU) + `classifier.out_proj`
- DistilBERT: `pre_classifier` + ReLU + `classifier`
- token classification: `classifier`; question answering: `qa_outputs` (2 outputs: start, end)
Dropout is the identity at inference. Any other head is refused by name; so is a model whose head
padfree cannot run (BertForMaskedLM, ...), whose weights would go unused, unless the caller allows
that (allow_unused_weights: the encoder alone runs), as padfree export refuses a checkpoint's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .weights import UnsupportedModelError

TEXT_CLASSIFICATION = "text-classification"
TOKEN_CLASSIFICATION = "token-classification"
QUESTION_ANSWERING = "question-answering"
SUFFIXES = {"ForSequenceClassification": TEXT_CLASSIFICATION, "ForTokenClassification": TOKEN_CLASSIFICATION,
            "ForQuestionAnswering": QUESTION_ANSWERING}
OUTPUTS = {TEXT_CLASSIFICATION: ("logits",), TOKEN_CLASSIFICATION: ("logits",),
           QUESTION_ANSWERING: ("start_logits", "end_logits")}
# activations a head's hidden dense may apply, by the class HF builds them with (the RoBERTa head's
# tanh is a call in its forward, not a module: see _classification_head)
_ACTIVATIONS = {"Tanh": "tanh", "ReLU": "relu", "GELUActivation": "gelu", "GELU": "gelu"}


@dataclass
class Dense:
    weight: torch.Tensor        # [out, in], as HF stores it
    bias: torch.Tensor          # [out]
    activation: str | None      # "tanh", "relu", "gelu" (erf) or None


@dataclass
class HeadWeights:
    task: str
    layers: list[Dense] = field(default_factory=list)  # applied in order; the last one gives the outputs

    @property
    def per_sequence(self) -> bool:
        """Whether the head reads each sequence's first row (one output row per sequence)."""
        return self.task == TEXT_CLASSIFICATION

    @property
    def output_names(self) -> list[str]:
        return list(OUTPUTS[self.task])

    @property
    def width(self) -> int:
        """Columns of the last dense layer's output (num_labels; 2 for question answering)."""
        return self.layers[-1].weight.shape[0]


def task_of(model) -> str | None:
    name = type(model).__name__
    return next((task for suffix, task in SUFFIXES.items() if name.endswith(suffix)), None)


def _linear(module, take, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(module, torch.nn.Linear) or module.bias is None:
        raise UnsupportedModelError(f"{where}: expected a Linear layer with a bias, got {type(module).__name__}")
    return take(module.weight), take(module.bias)


def _dense(module, take, where: str, activation: str | None) -> Dense:
    return Dense(*_linear(module, take, where), activation)


def _activation(module, where: str) -> str:
    name = type(module).__name__
    if name not in _ACTIVATIONS or getattr(module, "approximate", "none") != "none":
        raise UnsupportedModelError(f"{where}: activation {name} is not supported; a head runs"
                                    f" {', '.join(sorted(_ACTIVATIONS))} (erf GELU)")
    return _ACTIVATIONS[name]


def _classification_head(model, base, take) -> list[Dense]:
    cls = type(model).__name__
    classifier = getattr(model, "classifier", None)
    if isinstance(classifier, torch.nn.Linear):
        if hasattr(model, "pre_classifier"):  # DistilBERT: pre_classifier, ReLU (a call in its forward)
            return [_dense(model.pre_classifier, take, f"{cls}.pre_classifier", "relu"),
                    _dense(classifier, take, f"{cls}.classifier", None)]
        pooler = getattr(base, "pooler", None)  # BERT, ALBERT: the pooler's dense + tanh, then classifier
        if pooler is None:
            raise UnsupportedModelError(f"{cls}: a classifier over the pooled output, but the model has no pooler")
        dense = pooler.dense if hasattr(pooler, "dense") else pooler
        act = getattr(pooler, "activation", None) or getattr(base, "pooler_activation", None)
        return [_dense(dense, take, f"{cls} pooler", _activation(act, f"{cls} pooler")),
                _dense(classifier, take, f"{cls}.classifier", None)]
    if classifier is not None and hasattr(classifier, "dense") and hasattr(classifier, "out_proj"):
        extra = {n for n, m in classifier.named_children()} - {"dense", "out_proj", "dropout", "activation"}
        if extra:
            raise UnsupportedModelError(f"{cls}: classification head {type(classifier).__name__} with modules"
                                        f" {sorted(extra)} is not supported")
        # RoBERTa's head applies torch.tanh in its forward; ELECTRA's holds its activation module
        act = getattr(classifier, "activation", None)
        activation = "tanh" if act is None else _activation(act, f"{cls}.classifier.activation")
        return [_dense(classifier.dense, take, f"{cls}.classifier.dense", activation),
                _dense(classifier.out_proj, take, f"{cls}.classifier.out_proj", None)]
    raise UnsupportedModelError(f"{cls}: classification head {type(classifier).__name__} is not supported; padfree"
                                " runs BERT/ALBERT (pooler + classifier), RoBERTa/ELECTRA (dense + out_proj)"
                                " and DistilBERT (pre_classifier + classifier) heads")


def _has_weights_outside(model, base) -> bool:
    """Whether `model` holds parameters that are not its base model's (a head)."""
    own = {id(p) for p in base.parameters()}
    return any(id(p) not in own for p in model.parameters())


def extract_head(model, base, take: Callable[[torch.Tensor], torch.Tensor],
                 allow_unused_weights: bool = False) -> HeadWeights | None:
    """The head of a HF task model (None for a base model, or with allow_unused_weights for a head
    padfree cannot run). Raises UnsupportedModelError naming a head or weights it cannot run."""
    if model is base:
        return None
    task = task_of(model)
    cls = type(model).__name__
    if task is None:
        if _has_weights_outside(model, base) and not allow_unused_weights:
            raise UnsupportedModelError(
                f"{cls}: padfree.torch runs the heads of ForSequenceClassification, ForTokenClassification and"
                " ForQuestionAnswering models; this one's head weights would be left unused (pass"
                " allow_unused_weights=True, or the model's base_model, to run its encoder alone)")
        return None
    if task == TEXT_CLASSIFICATION:
        layers = _classification_head(model, base, take)
    elif task == TOKEN_CLASSIFICATION:
        layers = [_dense(getattr(model, "classifier", None), take, f"{cls}.classifier", None)]
    else:
        layers = [_dense(getattr(model, "qa_outputs", None), take, f"{cls}.qa_outputs", None)]
        if layers[0].weight.shape[0] != 2:
            raise UnsupportedModelError(f"{cls}.qa_outputs has {layers[0].weight.shape[0]} outputs; question"
                                        " answering needs 2 (start, end)")
    head = HeadWeights(task, layers)
    hidden = base.config.hidden_size if hasattr(base.config, "hidden_size") else base.config.dim
    if head.layers[0].weight.shape[1] != hidden:
        raise UnsupportedModelError(f"{cls}: the head reads {head.layers[0].weight.shape[1]} features, the encoder"
                                    f" gives {hidden}")
    return head


def activate(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    """x after a head's activation (HF's: tanh, ReLU, erf GELU)."""
    if activation == "tanh":
        return torch.tanh(x)
    if activation == "relu":
        return torch.relu(x)
    if activation == "gelu":
        return torch.nn.functional.gelu(x)
    return x
