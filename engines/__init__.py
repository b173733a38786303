"""TensorRT engine building (padfree.engines)."""
