"""Files of one item per line that the commands read: texts (`padfree run --text-file`, `padfree bench
--texts`) and sequence lengths (`padfree bench --lengths`). A malformed file is a CommandError naming
the file and the first bad line; a blank line is refused rather than skipped, since skipping it would
shift every later row."""
from __future__ import annotations

from pathlib import Path

from .arguments import CommandError


def _lines(path: Path, what: str, empty: str) -> list[str]:
    """The file's lines (UTF-8); CommandError where it cannot be read (`what` it should hold) or holds
    none (`empty`: what to give)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CommandError(f"cannot read {what} from {path}: {e}") from None
    if not lines:
        raise CommandError(f"{path} holds no {empty}")
    return lines


def read_texts(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, one text each; a blank line is refused (its row would be a text
    the user did not mean, and skipping it would shift every later row)."""
    lines = _lines(path, "texts", "text: give one text per line")
    blank = next((i for i, line in enumerate(lines) if not line.strip()), None)
    if blank is not None:
        raise CommandError(f"{path}: line {blank + 1} is blank; give one text per line, without blank lines")
    return lines


def read_lengths(path: Path) -> list[int]:
    """The sequence lengths in `path`, one integer >= 1 per line; CommandError naming the first bad line."""
    lines = _lines(path, "lengths", "lengths: give one integer (a sequence's length in tokens) per line")
    lengths = []
    for number, line in enumerate(lines, 1):
        try:
            value = int(line.strip())
        except ValueError:
            raise CommandError(f"{path} line {number}: expected one integer (a length in tokens), got"
                               f" {line.strip()[:40]!r}") from None
        if value < 1:
            raise CommandError(f"{path} line {number}: a length must be at least 1 token, got {value}")
        lengths.append(value)
    return lengths
