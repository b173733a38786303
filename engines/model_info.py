"""What the builder and the runtime need to know about an ONNX encoder: its I/O form, float dtype,
inputs and outputs, the plugin nodes it uses, vocabulary sizes and the longest position the model
allows. Sizes come from the tables the ids index (the weights decide what an id means); the
exporter's metadata_props "padfree.*", which anyone can edit, only fill in what the graph does not
tell."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from padfree.positions import positions_served

from .errors import BuildError

PLUGIN_NAMESPACE = "padfree"


def aliasing_plugins() -> frozenset[str]:
    """The plugins whose outputs alias inputs (the spec's "aliases"; IPluginV3OneBuildV2::getAliasedInput): a
    network with one builds only with TensorRT's preview feature ALIASED_PLUGIN_IO_10_03 (docs/PLUGINS.md,
    trt_api.Api.allow_aliased_plugin_io)."""
    from padfree.export import spec
    return frozenset(name for name, plugin in spec.load().plugins.items() if plugin.aliases_inputs)

_FLOAT_DTYPES = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}


@dataclass
class Tensor:
    name: str
    dtype: str  # numpy-style name: "int32", "int64", "float32", ...
    shape: list  # ints and symbolic names


@dataclass
class ModelInfo:
    # "packed" (input_ids[T], cu_seqlens, max_seqlen) or "padded" (input_ids[B, S], ...): an encoder;
    # "decoder_step" (cache_indir, the caches; a seq2seq export's decoder step, plain or swapped) or
    # "cross_kv" (encoder_hidden_states [T, hidden]): the other graphs of a seq2seq export
    io: str
    float_dtype: str  # "fp32" | "fp16" | "bf16"
    inputs: list[Tensor]
    outputs: list[Tensor]
    plugins: list[str] = field(default_factory=list)  # padfree plugin op types in the graph
    plugin_nodes: dict[str, int] = field(default_factory=dict)  # op type -> number of nodes
    vocab_size: int | None = None
    type_vocab_size: int | None = None  # 0: the model takes no token types
    max_positions: int | None = None  # longest sequence the position table allows
    # RoBERTa-style numbering: positions count the tokens that are not this id (HF), so a sequence
    # holding it inside would be numbered differently by padfree; the runtime refuses such input.
    position_pad_id: int | None = None
    attention_sizes: list = field(default_factory=list)  # (num_heads, head_dim) of each PadfreeAttention node
    num_beams: int | None = None  # the cross-attention nodes' field: rows = batch x num_beams (decoder step)
    aliased_plugin_io: bool = False  # a plugin aliases outputs to inputs (aliasing_plugins())
    # io "generation": the search the graph runs, as it records it (its padfree.generation metadata:
    # search, max_new_tokens, num_beams, ...), so the engine states what it generates
    generation: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _tensor(value_info) -> Tensor:
    t = value_info.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "unknown"
    return Tensor(value_info.name, dtype, dims)


def _nodes(graph):
    """The graph's nodes and, depth first, those of its subgraphs (a Loop's body)."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(a.g)


def _generation_facts(text: str | None, path) -> dict:
    """A generation graph's padfree.generation metadata: an object naming its search and its length."""
    try:
        facts = json.loads(text) if text is not None else None
    except ValueError:
        facts = None
    if not isinstance(facts, dict) or facts.get("search") not in ("greedy", "beam") or \
            not isinstance(facts.get("max_new_tokens"), int) or facts["max_new_tokens"] < 1:
        raise BuildError(f"{path}: a generation graph without its padfree.generation metadata (the search it runs "
                         f"and its max_new_tokens): export it again with `padfree export --generation-graph N`")
    return facts


