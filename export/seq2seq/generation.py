"""generation.padfree.onnx: a whole greedy generation in one graph, the form of a whole-generation engine.

    inputs   input_ids int32 [T]       the sources' tokens, packed end to end
             cu_seqlens int32 [B+1]    where each source starts
             max_seqlen int32 [S]      a tensor as long as the longest source (a shape input, as the
                                       packed encoder's and the step's)
    outputs  sequences int32 [B, 1+N]  the decoder start token, then N = max_new_tokens tokens per
                                       source, pad after its end (as HF's generate pads)
             lengths int32 [B]         tokens of each sequence up to and including its eos

It is the export's engine graphs joined: encoder.padfree.onnx (packed) -> cross_kv.onnx -> an ONNX
`Loop` of N steps whose body is decoder_step.padfree.onnx plus HF's greedy pick, the K/V caches, the
last tokens, the step, the finished flags and the lengths loop-carried, each step's tokens a scan
output. What the body adds to the step's logits is padfree.generation's processors for greedy search,
as standard ONNX: the eos ban while the sequence is shorter than min_length, forced_bos_token_id at
the first step, forced_eos_token_id at the last, then the first maximum (ArgMax: the smaller id on a
tie, torch's argmax) and the pad token for rows that have finished. The loop runs all N steps (a
fixed trip count keeps the scan output's shape the same in every backend; finished rows only pad).

Why the rules below:
- max_new_tokens is fixed when the graph is written: the caches are [R, H, N, D] inside the loop and
  TensorRT wants the loop's carried shapes fixed per profile; the options are fixed too (an engine
  serializes them), resolved from the model's generation_config as HF's generate resolves them.
- The decoder plugins inside the loop hold their scratch (own_workspace 1): TensorRT-RTX cannot give
  a plugin a workspace inside a loop (docs/PLUGINS.md, "Inside a Loop").
- Greedy only: beam search needs its bookkeeping (finished hypotheses, length penalty) inside the
  loop, which standard ONNX does not express naturally; options that need it, or sampling, are
  refused by name.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ExportError

__all__ = ["GENERATION", "build_generation_graph", "greedy_options"]

GENERATION = "generation.padfree.onnx"  # pipeline.GENERATION
LOOP_PLUGINS = ("PadfreeDecoderSelfAttention", "PadfreeDecoderCrossAttention", "PadfreeLogitsTopK")
NEG_INF = np.float32(-np.inf)


def greedy_options(generation_config, config, vocab_size: int, max_new_tokens: int):
    """The generation options for greedy search with exactly this many new tokens at most
    (padfree.generation's resolution of HF's); refused by name where greedy search in a graph cannot
    honour them."""
    from padfree.generation.options import resolve_options

    if max_new_tokens < 1:
        raise ExportError(f"the generation graph's max_new_tokens must be >= 1, got {max_new_tokens}")
    options = resolve_options(generation_config, config, vocab_size, max_new_tokens=max_new_tokens, num_beams=1,
                              do_sample=False)
    unsupported = {"no_repeat_ngram_size": options.no_repeat_ngram_size != 0,
                   "repetition_penalty": options.repetition_penalty != 1.0,
                   "bad_words_ids": bool(options.bad_words_single or options.bad_words_multi),
                   "num_return_sequences": options.num_return_sequences != 1}
    refused = [name for name, on in unsupported.items() if on]
    if refused:
        raise ExportError(f"the generation graph runs greedy search with min_length, forced_bos_token_id and "
                          f"forced_eos_token_id; this model's generation_config also sets {', '.join(refused)}: "
                          "generate through the step graph (padfree run --generate) instead")
    return options


def _scope(graph: onnx.GraphProto, prefix: str, wired: dict[str, str]):
    """(nodes, initializers, names) of `graph` with every name it defines prefixed; its inputs renamed
    by `wired` (input -> the name that feeds it). names maps the graph's own names to the new ones."""
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
    inits = []
    for init in graph.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = names[init.name]
        inits.append(copy)
    return nodes, inits, names


def _const(name: str, value, dtype) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(np.asarray(value, dtype), name))


def _own_workspace(node: onnx.NodeProto) -> None:
    kept = [a for a in node.attribute if a.name != "own_workspace"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("own_workspace", 1)])


