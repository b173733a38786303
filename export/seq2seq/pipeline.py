"""export_seq2seq(model, out): the files of an encoder-decoder export.

    encoder.onnx        HF's encoder (encoder.py), padded I/O
    cross_kv.onnx       packed encoder rows -> each decoder layer's cross-attention K | V (cross_kv.py)
    decoder_step.onnx   one decoder step with the caches as I/O (decoder_step.py), decoder ops as sites
    decoder_step.padfree.onnx   the same step with each site swapped for its plugin node (swap.py),
                        num_beams fixed (--num-beams; default the model's generation_config.num_beams),
                        in the export's dtype
    encoder.<dtype>.onnx, cross_kv.<dtype>.onnx   with --dtype fp16 / bf16: encoder.onnx and cross_kv.onnx
                        cast to it (export/precision.py), the graphs engines are built from
    encoder.padfree.onnx   with --io packed: encoder.onnx rewritten onto padfree's plugin nodes on packed
                        tokens (export/rewrite.py: input_ids [T], cu_seqlens [B+1], max_seqlen [S] ->
                        last_hidden_state [T, H], what cross_kv.onnx takes), in the dtype; the export is
                        refused, naming what did not fuse, unless the whole encoder fuses
    config.json, generation_config.json   the HF configs: generate()'s option merge reads them
    tokenizer files     copied from the source directory where it has them (export/text_files.py)
    seq2seq.json        what was written, the I/O names and the limits; written last (completion marker)

encoder.onnx, cross_kv.onnx and decoder_step.onnx are float32 whatever the dtype: they are what `padfree
check` proves against Hugging Face, and the dtype's graphs are checked against them with their values
rounded to the dtype (check.py). seq2seq.json's `engine_graphs` names the three graphs an engine is
built from. The previous export's files in the folder (these, and an encoder export's)
are removed before anything is written, each file is written whole (padfree.outputs), and
seq2seq.json is written last: a folder without it holds an incomplete export.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from padfree import outputs

from .. import text_files
from ..errors import ExportError
from ..onnx_files import data_file, save_model
from ..precision import DTYPES, cast
from .models import check_supported

__all__ = ["export_seq2seq", "Seq2SeqExportResult", "ENCODER", "CROSS_KV", "STEP", "STEP_PLUGINS", "ENCODER_PLUGINS",
           "MANIFEST", "FORMAT", "output_set", "engine_graphs"]

log = logging.getLogger(__name__)
ENCODER, CROSS_KV, STEP, MANIFEST = "encoder.onnx", "cross_kv.onnx", "decoder_step.onnx", "seq2seq.json"
STEP_PLUGINS, ENCODER_PLUGINS = "decoder_step.padfree.onnx", "encoder.padfree.onnx"
GENERATION = "generation.padfree.onnx"  # generation.py's GENERATION
CONFIG, GENERATION_CONFIG = "config.json", "generation_config.json"
FORMAT = "padfree-seq2seq/1"


@dataclass
class Seq2SeqExportResult:
    out: Path
    files: list[Path]
    manifest: dict

    def format(self) -> str:
        d = self.manifest["decoder"]
        sites = self.manifest["sites"]
        return (f"{self.manifest['family']}: {self.manifest['encoder']['layers']}+{d['layers']} layers, hidden "
                f"{d['hidden']}, {d['num_heads']} heads, vocabulary {d['vocab_size']}; decoder step with "
                f"{sites.get('PadfreeDecoderSelfAttention', 0)} self-attention and "
                f"{sites.get('PadfreeDecoderCrossAttention', 0)} cross-attention sites (standard ONNX); "
                f"{self.manifest['files']['decoder_step_plugins']} with them as plugin nodes "
                f"(num_beams {self.manifest['decoder_plugins']['num_beams']})")


def engine_graphs(dtype: str, io: str = "padded") -> dict[str, str]:
    """The files engines are built from, per graph, for an export in `dtype` with the encoder's `io`."""
    graphs = {"encoder": ENCODER, "cross_kv": CROSS_KV, "decoder_step": STEP_PLUGINS}
    if dtype != "fp32":
        graphs.update(encoder=f"encoder.{dtype}.onnx", cross_kv=f"cross_kv.{dtype}.onnx")
    if io == "packed":
        graphs["encoder"] = ENCODER_PLUGINS
    return graphs


def output_set(out: Path) -> list[Path]:
    typed = [name for dtype in DTYPES if dtype != "fp32" for name in engine_graphs(dtype).values()]
    files = [out / name for name in dict.fromkeys([ENCODER, CROSS_KV, STEP, STEP_PLUGINS, ENCODER_PLUGINS, GENERATION,
                                                   *typed])]
    return [p for f in files for p in (f, data_file(f))] + [out / CONFIG, out / GENERATION_CONFIG, out / MANIFEST]


