"""The Runtime's backends side by side (DESIGN.md "Runtime backends").

base: the protocol every backend meets (limits, output_names, execute_packed) and its checks;
encoder: the PyTorch-path backend over a padfree.torch PadfreeEncoder;
engine: the backend over a TensorRT engine file and its sidecar (needs padfree.engines, imported
only when an engine is opened);
seq2seq: the PyTorch path's encoder-decoder (padfree.generation's Seq2SeqGenerator), for generate();
onnxrt_encoder: an encoder export folder on ONNX Runtime (CPU), its plugin nodes expanded into their
references: the GPU-free way to run(), encode() and `padfree run OUT --text`;
onnxrt_seq2seq: a seq2seq export folder generating on ONNX Runtime (CPU) with padfree.generation's
searches, for generate() (the seed of engine-backed generation).

padfree.runtime depends on padfree.engines (for engine files) and never the other way round.
"""
