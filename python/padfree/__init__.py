"""padfree: padding-free transformer inference on packed variable-length tokens.

Subpackages: padfree.ops (kernel bindings on torch tensors), padfree.torch (HF encoders on the
kernels), padfree.export (ONNX export and rewrite), padfree.engines (TensorRT engine building),
padfree.runtime (serving variable-length batches), padfree.cli (the `padfree` command).
"""
__version__ = "0.1.0"

from ._lib import PadfreeError, LibraryNotFoundError  # noqa: E402,F401