def _position_limits(model, weights) -> tuple[int, int]:
    """Longest source and longest decoder sequence (start token excluded) the exported tables serve."""
    limit = int(model.config.max_position_embeddings)
    decoder = weights.decoder.max_positions
    return limit, limit if decoder is None else min(limit, int(decoder))


def _in_dtype(model, dtype: str, what: str):
    """`model` cast to dtype, its shapes inferred again (through the plugin ports) and fully checked."""
    from .. import shapes, spec as spec_mod
    return shapes.infer_checked(cast(model, dtype), spec_mod.load(), shapes.output_dims(model), f"{what} in {dtype}")


def _packed_encoder(encoder_graph, dtype: str):
    """The encoder rewritten onto plugin nodes on packed tokens, or an ExportError naming what did not fuse."""
    from ..errors import PartialFusionError
    from ..rewrite import rewrite
    try:
        return rewrite(encoder_graph, io="packed", dtype=dtype)
    except PartialFusionError as e:
        unmatched = "\n  - ".join(e.report.unmatched)
        raise ExportError(f"--io packed: the encoder does not fuse whole onto padfree's plugins ({e.report.summary()});"
                          f" not matched:\n  - {unmatched}\nExport it with --io padded (the default).") from e


def export_seq2seq(model, description: str, out: Path, opset: int,
                   source_path: str | None = None, num_beams: int | None = None,
                   dtype: str = "fp32", io: str = "padded",
                   generation_tokens: int | None = None) -> Seq2SeqExportResult:
    """source_path: the HF directory the model was loaded from (recorded for `padfree check OUT`).
    num_beams: the beam width decoder_step.padfree.onnx's cross-attention nodes serve (default: the
    model's generation_config.num_beams). dtype: "fp32", "fp16" or "bf16", the engine graphs' (the
    float32 graphs are written in every case). io: "packed" also writes encoder.padfree.onnx (the
    engines' encoder then), "padded" not. generation_tokens: with io "packed", also write
    generation.padfree.onnx, a whole greedy generation of that many new tokens in one graph
    (generation.py)."""
    import torch

    from padfree.generation.layers import ensure_position_rows
    from padfree.generation.weights import extract

    from . import cross_kv, decoder_step, encoder
    from .ops import sites_of
    from .swap import step_io, swap_sites

    spec = check_supported(model)
    if generation_tokens is not None:  # refused before anything is written
        from .generation import search_options
        if io != "packed":
            raise ExportError("the generation graph starts from the packed encoder: add --io packed")
        beams = num_beams if num_beams is not None else int(getattr(model.generation_config, "num_beams", None) or 1)
        search_options(model.generation_config, model.config, model.config.vocab_size, generation_tokens, beams)
    if num_beams is None:
        num_beams = int(getattr(model.generation_config, "num_beams", None) or 1)
    model = model.float().eval()
    weights = extract(model, spec, torch.float32, torch.device("cpu"))
    encoder_limit, decoder_limit = _position_limits(model, weights)
    if generation_tokens is not None and generation_tokens > decoder_limit:
        raise ExportError(f"the generation graph's {generation_tokens} new tokens: the decoder's position table serves "
                          f"{decoder_limit}; choose at most that many")
    # M2M100's table grows on demand in HF; the step's table is grown once to every row it may read
    ensure_position_rows(weights.decoder, spec, weights.pad_token_id, weights.pad_token_id + 2 + decoder_limit)
    facts = {"padfree.source": description, "padfree.family": spec.name, "padfree.format": FORMAT}
    outputs.remove(output_set(out))
    t0 = time.perf_counter()
    engines = engine_graphs(dtype, io)
    encoder_graph = encoder.export_encoder(model, opset)
    packed, fused = (None, None) if io != "packed" else _packed_encoder(encoder_graph, dtype)  # refused first
    save_model(encoder_graph, out / ENCODER)
    log.info("wrote %s in %.1f s", out / ENCODER, time.perf_counter() - t0)
    if packed is not None:
        save_model(packed, out / ENCODER_PLUGINS)
        log.info("wrote %s (%s)", out / ENCODER_PLUGINS, fused.summary())
        packed_io = ([i.name for i in packed.graph.input], [o.name for o in packed.graph.output])
        del packed
    cross_graph = cross_kv.build_cross_kv(weights, opset, facts)
    save_model(cross_graph, out / CROSS_KV)
    if dtype != "fp32":
        if io != "packed":
            save_model(_in_dtype(encoder_graph, dtype, ENCODER), out / engines["encoder"])
        save_model(_in_dtype(cross_graph, dtype, CROSS_KV), out / engines["cross_kv"])
        log.info("wrote %s in %s", ", ".join(sorted({engines["encoder"], engines["cross_kv"]})), dtype)
    del encoder_graph, cross_graph
    step = decoder_step.build_decoder_step(weights, opset, facts)
    save_model(step, out / STEP)
    log.info("wrote %s and %s (%d nodes)", out / CROSS_KV, out / STEP, len(step.graph.node))
    swapped = swap_sites(step, num_beams)
    if dtype != "fp32":
        swapped = _in_dtype(swapped, dtype, STEP_PLUGINS)
    save_model(swapped, out / STEP_PLUGINS)
    plugin_inputs, plugin_outputs = step_io(swapped)
    log.info("wrote %s (%d nodes, num_beams %d, %s)", out / STEP_PLUGINS, len(swapped.graph.node), num_beams, dtype)
    outputs.write_text(out / CONFIG, model.config.to_json_string())
    outputs.write_text(out / GENERATION_CONFIG, model.generation_config.to_json_string())
    copied = text_files.copy(out, text_files.sources_of(source_path) if source_path else [], config=False)
    stack = weights.decoder
    inputs, step_outputs = decoder_step.io_names(len(stack.layers))
    counts: dict[str, int] = {}
    for site in sites_of(step):
        counts[site.op] = counts.get(site.op, 0) + 1
    manifest = {
        "format": FORMAT, "source": description, "source_path": source_path, "family": spec.name,
        "hf_class": spec.hf_class, "opset": opset, "dtype": dtype,
        "files": {"encoder": ENCODER, "cross_kv": CROSS_KV, "decoder_step": STEP,
                  "decoder_step_plugins": STEP_PLUGINS, "config": CONFIG, "generation_config": GENERATION_CONFIG,
                  **({"encoder_plugins": ENCODER_PLUGINS} if io == "packed" else {})},
        "encoder": {"io": "padded", "layers": len(weights.encoder.layers), "inputs": ["input_ids", "attention_mask"],
                    "outputs": ["last_hidden_state"], "max_positions": encoder_limit,
                    "vocab_size": weights.source_vocab_size},
        "decoder": {"layers": len(stack.layers), "num_heads": stack.num_heads, "head_dim": stack.head_dim,
                    "hidden": stack.hidden, "vocab_size": weights.target_vocab_size,
                    "max_positions": decoder_limit, "pad_token_id": weights.pad_token_id,
                    "inputs": inputs, "outputs": step_outputs},
        "engine_graphs": engines,
        **({"encoder_plugins": {"io": "packed", "inputs": packed_io[0], "outputs": packed_io[1],
                                "fused": dict(fused.fused),
                                # M2M100's positions count the source's non-padding tokens: its padding id
                                # inside a source moves HF's positions, never the plugin's (offset + t)
                                "position_pad_id": weights.pad_token_id if spec.positions == "fairseq" else None}}
           if io == "packed" else {}),
        "text_files": copied,
        "sites": counts,
        "decoder_plugins": {"num_beams": num_beams, "plugins": counts, "inputs": plugin_inputs,
                            "outputs": plugin_outputs},
    }
    outputs.write_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    written = [ENCODER, CROSS_KV, STEP, STEP_PLUGINS, *engines.values(), CONFIG, GENERATION_CONFIG, MANIFEST]
    if generation_tokens is not None:  # joined from the engine graphs just written
        del step, swapped, stack, weights  # the join holds every weight again: free what this export held
        import onnx

        from .generation import build_generation_graph
        generation = build_generation_graph(out, generation_tokens)
        facts = json.loads({p.key: p.value for p in generation.metadata_props}["padfree.generation"])
        save_model(generation, out / GENERATION)
        try:  # by path: the joined graph holds every weight (past protobuf's 2 GB for NLLB-600M in float32)
            # the plugin nodes are opaque to ONNX's inference; the Loop's wiring and types are not
            onnx.checker.check_model(str(out / GENERATION), full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            outputs.remove([out / GENERATION, data_file(out / GENERATION)])
            raise ExportError(f"{GENERATION} does not check: {e}") from e
        manifest["files"]["generation"] = GENERATION
        manifest["generation"] = {"search": facts["search"], "max_new_tokens": generation_tokens,
                                  **({"num_beams": facts["num_beams"], "num_return_sequences":
                                      facts["num_return_sequences"]} if facts["search"] == "beam" else {}),
                                  "inputs": [i.name for i in generation.graph.input],
                                  "outputs": [o.name for o in generation.graph.output]}
        del generation
        outputs.write_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        written.append(GENERATION)
        log.info("wrote %s (%s search, %d new tokens)", out / GENERATION, facts["search"], generation_tokens)
    files = [out / n for n in dict.fromkeys(written)]
    return Seq2SeqExportResult(out, files, manifest)
