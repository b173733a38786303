"""ONNX export and graph rewrite (padfree.export)."""
