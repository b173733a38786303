"""padfree.torch: Hugging Face encoders (BERT, RoBERTa, XLM-R, ELECTRA, ALBERT, DistilBERT and models of
their architecture) run padding-free on padfree's kernels, with the GEMMs through torch (cuBLASLt) and
the whole forward replayed from CUDA graphs per size bucket.

    encoder = padfree.torch.from_hf(model, dtype=torch.float16, device="cuda")
    out = encoder(input_ids, attention_mask)          # as HF: out.last_hidden_state, out.pooler_output
    out = encoder([[101, 7592, 102], [101, 102]])     # a list of token sequences
    out = encoder.forward_packed(ids, cu_seqlens, max_seqlen)   # packed, for padfree.runtime

Task models (...ForSequenceClassification, ...ForTokenClassification, ...ForQuestionAnswering) run
their head in the same forward, with HF's output names:

    clf = padfree.torch.from_hf(BertForSequenceClassification..., dtype=torch.float16)
    logits = clf(input_ids, attention_mask).logits    # [B, num_labels]; per-token heads: [B, S, ...]

Sentence embeddings (a SentenceTransformer, padfree.export's load of a sentence-transformers
directory, or any encoder with pooling=...): the one output is sentence_embedding [B, H].

    st = padfree.torch.from_hf(SentenceTransformer(path), dtype=torch.float16)
    emb = st(input_ids, attention_mask).sentence_embedding

An encoder-decoder (Marian, M2M100/NLLB, BART, mBART) goes to padfree.generation instead:

    generator = padfree.torch.from_hf(seq2seq_model, dtype=torch.float16)
    sequences = generator.generate(input_ids, attention_mask, num_beams=4, max_new_tokens=64)
"""
from __future__ import annotations

import os

import torch

from ..ops._tensors import InputError
from . import sentence
from .buckets import Bucket
from .encoder import PadfreeEncoder
from .weights import EncoderWeights, UnsupportedModelError, check_kernel_sizes, extract

__all__ = ["from_hf", "PadfreeEncoder", "EncoderWeights", "Bucket", "InputError", "UnsupportedModelError"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def from_hf(model: torch.nn.Module, dtype: torch.dtype = torch.float16, device: str | torch.device | None = None,
            *, use_graphs: bool = True, max_graphs: int = 8, gemm_search: str = "heuristic",
            gemm_tuning: str | os.PathLike | None = None, programmatic_edges: bool = False,
            pooling: str | None = None, normalize: bool | None = None, allow_unused_weights: bool = False,
            capture_after: int = 0):
    """A PadfreeEncoder with a copy of `model`'s weights in `dtype` on `device` (a CUDA device; None:
    the current one), or for an encoder-decoder model (config.is_encoder_decoder) a
    padfree.generation.Seq2SeqGenerator on `device` (None: CUDA where available, else the CPU, which
    runs the torch reference of the decoder kernels); the encoder options below apply to encoders only,
    but for gemm_search, which also chooses how the decode step's output projection is tuned.

    model: BertModel, RobertaModel, XLMRobertaModel, ElectraModel, AlbertModel, DistilBertModel or
      one of the same architecture, their ...ForSequenceClassification, ...ForTokenClassification or
      ...ForQuestionAnswering models (the head runs on the packed rows in the same forward: outputs
      logits, or start_logits / end_logits, as HF names them; padfree.torch.heads), or a
      sentence model: sentence_transformers.SentenceTransformer (Transformer, Pooling, optional
      Normalize) or padfree.export's SentenceModel. pooling ("cls", "mean" or "max") and normalize
      make any encoder a sentence model; a sentence model's own must not be contradicted (None: the
      model's). A sentence model's one output is sentence_embedding [B, H] (padfree.torch.sentence).
      use_graphs=False runs eagerly (for debugging); max_graphs bounds the
      captured graphs kept (least recently used evicted). A new bucket's first call captures its
      graph and times cuBLASLt's candidates for its GEMMs against torch's calls (once per row count
      and process; H100, BERT-base: 0.2-0.4 s for small buckets, 1.2 s at 21504 rows).
      gemm_search="exhaustive" makes that screen every cuBLASLt configuration (seconds per row
      count; faster GEMMs on large buckets) instead of the heuristic's short list; gemm_tuning
      names a JSON file that keeps those choices across processes (read where it exists, rewritten
      after each capture; valid for the same GPU and cuBLASLt only); gemm_search="none" keeps torch's
      calls untimed, so that a capture costs only its warm-up and recording (serving).
      capture_after=N runs a bucket's first N calls eagerly at their exact size (~2 ms for a 12-layer
      BERT, no stall) and captures its graph on call N + 1: serving traffic brings one-off buckets,
      which then never stall a request (padfree.triton's model uses 1).
      programmatic_edges=True (experimental, off by default) lets each captured forward's GEMMs
      launch while the padfree kernel before them drains, where a capture-time check finds that the
      GEMM waits for it (padfree.torch.edges says why it is not on by default).
      allow_unused_weights: run the encoder alone where the model's head would go unused (a head
      padfree cannot run, as BertForMaskedLM's, or a task head under pooling=); refused otherwise.
    Raises UnsupportedModelError for an architecture, head or configuration it cannot run, or sizes the
    kernels are not built for (padfree.kernel_sizes: head_dim, hidden).
    """
    model, pooling, normalize = sentence.of_model(model, pooling, normalize)
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        from ..generation import Seq2SeqGenerator  # imported here: encoder users never load it
        # use_graphs and max_graphs mean the same there: CUDA-graph decode steps, states kept per bucket;
        # gemm_search tunes the decode step's output projection (Seq2SeqGenerator)
        encoder_only = {"gemm_tuning": (gemm_tuning, None),
                        "programmatic_edges": (programmatic_edges, False), "pooling": (pooling, None),
                        "capture_after": (capture_after, 0)}
        for name, (value, default) in encoder_only.items():
            if value != default:
                raise UnsupportedModelError(f"from_hf: {name}={value!r} applies to encoders; padfree.generation "
                                            f"({type(model).__name__}) does not implement it")
        return Seq2SeqGenerator(model, dtype=dtype, device=device, use_graphs=use_graphs,
                                max_graphs=max_graphs, gemm_search=gemm_search)
    if dtype not in _DTYPES:
        raise InputError(f"dtype: expected one of {', '.join(map(str, _DTYPES))}, got {dtype}")
    device = torch.device("cuda" if device is None else device)
    if device.type != "cuda":
        raise InputError(f"device: padfree's kernels run on CUDA devices, got {device}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    weights = extract(model, dtype, device, allow_unused_weights)
    if pooling is not None and weights.head is not None and not allow_unused_weights:
        raise UnsupportedModelError(f"pooling={pooling!r} makes a sentence model of {type(model).__name__}, whose"
                                    f" {weights.head.task} head would go unused (pass allow_unused_weights=True or"
                                    " the model's base_model)")
    if pooling is not None:  # a sentence model never runs the encoder's pooler or a head: their weights go
        weights.pooler_weight = weights.pooler_bias = weights.head = None
    check_kernel_sizes(weights)
    base = getattr(model, "base_model", model)
    return PadfreeEncoder(weights, base.config, use_graphs=use_graphs, max_graphs=max_graphs,
                          gemm_search=gemm_search, gemm_tuning=gemm_tuning, programmatic_edges=programmatic_edges,
                          pooling=pooling, normalize=normalize, capture_after=capture_after)
