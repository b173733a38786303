"""A Hugging Face encoder -> model.onnx: torch's dynamo exporter, dynamic batch and sequence axes.

Pinned rather than defaulted: dynamo=True (torch.export + onnxscript), its graph optimizer on,
float32, an explicit opset, and outputs named as HF names them for the task (export.tasks):
last_hidden_state (+ pooler_output) for feature-extraction, the head's logits otherwise.
"""
from __future__ import annotations

import inspect
import logging
import warnings

import onnx

from .errors import ExportError

log = logging.getLogger(__name__)
DEFAULT_OPSET = 18
MIN_OPSET = 17  # LayerNormalization; the rewrite refuses older models too
# Example batch: 2 x 8 with a padded row; sizes > 1 so torch.export keeps both axes symbolic.
_EXAMPLE_LENGTHS = (8, 5)


def has_token_types(model) -> bool:
    from .tasks import SENTENCE_SIMILARITY, encoder, of_model

    if of_model(model) == SENTENCE_SIMILARITY:
        model = encoder(model)
    return "token_type_ids" in inspect.signature(model.forward).parameters and \
        getattr(model.config, "type_vocab_size", 0) > 0


def metadata(model, source: str, task: str | None = None) -> dict[str, str]:
    """Facts about the model that `padfree check` uses to draw realistic inputs, and its task."""
    c = model.config
    facts = {"padfree.source": source, "padfree.model_type": c.model_type, "padfree.task": task,
             "padfree.vocab_size": c.vocab_size, "padfree.pad_token_id": c.pad_token_id,
             "padfree.max_position_embeddings": c.max_position_embeddings,
             "padfree.type_vocab_size": getattr(c, "type_vocab_size", 0) if has_token_types(model) else 0}
    from .sentence import of_model as sentence_of

    pooling = sentence_of(model)
    if pooling is not None:  # read by the rewrite's sentence pass
        facts.update({"padfree.pooling": pooling.pooling, "padfree.normalize": int(pooling.normalize)})
    return {k: str(v) for k, v in facts.items() if v is not None}


def export_onnx(model, source: str = "", opset: int = DEFAULT_OPSET, task: str | None = None) -> onnx.ModelProto:
    """Export an HF encoder (BertModel, RobertaModel, DistilBertModel, or alike), with the head of
    `task` where the model has one (None: the model's own, export.tasks.of_model), in float32."""
    import torch

    from . import tasks

    if opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old: padfree needs LayerNormalization (opset >= {MIN_OPSET})")
    if opset > onnx.defs.onnx_opset_version():
        raise ExportError(f"opset {opset} is newer than this onnx ({onnx.__version__}) knows"
                          f" ({onnx.defs.onnx_opset_version()}); choose one in"
                          f" [{MIN_OPSET}, {onnx.defs.onnx_opset_version()}]")
    model = model.float().eval()
    task = tasks.of_model(model) if task is None else task
    types = has_token_types(model)
    outputs = tasks.output_names(model, task)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kw = {"token_type_ids": token_type_ids} if types else {}
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **kw)
            return tuple(out[name] for name in outputs)

    lengths = torch.tensor(_EXAMPLE_LENGTHS)
    batch, seqlen = len(_EXAMPLE_LENGTHS), int(lengths.max())
    # int32 inputs, as the rewritten model takes them (the kernels' and TensorRT's plugins' index
    # type): both files have one interface, and TensorRT needs no int64 bindings for either.
    mask = (torch.arange(seqlen)[None, :] < lengths[:, None]).int()
    ids = torch.randint(3, model.config.vocab_size, (batch, seqlen), dtype=torch.int32) * mask
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if types:
        kwargs["token_type_ids"] = torch.zeros_like(ids)
    batch_dim, seq_dim = torch.export.Dim("batch"), torch.export.Dim("seqlen")
    dims = {name: {0: batch_dim, 1: seq_dim} for name in kwargs}
    log.info("exporting %s with torch %s (dynamo exporter, opset %d)", source or type(model).__name__,
             torch.__version__, opset)
    try:
        with warnings.catch_warnings():
            # torch warns about axis renaming and its own deprecations on every export
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.onnx.export(Encoder().eval(), (), kwargs=kwargs, dynamo=True, dynamic_shapes=dims,
                                        input_names=list(kwargs), output_names=outputs, opset_version=opset,
                                        optimize=True, external_data=False, verbose=False)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds; one clear message
        raise ExportError(f"torch.onnx.export failed for {source or type(model).__name__}: {e}") from e
    proto = program.model_proto
    onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props},
                                        **metadata(model, source, task)})
    return proto
