"""encoder.onnx: the HF encoder through torch's dynamo exporter (the encoder export's settings,
export/exporter.py), padded I/O for now.

inputs  input_ids int32 [batch, seqlen], attention_mask int32 [batch, seqlen] (right padding)
output  last_hidden_state float [batch, seqlen, hidden] (padded rows hold values nobody reads)

Traced from HF's own encoder rather than written from padfree's weights: the encoder has no cache,
so the trace exports as is, and the proof then compares padfree's decoder graphs against an
encoder computed the way HF computes it. Packed I/O (input_ids [T], cu_seqlens) comes with the
rewrite passes' seq2seq patterns; until then the generator packs the valid rows after the encoder.
"""
from __future__ import annotations

import logging
import warnings

import onnx

from ..errors import ExportError

__all__ = ["export_encoder"]

log = logging.getLogger(__name__)
_EXAMPLE_LENGTHS = (8, 5)


def export_encoder(model, opset: int) -> onnx.ModelProto:
    import torch

    encoder = model.get_encoder()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask):
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state

    lengths = torch.tensor(_EXAMPLE_LENGTHS)
    batch, seqlen = len(_EXAMPLE_LENGTHS), int(lengths.max())
    mask = (torch.arange(seqlen)[None, :] < lengths[:, None]).int()
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (batch, seqlen), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, model.config.pad_token_id))
    axes = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seqlen")}
    dims = {"input_ids": axes, "attention_mask": axes}
    log.info("exporting the encoder with torch %s (dynamo exporter, opset %d)", torch.__version__, opset)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.onnx.export(Encoder().eval(), (), kwargs={"input_ids": ids, "attention_mask": mask},
                                        dynamo=True, dynamic_shapes=dims, input_names=["input_ids", "attention_mask"],
                                        output_names=["last_hidden_state"], opset_version=opset, optimize=True,
                                        external_data=False, verbose=False)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds; one clear message
        raise ExportError(f"torch.onnx.export failed for the encoder of {type(model).__name__}: {e}") from e
    return program.model_proto
