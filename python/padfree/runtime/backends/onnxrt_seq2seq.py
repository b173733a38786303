"""An encoder-decoder export (padfree export's encoder.onnx, cross_kv.onnx, decoder_step.onnx) generating
on ONNX Runtime (CPU), with padfree.generation's own searches: the seed of Runtime.generate over an
exported model, and the CPU proof of the export (padfree.export.seq2seq.check).

The generation loop is padfree.generation's (generator.decode, runner.Runner, beam_search.BeamSearch,
sampling.SingleSearch): the same option merge (the export's config.json and generation_config.json),
the same processors, beam bookkeeping and cache-indirection reorder; only the decoder backend differs
(OrtDecoder below, the protocol runner.py states): its logits come from decoder_step.onnx, which
writes the caches it is given and returns them. So the options, refusals and outputs are those of
padfree.torch.from_hf(model).generate, and an export that computes the step correctly generates HF's
tokens.

Per call: the encoder runs padded ([batch, longest source], right padding), its valid rows are packed
([T, hidden], cu_seqlens order), cross_kv.onnx turns them into each layer's K | V once, and every
decode step is one decoder_step.onnx run. Caches are float32 [rows, heads, max_length - 1, head_dim]
numpy arrays per layer, replaced by the step's outputs.

step="plugins" runs decoder_step.padfree.onnx instead (the step on plugin nodes, export/seq2seq/swap.py)
with each plugin node expanded by its ONNX Runtime reference (padfree.export.reference): the CPU proof
of the swapped graph. Its cross-attention nodes carry the num_beams they were exported for; a call of
another width runs a copy with that one field set to the call's (swap.set_num_beams), as an engine of
that width would be built from its own swap. The swapped step's extra input `max_seqlen` gets a vector
as long as the call's longest source. An export with --io packed has its encoder on plugin nodes too
(encoder.padfree.onnx): step="plugins" runs it, on packed tokens, through the plugins' references. With
an export in fp16 / bf16 (seq2seq.json's `dtype`), step="plugins" runs the engine graphs
(`engine_graphs`: encoder.<dtype>.onnx, cross_kv.<dtype>.onnx and the step) cast back to float32, and
rounded=True runs the float32 graphs with every value rounded to that dtype (for an encoder whose engine
graph is on plugin nodes, --io packed: encoder.onnx rewritten again in float32, then rounded): the two
compute in float32 on the same values, which is how padfree check proves the dtype's graphs on the CPU.
"""
from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import numpy as np
import torch

from ..._lib import PadfreeError
from ...ops._tensors import INT32_MAX, InputError

__all__ = ["OnnxrtSeq2SeqGenerator", "OrtDecoder", "check_position_pad_id", "is_seq2seq_export"]

log = logging.getLogger(__name__)
MANIFEST = "seq2seq.json"
FORMAT = "padfree-seq2seq/1"


def is_seq2seq_export(path) -> bool:
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()


def check_position_pad_id(sources: list[list[int]], pad: int | None, encoder: str) -> None:
    """A packed encoder numbers a source's tokens in order (offset + t); HF's M2M100 leaves its padding
    id out of the count, so a source holding it would be encoded otherwise than HF's: refused."""
    if pad is None:
        return
    for index, source in enumerate(sources):
        if pad in source:
            raise InputError(f"source {index} holds the padding id {pad} at position {list(source).index(pad)}: "
                             f"{encoder} numbers positions in order, where the model skips that id; leave "
                             f"padding out of the sources (pass each source's tokens, or an attention_mask)")


