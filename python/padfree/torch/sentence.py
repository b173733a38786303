"""Sentence embeddings on the PyTorch path: a PadfreeEncoder under a sentence-transformers model's
pooling (CLS, mean or max over each sequence's packed rows) and optional L2 normalization, giving
the `sentence_embedding` output an export of the same directory gives (export/passes/sentence.py),
so that `Runtime(...).encode(texts)` serves it.

    model, _ = padfree.export.models.load("st_dir")      # encoder + Pooling (+ Normalize), modules.json
    rt = padfree.Runtime(padfree.torch.from_hf(model))    # a SentenceEncoder
    emb = rt.encode(texts)                                # float32 [len(texts), H]

Rules, each with its reason:
- **Pooled on the packed rows, never padded**: each row's sequence comes from cu_seqlens (a sorted
  search of the row index among the sequence ends), then CLS gathers the first rows, mean sums the
  rows into their sequence (index_add) and divides by the length, max takes the per-sequence maximum
  (scatter_reduce). The work is O(T * H) like the encoder's, and nothing waits for the host: the
  token and sequence counts are the inputs' shapes.
- **float32 accumulation and output**: a mean over up to max_seqlen fp16 rows summed in fp16 would
  lose the low bits the fp32 reference keeps; the embedding is float32 whatever the encoder's dtype
  (encode() returns float32 anyway).
- **The encoder's own pooler is not run** (BERT's dense + tanh): a sentence-transformers model never
  uses it (export.models drops it too).
These are torch ops after the encoder's graph replay (a handful of small launches); a fused pooling
kernel would take them into the graph.
"""
from __future__ import annotations

from typing import Any

import torch

POOLING_MODES = ("cls", "mean", "max")
OUTPUT = "sentence_embedding"


def pool_packed(hidden: torch.Tensor, cu_seqlens: torch.Tensor, mode: str, normalize: bool) -> torch.Tensor:
    """Per-sequence pooling of packed rows.

    hidden: [T, H] (any float dtype); cu_seqlens: int32 or int64 [B + 1] on hidden's device, every
    sequence non-empty. Returns float32 [B, H]: the first row (cls), the mean or the maximum of each
    sequence's rows, L2-normalized (x / max(||x||, 1e-12), as torch.nn.functional.normalize) if asked.
    """
    if mode not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {mode!r}")
    tokens, width = hidden.shape
    batch = cu_seqlens.shape[0] - 1
    if mode == "cls":
        pooled = hidden.index_select(0, cu_seqlens[:-1]).float()
    else:
        rows = torch.arange(tokens, device=hidden.device, dtype=cu_seqlens.dtype)
        segment = torch.searchsorted(cu_seqlens[1:], rows, right=True)     # int64 [T]: the sequence of each row
        values = hidden.float()
        if mode == "mean":
            pooled = torch.zeros(batch, width, device=hidden.device).index_add_(0, segment, values)
            pooled /= (cu_seqlens[1:] - cu_seqlens[:-1]).unsqueeze(1)
        else:
            pooled = torch.full((batch, width), float("-inf"), device=hidden.device)
            pooled.scatter_reduce_(0, segment.unsqueeze(1).expand(tokens, width), values, "amax")
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
    return pooled


def sentence_pooling(model: Any) -> tuple[str, bool] | None:
    """(pooling, normalize) of a sentence model as padfree.export.models.load returns it for a
    sentence-transformers directory (export.sentence.sentence_model); None for any other model."""
    if type(model).__name__ != "SentenceModel" or getattr(model, "pooling", None) not in POOLING_MODES:
        return None
    return model.pooling, bool(getattr(model, "normalize", False))


class SentenceEncoder:
    """An encoder's forward_packed followed by the sentence pooling: outputs {"sentence_embedding":
    float32 [B, H]}. Exposes what padfree.Runtime's EncoderBackend reads (limits, config, device,
    dtype, output_names, forward_packed); build it with padfree.torch.from_hf(sentence_model)."""

    def __init__(self, encoder: Any, pooling: str, normalize: bool):
        if pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {pooling!r}")
        self.encoder = encoder
        self.pooling, self.normalize = pooling, bool(normalize)
        self.config = encoder.config      # its _name_or_path leads the Runtime to the tokenizer
        self.limits = encoder.limits
        self.device, self.dtype = encoder.device, encoder.dtype
        self.output_names = [OUTPUT]

    @property
    def weights(self):
        return self.encoder.weights

    def forward_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: torch.Tensor | None = None, *, copy: bool = True) -> dict[str, torch.Tensor]:
        """As PadfreeEncoder.forward_packed, returning {"sentence_embedding": float32 [B, H]}, a tensor
        of its own (copy is accepted for the Runtime and changes nothing)."""
        # the pooling reads the encoder's static output before any later call can overwrite it (one stream)
        hidden = self.encoder.forward_packed(input_ids, cu_seqlens, max_seqlen, token_type_ids,
                                             copy=False)["last_hidden_state"]
        return {OUTPUT: pool_packed(hidden, cu_seqlens, self.pooling, self.normalize)}

    def __repr__(self) -> str:
        return f"SentenceEncoder({self.encoder!r}, {self.pooling} pooling{', normalized' if self.normalize else ''})"
