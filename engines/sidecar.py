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
from padfree import outputs

from .errors import CorruptEngineError, EngineFormatError, EngineVersionError
from .trt_api import PRECISIONS

FORMAT = "padfree-engine"
FORMAT_VERSION = 1
_REQUIRED = ("format", "format_version", "padfree_version", "backend", "model", "precision", "profiles",
             "inputs", "outputs", "engine")
# the last three: a seq2seq export's graphs (built, not run)
IO_FORMS = ("packed", "padded", "decoder_step", "cross_kv", "generation")
# Input dtypes the engine backend can feed (numpy-style names, as model_info records them).
INPUT_DTYPES = ("int32", "int64", "bool", "float32", "float16", "bfloat16")
_PACKED_INPUTS = ("input_ids", "cu_seqlens", "max_seqlen")  # the backend feeds these by name


def path_for(engine: str | os.PathLike) -> Path:
    return Path(str(engine) + ".json")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def text(metadata: dict[str, Any]) -> str:
    return json.dumps(metadata, indent=2, sort_keys=False) + "\n"


def write(engine: str | os.PathLike, metadata: dict[str, Any]) -> Path:
    return outputs.write_text(path_for(engine), text(metadata))


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
    _check_structure(data, path)
    return data


# ---- structure: every field the backend, `padfree check` and the CLI read, with its type ---------
def _is_int(minimum: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _is_str(v) -> bool:
    return isinstance(v, str) and v != ""


def _is_sha256(v) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _optional(test):
    return lambda v: v is None or test(v)


def _is_list_of(test):
    return lambda v: isinstance(v, list) and all(test(x) for x in v)


def _value(path: Path, obj: dict, key: str, where: str, test, expected: str, required: bool = True):
    name = f"{where}.{key}" if where else key
    if key not in obj:
        if not required:
            return None
        raise EngineFormatError(f"{path}: sidecar field {name} is missing (expected {expected}); rebuild the engine")
    value = obj[key]
    if not test(value):
        raise EngineFormatError(f"{path}: sidecar field {name} is {value!r}, expected {expected}: the sidecar is"
                                " corrupt or hand-edited; rebuild the engine")
    return value


def _object(path: Path, obj: dict, key: str, where: str = "") -> dict:
    return _value(path, obj, key, where, lambda v: isinstance(v, dict), "an object")


def _objects(path: Path, data: dict, key: str) -> list[dict]:
    return _value(path, data, key, "", lambda v: isinstance(v, list) and v and all(isinstance(x, dict) for x in v),
                  "a non-empty list of objects")


def _check_structure(data: dict[str, Any], path: Path) -> None:
    """Raise EngineFormatError naming the first field whose type or value the readers cannot use."""
    backend = _object(path, data, "backend")
    for key in ("name", "version"):
        _value(path, backend, key, "backend", _is_str, "a non-empty string")
    engine = _object(path, data, "engine")
    _value(path, engine, "bytes", "engine", _is_int(1), "a positive int")
    _value(path, engine, "sha256", "engine", _is_sha256, "a SHA-256 hex digest")
    model = _object(path, data, "model")
    _value(path, model, "io", "model", lambda v: v in IO_FORMS, f"one of {', '.join(IO_FORMS)}")
    for key, minimum in (("vocab_size", 1), ("type_vocab_size", 0), ("max_positions", 1), ("position_pad_id", 0)):
        _value(path, model, key, "model", _optional(_is_int(minimum)), f"null or an int >= {minimum}", required=False)
    if model["io"] == "generation" and "generation" in model:   # what the engine generates (model_info)
        facts = _object(path, model, "generation", "model")
        _value(path, facts, "search", "model.generation", lambda v: v in ("greedy", "beam"), "greedy or beam")
        _value(path, facts, "max_new_tokens", "model.generation", _is_int(1), "a positive int")
        if facts["search"] == "beam":
            _value(path, facts, "num_beams", "model.generation", _is_int(2), "an int >= 2")
            _value(path, facts, "num_return_sequences", "model.generation", _is_int(1), "a positive int")
    _value(path, data, "precision", "", lambda v: v in PRECISIONS, f"one of {', '.join(PRECISIONS)}")
    for i, profile in enumerate(_objects(path, data, "profiles")):
        for key in ("max_tokens", "max_batch", "max_seqlen"):
            _value(path, profile, key, f"profiles[{i}]", _is_int(1), "a positive int")
    names = []
    for i, tensor in enumerate(_objects(path, data, "inputs")):
        names.append(_value(path, tensor, "name", f"inputs[{i}]", _is_str, "a non-empty string"))
        _value(path, tensor, "dtype", f"inputs[{i}]", lambda v: v in INPUT_DTYPES, f"one of {', '.join(INPUT_DTYPES)}")
    if model["io"] == "packed" and not set(_PACKED_INPUTS) <= set(names):
        raise EngineFormatError(f"{path}: sidecar of a packed engine lists inputs {names}, expected at least"
                                f" {', '.join(_PACKED_INPUTS)}; rebuild the engine")
    for i, tensor in enumerate(_objects(path, data, "outputs")):
        _value(path, tensor, "name", f"outputs[{i}]", _is_str, "a non-empty string")
    _value(path, data, "plugins", "", _is_list_of(_is_str), "a list of plugin names", required=False)
    library = _value(path, data, "plugin_library", "", lambda v: v is None or isinstance(v, dict),
                     "null or an object", required=False)
    if library is not None:
        _value(path, library, "path", "plugin_library", _is_str, "a non-empty string")
        _value(path, library, "sha256", "plugin_library", _is_sha256, "a SHA-256 hex digest")


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
