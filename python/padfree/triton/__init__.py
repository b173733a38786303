"""padfree.triton: Triton Inference Server model repository entries with ragged batching (docs/SERVING.md).

tensorrt: an engine for Triton's TensorRT backend (`tensorrt_plan`, cu_seqlens and max_seqlen as batch inputs);
python_backend: padfree.Runtime inside a Python-backend model.py, over an export folder (ONNX Runtime, CPU)
or an HF directory (the PyTorch path, GPU);
server: a local tritonserver from the nvidia-pytriton wheel, for tests and bench/serve.py.
"""
from ._repository import TritonError, parse  # noqa: F401
from .python_backend import write_python_model  # noqa: F401
from .tensorrt import BATCH_INPUTS, RAGGED_INPUTS, config_text, default_max_batch, main_profile, write_repository  # noqa: F401
