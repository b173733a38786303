"""word + position (+ token type) embedding Gathers summed (then LayerNorm) -> PadfreeEmbLayerNorm.

The sum is found from the word Gather (the one indexing input_ids) up through the Adds whose other
operands are embedding Gathers too. Where the sum's one reader is a LayerNormalization (BERT, BART's
layernorm_embedding) the plugin ends in it; where the sum is read as it is (Marian: the first
attention's Q, K, V and its residual; M2M100: the first pre-LN LayerNorm and the residual) the plugin
outputs the sum (has_layernorm 0), and whatever reads it stays as it was.

A word Gather scaled by a constant (Marian, M2M100, mBART's embed_scale) has the scale folded into its
table: the product of each row with the scale in float32 is what the model's own multiply computes.

The word and token-type Gathers are recognised by the model input they index (input_ids,
token_type_ids); the position Gather is the remaining one (possibly on flattened ids and reshaped
back, as M2M100's index_select), and its position_offset comes from evaluating the exporter's own
position-id subgraph on probe inputs (0 for BERT's and Marian's arange, padding_idx + 1 for RoBERTa's
and M2M100's cumulative count of non-padding tokens); the position summand's probe value must then
be the table's rows offset + t, so a reshape or a table the plugin would read differently is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from ..context import CU_SEQLENS, DIM_T, INPUT_IDS, TOKEN_TYPE_IDS, Context, PassReport, log
from ..graph import const_value, producer_op
from ..probe import evaluate
from . import _probe_inputs
from ._layernorm import match_layernorm

NAME = "embeddings"


@dataclass
class _Leaf:
    """A summand of the embedding sum: Gather(table, ids), maybe times a scalar, maybe reshaped."""
    tensor: gs.Tensor
    gather: gs.Node
    scale: float | None = None
    reshaped: bool = False


def _summands(t: gs.Tensor) -> list[gs.Tensor]:
    """Leaves of a tree of Adds whose inner results are used only inside the tree."""
    node = producer_op(t, "Add")
    if node is None:
        return [t]
    leaves = []
    for x in node.inputs:
        inner = producer_op(x, "Add") is not None and len(x.outputs) == 1
        leaves.extend(_summands(x) if inner else [x])
    return leaves


def _leaf(t: gs.Tensor) -> _Leaf | None:
    """t as an embedding lookup from a constant table (read only by the sum), or None: Gather(table,
    ids) on axis 0; Mul(that, scalar constant) (a scaled word embedding); Reshape(that) (M2M100's
    positions, gathered on flattened ids)."""
    mul = producer_op(t, "Mul")
    if mul is not None and len(t.outputs) == 1:
        for x, c in (mul.inputs, mul.inputs[::-1]):
            scale = const_value(c)
            inner = _leaf(x)
            if inner is not None and scale is not None and scale.size == 1 and len(x.outputs) == 1 \
                    and inner.scale is None and not inner.reshaped:
                return _Leaf(t, inner.gather, float(scale.reshape(())))
        return None
    reshape = producer_op(t, "Reshape")
    if reshape is not None:
        x = reshape.inputs[0]
        inner = _leaf(x)
        if inner is None or len(x.outputs) != 1 or inner.scale is not None or inner.reshaped:
            return None
        return _Leaf(t, inner.gather, reshaped=True)
    gather = producer_op(t, "Gather")
    if gather is None or gather.attrs.get("axis", 0) != 0 or const_value(gather.inputs[0]) is None:
        return None
    return _Leaf(t, gather)


def _indexed_input(ctx: Context, indices: gs.Tensor) -> str | None:
    """Which original model input a Gather's indices are (through Casts), if any."""
    while (cast := producer_op(indices, "Cast")) is not None:
        indices = cast.inputs[0]
    for name, t in ctx.original_inputs.items():
        if t is indices:
            return name
    return None


def _sum_of(word: gs.Tensor) -> gs.Tensor:
    """The embedding sum the word lookup `word` is part of: up through each Add that reads it alone and
    whose other operand is a sum of embedding lookups too (a residual Add reads more than the sum)."""
    t = word
    while len(t.outputs) == 1 and t.outputs[0].op == "Add" and len(t.outputs[0].outputs) == 1:
        add = t.outputs[0]
        others = [x for x in add.inputs if x is not t]
        if len(others) != 1 or any(_leaf(x) is None for x in _summands(others[0])):
            break
        t = add.outputs[0]
    return t


def _position_offset(ctx: Context, leaf: _Leaf) -> int | str:
    """The offset such that the position of token t of every sequence is offset + t, or why not; the
    position summand must then hold the table's rows offset + t for the probe's tokens."""
    indices = leaf.gather.inputs[1]
    feeds = _probe_inputs.feeds(ctx, [leaf.tensor])
    try:
        pos, rows = evaluate(ctx.graph, [indices, leaf.tensor], feeds)
    except Exception as e:  # noqa: BLE001 - reported as a non-match
        return f"could not evaluate the position ids ({type(e).__name__}: {e})"
    seqlen = _probe_inputs.PROBE_MASK.shape[1]
    # [..., S] ids, or the [B * S] ids a gather on flattened ids takes (reshaped to [B, S, H] after)
    if pos.ndim == 0 or pos.size % seqlen or (not leaf.reshaped and pos.shape[-1] != seqlen):
        return f"position ids have shape {list(pos.shape)}, expected [..., {seqlen}] for the probe"
    ids = pos.reshape(-1, seqlen)
    offset = int(ids[0, 0])
    if not (ids == offset + np.arange(seqlen)).all():
        return f"position ids {ids.tolist()} are not offset + t within each sequence"
    table = const_value(leaf.gather.inputs[0])
    hidden = table.shape[-1]
    if rows.ndim < 2 or rows.shape[-2:] != (seqlen, hidden) or \
            not (rows.reshape(-1, seqlen, hidden) == table[offset:offset + seqlen]).all():
        return (f"the position embeddings (shape {list(rows.shape)}) are not the table's rows offset + t "
                f"for each sequence")
    return offset


