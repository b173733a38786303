"""generation.padfree.onnx: a whole generation in one graph, the form of a whole-generation engine.

    inputs   input_ids int32 [T]       the sources' tokens, packed end to end
             cu_seqlens int32 [B+1]    where each source starts
             max_seqlen int32 [S]      a tensor as long as the longest source (a shape input, as the
                                       packed encoder's and the step's)
    outputs  greedy:  sequences int32 [B, 1+N], lengths int32 [B]
             beam:    sequences int32 [B, n_ret, 1+N], lengths int32 [B, n_ret], scores float [B, n_ret]
             (the decoder start token, then up to N = max_new_tokens tokens, pad after each end, as HF's
             generate pads; lengths count tokens up to and including eos; scores are HF's
             sequences_scores)

It is the export's engine graphs joined: encoder.padfree.onnx (packed) -> cross_kv.onnx -> an ONNX
`Loop` of N steps whose body is decoder_step.padfree.onnx plus the search, the K/V caches and the
search state loop-carried. Both searches take their candidates from PadfreeLogitsTopK with
padfree.generation's processors as its inputs (the eos ban while shorter than min_length,
forced_bos_token_id at the first step, forced_eos_token_id at the last). Greedy (num_beams 1): the
top-1 of the raw logits (the smaller id on a tie, torch's argmax), then PadfreeGreedyStep (the pad
token for rows that have ended, eos ending a row; the pad id its field). Beam search (the export's
--num-beams K > 1): log_softmax plus the beam scores, then PadfreeBeamSearchStep, HF's bookkeeping
(the top candidates per source, the running beams, the pool of finished hypotheses with its length
penalty, early_stopping, the early-stop heuristic) with the search's options as its fields, and the
cache indirection reordered by PadfreeBeamReorder. The loop runs all N steps: a fixed trip count keeps
the carried shapes the same in every backend, and past HF's stop nothing changes (finished rows pad;
no pool can change).

Why the rules below:
- max_new_tokens and the options are fixed when the graph is written: the caches are [R, H, N, D]
  inside the loop and TensorRT wants the loop's carried shapes fixed per profile; the options are
  resolved from the model's generation_config as HF's generate resolves them (an engine serializes
  them). Options the graph cannot honour (no_repeat_ngram_size, repetition_penalty, bad_words_ids,
  sampling) are refused by name.
- The decoder plugins inside the loop hold their scratch (own_workspace 1): TensorRT-RTX cannot give
  a plugin a workspace inside a loop (docs/PLUGINS.md, "Inside a Loop").
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ExportError

__all__ = ["GENERATION", "build_generation_graph", "search_options"]

GENERATION = "generation.padfree.onnx"  # pipeline.GENERATION
LOOP_PLUGINS = ("PadfreeDecoderSelfAttention", "PadfreeDecoderCrossAttention", "PadfreeLogitsTopK")


def search_options(generation_config, config, vocab_size: int, max_new_tokens: int, num_beams: int = 1):
    """The generation options for greedy (num_beams 1) or beam search with exactly this many new tokens
    at most (padfree.generation's resolution of HF's); refused by name where the graph cannot honour
    them."""
    from padfree.generation.options import resolve_options

    if max_new_tokens < 1:
        raise ExportError(f"the generation graph's max_new_tokens must be >= 1, got {max_new_tokens}")
    options = resolve_options(generation_config, config, vocab_size, max_new_tokens=max_new_tokens,
                              num_beams=num_beams, do_sample=False)
    unsupported = {"no_repeat_ngram_size": options.no_repeat_ngram_size != 0,
                   "repetition_penalty": options.repetition_penalty != 1.0,
                   "bad_words_ids": bool(options.bad_words_single or options.bad_words_multi),
                   "num_return_sequences": num_beams == 1 and options.num_return_sequences != 1}
    refused = [name for name, on in unsupported.items() if on]
    if refused:
        raise ExportError(f"the generation graph runs {'greedy' if num_beams == 1 else 'beam'} search with "
                          "min_length, forced_bos_token_id and forced_eos_token_id; this model's generation_config "
                          f"also sets {', '.join(refused)}: generate through the step graph (padfree run --generate)"
                          " instead")
    return options


def _scope(graph: onnx.GraphProto, prefix: str, wired: dict[str, str], into: onnx.GraphProto):
    """(nodes, names) of `graph` with every name it defines prefixed and its inputs renamed by `wired`
    (input -> the name that feeds it); names maps the graph's own names to the new ones. Its
    initializers move into `into` (renamed; `graph` keeps none): one sub-graph's weights are copied at
    a time, so a joined NLLB-600M holds its weights about twice at most, not four times."""
    names = dict(wired)
    for init in graph.initializer:
        names[init.name] = prefix + init.name
    nodes = []
    for node in graph.node:
        for out in node.output:
            if out:
                names[out] = prefix + out
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = prefix + (node.name or node.output[0])
        del copy.input[:]
        copy.input.extend(names.get(i, i) if i else "" for i in node.input)
        del copy.output[:]
        copy.output.extend(names[o] if o else "" for o in node.output)
        nodes.append(copy)
    for init in graph.initializer:
        init.name = names[init.name]
    into.initializer.extend(graph.initializer)
    del graph.initializer[:]
    return nodes, names


def _const(name: str, value, dtype) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(np.asarray(value, dtype), name))


class _Nodes:
    """Appends nodes to a list; op() names each output uniquely under `prefix` and returns it."""

    def __init__(self, nodes: list, prefix: str):
        self.nodes, self.prefix, self.n = nodes, prefix, 0

    def op(self, op_type: str, *inputs: str, outputs: int = 1, out: list[str] | None = None, domain: str = "",
           **attrs):
        names = out or [f"{self.prefix}{op_type}_{self.n}_{k}" for k in range(outputs)]
        self.n += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=f"{self.prefix}{self.n}",
                                           domain=domain, **attrs))
        return names[0] if len(names) == 1 else names

    def const(self, value, dtype) -> str:
        name = f"{self.prefix}const_{self.n}"
        self.n += 1
        self.nodes.append(_const(name, value, dtype))
        return name


def _own_workspace(node: onnx.NodeProto) -> None:
    kept = [a for a in node.attribute if a.name != "own_workspace"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("own_workspace", 1)])


def _vi(name: str, elem: int, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def _forced_by_step(options) -> np.ndarray:
    """The forced token of each step ([max_length] int32, -1 where none), padfree.generation.processors'
    rule: forced_bos_token_id at step 0, forced_eos_token_id at the last step (it wins over a bos there)."""
    forced = np.full([options.max_length], -1, np.int32)
    if options.forced_bos_token_id is not None:
        forced[0] = options.forced_bos_token_id
    if options.forced_eos_token_id is not None and options.max_length >= 2:
        forced[options.max_length - 2] = options.forced_eos_token_id
    return forced


def _initial_cache(g: "_Nodes", rows: str, rows_scalar: str, heads: int, n: int, head_dim: int,
                   cache_type: int) -> tuple[str, str]:
    """(zero K/V cache [R, heads, N, head_dim], cache indirection [R, N] with every row reading its own
    history) for R = rows ([1] int64; rows_scalar its scalar)."""
    cache_shape = g.op("Concat", rows, g.const([heads, n, head_dim], np.int64), axis=0)
    cache = g.op("ConstantOfShape", cache_shape, value=helper.make_tensor("zero", cache_type, [1], [0]))
    row_col = g.op("Unsqueeze", g.op("Range", g.const(0, np.int64), rows_scalar, g.const(1, np.int64)),
                   g.const([1], np.int64))
    indir = g.op("Cast", g.op("Expand", row_col, g.op("Concat", rows, g.const([n], np.int64), axis=0)),
                 to=TensorProto.INT32)
    return cache, indir


def _step_body(step: onnx.ModelProto, model: onnx.ModelProto, ids: str, cache_indir: str, ckv_names: dict,
               layers: int) -> tuple[list, dict]:
    """The decoder step's nodes for the loop body (its weights moved to the outer graph, read from the
    outer scope; its plugins on their own scratch) and their names: input_ids from `ids`, the caches from
    the carried b/past_*, the cross-attention memory from cross_kv's outputs."""
    wired = {"input_ids": ids, "step": "b/step", "cache_indir": cache_indir, "cu_seqlens": "cu_seqlens",
             "max_seqlen": "max_seqlen"}
    for i in range(layers):
        wired[f"past_key.{i}"], wired[f"past_value.{i}"] = f"b/past_key.{i}", f"b/past_value.{i}"
        wired[f"cross_kv.{i}"] = ckv_names[f"cross_kv.{i}"]
    nodes, names = _scope(step.graph, "step/", wired, model.graph)
    for node in nodes:
        if node.op_type in LOOP_PLUGINS:
            _own_workspace(node)
    return nodes, names


