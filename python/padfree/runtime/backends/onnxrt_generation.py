"""A seq2seq export's whole-generation graph (generation.padfree.onnx, `padfree export --io packed
--generation-graph N`) generating on ONNX Runtime (CPU), its plugin nodes on their references.

One session run per call, on the graph's own I/O: packed source ids, cu_seqlens and a max_seqlen shape
vector in; sequences, lengths (and beam search's scores) out. That is the contract a whole-generation
engine serves, so this backend is also what Runtime.generate does around one: the options are resolved
as HF's generate resolves them (the export's config.json and generation_config.json, then the call's),
checked against the options the graph was written with (its `padfree.generation` metadata) and refused
by name where they differ, since a graph (an engine) cannot change its search (the graph's
max_new_tokens and num_beams are the defaults); the sources are checked
before anything runs; the outputs are HF's (sequences as wide as the longest returned hypothesis, pad
after each end; sequences_scores with beam search).

    gen = Runtime("out/generation.padfree.onnx")
    out = gen.generate([[12, 7, 0], [5, 0]], return_dict_in_generate=True, output_scores=True)
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..._lib import PadfreeError
from ...ops._tensors import INT32_MAX
from .onnxrt_seq2seq import MANIFEST, check_position_pad_id, is_seq2seq_export

__all__ = ["OnnxrtGenerationGraph", "is_generation_graph", "generation_session", "run_generation_graph"]

METADATA = "padfree.generation"


def is_generation_graph(path) -> bool:
    """Whether `path` is the generation graph file of a seq2seq export (its seq2seq.json names it)."""
    path = Path(path)
    if not (path.is_file() and path.suffix == ".onnx" and is_seq2seq_export(path.parent)):
        return False
    try:
        files = json.loads((path.parent / MANIFEST).read_text()).get("files", {})
    except (OSError, ValueError):
        return False
    return files.get("generation") == path.name


def generation_session(path: Path, dtype: str = "fp32", threads: int | None = None):
    """A CPU session of the generation graph at `path` with its plugin nodes (the Loop body's too) on their
    ONNX Runtime references; an fp16 / bf16 graph cast back to float32."""
    import onnx
    import onnxruntime as ort

    from padfree.export.onnx_files import data_file, load_model
    from padfree.export.precision import cast
    from padfree.export.reference import with_references

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3
    if dtype == "fp32" and data_file(path).is_file():
        # past protobuf's 2 GB (NLLB-600M) the weights stay in the export's data file: the session gets the
        # graph alone, its plugin nodes expanded, as bytes, and reads the weights from the export's folder
        # (nothing is written there: it may be read-only)
        model = with_references(load_model(path, "the generation graph", load_external_data=False))
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         str(path.parent.resolve()))
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    model = load_model(path, "the generation graph")
    model = with_references(model if dtype == "fp32" else cast(model, "fp32"))
    with tempfile.TemporaryDirectory(prefix="padfree-generation-") as tmp:
        onnx.save_model(model, f"{tmp}/generation.onnx", save_as_external_data=True, location="weights.bin")
        del model
        return ort.InferenceSession(f"{tmp}/generation.onnx", options, providers=["CPUExecutionProvider"])


def run_generation_graph(session, sources: list[list[int]]) -> dict[str, np.ndarray]:
    """The graph's outputs by name for these sources (each a non-empty list of ids)."""
    lengths = [len(s) for s in sources]
    feeds = {"input_ids": np.concatenate([np.asarray(s, np.int32) for s in sources]),
             "cu_seqlens": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
             "max_seqlen": np.zeros(max(lengths), np.int32)}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


class OnnxrtGenerationGraph:
    """generate() over a generation graph on ONNX Runtime (CPU); also a Runtime backend:
    padfree.Runtime("out/generation.padfree.onnx").generate(batch, **options)."""

    def __init__(self, path, *, threads: int | None = None):
        import onnx
        from transformers import AutoConfig, GenerationConfig

        path = Path(path)
        if not is_generation_graph(path):
            raise PadfreeError(f"{os.fspath(path)} is not the generation graph of a seq2seq export (its folder's "
                               f"{MANIFEST} names none by that name): export with `padfree export MODEL --io packed "
                               f"--generation-graph N`")
        self.path, self.folder = path, path.parent
        manifest = json.loads((self.folder / MANIFEST).read_text())
        self.manifest = manifest
        self.dtype = manifest.get("dtype", "fp32")
        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        if METADATA not in props:
            raise PadfreeError(f"{path}: no {METADATA} metadata (the options the graph was written with); "
                               f"export the model again")
        self.facts = json.loads(props[METADATA])
        self.config = AutoConfig.from_pretrained(self.folder)
        self.generation_config = GenerationConfig.from_pretrained(self.folder, manifest["files"]["generation_config"])
        self.source_vocab_size = int(manifest["encoder"]["vocab_size"])
        self.vocab_size = int(manifest["decoder"]["vocab_size"])
        self.encoder_positions = int(manifest["encoder"]["max_positions"])
        self.decoder_positions = int(manifest["decoder"]["max_positions"])
        self.pad_token_id = int(manifest["decoder"]["pad_token_id"])
        self.position_pad_id = manifest.get("encoder_plugins", {}).get("position_pad_id")
        self.device = torch.device("cpu")
        self.output_names = ["sequences"]
        self.resolve()      # the export's generation_config is checked now, as from_hf checks the model's
        self.session = generation_session(path, self.dtype, threads)

    def __repr__(self) -> str:
        facts = self.facts
        search = ("greedy" if facts["search"] == "greedy" else
                  f"beam search, {facts['num_beams']} beams, {facts['num_return_sequences']} returned")
        return (f"OnnxrtGenerationGraph({self.path}, {self.manifest['family']}, {search}, "
                f"{facts['max_new_tokens']} new tokens, ONNX Runtime CPU)")

    @property
    def limits(self):
        from .base import Limits
        return Limits(max_tokens=INT32_MAX, max_batch=INT32_MAX, max_seqlen=self.encoder_positions,
                      vocab_size=self.source_vocab_size, dtype=torch.float32)

    def resolve(self, generation_config=None, **kwargs):
        """The call's options over the graph's: the export resolved the model's generation_config with
        its --generation-graph N and --num-beams K, so those are the defaults here too."""
        from ...generation.options import resolve_options
        defaults = {"num_beams": self.facts.get("num_beams", 1), "do_sample": False}
        if "max_new_tokens" not in kwargs and "max_length" not in kwargs:
            defaults["max_new_tokens"] = self.facts["max_new_tokens"]
        return resolve_options(self.generation_config, self.config, self.vocab_size, generation_config,
                               **{**defaults, **kwargs})

    def check_options(self, options) -> None:
        """Refuses, naming the first option, a call whose resolved options are not the graph's."""
        facts, name = self.facts, self.path.name
        beam = facts["search"] == "beam"
        fixed = {"do_sample": (options.do_sample, False),
                 "num_beams": (options.num_beams, facts["num_beams"] if beam else 1),
                 "max_new_tokens": (options.max_length - 1, facts["max_new_tokens"]),
                 "min_length": (options.min_length, facts["min_length"]),
                 "forced_bos_token_id": (options.forced_bos_token_id, facts["forced_bos_token_id"]),
                 "forced_eos_token_id": (options.forced_eos_token_id, facts["forced_eos_token_id"]),
                 "eos_token_id": (list(options.eos_token_ids), facts["eos_token_ids"]),
                 "pad_token_id": (options.pad_token_id, facts["pad_token_id"]),
                 "decoder_start_token_id": (options.decoder_start_token_id, facts["decoder_start_token_id"]),
                 "no_repeat_ngram_size": (options.no_repeat_ngram_size, 0),
                 "repetition_penalty": (options.repetition_penalty, 1.0),
                 "bad_words_ids": (bool(options.bad_words_single or options.bad_words_multi), False)}
        if beam:
            fixed.update({"num_return_sequences": (options.num_return_sequences, facts["num_return_sequences"]),
                          "length_penalty": (options.length_penalty, facts["length_penalty"]),
                          "early_stopping": (options.early_stopping, facts["early_stopping"])})
        else:
            fixed["num_return_sequences"] = (options.num_return_sequences, 1)
        for option, (asked, built) in fixed.items():
            if asked != built:
                raise ValueError(f"{option}={asked!r}: {name} was written for {option}={built!r}, and a generation "
                                 f"graph (an engine built from it) cannot change its search; export it again with "
                                 f"that option, or generate through the export's step graphs "
                                 f"(padfree.Runtime({os.fspath(self.folder)!r}))")

    def generate(self, input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        """HF-compatible generate with the graph's options (as padfree.generation's generate returns)."""
        from ...generation import inputs
        from ...generation.generator import hf_output

        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)
        options = self.resolve(generation_config, **kwargs)
        self.check_options(options)
        sources = inputs.source_lists(input_ids, attention_mask)
        inputs.check_source_lengths(sources, self.source_vocab_size, self.encoder_positions, self.decoder_positions,
                                    options.max_length)
        check_position_pad_id(sources, self.position_pad_id, "the generation graph's packed encoder")
        found = run_generation_graph(self.session, sources)
        lengths = found["lengths"].reshape(-1)
        width = int(lengths.max())       # HF's width: the longest returned hypothesis, start token included
        sequences = torch.from_numpy(found["sequences"].reshape(lengths.shape[0], -1)[:, :width].astype(np.int64))
        scores = None
        if "scores" in found:
            scores = torch.from_numpy(found["scores"].reshape(-1).astype(np.float32))
        return hf_output(sequences, scores, options)