class OrtDecoder:
    """The decoder backend (generation/runner.py's protocol) over decoder_step.onnx."""

    def __init__(self, owner: "OnnxrtSeq2SeqGenerator", batch: int, rows_per_source: int, capacity: int,
                 tokens: int, max_seqlen: int):
        self.owner, self.ops = owner, owner.ops
        self.batch, self.rows_per_source = batch, rows_per_source
        self.rows = batch * rows_per_source
        self.capacity = capacity
        self.device = torch.device("cpu")
        self.vocab_size = owner.vocab_size
        shape = (self.rows, owner.num_heads, capacity, owner.head_dim)
        # zeroed once: the step reads every slot under a mask, and a NaN there would survive a zero weight
        self.caches = {f"past_{kind}.{i}": np.zeros(shape, dtype=np.float32)
                       for i in range(owner.layers) for kind in ("key", "value")}
        identity = torch.arange(self.rows, dtype=torch.int32)[:, None].expand(self.rows, capacity)
        self.indir = identity.contiguous()
        self.indir_next = identity.contiguous()
        self.step = torch.zeros(1, dtype=torch.int32)
        self.memory: dict[str, np.ndarray] = {}
        self.cu_seqlens: np.ndarray | None = None
        self.max_seqlen: np.ndarray | None = None
        self.session, self.input_names = owner.step_for(rows_per_source)

    def load(self, sources, encoder_out: np.ndarray) -> None:
        """This call's cross-attention memory (cross_kv.onnx on the packed encoder rows) and cu_seqlens."""
        names = [o.name for o in self.owner.cross_kv.get_outputs()]
        values = self.owner.cross_kv.run(None, {"encoder_hidden_states": encoder_out})
        self.memory = dict(zip(names, values))
        self.cu_seqlens = sources.cu_seqlens.cpu().numpy().astype(np.int32)
        self.max_seqlen = np.zeros(int(np.diff(self.cu_seqlens).max(initial=1)), dtype=np.int32)
        self.step.zero_()

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        feeds = {"input_ids": tokens.to(torch.int32).numpy(), "step": self.step.numpy(),
                 "cache_indir": self.indir.numpy(), "cu_seqlens": self.cu_seqlens, **self.caches, **self.memory}
        if "max_seqlen" in self.input_names:
            feeds["max_seqlen"] = self.max_seqlen
        values = self.session.run(None, feeds)
        out = dict(zip(self.owner.step_outputs, values))
        for name in self.caches:
            self.caches[name] = out[name.replace("past_", "present_")]
        return torch.from_numpy(out["logits"])

    def reorder(self, parents: torch.Tensor) -> None:
        self.ops.beam_reorder_cache_indir(self.indir, parents, self.step, out=self.indir_next)
        self.indir.copy_(self.indir_next)

    def advance(self) -> None:
        self.step.add_(1)


