"""What generate() does around one run of a whole-generation graph or engine (generation.padfree.onnx and
the engine built from it): the options resolved as HF's generate resolves them (the export's config.json
and generation_config.json, then the call's), checked against the options the graph was written with
(its `padfree.generation` facts) and refused by name where they differ, since a graph (an engine) cannot
change its search (its max_new_tokens and num_beams are the defaults); the sources checked before
anything runs; HF's outputs from the graph's (sequences as wide as the longest returned hypothesis, pad
after each end; sequences_scores with beam search).

The run itself is the executor's (GenerationGraph.execute): ONNX Runtime on the CPU
(onnxrt_generation.py) or TensorRT on the GPU (engine_generation.py), one run per call on the graph's own
I/O: packed source ids, cu_seqlens and a max_seqlen shape vector in; sequences, lengths (and beam
search's scores) out.
"""
from __future__ import annotations

import abc
import json
import os
from pathlib import Path

import numpy as np
import torch

from .onnxrt_seq2seq import MANIFEST, check_position_pad_id, is_seq2seq_export

__all__ = ["GenerationGraph", "is_generation_graph", "packed_sources"]

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


def packed_sources(sources: list[list[int]]) -> dict[str, np.ndarray]:
    """The graph's inputs for these sources (each a non-empty list of ids): int32 input_ids [T],
    cu_seqlens [B + 1] and a max_seqlen shape vector [S]."""
    lengths = [len(s) for s in sources]
    return {"input_ids": np.concatenate([np.asarray(s, np.int32) for s in sources]),
            "cu_seqlens": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
            "max_seqlen": np.zeros(max(lengths), np.int32)}


class GenerationGraph(abc.ABC):
    """generate() around a whole-generation graph whose export folder (config.json, generation_config.json,
    seq2seq.json) is `folder` and whose search is `facts` (its padfree.generation metadata). Subclasses run
    the graph: execute(sources) -> {output name: numpy array}; `name` is what refusals call it."""

    def __init__(self, folder: Path, facts: dict, name: str):
        from transformers import AutoConfig, GenerationConfig

        self.folder, self.facts, self.name = Path(folder), facts, name
        manifest = json.loads((self.folder / MANIFEST).read_text())
        self.manifest = manifest
        self.dtype = manifest.get("dtype", "fp32")
        self.config = AutoConfig.from_pretrained(self.folder)
        self.generation_config = GenerationConfig.from_pretrained(self.folder, manifest["files"]["generation_config"])
        self.source_vocab_size = int(manifest["encoder"]["vocab_size"])
        self.vocab_size = int(manifest["decoder"]["vocab_size"])
        self.encoder_positions = int(manifest["encoder"]["max_positions"])
        self.decoder_positions = int(manifest["decoder"]["max_positions"])
        self.pad_token_id = int(manifest["decoder"]["pad_token_id"])
        self.position_pad_id = manifest.get("encoder_plugins", {}).get("position_pad_id")
        self.output_names = ["sequences"]
        self.resolve()      # the export's generation_config is checked now, as from_hf checks the model's

    def describe(self) -> str:
        facts = self.facts
        search = ("greedy" if facts["search"] == "greedy" else
                  f"beam search, {facts['num_beams']} beams, {facts['num_return_sequences']} returned")
        return f"{self.manifest['family']}, {search}, {facts['max_new_tokens']} new tokens"

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
        facts, name = self.facts, self.name
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
        found = self.execute(sources)
        lengths = found["lengths"].reshape(-1)
        width = int(lengths.max())       # HF's width: the longest returned hypothesis, start token included
        sequences = torch.from_numpy(found["sequences"].reshape(lengths.shape[0], -1)[:, :width].astype(np.int64))
        scores = None
        if "scores" in found:
            scores = torch.from_numpy(found["scores"].reshape(-1).astype(np.float32))
        return hf_output(sequences, scores, options)

    @abc.abstractmethod
    def execute(self, sources: list[list[int]]) -> dict[str, np.ndarray]:
        """The graph's outputs by name (numpy) for these checked sources; an executor refuses a batch it
        cannot take (an engine: outside its profiles) before it runs anything."""