def _greedy_pick(b: list, logits: str, step: str, done: str, options, vocab: int) -> tuple[str, str]:
    """Nodes appended to `b`: the processors and the pick; returns (next ids int32 [R], done [R])."""
    n = len(b)

    def name(tag):
        return f"gen/pick/{tag}_{n}"
    x = logits
    step64 = name("step64")
    b.append(helper.make_node("Cast", [step], [step64], to=TensorProto.INT64))
    eos = list(options.eos_token_ids)
    if eos and options.min_length > 1:  # cur_len = step + 1 < min_length: eos may not come
        b.append(_const(name("min_last"), [options.min_length - 2], np.int64))
        b.append(helper.make_node("LessOrEqual", [step64, name("min_last")], [name("too_short")]))
        mask = np.zeros([1, vocab], bool)
        mask[0, eos] = True
        b.append(_const(name("eos_mask"), mask, bool))
        b.append(helper.make_node("And", [name("eos_mask"), name("too_short")], [name("ban")]))
        b.append(_const(name("neg_inf"), NEG_INF, np.float32))
        b.append(helper.make_node("Where", [name("ban"), name("neg_inf"), x], [name("min_len_logits")]))
        x = name("min_len_logits")
    # forced tokens by step (HF's order: a forced eos at the last step wins over a forced bos there)
    forced = {}
    if options.forced_bos_token_id is not None:
        forced[0] = options.forced_bos_token_id
    if options.forced_eos_token_id is not None and options.max_length >= 2:
        forced[options.max_length - 2] = options.forced_eos_token_id
    for at, token in sorted(forced.items()):
        row = np.full([1, vocab], NEG_INF, np.float32)
        row[0, token] = 0.0
        b.append(_const(name(f"forced_row_{at}"), row, np.float32))
        b.append(_const(name(f"forced_at_{at}"), [at], np.int64))
        b.append(helper.make_node("Equal", [step64, name(f"forced_at_{at}")], [name(f"is_forced_{at}")]))
        b.append(helper.make_node("Where", [name(f"is_forced_{at}"), name(f"forced_row_{at}"), x],
                                  [name(f"forced_logits_{at}")]))
        x = name(f"forced_logits_{at}")
    b.append(helper.make_node("ArgMax", [x], [name("argmax")], axis=1, keepdims=0))
    b.append(helper.make_node("Cast", [name("argmax")], [name("picked")], to=TensorProto.INT32))
    pad = options.pad_token_id if options.pad_token_id is not None else 0
    b.append(_const(name("pad"), pad, np.int32))
    b.append(helper.make_node("Where", [done, name("pad"), name("picked")], [name("next")]))
    if not eos:
        return name("next"), done
    b.append(_const(name("eos_ids"), np.asarray(eos, np.int32).reshape(1, -1), np.int32))
    b.append(_const(name("axis1"), [1], np.int64))
    b.append(helper.make_node("Unsqueeze", [name("next"), name("axis1")], [name("next_col")]))
    b.append(helper.make_node("Equal", [name("next_col"), name("eos_ids")], [name("is_eos_each")]))
    b.append(helper.make_node("Cast", [name("is_eos_each")], [name("is_eos_i32")], to=TensorProto.INT32))
    b.append(helper.make_node("ReduceMax", [name("is_eos_i32"), name("axis1")], [name("is_eos_any")], keepdims=0))
    b.append(helper.make_node("Cast", [name("is_eos_any")], [name("is_eos")], to=TensorProto.BOOL))
    b.append(helper.make_node("Or", [done, name("is_eos")], [name("done_next")]))
    return name("next"), name("done_next")


