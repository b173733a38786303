"""Every file padfree writes goes through here: nothing is ever left half-written under its final name.

A file is written under a temporary name in its own folder, flushed to disk (fsync), then renamed
into place (os.replace, atomic on one filesystem). A set of files that belong together (an ONNX
model and its external data) is staged in a temporary folder beside them and renamed into place in
the order given once every file is complete; a failure or an interruption removes the stage and
leaves the folder as it was. Output folders are checked before long work starts, so that a path
that is a file or a read-only folder is reported at once rather than after an export or a build.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ._lib import PadfreeError

_STAGE_PREFIX = ".padfree-partial-"


class OutputError(PadfreeError, OSError):
    """An output path cannot be written (it is a file where a folder is needed, read-only, ...)."""


def writable_folder(path: str | os.PathLike, what: str = "output folder") -> Path:
    """`path` as a folder padfree can write into, created if missing; OutputError if it cannot be."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{what} {folder} is a file, not a folder: give a folder path (-o DIR)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create {what} {folder}: {e.strerror or e}; choose another path") from e
    try:  # os.access misses read-only mounts and ACLs: try the real thing
        with tempfile.NamedTemporaryFile(dir=folder, prefix=_STAGE_PREFIX):
            pass
    except OSError as e:
        raise OutputError(f"cannot write into {what} {folder}: {e.strerror or e}; choose another path") from e
    return folder


def writable_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """`path` as a file padfree can create or replace (its folder is created if missing)."""
    file = Path(path)
    if file.is_dir():
        raise OutputError(f"{what} {file} is a folder: give a file path")
    writable_folder(file.parent if str(file.parent) else Path("."), f"folder of {what} {file}")
    return file


def _fsync_folder(folder: Path) -> None:
    # the rename itself is durable only once the folder's entry is on disk
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


class Stage:
    """Files written under a temporary folder, renamed into `folder` by commit()."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.root = Path(tempfile.mkdtemp(prefix=_STAGE_PREFIX, dir=folder))
        self._names: list[str] = []

    def path(self, name: str) -> Path:
        """Where to write the file that becomes folder/name (committed in the order asked for)."""
        if Path(name).name != name:
            raise ValueError(f"a staged file is named within its folder, got {name!r}")
        if name not in self._names:
            self._names.append(name)
        return self.root / name

    def commit(self) -> list[Path]:
        staged = [n for n in self._names if (self.root / n).is_file()]
        for name in staged:
            _fsync_file(self.root / name)
        for name in staged:
            os.replace(self.root / name, self.folder / name)
        _fsync_folder(self.folder)
        return [self.folder / n for n in staged]

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def staged(folder: str | os.PathLike) -> Iterator[Stage]:
    """with staged(folder) as s: write s.path("a"), s.path("b") -> both renamed into folder at the end
    (only when the block completes; otherwise neither)."""
    stage = Stage(Path(folder))
    try:
        yield stage
        stage.commit()
    finally:
        stage.discard()


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically: readers see the old file or the complete new one."""
    path = Path(path)
    with staged(path.parent if str(path.parent) else Path(".")) as stage:
        stage.path(path.name).write_bytes(data)
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def remove(paths: list[Path]) -> None:
    """Delete files that a new output set replaces, so that none of the old set survives a failure."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
