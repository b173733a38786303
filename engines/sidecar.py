"""The JSON sidecar written beside every engine (MODEL.engine -> MODEL.engine.json), and the checks
the runtime makes against it before it hands the engine bytes to TensorRT: a plan is only valid for
the TensorRT version that built it, needs the plugin library its plugin layers came from, and a
truncated or replaced file must be refused with a clear message rather than crash deserialization.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import padfree

from .errors import CorruptEngineError, EngineFormatError, EngineVersionError

FORMAT = "padfree-engine"
FORMAT_VERSION = 1
_REQUIRED = ("format", "format_version", "padfree_version", "backend", "model", "precision", "profiles",
             "inputs", "outputs", "engine")


def path_for(engine: str | os.PathLike) -> Path:
    return Path(str(engine) + ".json")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(engine: str | os.PathLike, metadata: dict[str, Any]) -> Path:
    path = path_for(engine)
    path.write_text(json.dumps(metadata, indent=2, sort_keys=False) + "\n")
    return path


def read(engine: str | os.PathLike) -> dict[str, Any]:
    """The sidecar of `engine`, checked for format and completeness (not yet against the installation)."""
    path = path_for(engine)
    if not path.is_file():
        raise EngineFormatError(f"{engine}: no sidecar {path.name} beside it; padfree serves engines built by"
                                " `padfree build` (rebuild it from the ONNX model)")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise EngineFormatError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise EngineFormatError(f"{path}: unknown format {found!r}, expected {FORMAT!r}")
    if data.get("format_version") != FORMAT_VERSION:
        raise EngineVersionError(f"{path}: sidecar format version {data.get('format_version')!r}, this padfree"
                                 f" ({padfree.__version__}) reads version {FORMAT_VERSION}: rebuild the engine")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise EngineFormatError(f"{path}: sidecar lacks {', '.join(missing)}")
    return data


def check_backend(data: dict[str, Any], backend_name: str, backend_version: str, engine: str | os.PathLike) -> None:
    built = data["backend"]
    if built.get("name") != backend_name or built.get("version") != backend_version:
        raise EngineVersionError(
            f"{engine} was built with {built.get('name')} {built.get('version')}, this process has {backend_name}"
            f" {backend_version}: TensorRT plans only load into the version that built them; rebuild it with"
            " `padfree build`")


def read_engine_bytes(engine: str | os.PathLike, data: dict[str, Any]) -> bytes:
    """The engine file's bytes, refused unless their size and SHA-256 are what the build recorded."""
    try:
        blob = Path(engine).read_bytes()
    except OSError as e:
        raise CorruptEngineError(f"{engine}: cannot read the engine ({e})") from e
    want = data["engine"]
    if len(blob) != want.get("bytes") or digest(blob) != want.get("sha256"):
        raise CorruptEngineError(f"{engine}: {len(blob)} bytes that do not match the sidecar ({want.get('bytes')}"
                                 " bytes, sha256 recorded at build): truncated, corrupt or replaced; rebuild it")
    return blob