def _facts(options, n: int, **search) -> dict:
    """The options the graph fixed (its `padfree.generation` metadata)."""
    return {**search, "max_new_tokens": n, "min_length": options.min_length,
            "forced_bos_token_id": options.forced_bos_token_id, "forced_eos_token_id": options.forced_eos_token_id,
            "eos_token_ids": list(options.eos_token_ids), "pad_token_id": options.pad_token_id,
            "decoder_start_token_id": options.decoder_start_token_id}


def _processed_topk(b: "_Nodes", logits: str, cur_len: str, step64: str, rows: str, options, k: int,
                    beam_scores: str | None) -> tuple[str, str]:
    """PadfreeLogitsTopK with padfree.generation.processors' step processors as its inputs: eos banned while
    cur_len < min_length, forced_bos / forced_eos at their steps; log_softmax plus the beam scores for beam
    search (beam_scores), raw logits for greedy. Returns (scores fp32 [R, k], ids int32 [R, k])."""
    from ..spec import load as load_spec

    spec = load_spec()
    eos = list(options.eos_token_ids)
    inputs = [logits] + ([beam_scores] if beam_scores is not None else [])
    has_banned = bool(eos) and options.min_length > 1
    if has_banned:
        ban_now = b.op("Less", cur_len, b.const([options.min_length], np.int64))
        row = b.op("Where", ban_now, b.const(np.asarray([eos], np.int32), np.int32),
                   b.const(np.full([1, len(eos)], -1, np.int32), np.int32))
        inputs.append(b.op("Expand", row, b.op("Concat", rows, b.const([len(eos)], np.int64), axis=0)))
    forced = _forced_by_step(options)
    has_forced = bool((forced >= 0).any())
    if has_forced:
        inputs.append(b.op("Expand", b.op("Gather", b.const(forced, np.int32), step64, axis=0), rows))
    fields = {"k": k, "normalize": int(beam_scores is not None), "repetition_penalty": 1.0, "has_bias": 0,
              "has_beam_scores": int(beam_scores is not None), "has_banned": int(has_banned), "has_penalty": 0,
              "has_forced": int(has_forced), "own_workspace": 1}
    scores, ids = b.op("PadfreeLogitsTopK", *inputs, outputs=2, domain=spec.namespace,
                       **spec.node_attributes("PadfreeLogitsTopK", fields))
    return scores, ids


