"""Writing one model folder into a Triton model repository, all or nothing.

The folder is built under a hidden temporary name in the repository and renamed into place whole;
a previous model of that name is moved aside first and put back if the rename fails, so a failure
leaves the repository as it was (a server polling the repository never sees half a model).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from padfree._lib import PadfreeError

PARTIAL = ".padfree-partial-"


class TritonError(PadfreeError, ValueError):
    """The model cannot be served by Triton as asked; the message says what to do."""


def quote(text: str) -> str:
    """A protobuf text-format string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_name(name: str) -> str:
    if not name or Path(name).name != name or name.startswith("."):
        raise TritonError(f"model name {name!r}: give a plain folder name (--name NAME)")
    return name


def check_config(text: str) -> None:
    """Parse the config with Triton's own ModelConfig protobuf where tritonclient is installed."""
    try:
        from google.protobuf.text_format import ParseError
    except ImportError:
        return
    try:
        parse(text)
    except ImportError:
        return
    except ParseError as e:
        raise TritonError(f"internal error: the generated config.pbtxt does not parse ({e})") from e


def parse(text: str):
    """The config parsed with Triton's own ModelConfig protobuf (tritonclient[grpc]); ImportError without it."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(text, model_config_pb2.ModelConfig())


def write_model(repository: str | os.PathLike, name: str, config: str, fill: Callable[[Path], list[Path]]) -> Path:
    """REPOSITORY/NAME with config.pbtxt and what fill(stage) writes into the staged folder (it returns
    the files it wrote, each synced before the rename)."""
    from padfree import outputs

    try:
        root = outputs.writable_folder(repository, "model repository")
    except outputs.OutputError as e:
        raise TritonError(str(e)) from e
    stage = Path(tempfile.mkdtemp(prefix=PARTIAL, dir=root))
    target, old = root / name, None
    try:
        written = fill(stage)
        (stage / "config.pbtxt").write_text(config)
        for f in [*written, stage / "config.pbtxt"]:
            outputs._fsync_file(f)
        if target.exists() or target.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=PARTIAL, dir=root))
            os.replace(target, old / name)
        os.replace(stage, target)
        outputs._fsync_folder(root)
    except BaseException:
        if old is not None and not target.exists():
            os.replace(old / name, target)  # put the previous model back
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target
