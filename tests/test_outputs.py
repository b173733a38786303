"""padfree.outputs: every output is written whole or not at all, and unusable output paths are
named before any work starts."""
from __future__ import annotations

import os

import pytest

from padfree import outputs
from padfree.outputs import OutputError


def _entries(folder):
    return sorted(p.name for p in folder.iterdir())


def test_write_replaces_whole_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    outputs.write_text(target, "new")
    assert target.read_text() == "new" and _entries(tmp_path) == ["a.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    """A full disk (ENOSPC from the write) must not leave a truncated file under the final name."""
    target = tmp_path / "model.engine"
    target.write_bytes(b"the previous engine")

    def full_disk(self, data):
        with open(self, "wb") as f:
            f.write(data[:3])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(type(target), "write_bytes", full_disk)
    with pytest.raises(OSError, match="No space left"):
        outputs.write_bytes(target, b"a new engine, never complete")
    monkeypatch.undo()
    assert target.read_bytes() == b"the previous engine" and _entries(tmp_path) == ["model.engine"]


def test_a_staged_set_lands_together_in_order_or_not_at_all(tmp_path, monkeypatch):
    (tmp_path / "m.engine").write_bytes(b"old engine")
    (tmp_path / "m.engine.json").write_text("old sidecar")
    with pytest.raises(RuntimeError):
        with outputs.staged(tmp_path) as stage:
            stage.path("m.engine").write_bytes(b"new engine")
            raise RuntimeError("interrupted before the sidecar was written")
    assert (tmp_path / "m.engine").read_bytes() == b"old engine"
    assert _entries(tmp_path) == ["m.engine", "m.engine.json"]
    order = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append(os.path.basename(b)), real_replace(a, b)))
    with outputs.staged(tmp_path) as stage:
        stage.path("m.engine").write_bytes(b"new engine")
        stage.path("m.engine.json").write_text("new sidecar")
    assert order == ["m.engine", "m.engine.json"]  # the sidecar, the mark of completion, last
    assert (tmp_path / "m.engine.json").read_text() == "new sidecar"
    assert _entries(tmp_path) == ["m.engine", "m.engine.json"]
    with pytest.raises(ValueError, match="within its folder"):
        with outputs.staged(tmp_path) as stage:
            stage.path("../escape")


def test_unusable_output_paths_are_named(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        outputs.writable_folder(file)
    with pytest.raises(OutputError, match="cannot create"):
        outputs.writable_folder(file / "sub")
    with pytest.raises(OutputError, match="is a folder"):
        outputs.writable_file(tmp_path, "engine output")
    assert outputs.writable_folder(tmp_path / "new" / "deeper").is_dir()
    assert _entries(tmp_path) == ["file", "new"]  # the probe file is gone
    if os.geteuid() != 0:  # root writes into read-only folders
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        with pytest.raises(OutputError, match="cannot write into"):
            outputs.writable_folder(locked)