def build_generation_graph(folder: str | Path, max_new_tokens: int) -> onnx.ModelProto:
    """The whole generation of the export in `folder` (written with --io packed) as one graph: greedy, or
    beam search where its decoder step serves num_beams > 1 (`padfree export --num-beams K`)."""
    folder = Path(folder)
    manifest = json.loads((folder / "seq2seq.json").read_text())
    graphs = manifest.get("engine_graphs", {})
    if "encoder_plugins" not in manifest:
        raise ExportError(f"{folder}: the generation graph starts from the packed encoder: export with --io packed")
    from transformers import AutoConfig, GenerationConfig

    decoder = manifest["decoder"]
    num_beams = int(manifest.get("decoder_plugins", {}).get("num_beams", 1))
    options = search_options(GenerationConfig.from_pretrained(folder, manifest["files"]["generation_config"]),
                             AutoConfig.from_pretrained(folder), decoder["vocab_size"], max_new_tokens, num_beams)
    n = max_new_tokens
    encoder = onnx.load(str(folder / graphs["encoder"]))
    cross = onnx.load(str(folder / graphs["cross_kv"]))
    step = onnx.load(str(folder / graphs["decoder_step"]))
    cache_type = next(i.type.tensor_type.elem_type for i in step.graph.input if i.name == "past_key.0")

    main: list[onnx.NodeProto] = []
    model = onnx.ModelProto()  # filled in place: its graph takes each sub-graph's weights as they come
    enc_nodes, enc_names = _scope(encoder.graph, "enc/", {i.name: i.name for i in encoder.graph.input}, model.graph)
    main += enc_nodes
    hidden = enc_names[encoder.graph.output[0].name]
    ckv_nodes, ckv_names = _scope(cross.graph, "ckv/", {cross.graph.input[0].name: hidden}, model.graph)
    main += ckv_nodes
    del cross
    if num_beams > 1:
        return _beam_graph(main, model, encoder, step, ckv_names, options, decoder, n, cache_type)
    return _greedy_graph(main, model, encoder, step, ckv_names, options, decoder, n, cache_type)


