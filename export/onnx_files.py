"""Reading and writing ONNX files with user-facing errors: a missing, unreadable or corrupt file is an
ExportError naming it, and a model is saved atomically (padfree.outputs), its external data
included, so that no reader ever sees a truncated model."""
from __future__ import annotations

import os
from pathlib import Path

import onnx

from padfree import outputs

from .errors import ExportError, first_line

_PROTO_LIMIT = 1_800_000_000  # protobuf's 2 GiB cap, with headroom


def lowest_ir_version(model: onnx.ModelProto) -> int:
    """The lowest IR version that carries the model's opsets. onnx's helpers stamp the newest IR the installed
    onnx knows, which an ONNX Runtime older than that onnx refuses ("Unsupported model IR version: 14, max
    supported IR version: 13"): a model padfree builds to run on ONNX Runtime takes this one instead."""
    return onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)


def data_file(path: str | os.PathLike) -> Path:
    """Where save_model puts a large model's external data (beside it, named after it)."""
    return Path(str(path) + ".data")


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Save `model` to `path`; past protobuf's limit its weights go to path.data. Both files are
    staged and renamed into place together (data first), and a stale path.data is removed."""
    path = Path(path)
    large = model.ByteSize() > _PROTO_LIMIT
    with outputs.staged(path.parent) as stage:
        target = stage.path(data_file(path).name) if large else None
        staged_model = stage.path(path.name)
        onnx.save_model(model, str(staged_model), save_as_external_data=large,
                        location=target.name if large else None)
    if not large:
        outputs.remove([data_file(path)])
    return path


def load_model(path: str | os.PathLike, what: str = "the model", load_external_data: bool = True) -> onnx.ModelProto:
    """The ONNX model at `path`, or an ExportError saying why not (missing, a folder, not ONNX)."""
    path = Path(path)
    if not path.is_file():
        kind = "a folder" if path.is_dir() else "not found"
        raise ExportError(f"{what} {path}: {kind}; give the path of an .onnx file")
    try:
        return onnx.load(str(path), load_external_data=load_external_data)
    except Exception as e:  # noqa: BLE001 - protobuf and onnx raise several unrelated types
        raise ExportError(f"{what} {path} is not a readable ONNX model ({type(e).__name__}: {first_line(e)});"
                          " export it again with `padfree export`") from e
