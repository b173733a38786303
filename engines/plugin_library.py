"""Where libpadfree_trt.so (the TensorRT plugins, plugins/trt) is found, and loading it into a
TensorRT plugin registry through IPluginRegistry.loadLibrary (its getCreators entry point).

Loading a shared library runs its code, so only the user chooses it: an explicit path (--plugin-library),
$PADFREE_TRT_LIBRARY, or the library installed with padfree. An engine's sidecar records the SHA-256
of the library it was built with (and its path, for messages only); a library whose hash differs is
refused before it is loaded unless the caller allows it explicitly (--allow-plugin-mismatch)."""
from __future__ import annotations

import glob
import hashlib
import logging
import os
from pathlib import Path

from padfree import env

from .errors import PluginLibraryError

log = logging.getLogger(__name__)
LIBRARY_NAME = "libpadfree_trt.so"
ENV_VAR = "PADFREE_TRT_LIBRARY"


def candidates() -> list[Path]:
    """First match wins: $PADFREE_TRT_LIBRARY, the installed package's lib/, a source checkout's build/."""
    found: list[Path] = []
    if env.is_set(ENV_VAR):
        found.append(env.path(ENV_VAR))
    import padfree
    package = Path(padfree.__file__).resolve().parent
    found.append(package / "lib" / LIBRARY_NAME)
    root = package.parent.parent  # python/padfree -> repository root in a checkout
    found += [Path(p) for p in sorted(glob.glob(str(root / "build" / "**" / LIBRARY_NAME), recursive=True))]
    return found


def find(explicit: str | os.PathLike | None = None, required: bool = True) -> Path | None:
    """The plugin library to use: `explicit` if given (it must exist), else the first candidate
    ($PADFREE_TRT_LIBRARY, then the installation's). Never a path read from a model or a sidecar."""
    if explicit is None and env.is_set(ENV_VAR):  # set by the user: as explicit as a flag
        explicit, where = env.get(ENV_VAR), f" (${ENV_VAR})"
    else:
        where = ""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise PluginLibraryError(f"plugin library {path}{where} does not exist: give the path of {LIBRARY_NAME}")
        return path.resolve()
    for path in candidates():
        if path.is_file():
            return path.resolve()
    if required:
        raise PluginLibraryError(
            f"{LIBRARY_NAME} was not found (looked in: {', '.join(str(p) for p in candidates()[:3])}). Build it"
            f" with TensorRT headers (cmake -DTensorRT_ROOT=...), then pass --plugin-library or set {ENV_VAR}.")
    return None


def sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_recorded(library: Path, recorded: dict | None, engine: str | os.PathLike,
                   allow_mismatch: bool = False) -> bool:
    """Refuse (PluginLibraryError) `library` unless its SHA-256 is the one the engine's sidecar
    recorded at build; True when they differ and allow_mismatch let it through (with a warning). A plan
    keeps its plugins' serialized state, not their code: another build may misread that state."""
    want = (recorded or {}).get("sha256")
    have = sha256(library)
    if want == have:
        return False
    built = f"{recorded.get('path')} (sha256 {want})" if want else "a plugin library it did not record"
    message = (f"{engine} was built with {built}, but the plugin library to load is {library} (sha256 {have}):"
               " another build of the plugins may refuse or misread the engine's plugin state")
    if not allow_mismatch:
        raise PluginLibraryError(f"{message}. Rebuild the engine with `padfree build`, give the library it was built"
                                 f" with (--plugin-library or {ENV_VAR}), or pass --allow-plugin-mismatch"
                                 " (allow_plugin_mismatch=True) to load this one anyway.")
    log.warning("%s; loading it because the mismatch was allowed", message)
    return True


_LOADED: dict[tuple[int, str], object] = {}


def load_into(trt, path: Path) -> None:
    """Register the library's creators in `trt`'s global plugin registry (once per process)."""
    key = (id(trt), str(path))
    if key in _LOADED:
        return
    registry = trt.get_plugin_registry()
    try:
        handle = registry.load_library(str(path))
    except Exception as e:  # noqa: BLE001 - the bindings raise various types
        raise PluginLibraryError(f"{trt.__name__} could not load {path}: {e}") from e
    if handle is None:
        raise PluginLibraryError(f"{trt.__name__} refused {path} (already registered, or not a plugin library)")
    _LOADED[key] = handle
