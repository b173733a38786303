"""Rewritten model vs plain export on ONNX Runtime (CPU), through polygraphy's Comparator.

Both runners take the same HF-style padded batch (input_ids, attention_mask, token_type_ids, drawn
at random with variable lengths, edge lengths 1 and max included). The rewritten model, with its
plugin nodes expanded into their ONNX references (padfree.export.reference), gets that batch packed
(or as int32 padded tensors for --io padded). Both runners return outputs on valid tokens only
([T, H] and [B, H]): the reference's padded rows hold values no one should read.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from . import wiring
from .precision import cast, float_dtype, round_weights
from .reference import with_references
from .spec import load as load_spec

log = logging.getLogger(__name__)
LHS = "last_hidden_state"


@dataclass
class ModelFacts:
    """What the check needs to draw valid inputs, read from the rewritten model."""
    io: str
    vocab_size: int
    type_vocab_size: int  # 0: no token types
    max_seqlen: int       # longest sequence the position table allows
    pad_token_id: int
    outputs: list[str] = field(default_factory=list)
    position_offset: int = 0  # > 0: RoBERTa-style positions, numbered from pad_token_id + 1


def model_facts(rewritten: onnx.ModelProto) -> ModelFacts:
    spec = load_spec()
    inits = {t.name: tuple(t.dims) for t in rewritten.graph.initializer}
    emb = next((n for n in rewritten.graph.node if n.op_type == "PadfreeEmbLayerNorm"
                and n.domain == spec.namespace), None)
    if emb is None:
        raise ValueError("the model has no PadfreeEmbLayerNorm node: is it a padfree-rewritten model?")
    attrs = {a.name: helper.get_attribute_value(a) for a in emb.attribute}
    try:
        names = spec["PadfreeEmbLayerNorm"].input_names(attrs)
        offset = int(attrs["position_offset"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"the PadfreeEmbLayerNorm node lacks a valid field ({e}): export the model again") from e
    port = dict(zip(names, emb.input))
    meta = {p.key: p.value for p in rewritten.metadata_props}
    inputs = [i.name for i in rewritten.graph.input]
    io = "packed" if "cu_seqlens" in inputs else "padded"  # the graph's inputs, not editable metadata

    def rows(name: str) -> int:
        if name not in port or port[name] not in inits or len(inits[port[name]]) != 2:
            raise ValueError(f"the PadfreeEmbLayerNorm node's {name} is not a 2-D weight of the model: export it again")
        return int(inits[port[name]][0])

    vocab = rows("word_embeddings")
    # The graph says RoBERTa's padding id (position_offset - 1); BERT's numbering ignores it, so the
    # exporter's metadata, which anyone can edit, is used only where it names a row of the table.
    pad = offset - 1 if offset > 0 else _int_or(meta.get("padfree.pad_token_id"), 0)
    pad = pad if 0 <= pad < vocab else 0
    return ModelFacts(io, vocab,
                      rows("token_type_embeddings") if "token_type_embeddings" in port else 0,
                      rows("position_embeddings") - offset, pad, [o.name for o in rewritten.graph.output], offset)


def _int_or(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


@dataclass
class Batch:
    lengths: np.ndarray
    feed: "OrderedDict[str, np.ndarray]"  # HF-style padded int64 inputs


def random_batch(facts: ModelFacts, batch: int, max_seqlen: int, seed: int) -> Batch:
    """Lengths uniform in [1, max_seqlen] with the first two at max_seqlen and 1; token ids never
    the padding id (a padding id inside a sequence would shift RoBERTa's positions in the
    reference, which counts non-padding tokens)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_seqlen + 1, batch)
    lengths[: min(batch, 2)] = [max_seqlen, 1][: min(batch, 2)]
    mask = (np.arange(max_seqlen)[None, :] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(0, facts.vocab_size - 1, (batch, max_seqlen))
    ids = np.where(ids >= facts.pad_token_id, ids + 1, ids)  # skip the padding id
    feed = OrderedDict(input_ids=np.where(mask == 1, ids, facts.pad_token_id), attention_mask=mask)
    if facts.type_vocab_size:
        feed["token_type_ids"] = rng.integers(0, facts.type_vocab_size, (batch, max_seqlen)) * mask
    return Batch(lengths, feed)


def pack_rows(padded: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[B, S, ...] -> [T, ...]: the valid rows, sequence after sequence (masks are left-aligned)."""
    return padded[mask.astype(bool)]


def packed_feed(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    mask = feed["attention_mask"]
    lengths = mask.sum(axis=1)
    out = {"input_ids": pack_rows(feed["input_ids"], mask).astype(np.int32)}
    if "token_type_ids" in feed:
        out["token_type_ids"] = pack_rows(feed["token_type_ids"], mask).astype(np.int32)
    out["cu_seqlens"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    out["max_seqlen"] = np.zeros(int(lengths.max()), np.int32)
    return out


def token_outputs(model: onnx.ModelProto) -> set[str]:
    """Outputs of a padded-form model with one row per token: axes 0 and 1 named as input_ids' are
    (last_hidden_state, token logits, start / end logits), a per-sequence output's axis 1 is not."""
    ids = next((i for i in model.graph.input if i.name == "input_ids"), None)
    if ids is None or len(ids.type.tensor_type.shape.dim) != 2:
        return set()
    want = [d.dim_param for d in ids.type.tensor_type.shape.dim]
    return {o.name for o in model.graph.output
            if [d.dim_param for d in o.type.tensor_type.shape.dim[:2]] == want and all(want)}


def _runner_classes():
    from polygraphy.backend.base import BaseRunner
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.common import TensorMetadata

    class ValidTokensRunner(BaseRunner):
        """Runs an ONNX model on an HF-style padded feed and returns outputs on valid tokens only.

        form: "reference" (the plain export: int64 padded inputs, padded outputs), "packed" or
        "padded" (a rewritten model's I/O form). padding_max records, for padded outputs, the largest
        magnitude in padded rows (the padded form promises zeros there).
        """

        def __init__(self, model: onnx.ModelProto, form: str, name: str):
            super().__init__(name=name, prefix="padfree")
            self.form = form
            self.inputs = {i.name: i for i in model.graph.input}
            self.token_outputs = token_outputs(model)
            self.padding_max: dict[str, float] = {}
            self._inner = OnnxrtRunner(SessionFromOnnx(model.SerializeToString(), providers=["cpu"]),
                                       name=f"{name}/onnxrt")

        def activate_impl(self):
            self._inner.activate()

        def deactivate_impl(self):
            self._inner.deactivate()

        def get_input_metadata_impl(self):
            meta = TensorMetadata()
            types = ["token_type_ids"] if "token_type_ids" in self.inputs else []
            for name in ["input_ids", "attention_mask"] + types:
                meta.add(name, np.int64, (None, None))
            return meta

        def _feed(self, feed):
            if self.form == "packed":
                return packed_feed(feed)
            return {k: v.astype(helper.tensor_dtype_to_np_dtype(self.inputs[k].type.tensor_type.elem_type))
                    for k, v in feed.items() if k in self.inputs}

        def infer_impl(self, feed_dict):
            import time
            start = time.perf_counter()
            outputs = self._inner.infer(self._feed(feed_dict), check_inputs=False)
            self.inference_time = time.perf_counter() - start
            mask = feed_dict["attention_mask"]
            out = OrderedDict()
            for name, value in outputs.items():
                if self.form != "packed" and name in self.token_outputs:
                    if self.form == "padded":
                        pad = np.abs(value[~mask.astype(bool)])
                        self.padding_max[name] = float(pad.max()) if pad.size else 0.0
                    value = pack_rows(value, mask)
                out[name] = np.array(value)
            return out

    return ValidTokensRunner


@dataclass
class OutputResult:
    name: str
    max_abs: float
    max_rel: float
    passed: bool
    padding_max: float | None = None


# float32 rounding: the rewrite and the plain export sum in different orders, and the difference grows
# with depth. The rule: rtol 1e-4 per 12 layers (at least 1e-4), atol a tenth of it. Example: a
# 24-layer random-weight BERT reaches ~1e-4 of relative difference on some batches, so it gets 2e-4.
FP32_RTOL_PER_12_LAYERS = 1e-4


def fp32_tolerances(rewritten: onnx.ModelProto) -> tuple[float, float]:
    """(rtol, atol) for a float32 check of `rewritten`, by its depth (its PadfreeAttention nodes)."""
    layers = sum(1 for n in rewritten.graph.node if n.op_type == "PadfreeAttention")
    rtol = FP32_RTOL_PER_12_LAYERS * max(1.0, layers / 12)
    return rtol, rtol / 10


def compare(rewritten: onnx.ModelProto, reference: onnx.ModelProto, batch: int = 8, max_seqlen: int = 64,
            seed: int = 0, rtol: float | None = None, atol: float | None = None,
            verbose: bool = False) -> tuple[bool, list[OutputResult], Batch]:
    """Run both models on one random batch through polygraphy's Comparator; per output results.

    An element passes when its absolute error is <= atol or its relative error <= rtol (polygraphy's
    elementwise rule; unset, fp32_tolerances(rewritten) gives them); padded outputs of the padded
    form must also be exactly 0 in padded rows.
    A fp16 / bf16 rewritten model runs cast back to float32, against the reference with its weights
    rounded to that dtype (export.precision): float32 tolerances hold for every dtype.
    """
    from polygraphy import comparator as pc
    from polygraphy.logger import G_LOGGER

    simple = getattr(pc, "SimpleCompareFunc", None) or pc.CompareFunc.simple  # renamed in polygraphy 0.53

    if rtol is None:
        rtol = fp32_tolerances(rewritten)[0]
    if atol is None:
        atol = rtol / 10
    facts = model_facts(rewritten)
    _check_reference(reference, load_spec().namespace)
    miswired = wiring.problems(rewritten)
    if miswired:  # ONNX Runtime would stop at a shape error deep inside the references
        raise ValueError("plugin nodes wired against the spec (plugins/spec/plugins.json): " + "; ".join(miswired))
    if max_seqlen > facts.max_seqlen:
        log.warning("max_seqlen %d exceeds the position table (%d); using %d", max_seqlen, facts.max_seqlen,
                    facts.max_seqlen)
        max_seqlen = facts.max_seqlen
    data = random_batch(facts, batch, max_seqlen, seed)
    Runner = _runner_classes()
    dtype = float_dtype(rewritten)
    if dtype != "fp32":  # both in float32 on the same rounded weights (export.precision)
        rewritten, reference = cast(rewritten, "fp32"), round_weights(reference, dtype)
    runners = [Runner(reference, "reference", "reference"), Runner(with_references(rewritten), facts.io, "padfree")]
    with G_LOGGER.verbosity(G_LOGGER.INFO if verbose else G_LOGGER.ERROR):
        results = pc.Comparator.run(runners, data_loader=[data.feed])
        accuracy = pc.Comparator.compare_accuracy(
            results, compare_func=simple(rtol=rtol, atol=atol, check_error_stat="elemwise"))
    (pair_results,) = accuracy[0].values()
    per_output = pair_results[0]
    out = []
    floor = atol / rtol if rtol > 0 else np.inf
    for name, res in per_output.items():
        ref, got = (np.asarray(r[1][0][name], np.float64) for r in results)
        diff = np.abs(got - ref)
        rel = diff / np.maximum(np.abs(ref), floor)  # <= rtol exactly where polygraphy's rule passes
        padding = runners[1].padding_max.get(name)
        ok = bool(res) and (padding is None or padding == 0.0)
        out.append(OutputResult(name, float(diff.max(initial=0)), float(rel.max(initial=0)), ok, padding))
    missing = set(facts.outputs) - {r.name for r in out}
    if missing:
        raise ValueError(f"outputs {sorted(missing)} of the rewritten model have no counterpart in the reference")
    return all(r.passed for r in out), out, data


def _check_reference(reference: onnx.ModelProto, namespace: str) -> None:
    """The reference must be a plain export that ONNX Runtime runs on HF-style padded inputs."""
    if any(n.domain == namespace for n in reference.graph.node):
        raise ValueError("the reference holds padfree plugin nodes: give the plain export (model.onnx), not a"
                         " rewritten model")
    inputs = {i.name for i in reference.graph.input}
    if not {"input_ids", "attention_mask"} <= inputs:
        raise ValueError(f"the reference's inputs are {sorted(inputs)}, expected input_ids and attention_mask (+"
                         " token_type_ids): give the plain export (model.onnx)")


def format_results(results: list[OutputResult], rtol: float, atol: float) -> str:
    lines = [f"{'output':<20} {'max abs err':>12} {'max rel err':>12}  result   "
             f"(valid tokens; rel = |err| / max(|ref|, atol/rtol); pass: rel <= rtol {rtol:g}, atol {atol:g})"]
    for r in results:
        extra = f"  padded rows max |x| {r.padding_max:g}" if r.padding_max is not None else ""
        lines.append(f"{r.name:<20} {r.max_abs:>12.3e} {r.max_rel:>12.3e}  {'PASS' if r.passed else 'FAIL':<6}{extra}")
    return "\n".join(lines)