def _greedy_graph(main: list, model: onnx.ModelProto, encoder, step, ckv_names: dict, options, decoder: dict, n: int,
                  cache_type: int) -> onnx.ModelProto:
    """Greedy search (R = B rows) in one graph, all inside the loop: the top-1 of the processed logits from
    PadfreeLogitsTopK (raw logits, the processors as its inputs; ties to the smaller id, torch's argmax),
    then PadfreeGreedyStep (the pad token for rows that ended, eos finishing a row; the pad id its field).
    Outputs sequences [B, 1 + N] and lengths [B] (up to and with the eos, or 1 + N)."""
    from ..spec import load as load_spec

    spec = load_spec()
    layers, heads, head_dim = decoder["layers"], decoder["num_heads"], decoder["head_dim"]
    m = options.max_length  # 1 + N
    eos = list(options.eos_token_ids)
    pad = options.pad_token_id if options.pad_token_id is not None else 0
    g = _Nodes(main, "gen/")
    rows = g.op("Sub", g.op("Shape", "cu_seqlens"), g.const([1], np.int64))             # [1]
    rows_s = g.op("Squeeze", rows, g.const([0], np.int64))
    start_row = np.full([1, m], pad, np.int64)
    start_row[0, 0] = options.decoder_start_token_id
    sequences0 = g.op("Expand", g.const(start_row, np.int64), g.op("Concat", rows, g.const([m], np.int64), axis=0))
    generated0 = g.op("Expand", g.const(np.zeros([1], np.int64), np.int64), rows)
    unfinished0 = g.op("Expand", g.const(np.ones([1], np.int32), np.int32), rows)
    cache0, cache_indir = _initial_cache(g, rows, rows_s, heads, n, head_dim, cache_type)  # own history per row

    carried = ["b/step", "b/sequences", "b/generated", "b/unfinished"] + \
        [f"b/past_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
    body_nodes: list = []
    b = _Nodes(body_nodes, "gen/b/")
    step64 = b.op("Cast", "b/step", to=TensorProto.INT64)                 # [1]
    cur_len = b.op("Add", step64, b.const([1], np.int64))                 # tokens so far, the start included
    tokens = b.op("Cast", b.op("Reshape", b.op("Gather", "b/sequences", b.op("Squeeze", step64, b.const([0], np.int64)),
                                               axis=1), b.const([-1], np.int64)), to=TensorProto.INT32)   # [R]
    step_nodes, step_names = _step_body(step, model, tokens, cache_indir, ckv_names, layers)
    body_nodes += step_nodes
    _, top1 = _processed_topk(b, step_names["logits"], cur_len, step64, rows, options, 1, None)
    search_inputs = [top1, "b/step", "b/sequences", "b/generated", "b/unfinished"]
    if eos:
        search_inputs.append(b.const(np.asarray(eos, np.int32), np.int32))
    sequences, generated, unfinished, _next_tokens = b.op(
        "PadfreeGreedyStep", *search_inputs, outputs=4, domain=spec.namespace,
        **spec.node_attributes("PadfreeGreedyStep", {"pad_token_id": int(pad), "has_eos": int(bool(eos))}))
    step_next = b.op("Add", "b/step", b.const([1], np.int32))
    cond = b.op("Identity", "b/cond")
    presents = [step_names[f"present_{kind}.{i}"] for i in range(layers) for kind in ("key", "value")]
    types = [(TensorProto.INT32, [1]), (TensorProto.INT64, ["rows", m]), (TensorProto.INT64, ["rows"]),
             (TensorProto.INT32, ["rows"])] + [(cache_type, ["rows", heads, n, head_dim])] * (2 * layers)
    body_in = [_vi("b/iteration", TensorProto.INT64, []), _vi("b/cond", TensorProto.BOOL, [])] + \
        [_vi(name, *t) for name, t in zip(carried, types)]
    produced = [step_next, sequences, generated, unfinished] + presents
    body_out = [_vi(cond, TensorProto.BOOL, [])] + [_vi(name, *t) for name, t in zip(produced, types)]
    body = helper.make_graph(body_nodes, "greedy_step", body_in, body_out)
    initial = [g.const([0], np.int32), sequences0, generated0, unfinished0] + [cache0] * (2 * layers)
    finals = [f"gen/final_{i}" for i in range(len(initial))]
    main.append(helper.make_node("Loop", [g.const(n, np.int64), g.const(True, bool)] + initial, finals,
                                 name="gen/loop", body=body))
    # lengths: up to and with the eos (generated + 1 for the start token), or all 1 + N for a row that ran on
    g.op("Cast", finals[1], to=TensorProto.INT32, out=["sequences"])
    ran_on = g.op("Cast", finals[3], to=TensorProto.BOOL)
    with_start = g.op("Add", finals[2], g.const(np.int64(1), np.int64))
    g.op("Cast", g.op("Where", ran_on, g.const(np.int64(m), np.int64), with_start), to=TensorProto.INT32,
         out=["lengths"])
    outputs = [_vi("sequences", TensorProto.INT32, ["batch", m]), _vi("lengths", TensorProto.INT32, ["batch"])]
    opsets = {o.domain: o.version for mdl in (encoder, step) for o in mdl.opset_import}
    opsets[spec.namespace] = 1
    _finish(model, "padfree_greedy_generation", main, list(encoder.graph.input), outputs, opsets, step.ir_version)
    helper.set_model_props(model, {"padfree.generation": json.dumps(_facts(options, n, search="greedy"))})
    return model


def _finish(model: onnx.ModelProto, name: str, nodes: list, inputs, outputs, opsets: dict, ir_version: int) -> None:
    """The joined graph's nodes, I/O and opsets, set on `model` in place (helper.make_model would copy
    every weight once more)."""
    model.graph.name = name
    model.graph.node.extend(nodes)
    model.graph.input.extend(inputs)
    model.graph.output.extend(outputs)
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in opsets.items())
    model.ir_version = ir_version
    model.producer_name = "padfree"


