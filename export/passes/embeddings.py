"""word + position (+ token type) embedding Gathers summed, then LayerNorm -> PadfreeEmbLayerNorm.

A word Gather scaled by a constant (mBART's embed_scale) has the scale folded into its table: the
product of each row with the scale in float32 is what the model's own multiply computes.

The word and token-type Gathers are recognised by the model input they index (input_ids,
token_type_ids); the position Gather is the remaining one, and its position_offset comes from
evaluating the exporter's own position-id subgraph on probe inputs (0 for BERT's arange, padding_idx
+ 1 for RoBERTa's cumulative count of non-padding tokens).
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..context import CU_SEQLENS, DIM_T, INPUT_IDS, TOKEN_TYPE_IDS, Context, PassReport, log
from ..graph import const_value, producer_op
from ..probe import evaluate
from . import _probe_inputs
from ._layernorm import match_layernorm

NAME = "embeddings"


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


def _indexed_input(ctx: Context, indices: gs.Tensor) -> str | None:
    """Which original model input a Gather's indices are (through Casts), if any."""
    while (cast := producer_op(indices, "Cast")) is not None:
        indices = cast.inputs[0]
    for name, t in ctx.original_inputs.items():
        if t is indices:
            return name
    return None


def _position_offset(ctx: Context, indices: gs.Tensor) -> int | str:
    """The offset such that the position of token t of every sequence is offset + t, or why not."""
    feeds = _probe_inputs.feeds(ctx, [indices])
    try:
        (pos,) = evaluate(ctx.graph, [indices], feeds)
    except Exception as e:  # noqa: BLE001 - reported as a non-match
        return f"could not evaluate the position ids ({type(e).__name__}: {e})"
    seqlen = _probe_inputs.PROBE_MASK.shape[1]
    if pos.ndim == 0 or pos.shape[-1] != seqlen:
        return f"position ids have shape {list(pos.shape)}, expected [..., {seqlen}] for the probe"
    rows = pos.reshape(-1, seqlen)
    offset = int(rows[0, 0])
    if not (rows == offset + np.arange(seqlen)).all():
        return f"position ids {rows.tolist()} are not offset + t within each sequence"
    return offset


def _scaled_gather(t: gs.Tensor) -> tuple[gs.Node | None, float | None]:
    """(the Gather, its scale) where t = Mul(Gather(...), scalar constant) read only by the sum (a scaled
    word embedding: Marian, M2M100, mBART); (Gather or None, None) otherwise."""
    mul = producer_op(t, "Mul")
    if mul is None or len(t.outputs) != 1:
        return producer_op(t, "Gather"), None
    for x, c in (mul.inputs, mul.inputs[::-1]):
        scale = const_value(c)
        gather = producer_op(x, "Gather")
        if gather is not None and scale is not None and scale.size == 1 and len(x.outputs) == 1:
            return gather, float(scale.reshape(()))
    return None, None


def _fuse(ctx: Context, ln_node: gs.Node, report: PassReport) -> bool:
    """Fuse when ln_node ends an embedding sum; False when it is not one (left to other passes)."""
    leaves = _summands(ln_node.inputs[0])
    scaled = [_scaled_gather(t) for t in leaves]
    gathers = [g for g, _ in scaled]
    scales = {id(g): s for g, s in scaled if s is not None}
    if len(leaves) < 2 or any(g is None or g.attrs.get("axis", 0) != 0 or const_value(g.inputs[0]) is None
                              for g in gathers):
        return False
    roles: dict[str, gs.Node] = {}
    for g in gathers:
        role = _indexed_input(ctx, g.inputs[1]) or "position"
        if role in roles or role not in (INPUT_IDS, TOKEN_TYPE_IDS, "position"):
            report.miss(f"embedding sum into {ln_node.op} '{ln_node.name}': unexpected Gather by {role}")
            return True
        roles[role] = g
    where = f"embedding sum into {ln_node.op} '{ln_node.name}'"
    if INPUT_IDS not in roles or "position" not in roles:
        report.miss(f"{where}: needs word and position Gathers, found {sorted(roles)}")
        return True
    if any(id(roles[r]) in scales for r in roles if r != INPUT_IDS):
        report.miss(f"{where}: a scaled position or token-type embedding (only the word embedding's scale folds)")
        return True
    ln = match_layernorm(ctx, ln_node)
    if isinstance(ln, str):
        report.miss(f"{where}: {ln}")
        return True
    offset = _position_offset(ctx, roles["position"].inputs[1])
    if isinstance(offset, str):
        report.miss(f"{where}: {offset}")
        return True
    word = roles[INPUT_IDS].inputs[0]
    scale = scales.get(id(roles[INPUT_IDS]))
    if scale is not None:
        # the word embedding's scale folded into its table: a float32 product, the same as the model's
        # own multiply of each looked-up row
        table = const_value(word)
        word = ctx.const("scaled_word_embeddings", (table * table.dtype.type(scale)).astype(table.dtype))
    has_type = TOKEN_TYPE_IDS in roles
    inputs = [ctx.packed(INPUT_IDS)] + ([ctx.packed(TOKEN_TYPE_IDS)] if has_type else [])
    inputs += [ctx.packed(CU_SEQLENS), word, roles["position"].inputs[0]]
    inputs += [roles[TOKEN_TYPE_IDS].inputs[0]] if has_type else []
    inputs += [ln.gamma, ln.beta]
    out = ln_node.outputs[0]
    ln_node.outputs.clear()
    out.shape = [DIM_T, const_value(word).shape[1]]
    ctx.plugin("PadfreeEmbLayerNorm", inputs, [out],
               {"epsilon": ln.epsilon, "position_offset": offset, "has_token_type": int(has_type)})
    report.add("PadfreeEmbLayerNorm")
    log.debug("embeddings: fused %s (position_offset %d, token types %s)", ln_node.name, offset, has_type)
    return True


def run(graph: gs.Graph, ctx: Context) -> gs.Graph:
    report = PassReport(NAME)
    ctx.reports.append(report)
    word_gathers = [n for n in graph.nodes if n.op == "Gather" and len(n.inputs) == 2
                    and _indexed_input(ctx, n.inputs[1]) == INPUT_IDS]
    for node in [n for n in graph.nodes if n.op == "LayerNormalization"]:
        _fuse(ctx, node, report)
    if not report.fused and not report.unmatched:
        report.miss("no LayerNormalization of a sum of embedding Gathers "
                    f"({len(word_gathers)} Gather(s) index input_ids)")
    return graph.cleanup()