def _session(path, threads: int | None, transform=None):
    """A CPU session of the graph at path, or of transform(the graph) where given."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3
    if transform is not None:
        import onnx
        path = transform(onnx.load(str(path))).SerializeToString()
    else:
        path = str(path)
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


class OnnxrtSeq2SeqGenerator:
    """generate() of padfree.torch.from_hf's Seq2SeqGenerator, over an export folder on ONNX Runtime (CPU).

        gen = OnnxrtSeq2SeqGenerator("out/")
        out = gen.generate([[12, 7, 0], [5, 0]], num_beams=4, return_dict_in_generate=True, output_scores=True)

    Also a Runtime backend: padfree.Runtime("out/").generate(batch, **options)."""

    def __init__(self, folder, *, threads: int | None = None, step: str = "plain", rounded: bool = False):
        from transformers import AutoConfig, GenerationConfig

        from ...generation.dispatch import DecoderOps
        from ...generation.runner import Runner

        self.folder = Path(folder)
        if not is_seq2seq_export(self.folder):
            raise PadfreeError(f"{self.folder}: not a seq2seq export (no {MANIFEST}); run `padfree export` on an "
                               f"encoder-decoder into it")
        manifest = json.loads((self.folder / MANIFEST).read_text())
        if manifest.get("format") != FORMAT:
            raise PadfreeError(f"{self.folder / MANIFEST}: format {manifest.get('format')!r}, expected {FORMAT!r}; "
                               f"export the model again")
        self.manifest = manifest
        files = manifest["files"]
        if step not in ("plain", "plugins"):
            raise ValueError(f"step must be 'plain' or 'plugins', got {step!r}")
        if step == "plugins" and "decoder_step_plugins" not in files:
            raise PadfreeError(f"{self.folder}: the export has no decoder step on plugin nodes; export it again")
        self.dtype = manifest.get("dtype", "fp32")
        if rounded and (step != "plain" or self.dtype == "fp32"):
            raise ValueError("rounded=True: the float32 graphs rounded to a float16 / bfloat16 export's dtype "
                             "(step='plain' of such an export)")
        self.step_kind, self.threads, self.rounded = step, threads, rounded
        self.step_file = self.folder / files["decoder_step" if step == "plain" else "decoder_step_plugins"]
        self._steps: dict[int, tuple] = {}
        self.config = AutoConfig.from_pretrained(self.folder)
        self.generation_config = GenerationConfig.from_pretrained(self.folder, files["generation_config"])
        from padfree.export import precision
        graphs = {"encoder": files["encoder"], "cross_kv": files["cross_kv"]}
        transform = None
        if step == "plugins":  # the engines' graphs, an fp16 / bf16 export's cast back
            graphs.update({k: v for k, v in manifest.get("engine_graphs", {}).items() if k in graphs})
            if self.dtype != "fp32":
                transform = functools.partial(precision.cast, dtype="fp32")
        elif rounded:
            transform = functools.partial(precision.round_values, dtype=self.dtype)
        self.graph_files = {k: self.folder / v for k, v in graphs.items()}
        # --io packed: the encoder on plugin nodes (their references) over packed tokens
        self.packed_encoder = step == "plugins" and graphs["encoder"] == files.get("encoder_plugins")
        encoder_transform = transform
        if rounded and "encoder_plugins" in files:
            # the engines' encoder is encoder.onnx rewritten (constants folded: an embedding's scale into
            # its table) and then cast: its float32 rewrite, made again here, with every value rounded
            from padfree.export.rewrite import rewrite
            self.packed_encoder = True

            def encoder_transform(model, dtype=self.dtype):
                return precision.round_values(rewrite(model, io="packed")[0], dtype)
        if self.packed_encoder:
            from padfree.export.reference import with_references

            def encoder_transform(model, before=encoder_transform):
                return with_references(model if before is None else before(model))
        self.encoder = _session(self.graph_files["encoder"], threads, encoder_transform)
        self.cross_kv = _session(self.graph_files["cross_kv"], threads, transform)
        if step == "plain":
            self.step_session = _session(self.step_file, threads, transform)
            self.step_num_beams = None
        else:
            import onnx

            from padfree.export.seq2seq.swap import num_beams_of
            self._plugin_step = onnx.load(str(self.step_file))
            if transform is not None:
                self._plugin_step = transform(self._plugin_step)
            self.step_num_beams = num_beams_of(self._plugin_step)
            exported = manifest.get("decoder_plugins", {}).get("num_beams")
            if self.step_num_beams != exported:
                raise PadfreeError(f"{self.step_file}: its cross-attention nodes have num_beams {self.step_num_beams}, "
                                   f"the export's {MANIFEST} says {exported}; export the model again")
            self.step_session, _ = self.step_for(self.step_num_beams)
        # the step's structure from its own I/O, not from the manifest
        inputs = {i.name: i.shape for i in self.step_session.get_inputs()}
        self.layers = sum(1 for name in inputs if name.startswith("past_key."))
        _, self.num_heads, _, self.head_dim = inputs["past_key.0"]
        self.step_outputs = [o.name for o in self.step_session.get_outputs()]
        self.vocab_size = int(self.step_session.get_outputs()[0].shape[1])
        self.source_vocab_size = int(manifest["encoder"]["vocab_size"])
        self.encoder_positions = int(manifest["encoder"]["max_positions"])
        self.decoder_positions = int(manifest["decoder"]["max_positions"])
        self.pad_token_id = int(manifest["decoder"]["pad_token_id"])
        # an id a source may not hold on the packed encoder (M2M100's padding id: HF skips it in positions)
        self.position_pad_id = manifest.get("encoder_plugins", {}).get("position_pad_id") \
            if self.packed_encoder else None
        self.device = torch.device("cpu")
        self.ops = DecoderOps(self.device, self.head_dim, force_reference=True)
        self.runner = Runner(None, self.ops, self.device, use_graphs=False,
                             make_decoder=lambda *sizes: OrtDecoder(self, *sizes), logits_bias=None)
        self.output_names = ["sequences"]
        self.resolve()      # the export's generation_config is checked now, as from_hf checks the model's

    def step_for(self, rows_per_source: int):
        """(session, input names) of the step serving `rows_per_source` hypotheses per source."""
        if self.step_kind == "plain":
            return self.step_session, {i.name for i in self.step_session.get_inputs()}
        if rows_per_source not in self._steps:
            import onnxruntime as ort

            from padfree.export.reference import with_references
            from padfree.export.seq2seq.swap import set_num_beams
            model = self._plugin_step
            if rows_per_source != self.step_num_beams:
                model = set_num_beams(model, rows_per_source)
            options = ort.SessionOptions()
            if self.threads:
                options.intra_op_num_threads = self.threads
            options.log_severity_level = 3
            session = ort.InferenceSession(with_references(model).SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
            self._steps[rows_per_source] = (session, {i.name for i in session.get_inputs()})
        return self._steps[rows_per_source]

    def __repr__(self) -> str:
        return (f"OnnxrtSeq2SeqGenerator({self.folder}, {self.manifest['family']}, {self.layers} decoder layers, "
                f"vocab {self.vocab_size}, ONNX Runtime CPU)")

    @property
    def limits(self):
        from .base import Limits
        return Limits(max_tokens=INT32_MAX, max_batch=INT32_MAX, max_seqlen=self.encoder_positions,
                      vocab_size=self.source_vocab_size, dtype=torch.float32)

    def resolve(self, generation_config=None, **kwargs):
        from ...generation.options import resolve_options
        return resolve_options(self.generation_config, self.config, self.vocab_size, generation_config, **kwargs)

    def encode(self, sources: list[list[int]]) -> np.ndarray:
        """The encoder's hidden states of the valid tokens, packed: float32 [T, hidden]."""
        if self.packed_encoder:  # nothing padded: the tokens in, their rows out
            self._check_position_pad_id(sources)
            lengths = [len(s) for s in sources]
            feeds = {"input_ids": np.concatenate([np.asarray(s, dtype=np.int32) for s in sources]),
                     "cu_seqlens": np.concatenate(([0], np.cumsum(lengths))).astype(np.int32),
                     "max_seqlen": np.zeros(max(lengths), dtype=np.int32)}
            return np.ascontiguousarray(self.encoder.run(None, feeds)[0], dtype=np.float32)
        width = max(len(s) for s in sources)
        ids = np.full((len(sources), width), self.pad_token_id, dtype=np.int32)
        mask = np.zeros((len(sources), width), dtype=np.int32)
        for i, s in enumerate(sources):
            ids[i, :len(s)] = s
            mask[i, :len(s)] = 1
        hidden = self.encoder.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        return np.ascontiguousarray(hidden[mask.astype(bool)], dtype=np.float32)

    def _check_position_pad_id(self, sources: list[list[int]]) -> None:
        check_position_pad_id(sources, self.position_pad_id, "the packed encoder (encoder.padfree.onnx)")

    def generate(self, input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        """HF-compatible generate, as padfree.generation.Seq2SeqGenerator.generate (same options and outputs)."""
        from ...generation import inputs
        from ...generation.encoder import PackedSources
        from ...generation.generator import decode

        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)
        options = self.resolve(generation_config, **kwargs)
        sources = inputs.source_lists(input_ids, attention_mask)
        inputs.check_source_lengths(sources, self.source_vocab_size, self.encoder_positions, self.decoder_positions,
                                    options.max_length)
        packed = PackedSources.from_lists(sources, self.device)
        encoder_out = self.encode(sources)
        if encoder_out.shape[0] != packed.total_tokens:
            raise InputError(f"the encoder returned {encoder_out.shape[0]} rows for {packed.total_tokens} tokens")
        with torch.inference_mode():
            return decode(self.runner, packed, encoder_out, options)