def _beam_graph(main: list, model: onnx.ModelProto, encoder, step, ckv_names: dict, options, decoder: dict, n: int,
                cache_type: int) -> onnx.ModelProto:
    """The whole beam search (num_beams K > 1) in one graph, all inside the loop: the candidates from
    PadfreeLogitsTopK (log_softmax, the processors, + the beam scores), HF's bookkeeping in one
    PadfreeBeamSearchStep node (its options as the node's fields; its ONNX Runtime reference is
    padfree.generation.beam_search's tensorised step in standard ONNX, export/reference.py), and the
    cache indirection reordered by PadfreeBeamReorder. Outputs the pool's best num_return_sequences per
    source: sequences [B, n_ret, 1 + N], lengths [B, n_ret] and scores [B, n_ret] (HF's
    sequences_scores)."""
    from padfree.generation.beam_search import NEG, _fill_value
    from padfree.ops.search import EARLY_STOPPING

    from ..spec import load as load_spec

    spec = load_spec()
    layers, heads, head_dim = decoder["layers"], decoder["num_heads"], decoder["head_dim"]
    k = options.num_beams
    keep = options.candidates_per_row * k
    m = options.max_length  # 1 + N
    lp, early = float(options.length_penalty), options.early_stopping
    eos = list(options.eos_token_ids)
    fill = _fill_value(options)
    returned = options.num_return_sequences
    g = _Nodes(main, "gen/")
    batch = g.op("Sub", g.op("Shape", "cu_seqlens"), g.const([1], np.int64))            # [1]
    rows = g.op("Mul", batch, g.const([k], np.int64))
    rows_s = g.op("Squeeze", rows, g.const([0], np.int64))

    def shape(*parts):
        return g.op("Concat", *[p if isinstance(p, str) else g.const(list(p), np.int64) for p in parts], axis=0)
    start_row = np.full([m], fill, np.int64)
    start_row[0] = options.decoder_start_token_id
    running0 = g.op("Expand", g.const(start_row.reshape(1, 1, m), np.int64), shape(batch, (k, m)))
    score_row = np.full([1, k], NEG, np.float32)
    score_row[0, 0] = 0.0                                   # only beam 0's continuations count at first
    running_scores0 = g.op("Expand", g.const(score_row, np.float32), shape(batch, (k,)))
    pool_scores0 = g.op("Expand", g.const(np.full([1, k], NEG, np.float32), np.float32), shape(batch, (k,)))
    lengths0 = g.op("Expand", g.const(np.zeros([1, k], np.int64), np.int64), shape(batch, (k,)))
    finished0 = g.op("Expand", g.const(np.zeros([1, k], np.int32), np.int32), shape(batch, (k,)))
    improvable0 = g.op("Expand", g.const(np.ones([1], np.int32), np.int32), batch)
    cache0, indir0 = _initial_cache(g, rows, rows_s, heads, n, head_dim, cache_type)
    step0 = g.const([0], np.int32)

    # ---- the body --------------------------------------------------------------------------------------
    carried = ["b/step", "b/running", "b/running_scores", "b/pool", "b/pool_scores", "b/pool_lengths",
               "b/pool_finished", "b/improvable", "b/cache_indir"] + \
        [f"b/past_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
    body_nodes: list = []
    b = _Nodes(body_nodes, "gen/b/")
    step64 = b.op("Cast", "b/step", to=TensorProto.INT64)                 # [1]
    step_s = b.op("Squeeze", step64, b.const([0], np.int64))
    cur_len = b.op("Add", step64, b.const([1], np.int64))                 # tokens so far, the start included
    tokens = b.op("Cast", b.op("Reshape", b.op("Gather", "b/running", step_s, axis=2), b.const([-1], np.int64)),
                  to=TensorProto.INT32)   # [R]
    step_nodes, step_names = _step_body(step, model, tokens, "b/cache_indir", ckv_names, layers)
    body_nodes += step_nodes
    logits = step_names["logits"]   # in the export's dtype: the top-k reads it as it is, scores in float32
    # the processors of padfree.generation.processors as the top-k plugin's inputs, the beam scores added
    beam_scores = b.op("Reshape", "b/running_scores", b.const([-1], np.int64))
    cand_scores, cand_ids = _processed_topk(b, logits, cur_len, step64, rows, options, keep, beam_scores)
    search_inputs = [cand_scores, cand_ids, "b/step", "b/running", "b/running_scores", "b/pool", "b/pool_scores",
                     "b/pool_lengths", "b/pool_finished", "b/improvable"]
    if eos:
        search_inputs.append(b.const(np.asarray(eos, np.int32), np.int32))
    search_fields = {"num_beams": k, "length_penalty": lp, "early_stopping": EARLY_STOPPING[early],
                     "has_eos": int(bool(eos)), "own_workspace": 1}
    (running, running_scores, pool, pool_scores, pool_lengths, pool_finished, improvable, _next_tokens,
     parents) = b.op("PadfreeBeamSearchStep", *search_inputs, outputs=9, domain=spec.namespace,
                     **spec.node_attributes("PadfreeBeamSearchStep", search_fields))
    indir = b.op("PadfreeBeamReorder", "b/cache_indir", parents, "b/step", domain=spec.namespace,
                 **spec.node_attributes("PadfreeBeamReorder", {}))
    step_next = b.op("Add", "b/step", b.const([1], np.int32))
    cond = b.op("Identity", "b/cond")

    presents = [step_names[f"present_{kind}.{i}"] for i in range(layers) for kind in ("key", "value")]
    dims_bk, dims_bkm = ["batch", k], ["batch", k, m]
    cache_dims = ["rows", heads, n, head_dim]
    types = [(TensorProto.INT32, [1]), (TensorProto.INT64, dims_bkm), (TensorProto.FLOAT, dims_bk),
             (TensorProto.INT64, dims_bkm), (TensorProto.FLOAT, dims_bk), (TensorProto.INT64, dims_bk),
             (TensorProto.INT32, dims_bk), (TensorProto.INT32, ["batch"]), (TensorProto.INT32, ["rows", n])] + \
        [(cache_type, cache_dims)] * (2 * layers)
    body_in = [_vi("b/iteration", TensorProto.INT64, []), _vi("b/cond", TensorProto.BOOL, [])] + \
        [_vi(name, *t) for name, t in zip(carried, types)]
    produced = [step_next, running, running_scores, pool, pool_scores, pool_lengths, pool_finished, improvable,
                indir] + presents
    body_out = [_vi(cond, TensorProto.BOOL, [])] + [_vi(name, *t) for name, t in zip(produced, types)]
    body = helper.make_graph(body_nodes, "beam_step", body_in, body_out)
    initial = [step0, running0, running_scores0, running0, pool_scores0, lengths0, finished0, improvable0, indir0] + \
        [cache0] * (2 * layers)
    finals = [f"gen/final_{i}" for i in range(len(initial))]
    main.append(helper.make_node("Loop", [g.const(n, np.int64), g.const(True, bool)] + initial, finals,
                                 name="gen/loop", body=body))
    pool_f, pool_scores_f, pool_lengths_f = finals[3], finals[4], finals[5]
    first, ret = g.const([0], np.int64), g.const([returned], np.int64)
    axis1 = g.const([1], np.int64)
    g.op("Cast", g.op("Slice", pool_f, first, ret, axis1), to=TensorProto.INT32, out=["sequences"])
    g.op("Cast", g.op("Add", g.op("Slice", pool_lengths_f, first, ret, axis1), g.const(np.int64(1), np.int64)),
         to=TensorProto.INT32, out=["lengths"])
    g.op("Slice", pool_scores_f, first, ret, axis1, out=["scores"])
    outputs = [_vi("sequences", TensorProto.INT32, ["batch", returned, m]),
               _vi("lengths", TensorProto.INT32, ["batch", returned]),
               _vi("scores", TensorProto.FLOAT, ["batch", returned])]
    opsets = {o.domain: o.version for mdl in (encoder, step) for o in mdl.opset_import}
    opsets[spec.namespace] = 1
    _finish(model, "padfree_beam_generation", main, list(encoder.graph.input), outputs, opsets, step.ir_version)
    helper.set_model_props(model, {"padfree.generation": json.dumps(_facts(
        options, n, search="beam", num_beams=k, num_return_sequences=returned, length_penalty=lp,
        early_stopping=early))})
    return model
