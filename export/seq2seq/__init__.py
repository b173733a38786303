"""Encoder-decoder export (Marian, M2M100/NLLB, BART, mBART): encoder.onnx, cross_kv.onnx and
decoder_step.onnx, and their CPU proof against Hugging Face's generate (docs/EXPORT.md, "Seq2seq").

Modules, one job each: models (detection, loading, refusals), encoder (HF's encoder through the
dynamo exporter), builder (ONNX graphs written from weights), layers (the standard sublayers), ops
(the decoder ops as swappable standard-ONNX sites), cross_kv and decoder_step (the two graphs),
pipeline (the files), check (the ONNX Runtime generation loop vs HF generate).
"""