def _fuse(ctx: Context, total: gs.Tensor, report: PassReport) -> None:
    """Replace the embedding sum `total` (and the LayerNorm that is its one reader, if so) with the plugin."""
    readers = total.outputs
    ln_node = readers[0] if len(readers) == 1 and readers[0].op == "LayerNormalization" \
        and readers[0].inputs[0] is total else None
    where = (f"embedding sum into {ln_node.op} '{ln_node.name}'" if ln_node is not None
             else f"embedding sum '{total.name}'")
    leaves = [_leaf(t) for t in _summands(total)]
    if any(leaf is None for leaf in leaves):  # _sum_of stops before any other summand; a guard
        report.miss(f"{where}: a summand that is not an embedding lookup")
        return
    roles: dict[str, _Leaf] = {}
    for leaf in leaves:
        role = _indexed_input(ctx, leaf.gather.inputs[1]) or "position"
        if role in roles or role not in (INPUT_IDS, TOKEN_TYPE_IDS, "position"):
            report.miss(f"{where}: unexpected Gather by {role}")
            return
        roles[role] = leaf
    if INPUT_IDS not in roles or "position" not in roles:
        report.miss(f"{where}: needs word and position Gathers, found {sorted(roles)}")
        return
    if any(roles[r].scale is not None for r in roles if r != INPUT_IDS):
        report.miss(f"{where}: a scaled position or token-type embedding (only the word embedding's scale folds)")
        return
    if any(roles[r].reshaped for r in roles if r != "position"):
        report.miss(f"{where}: a reshaped word or token-type embedding")
        return
    ln = match_layernorm(ctx, ln_node) if ln_node is not None else None
    if isinstance(ln, str):
        report.miss(f"{where}: {ln}")
        return
    offset = _position_offset(ctx, roles["position"])
    if isinstance(offset, str):
        report.miss(f"{where}: {offset}")
        return
    word = roles[INPUT_IDS].gather.inputs[0]
    scale = roles[INPUT_IDS].scale
    if scale is not None:
        # the word embedding's scale folded into its table: a float32 product, the same as the model's
        # own multiply of each looked-up row
        table = const_value(word)
        word = ctx.const("scaled_word_embeddings", (table * table.dtype.type(scale)).astype(table.dtype))
    has_type = TOKEN_TYPE_IDS in roles
    inputs = [ctx.packed(INPUT_IDS)] + ([ctx.packed(TOKEN_TYPE_IDS)] if has_type else [])
    inputs += [ctx.packed(CU_SEQLENS), word, roles["position"].gather.inputs[0]]
    inputs += [roles[TOKEN_TYPE_IDS].gather.inputs[0]] if has_type else []
    inputs += [ln.gamma, ln.beta] if ln is not None else []
    # the plugin takes over the tensor its readers read: the LayerNorm's output, or the sum itself
    producer = ln_node if ln is not None else total.inputs[0]
    out = producer.outputs[0]
    producer.outputs.clear()
    out.shape = [DIM_T, const_value(word).shape[1]]
    fields = {"epsilon": ln.epsilon if ln is not None else 0.0, "position_offset": offset,
              "has_token_type": int(has_type), "has_layernorm": int(ln is not None)}
    ctx.plugin("PadfreeEmbLayerNorm", inputs, [out], fields)
    report.add("PadfreeEmbLayerNorm")
    log.debug("embeddings: fused %s (position_offset %d, token types %s, LayerNorm %s)", where, offset,
              has_type, ln is not None)


def run(graph: gs.Graph, ctx: Context) -> gs.Graph:
    report = PassReport(NAME)
    ctx.reports.append(report)
    word_gathers = [n for n in graph.nodes if n.op == "Gather" and len(n.inputs) == 2
                    and _indexed_input(ctx, n.inputs[1]) == INPUT_IDS]
    sums: dict[int, gs.Tensor] = {}
    for gather in word_gathers:
        word = gather.outputs[0]
        if len(word.outputs) == 1 and word.outputs[0].op == "Mul" and _leaf(word.outputs[0].outputs[0]) is not None:
            word = word.outputs[0].outputs[0]  # the scaled lookup
        total = _sum_of(word)
        if total is not word:
            sums.setdefault(id(total), total)
    for total in sums.values():
        _fuse(ctx, total, report)
    if not report.fused and not report.unmatched:
        report.miss("no sum of embedding Gathers "
                    f"({len(word_gathers)} Gather(s) index input_ids)")
    return graph.cleanup()
