"""What a rewrite did, as a dict (written to JSON) and as a short printed table."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RewriteReport:
    io: str
    fused: dict[str, int] = field(default_factory=dict)
    passes: list[dict] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0

    @classmethod
    def from_passes(cls, io: str, reports, nodes_before: int, nodes_after: int) -> "RewriteReport":
        fused: dict[str, int] = {}
        for r in reports:
            for k, v in r.fused.items():
                fused[k] = fused.get(k, 0) + v
        return cls(io, fused, [asdict(r) for r in reports], [m for r in reports for m in r.unmatched],
                   nodes_before, nodes_after)

    @property
    def complete(self) -> bool:
        return not self.unmatched

    def summary(self) -> str:
        parts = ", ".join(f"{v} {k}" for k, v in self.fused.items()) or "nothing"
        return f"fused {parts}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["complete"] = self.complete
        return d

    def format(self) -> str:
        lines = [f"rewrite ({self.io} I/O): {self.nodes_before} nodes -> {self.nodes_after} nodes"]
        width = max([len(k) for k in self.fused] + [10])
        lines += [f"  {k:<{width}}  {v:>4}" for k, v in self.fused.items()]
        for p in self.passes:
            lines += [f"  [{p['name']}] {note}" for note in p["notes"]]
        if self.unmatched:
            lines.append(f"  not fused ({len(self.unmatched)}):")
            lines += [f"    - {m}" for m in self.unmatched]
        return "\n".join(lines)
