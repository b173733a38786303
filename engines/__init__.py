"""TensorRT engine building and serving (padfree.engines).

build: ONNX -> engine + JSON sidecar (`padfree build`); sidecar, plugin_library, profiles: what the
engine backend (padfree.runtime.backends.engine) reads;
check: engine vs ONNX Runtime through polygraphy (`padfree check --engine`); trt_api: the adapter over
`tensorrt` and TensorRT-RTX. Importing this package needs neither.
"""