def build_generation_graph(folder: str | Path, max_new_tokens: int) -> onnx.ModelProto:
    """The whole greedy generation of the export in `folder` (written with --io packed) as one graph."""
    folder = Path(folder)
    manifest = json.loads((folder / "seq2seq.json").read_text())
    graphs = manifest.get("engine_graphs", {})
    if "encoder_plugins" not in manifest:
        raise ExportError(f"{folder}: the generation graph starts from the packed encoder: export with --io packed")
    from transformers import AutoConfig, GenerationConfig

    decoder = manifest["decoder"]
    options = greedy_options(GenerationConfig.from_pretrained(folder, manifest["files"]["generation_config"]),
                             AutoConfig.from_pretrained(folder), decoder["vocab_size"], max_new_tokens)
    layers, heads, head_dim, vocab = decoder["layers"], decoder["num_heads"], decoder["head_dim"], decoder["vocab_size"]
    n = max_new_tokens
    encoder = onnx.load(str(folder / graphs["encoder"]))
    cross = onnx.load(str(folder / graphs["cross_kv"]))
    step = onnx.load(str(folder / graphs["decoder_step"]))
    cache_type = next(i.type.tensor_type.elem_type for i in step.graph.input if i.name == "past_key.0")

    main: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    enc_nodes, enc_inits, enc_names = _scope(encoder.graph, "enc/", {i.name: i.name for i in encoder.graph.input})
    main += enc_nodes
    inits += enc_inits
    hidden = enc_names[encoder.graph.output[0].name]
    ckv_nodes, ckv_inits, ckv_names = _scope(cross.graph, "ckv/", {cross.graph.input[0].name: hidden})
    main += ckv_nodes
    inits += ckv_inits

    # initial loop state: R = B rows (greedy), caches of N positions, the start token
    main += [_const("gen/one64", [1], np.int64), _const("gen/axis0", [0], np.int64),
             helper.make_node("Shape", ["cu_seqlens"], ["gen/cu_len"]),
             helper.make_node("Sub", ["gen/cu_len", "gen/one64"], ["gen/rows"]),
             helper.make_node("Squeeze", ["gen/rows", "gen/axis0"], ["gen/rows_scalar"]),
             _const("gen/cache_tail", [heads, n, head_dim], np.int64),
             helper.make_node("Concat", ["gen/rows", "gen/cache_tail"], ["gen/cache_shape"], axis=0),
             helper.make_node("ConstantOfShape", ["gen/cache_shape"], ["gen/cache0"],
                              value=helper.make_tensor("zero", cache_type, [1], [0])),
             _const("gen/start", [options.decoder_start_token_id], np.int32),
             helper.make_node("Expand", ["gen/start", "gen/rows"], ["gen/ids0"]),
             _const("gen/step0", [0], np.int32),
             helper.make_node("ConstantOfShape", ["gen/rows"], ["gen/done0"],
                              value=helper.make_tensor("false", TensorProto.BOOL, [1], [False])),
             helper.make_node("ConstantOfShape", ["gen/rows"], ["gen/len0"],
                              value=helper.make_tensor("zero_i", TensorProto.INT32, [1], [0])),
             # cache_indir [R, N]: every row reads its own history (greedy: no reorder)
             _const("gen/zero_s", 0, np.int64), _const("gen/one_s", 1, np.int64), _const("gen/n", [n], np.int64),
             helper.make_node("Range", ["gen/zero_s", "gen/rows_scalar", "gen/one_s"], ["gen/row_ids"]),
             helper.make_node("Unsqueeze", ["gen/row_ids", "gen/one64"], ["gen/row_col"]),
             helper.make_node("Concat", ["gen/rows", "gen/n"], ["gen/indir_shape"], axis=0),
             helper.make_node("Expand", ["gen/row_col", "gen/indir_shape"], ["gen/indir64"]),
             helper.make_node("Cast", ["gen/indir64"], ["gen/cache_indir"], to=TensorProto.INT32),
             _const("gen/trips", n, np.int64), _const("gen/keep_going", True, bool)]

    # the loop body: the step, the pick, the carried values
    carried = ["b/step", "b/ids"] + [f"b/past_{kind}.{i}" for i in range(layers) for kind in ("key", "value")] \
        + ["b/done", "b/len"]
    wired = {"input_ids": "b/ids", "step": "b/step", "cache_indir": "gen/cache_indir", "cu_seqlens": "cu_seqlens",
             "max_seqlen": "max_seqlen"}
    for i in range(layers):
        wired[f"past_key.{i}"], wired[f"past_value.{i}"] = f"b/past_key.{i}", f"b/past_value.{i}"
        wired[f"cross_kv.{i}"] = ckv_names[f"cross_kv.{i}"]
    body_nodes, step_inits, step_names = _scope(step.graph, "step/", wired)
    for node in body_nodes:
        if node.op_type in LOOP_PLUGINS:
            _own_workspace(node)
    inits += step_inits  # read from the outer scope: the body holds no copy of the weights
    logits = step_names["logits"]
    if step.graph.output[0].type.tensor_type.elem_type != TensorProto.FLOAT:
        body_nodes.append(helper.make_node("Cast", [logits], ["gen/logits32"], to=TensorProto.FLOAT))
        logits = "gen/logits32"
    next_ids, done_next = _greedy_pick(body_nodes, logits, "b/step", "b/done", options, vocab)
    body_nodes += [_const("gen/b/one", [1], np.int32),
                   helper.make_node("Add", ["b/step", "gen/b/one"], ["gen/b/step_next"]),
                   helper.make_node("Not", ["b/done"], ["gen/b/live"]),
                   helper.make_node("Cast", ["gen/b/live"], ["gen/b/live_i32"], to=TensorProto.INT32),
                   helper.make_node("Add", ["b/len", "gen/b/live_i32"], ["gen/b/len_next"]),
                   helper.make_node("Identity", [next_ids], ["gen/b/scan_ids"]),
                   helper.make_node("Identity", ["b/cond"], ["gen/b/cond_next"])]
    presents = [step_names[f"present_{kind}.{i}"] for i in range(layers) for kind in ("key", "value")]
    rows_dim, cache_dims = "rows", ["rows", heads, n, head_dim]

    def vi(name, elem, shape):
        return helper.make_tensor_value_info(name, elem, shape)
    body_in = [vi("b/iteration", TensorProto.INT64, []), vi("b/cond", TensorProto.BOOL, []),
               vi("b/step", TensorProto.INT32, [1]), vi("b/ids", TensorProto.INT32, [rows_dim])]
    body_in += [vi(c, cache_type, cache_dims) for c in carried[2:-2]]
    body_in += [vi("b/done", TensorProto.BOOL, [rows_dim]), vi("b/len", TensorProto.INT32, [rows_dim])]
    body_out = [vi("gen/b/cond_next", TensorProto.BOOL, []), vi("gen/b/step_next", TensorProto.INT32, [1]),
                vi(next_ids, TensorProto.INT32, [rows_dim])]
    body_out += [vi(p, cache_type, cache_dims) for p in presents]
    body_out += [vi(done_next, TensorProto.BOOL, [rows_dim]), vi("gen/b/len_next", TensorProto.INT32, [rows_dim]),
                 vi("gen/b/scan_ids", TensorProto.INT32, [rows_dim])]
    body = helper.make_graph(body_nodes, "greedy_step", body_in, body_out)
    initial = ["gen/step0", "gen/ids0"] + ["gen/cache0"] * (2 * layers) + ["gen/done0", "gen/len0"]
    finals = ["gen/step_f", "gen/ids_f"] + [f"gen/cache_f.{k}" for k in range(2 * layers)] + ["gen/done_f", "gen/len_f"]
    main.append(helper.make_node("Loop", ["gen/trips", "gen/keep_going"] + initial, finals + ["gen/scan_ids"],
                                 name="gen/loop", body=body))
    # sequences [B, 1 + N]: the start token, then each step's tokens; lengths: + 1 for the start token
    main += [helper.make_node("Transpose", ["gen/scan_ids"], ["gen/tokens"], perm=[1, 0]),
             helper.make_node("Unsqueeze", ["gen/ids0", "gen/one64"], ["gen/start_col"]),
             helper.make_node("Concat", ["gen/start_col", "gen/tokens"], ["sequences"], axis=1),
             _const("gen/one_i32", [1], np.int32),
             helper.make_node("Add", ["gen/len_f", "gen/one_i32"], ["lengths"])]
    inputs = [i for i in encoder.graph.input]
    outputs = [vi("sequences", TensorProto.INT32, ["batch", 1 + n]), vi("lengths", TensorProto.INT32, ["batch"])]
    graph = helper.make_graph(main, "padfree_greedy_generation", inputs, outputs, inits)
    opsets = {o.domain: o.version for m in (encoder, cross, step) for o in m.opset_import}
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                              producer_name="padfree")
    model.ir_version = step.ir_version
    helper.set_model_props(model, {"padfree.generation": json.dumps(
        {"search": "greedy", "max_new_tokens": n, "min_length": options.min_length,
         "forced_bos_token_id": options.forced_bos_token_id, "forced_eos_token_id": options.forced_eos_token_id,
         "eos_token_ids": list(options.eos_token_ids), "pad_token_id": options.pad_token_id,
         "decoder_start_token_id": options.decoder_start_token_id})})
    return model
