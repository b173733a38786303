"""`padfree export SOURCE -o OUT`: plain ONNX export + rewrite onto padfree plugin nodes."""
from __future__ import annotations

import argparse
import logging
import warnings

from padfree.arguments import positive_int
from padfree.export.models import BUILTIN
from padfree.export.tasks import TASKS

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="export an HF encoder to ONNX and rewrite it onto padfree plugin nodes",
        description="Writes OUT/model.onnx (plain export, dynamic batch and sequence axes), "
                    "OUT/model.padfree.onnx (rewritten) and OUT/report.json (what was fused). An encoder-decoder "
                    "(config.is_encoder_decoder: Marian, M2M100/NLLB, BART, mBART) writes OUT/encoder.onnx, "
                    "OUT/cross_kv.onnx, OUT/decoder_step.onnx, OUT/decoder_step.padfree.onnx (the step on plugin "
                    "nodes) and OUT/seq2seq.json instead (docs/EXPORT.md).")
    p.add_argument("source", help=f"a local Hugging Face model directory, or one of: {', '.join(BUILTIN)}")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--task", choices=TASKS, default=None,
                   help="the head to export, with its outputs named as HF names them (default: the task of"
                        " config.json's architectures, e.g. BertForSequenceClassification -> text-classification;"
                        " feature-extraction for a built-in or an architecture without such a head)")
    p.add_argument("--allow-unused-weights", action="store_true",
                   help="export even where the checkpoint holds weights the task leaves unused (a classifier"
                        " under feature-extraction, a masked-LM head): refused otherwise")
    p.add_argument("--io", choices=("packed", "padded"), default=None,
                   help="packed: input_ids[T], cu_seqlens[B+1], max_seqlen[S] (default for encoders); "
                        "padded: input_ids[B,S] + attention_mask[B,S] with padding plugins at the edges "
                        "(an encoder-decoder: encoder.onnx is padded; packed adds encoder.padfree.onnx, its "
                        "encoder on plugin nodes over packed tokens, where the whole encoder fuses)")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="float dtype of model.padfree.onnx, and so of a TensorRT-RTX engine built from it "
                        "(default fp32; model.onnx, the check's reference, is always fp32); an "
                        "encoder-decoder's engine graphs: encoder.<dtype>.onnx, cross_kv.<dtype>.onnx, "
                        "decoder_step.padfree.onnx (its float32 graphs are written too)")
    p.add_argument("--opset", type=positive_int, default=None, help="ONNX opset (>= 17; default 18)")
    p.add_argument("--allow-partial", action="store_true",
                   help="keep what did not fuse on padded rows instead of refusing the model")
    p.add_argument("--attn-implementation", choices=("sdpa", "eager"), default=None,
                   help="HF attention implementation to export (default: the model's)")
    p.add_argument("--num-beams", type=positive_int, default=None,
                   help="encoder-decoder: the beam width decoder_step.padfree.onnx (and an engine built from it) "
                        "serves, rows = batch x num_beams (default: the model's generation_config.num_beams)")
    p.add_argument("--generation-graph", type=positive_int, default=None, metavar="N",
                   help="encoder-decoder with --io packed: also write generation.padfree.onnx, a whole greedy "
                        "generation of N new tokens in one graph (the whole-generation engine's form)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """ExportError and unwritable outputs end the command in padfree.cli (exit status 2)."""
    from padfree.export.pipeline import export

    _quiet_exporter(args.verbose)
    result = export(args.source, args.output, io=args.io, opset=args.opset, allow_partial=args.allow_partial,
                    attn_implementation=args.attn_implementation, dtype=args.dtype, num_beams=args.num_beams,
                    task=args.task, allow_unused_weights=args.allow_unused_weights,
                    generation_tokens=args.generation_graph)
    if hasattr(result, "manifest"):     # an encoder-decoder
        print(result.format())
        print("wrote " + ", ".join(str(f) for f in result.files))
        return 0
    print(result.report.format())
    print(f"wrote {result.model_path}, {result.padfree_path}, {result.report_path}")
    return 0


def _quiet_exporter(verbose: bool) -> None:
    """torch's exporter logs every optimizer step; keep padfree's progress readable."""
    if verbose:
        logging.getLogger("padfree").setLevel(logging.DEBUG)
        return
    import torch  # noqa: F401 - torch sets its loggers' levels on import; override them after
    for name in ("onnx_ir", "onnxscript", "torch.onnx", "torch._export", "torch.export",
                 "torch.onnx._internal.exporter._registration"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"torch\..*")
    warnings.filterwarnings("ignore", category=FutureWarning)
