"""State shared by the rewrite passes: the graph, the I/O form, the new inputs and the report."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from . import spec as spec_mod

log = logging.getLogger(__name__)

# Names of the interface tensors (graph inputs of the rewritten model).
INPUT_IDS, TOKEN_TYPE_IDS, ATTENTION_MASK = "input_ids", "token_type_ids", "attention_mask"
CU_SEQLENS, MAX_SEQLEN = "cu_seqlens", "max_seqlen"
# Symbolic dimension names of the rewritten model.
DIM_T, DIM_B, DIM_B1, DIM_S = "total_tokens", "batch", "batch_plus_1", "seqlen"


@dataclass
class PassReport:
    """What one pass changed: fused matches, and patterns it recognised but could not fuse."""
    name: str
    fused: dict[str, int] = field(default_factory=dict)  # plugin name -> nodes emitted
    unmatched: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, plugin: str) -> None:
        self.fused[plugin] = self.fused.get(plugin, 0) + 1

    def miss(self, message: str) -> None:
        log.debug("%s: no match: %s", self.name, message)
        self.unmatched.append(message)


class Context:
    """Holds what passes share. Passes create plugin nodes through `plugin()` so that every node
    follows the spec, and ask for interface tensors through `packed()` (created on first use)."""

    def __init__(self, graph: gs.Graph, io: str, spec: spec_mod.Spec | None = None):
        if io not in ("packed", "padded"):
            raise ValueError(f"io must be 'packed' or 'padded', got {io!r}")
        self.graph, self.io = graph, io
        self.spec = spec or spec_mod.load()
        self.reports: list[PassReport] = []
        # The exported model's inputs by their original names, renamed out of the way so that the
        # rewritten interface can take the same names.
        self.original_inputs: dict[str, gs.Variable] = {t.name: t for t in graph.inputs}
        for t in graph.inputs:
            t.name = f"original_{t.name}"
        self.new_inputs: dict[str, gs.Variable] = {}
        self._packed: dict[str, gs.Tensor] = {}
        self.plugin_outputs: set[int] = set()   # ids of tensors on packed token rows made by plugins
        self.batch_rows: set[int] = set()        # ids of nodes whose output has one row per sequence
        self.row_maps: set[int] = set()          # ids of nodes made here that map packed rows one by one
        self.metadata: dict[str, str] = {}       # the exported model's metadata_props (padfree.pooling, ...)
        self._names: set[str] = {t for t in graph.tensors()} | {n.name for n in graph.nodes}
        self._counter = 0

    # ----- naming and node creation
    def unique(self, base: str) -> str:
        while True:
            self._counter += 1
            name = f"padfree/{base}_{self._counter}"
            if name not in self._names:
                self._names.add(name)
                return name

    def variable(self, base: str, dtype=None, shape=None) -> gs.Variable:
        return gs.Variable(self.unique(base), dtype=dtype, shape=shape)

    def const(self, base: str, value: np.ndarray) -> gs.Constant:
        # np.asarray, not np.ascontiguousarray: the latter makes 0-D scalars 1-D (a Gather index, a Range bound)
        return gs.Constant(self.unique(base), np.asarray(value, order="C"))

    def node(self, op: str, inputs: list, outputs: list, **attrs: Any) -> gs.Node:
        node = gs.Node(op, self.unique(op), attrs=attrs, inputs=list(inputs), outputs=list(outputs))
        self.graph.nodes.append(node)
        return node

    def plugin(self, name: str, inputs: list[gs.Tensor], outputs: list[gs.Variable],
               fields: dict[str, Any], token_rows: bool = True) -> gs.Node:
        """A plugin node from the spec; inputs and outputs must match the spec's lists for these fields
        (TensorRT's parser refuses a node that leaves out a plugin output, even an unused one)."""
        plugin = self.spec[name]
        attrs = self.spec.node_attributes(name, fields)
        for kind, want, got in (("inputs", plugin.input_names(attrs), inputs),
                                ("outputs", plugin.output_names(attrs), outputs)):
            if len(got) != len(want):
                raise ValueError(f"{name}: the spec wants {kind} {want}, got {len(got)}")
        node = gs.Node(name, self.unique(name), attrs=attrs, inputs=list(inputs), outputs=list(outputs),
                       domain=self.spec.namespace)
        self.graph.nodes.append(node)
        if token_rows:
            self.plugin_outputs.update(id(t) for t in outputs)
        return node

    # ----- interface tensors
    def _input(self, name: str, shape: list) -> gs.Variable:
        if name not in self.new_inputs:
            self.new_inputs[name] = gs.Variable(name, dtype=np.int32, shape=shape)
        return self.new_inputs[name]

    def has_token_types(self) -> bool:
        return TOKEN_TYPE_IDS in self.original_inputs

    def packed(self, name: str) -> gs.Tensor:
        """input_ids / token_type_ids [T], cu_seqlens [B+1] or max_seqlen [S] in packed layout.

        Packed I/O: graph inputs. Padded I/O: made from the padded inputs by PadfreeRemovePadding.
        """
        if name in self._packed:
            return self._packed[name]
        if self.io == "packed":
            shapes = {INPUT_IDS: [DIM_T], TOKEN_TYPE_IDS: [DIM_T], CU_SEQLENS: [DIM_B1], MAX_SEQLEN: [DIM_S]}
            self._packed[name] = self._input(name, shapes[name])
        elif name == MAX_SEQLEN:
            # Only the length of this tensor is read: the padded length bounds the longest sequence.
            out = self.variable("max_seqlen", np.int32, [DIM_S])
            self.node("Gather", [self.padded_mask(), self.const("zero", np.array(0, np.int64))], [out], axis=0)
            self._packed[name] = out
        else:
            self._remove_padding_of_ids()
        return self._packed[name]

    def _remove_padding_of_ids(self) -> None:
        """Padded I/O: input_ids and token_type_ids packed by one PadfreeRemovePadding, side by side
        ([B, S, 2] -> [T, 2]), which also yields cu_seqlens. One node, not one per id tensor: each
        node adds a size tensor that TensorRT reads back before it can shape what follows, and two
        of them would give the two id tensors extents TensorRT cannot tell are equal."""
        names = [INPUT_IDS] + ([TOKEN_TYPE_IDS] if self.has_token_types() else [])
        padded = [self._input(n, [DIM_B, DIM_S]) for n in names]
        cu = self.variable("cu_seqlens", np.int32, [DIM_B1])
        outputs = [cu, self.variable("total_tokens", np.int32, [])]
        if len(names) == 1:
            rows = self.variable(f"packed_{INPUT_IDS}", np.int32, [DIM_T])
            self.plugin("PadfreeRemovePadding", [padded[0], self.padded_mask()], [rows, *outputs], {}, token_rows=False)
            self._packed[INPUT_IDS] = rows
        else:
            last_axis = self.const("last_axis", np.array([-1], np.int64))
            columns = [self.variable(f"{n}_column", np.int32, [DIM_B, DIM_S, 1]) for n in names]
            for t, column in zip(padded, columns):
                self.node("Unsqueeze", [t, last_axis], [column])
            stacked = self.variable("padded_ids", np.int32, [DIM_B, DIM_S, len(names)])
            self.node("Concat", columns, [stacked], axis=-1)
            rows = self.variable("packed_ids", np.int32, [DIM_T, len(names)])
            self.plugin("PadfreeRemovePadding", [stacked, self.padded_mask()], [rows, *outputs], {}, token_rows=False)
            for k, n in enumerate(names):
                self._packed[n] = self.variable(f"packed_{n}", np.int32, [DIM_T])
                column = self.node("Gather", [rows, self.const("column", np.array(k, np.int64))], [self._packed[n]],
                                   axis=1)
                self.row_maps.add(id(column))
        self._packed[CU_SEQLENS] = cu

    def padded_mask(self) -> gs.Tensor:
        """A [B, S] int32 attention mask: the input in padded I/O, built from cu_seqlens in packed I/O."""
        if ATTENTION_MASK in self._packed:
            return self._packed[ATTENTION_MASK]
        if self.io == "padded":
            mask = self._input(ATTENTION_MASK, [DIM_B, DIM_S])
        else:
            mask = _mask_from_cu_seqlens(self, self.packed(CU_SEQLENS), self.packed(MAX_SEQLEN))
        self._packed[ATTENTION_MASK] = mask
        return mask

    def interface_inputs(self) -> list[gs.Variable]:
        order = ([INPUT_IDS, TOKEN_TYPE_IDS, CU_SEQLENS, MAX_SEQLEN] if self.io == "packed"
                 else [INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS])
        if self.io == "packed":
            for name in (INPUT_IDS, CU_SEQLENS, MAX_SEQLEN):
                self.packed(name)  # a uniform interface even where a pass did not need one
        else:
            self.packed(INPUT_IDS)
            self.padded_mask()
        if self.has_token_types():
            self.packed(TOKEN_TYPE_IDS)
        return [self.new_inputs[n] for n in order if n in self.new_inputs]


def _mask_from_cu_seqlens(ctx: Context, cu: gs.Tensor, max_seqlen: gs.Tensor) -> gs.Variable:
    """mask[b, s] = s < cu[b+1] - cu[b], s < len(max_seqlen): only used where a part stays padded."""
    i64 = lambda v: ctx.const("c", np.array(v, np.int64))  # noqa: E731
    starts, ends, lengths = (ctx.variable(n) for n in ("starts", "ends", "lengths"))
    ctx.node("Slice", [cu, i64([0]), i64([-1])], [starts])
    ctx.node("Slice", [cu, i64([1]), i64([2**62])], [ends])
    ctx.node("Sub", [ends, starts], [lengths])
    s_len, s_scalar, pos = ctx.variable("s_len"), ctx.variable("s"), ctx.variable("positions")
    ctx.node("Shape", [max_seqlen], [s_len])
    ctx.node("Squeeze", [s_len], [s_scalar])
    ctx.node("Range", [i64(0), s_scalar, i64(1)], [pos])
    pos32, pos_row, len_col, less = (ctx.variable(n) for n in ("pos32", "pos_row", "len_col", "less"))
    ctx.node("Cast", [pos], [pos32], to=6)
    ctx.node("Unsqueeze", [pos32, i64([0])], [pos_row])
    ctx.node("Unsqueeze", [lengths, i64([1])], [len_col])
    ctx.node("Less", [pos_row, len_col], [less])
    mask = ctx.variable("mask", np.int32, [DIM_B, DIM_S])
    ctx.node("Cast", [less], [mask], to=6)
    return mask
