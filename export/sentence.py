"""Sentence embeddings: a sentence-transformers directory -> task sentence-similarity.

Read without the sentence-transformers package: modules.json lists the modules in order; padfree
exports a Transformer (the HF encoder, at the module's path), a Pooling (`1_Pooling/config.json`:
CLS, mean or max over each sequence's tokens) and an optional Normalize (L2). Any other module
(Dense, ...) is refused by name. The encoder's own pooler (BERT's dense + tanh on the first token)
is not part of such a model and is not exported.

The plain export (model.onnx) pools in torch as sentence-transformers does, on the padded batch.
The rewrite (export/passes/sentence.py) pools on packed rows instead, segment by cu_seqlens.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ExportError

MODULES = "modules.json"
POOLING_MODES = ("cls", "mean", "max")
_TRANSFORMER, _POOLING, _NORMALIZE = "Transformer", "Pooling", "Normalize"
# sentence-transformers < 5 wrote one flag per mode
_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max",
          "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens":
          "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


@dataclass
class SentenceConfig:
    encoder_path: Path
    pooling: str        # one of POOLING_MODES
    normalize: bool


def is_sentence_dir(path) -> bool:
    return isinstance(path, (str, Path)) and (Path(path) / MODULES).is_file()


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot read {path}: {e}") from e


def read(path) -> SentenceConfig:
    """The modules of a sentence-transformers directory; ExportError for what padfree cannot export."""
    path = Path(path)
    modules = _read_json(path / MODULES)
    if not isinstance(modules, list) or not modules:
        raise ExportError(f"{path / MODULES}: expected a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unknown = [k for k in kinds if k not in (_TRANSFORMER, _POOLING, _NORMALIZE)]
    order = kinds[:2] == [_TRANSFORMER, _POOLING] and kinds[2:] in ([], [_NORMALIZE])
    if unknown or not order:
        raise ExportError(f"{path}: modules {kinds}; padfree exports Transformer, Pooling and an optional"
                          " Normalize, in that order" + (f" (not {', '.join(unknown)})" if unknown else ""))
    pooling = _read_json(path / modules[1].get("path", "1_Pooling") / "config.json")
    mode = pooling.get("pooling_mode")
    modes = [mode] if isinstance(mode, str) else list(mode) if mode else \
        [name for flag, name in _FLAGS.items() if pooling.get(flag)]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise ExportError(f"{path}: pooling {modes or 'none'}; padfree exports one of {', '.join(POOLING_MODES)}")
    if pooling.get("include_prompt") is False:
        raise ExportError(f"{path}: pooling with include_prompt false (prompt tokens left out) is not exported")
    return SentenceConfig(path / modules[0].get("path", ""), modes[0], len(kinds) == 3)


def sentence_model(encoder, config: SentenceConfig):
    """A torch module: encoder + pooling (+ L2 normalization), as sentence-transformers computes them."""
    import torch
    import torch.nn.functional as F

    class SentenceModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder
            self.config = encoder.config
            self.pooling, self.normalize = config.pooling, config.normalize

        def forward(self, input_ids, attention_mask, token_type_ids=None, return_dict=True):
            kw = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kw).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            elif self.pooling == "mean":
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            else:  # max over valid tokens (sentence-transformers fills padding with a large negative value)
                pooled = hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).max(1).values
            if self.normalize:
                pooled = F.normalize(pooled, p=2, dim=1)
            return {"sentence_embedding": pooled}

    SentenceModel.__name__ = "SentenceModel"
    return SentenceModel().eval()


def of_model(model) -> SentenceConfig | None:
    """The pooling of a SentenceModel made by sentence_model (None for any other model)."""
    if type(model).__name__ != "SentenceModel" or not hasattr(model, "pooling"):
        return None
    return SentenceConfig(Path(), model.pooling, model.normalize)
