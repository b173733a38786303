"""padfree: padding-free transformer inference on packed variable-length tokens.

Subpackages: padfree.ops (kernel bindings on torch tensors), padfree.torch (HF encoders on the
kernels), padfree.export (ONNX export and rewrite), padfree.engines (TensorRT engine building),
padfree.runtime (serving variable-length batches), padfree.cli (the `padfree` command).
"""
__version__ = "0.1.0"

from ._lib import LibraryNotFoundError, PadfreeError  # noqa: E402,F401


def __getattr__(name: str):
    # padfree.Runtime, imported on first use so that `import padfree` (and `padfree --help`) stays
    # free of torch
    if name == "Runtime":
        from .runtime import Runtime
        return Runtime
    raise AttributeError(f"module 'padfree' has no attribute {name!r}")
