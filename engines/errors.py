"""The engine package's errors: each says what was expected, what was found, and what to do."""
from __future__ import annotations

from padfree._lib import PadfreeError


class EngineError(PadfreeError):
    """Base of padfree.engines' errors."""


class BackendUnavailableError(EngineError, ImportError):
    """Neither TensorRT nor TensorRT-RTX (Python bindings) can be imported."""


class BuildError(EngineError):
    """The ONNX model could not be parsed or built into an engine."""


class PrecisionError(BuildError, ValueError):
    """The requested precision cannot be honoured by this backend for this model."""


class EngineFormatError(EngineError):
    """The engine's sidecar is missing, unreadable or of an unknown format."""


class EngineVersionError(EngineError):
    """The engine was built by another TensorRT / padfree / format version than the one installed."""


class CorruptEngineError(EngineError):
    """The engine bytes do not match what the sidecar recorded, or TensorRT refused them."""


class PluginLibraryError(EngineError):
    """The padfree TensorRT plugin library is needed but missing or not loadable."""
