"""Errors of padfree.export."""
from __future__ import annotations

from padfree import PadfreeError


def first_line(e: BaseException) -> str:
    """The first line of an exception's message: libraries' multi-line reports shortened for one line."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else "no message"


class ExportError(PadfreeError, ValueError):
    """The model could not be exported or rewritten."""


class PartialFusionError(ExportError):
    """Some recognised patterns did not fuse; the message names each. `report` holds the details."""

    def __init__(self, report):
        self.report = report
        lines = "\n  - ".join(report.unmatched)
        super().__init__(f"the rewrite fused only part of the model ({report.summary()}); not matched:\n  - {lines}\n"
                         "Pass allow_partial=True (--allow-partial) to keep the unfused parts on padded rows.")
