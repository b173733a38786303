"""The PyTorch path's encoder-decoder as a Runtime backend: padfree.generation's Seq2SeqGenerator with the
limits a Runtime reads, so that Runtime(padfree.torch.from_hf(seq2seq_model)).generate(...) and
Runtime("export_folder/").generate(...) (backends/onnxrt_seq2seq.py) take the same call."""
from __future__ import annotations

from ...ops._tensors import INT32_MAX
from .base import Limits

__all__ = ["TorchSeq2SeqBackend"]


class TorchSeq2SeqBackend:
    output_names = ["sequences"]

    def __init__(self, generator):
        self.generator = generator
        self.device = generator.device
        w = generator.weights
        self.limits = Limits(max_tokens=INT32_MAX, max_batch=INT32_MAX,
                             max_seqlen=w.encoder.max_positions or INT32_MAX, vocab_size=w.source_vocab_size,
                             dtype=generator.dtype)

    def __repr__(self) -> str:
        return f"TorchSeq2SeqBackend({self.generator!r})"

    def generate(self, input_ids, attention_mask=None, **options):
        return self.generator.generate(input_ids, attention_mask, **options)
