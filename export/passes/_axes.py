"""Track which logical axes a tensor has through Reshape/Transpose chains.

A layout is a tuple of axes, each a tuple of atoms: "B" (batch), "S" (sequence), "N" (heads), "D"
(head dim); ("N", "D") is the hidden axis. Reshape targets are read symbolically: constants, and
Shape/Slice/Concat/Squeeze/Unsqueeze/Gather pieces that copy dims of tensors whose layout is known.
This is what lets the attention pass accept both ways torch writes K^T (a 4-D Transpose, or
SDPA's reshape-to-3-D / transpose / reshape-back) and refuse a head split that is not [B,S,N,D].
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..graph import const_value, producer

Layout = tuple[tuple[str, ...], ...]
BSH: Layout = (("B",), ("S",), ("N", "D"))


class AxesError(ValueError):
    pass


def _entries(t: gs.Tensor, known: dict[int, Layout]) -> list:
    """A 1-D shape tensor as entries: ints, or tuples of atoms copied from a known tensor's dims."""
    v = const_value(t)
    if v is not None:
        return [int(x) for x in v.reshape(-1)]
    node = producer(t)
    if node is None:
        raise AxesError(f"shape value {t.name!r} is a graph input")
    if node.op == "Concat":
        return [e for x in node.inputs for e in _entries(x, known)]
    if node.op == "Shape":
        src = node.inputs[0]
        if id(src) not in known:
            raise AxesError(f"Shape of {src.name!r}, whose axes are not known")
        dims = list(known[id(src)])
        return dims[slice(node.attrs.get("start", 0), node.attrs.get("end", None))]
    if node.op == "Slice":
        base = _entries(node.inputs[0], known)
        starts, ends = (const_value(x) for x in node.inputs[1:3])
        axes = const_value(node.inputs[3]) if len(node.inputs) > 3 else None
        steps = const_value(node.inputs[4]) if len(node.inputs) > 4 else None
        if starts is None or ends is None or (axes is not None and list(axes.reshape(-1)) != [0]) or (
                steps is not None and list(steps.reshape(-1)) != [1]):
            raise AxesError(f"Slice '{node.name}' of a shape is not a constant range")
        lo, hi = int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0])
        n = len(base)
        lo, hi = max(lo + n if lo < 0 else lo, 0), min(hi + n if hi < 0 else hi, n)
        return base[lo:hi]
    if node.op in ("Squeeze", "Unsqueeze", "Identity", "Cast"):
        return _entries(node.inputs[0], known)
    if node.op == "Gather":
        idx = const_value(node.inputs[1])
        if idx is None:
            raise AxesError(f"Gather '{node.name}' of a shape has non-constant indices")
        base = _entries(node.inputs[0], known)
        return [base[int(i)] for i in idx.reshape(-1)]
    raise AxesError(f"shape value made by {node.op} '{node.name}'")


def _atoms(layout: Layout) -> list[str]:
    return [a for axis in layout for a in axis]


def reshape(layout: Layout, node: gs.Node, known: dict[int, Layout], sizes: dict[str, int]) -> Layout:
    """The layout after `node` (a Reshape) given its input layout; sizes: atom -> known size."""
    entries = _entries(node.inputs[1], known)
    allowzero = node.attrs.get("allowzero", 0)
    entries = [layout[i] if e == 0 and not allowzero and i < len(layout) else e for i, e in enumerate(entries)]
    atoms = _atoms(layout)

    def take(entry, pool: list[str], from_left: bool) -> tuple[str, ...]:
        if isinstance(entry, tuple):
            got = tuple(pool[:len(entry)]) if from_left else tuple(pool[len(pool) - len(entry):])
            if got != entry:
                raise AxesError(f"Reshape '{node.name}' copies axis {entry} where {got} is")
            return entry
        got, size = [], 1
        while size < entry and pool:
            a = pool[len(got)] if from_left else pool[len(pool) - 1 - len(got)]
            if a not in sizes:
                break
            got.append(a)
            size *= sizes[a]
        if size != entry:
            raise AxesError(f"Reshape '{node.name}': size {entry} does not match axes of {atoms}")
        return tuple(got) if from_left else tuple(reversed(got))

    if sum(1 for e in entries if e == -1) > 1:
        raise AxesError(f"Reshape '{node.name}' has more than one -1")
    split = entries.index(-1) if -1 in entries else len(entries)
    pool, head = list(atoms), []
    for e in entries[:split]:
        axis = take(e, pool, True)
        head.append(axis)
        del pool[:len(axis)]
    tail = []
    for e in reversed(entries[split + 1:]):
        axis = take(e, pool, False)
        tail.insert(0, axis)
        del pool[len(pool) - len(axis):]
    if split < len(entries):
        if not pool:
            raise AxesError(f"Reshape '{node.name}': nothing left for its -1")
        return tuple(head) + (tuple(pool),) + tuple(tail)
    if pool:
        raise AxesError(f"Reshape '{node.name}' drops axes {pool}")
    return tuple(head) + tuple(tail)


def transpose(layout: Layout, node: gs.Node) -> Layout:
    perm = node.attrs.get("perm")
    if perm is None:
        perm = list(reversed(range(len(layout))))
    if sorted(perm) != list(range(len(layout))):
        raise AxesError(f"Transpose '{node.name}' perm {perm} does not fit rank {len(layout)}")
    return tuple(layout[p] for p in perm)


def follow(layout: Layout, nodes: list[gs.Node], known: dict[int, Layout], sizes: dict[str, int]) -> Layout:
    """Apply a chain of Reshape/Transpose (and layout-neutral) nodes, recording each output in known."""
    for node in nodes:
        if node.op == "Reshape":
            layout = reshape(layout, node, known, sizes)
        elif node.op == "Transpose":
            layout = transpose(layout, node)
        known[id(node.outputs[0])] = layout
    return layout


def show(layout: Layout) -> str:
    return "[" + ", ".join("".join(axis) if len(axis) == 1 else "(" + "".join(axis) + ")" for axis in layout) + "]"


def sizes_for(heads: int, head_dim: int) -> dict[str, int]:
    return {"N": heads, "D": head_dim}