def read(path: str | Path) -> ModelInfo:
    """Reads the graph structure only (external weights are not loaded)."""
    from padfree.export.errors import ExportError
    from padfree.export.onnx_files import load_model
    try:
        model = load_model(path, "the model", load_external_data=False)
    except ExportError as e:
        raise BuildError(str(e)) from e
    graph = model.graph
    initializer_names = {i.name for i in graph.initializer}
    inputs = [_tensor(i) for i in graph.input if i.name not in initializer_names]
    outputs = [_tensor(o) for o in graph.output]
    generation = {"sequences", "lengths"} <= {o.name for o in graph.output}  # generation.padfree.onnx
    # a generation graph's outputs are token ids: its weights' dtype is the model's
    typed = graph.initializer if generation else [o.type.tensor_type for o in graph.output]
    float_types = {getattr(t, "elem_type", getattr(t, "data_type", None)) for t in typed} & set(_FLOAT_DTYPES)
    if len(float_types) != 1:
        raise BuildError(f"{path}: expected float {'weights' if generation else 'outputs'} of one dtype (float32,"
                         " float16 or bfloat16)")
    plugin_nodes: dict[str, int] = {}
    attention_sizes = []
    for n in _nodes(graph):
        if n.domain == PLUGIN_NAMESPACE or n.op_type.startswith("Padfree"):
            plugin_nodes[n.op_type] = plugin_nodes.get(n.op_type, 0) + 1
        if n.op_type == "PadfreeAttention":
            fields = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            attention_sizes.append((int(fields.get("num_heads", 0)), int(fields.get("head_dim", 0))))
    names = {t.name for t in inputs}
    io = ("generation" if generation else "decoder_step" if "cache_indir" in names
          else "cross_kv" if "encoder_hidden_states" in names else "packed" if "cu_seqlens" in names else "padded")
    beams = {int(onnx.helper.get_attribute_value(a)) for n in _nodes(graph)
             if n.op_type == "PadfreeDecoderCrossAttention"
             for a in n.attribute if a.name == "num_beams"}
    if len(beams) > 1:
        raise BuildError(f"{path}: the cross-attention nodes disagree on num_beams ({sorted(beams)})")
    info = ModelInfo(io=io,
                     float_dtype=_FLOAT_DTYPES[float_types.pop()], inputs=inputs, outputs=outputs,
                     plugins=sorted(plugin_nodes), plugin_nodes=plugin_nodes, attention_sizes=attention_sizes,
                     num_beams=beams.pop() if beams else None,
                     aliased_plugin_io=bool(aliasing_plugins() & set(plugin_nodes)))
    meta = {p.key: p.value for p in model.metadata_props}
    if io == "generation":
        info.generation = _generation_facts(meta.get("padfree.generation"), path)
    if io in ("decoder_step", "cross_kv", "generation"):
        return info  # no token embedding or position table of an encoder to size

    def meta_int(key: str) -> int | None:
        try:
            return int(meta[key])
        except (KeyError, ValueError):
            return None

    # The tables first: metadata is only a fallback for a graph whose tables cannot be told apart.
    info.vocab_size = _table_rows(graph, "input_ids", "word_embeddings")
    if info.vocab_size is None:
        info.vocab_size = meta_int("padfree.vocab_size")
    if "token_type_ids" not in names:
        info.type_vocab_size = 0  # nothing to feed them through: the model takes none
    else:
        info.type_vocab_size = _table_rows(graph, "token_type_ids", "token_type_embeddings")
        if info.type_vocab_size is None:
            info.type_vocab_size = meta_int("padfree.type_vocab_size")
    offset = _position_offset(graph)
    rows = _table_rows(graph, None, "position_embeddings")
    if rows is None:
        rows = meta_int("padfree.max_position_embeddings")
    if rows is not None:
        # a plugin node states its offset; a plain export's model type (metadata) says how it numbers
        info.max_positions = rows - offset if offset is not None else positions_served(
            rows, meta.get("padfree.model_type", ""), meta_int("padfree.pad_token_id") or 0)
        if info.max_positions < 1:
            raise BuildError(f"{path}: the position table has {rows} rows, none left after the position offset")
    info.position_pad_id = offset - 1 if offset else None
    return info


def _position_offset(graph) -> int | None:
    """The position of a sequence's first token, as the PadfreeEmbLayerNorm node says (RoBERTa:
    padding_idx + 1); None for a graph without one (a plain export)."""
    for n in graph.node:
        if n.op_type == "PadfreeEmbLayerNorm":
            fields = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            value = fields.get("position_offset", 0)
            return int(value) if isinstance(value, int) and value >= 0 else 0
    return None


def _table_rows(graph, ids_input: str, table_port: str) -> int | None:
    """Rows of the one 2-D initializer that `ids_input` indexes: a PadfreeEmbLayerNorm node's
    `table_port` input (the ids reach it packed, in either I/O form), or the data of a Gather that
    reads the graph input `ids_input` itself (a plain export); else HF's table name; None if unsure."""
    from padfree.export.spec import load

    tables = {i.name: i for i in graph.initializer if len(i.dims) == 2}
    names = set()
    for n in graph.node:
        if n.op_type == "PadfreeEmbLayerNorm":
            fields = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            try:
                ports = load()["PadfreeEmbLayerNorm"].input_names(fields)
            except (KeyError, ValueError):  # a malformed node: the parser will say so
                continue
            if table_port in ports and ports.index(table_port) < len(n.input):
                names.add(n.input[ports.index(table_port)])
        elif n.op_type == "Gather" and len(n.input) == 2 and n.input[1] == ids_input:
            names.add(n.input[0])
    found = [tables[name] for name in names if name in tables]
    if not names:
        found = [t for t in tables.values() if table_port in t.name]
    return int(found[0].dims[0]) if len(found) == 1 else None
