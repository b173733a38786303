"""padfree.Runtime: one run(batch) over an engine file or the PyTorch path."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import torch

from .._lib import PadfreeError
from ._inputs import HostBatch, checked_host_batch
from ._outputs import OutputGather, needs_data, padded_index, shape_outputs
from ._pending import PendingRun
from ._plan import Chunk, plan_chunks
from ._staging import Staging
from .backends.base import Limits, check_chunk_limits, device_of, limits_of, on_stream, per_sequence_outputs_of

OUTPUT_FORMATS = ("torch", "numpy")
# what torch.cuda.current_stream() reads before it builds a Stream (absent: that call is used instead)
_raw_current_stream = getattr(torch._C, "_cuda_getCurrentStream", None)


def open_backend(source: Any, max_tokens: int | None = None, max_batch: int | None = None,
                 **engine_options: Any) -> Any:
    """The backend for an engine path, an export folder (an encoder's or a seq2seq's, on ONNX Runtime), a
    seq2seq export's generation graph (generation.padfree.onnx, on ONNX Runtime), a PadfreeEncoder, a
    padfree.generation Seq2SeqGenerator, or an object that already is a backend."""
    if isinstance(source, (str, os.PathLike)) and os.path.isdir(source):
        from .backends.onnxrt_encoder import OnnxrtEncoderBackend, is_encoder_export
        from .backends.onnxrt_seq2seq import OnnxrtSeq2SeqGenerator, is_seq2seq_export
        if is_seq2seq_export(source):
            return OnnxrtSeq2SeqGenerator(source)
        if is_encoder_export(source):
            return OnnxrtEncoderBackend(source, max_tokens=max_tokens, max_batch=max_batch)
        raise PadfreeError(f"{os.fspath(source)} is a folder but not a padfree export (no report.json or"
                           f" seq2seq.json): export it with `padfree export`, or serve an HF model through"
                           f" padfree.torch.from_hf")
    if isinstance(source, (str, os.PathLike)) and os.fspath(source).endswith(".onnx"):
        from .backends.onnxrt_generation import OnnxrtGenerationGraph
        return OnnxrtGenerationGraph(source)    # refuses any other ONNX file by name
    if isinstance(source, (str, os.PathLike)):
        try:
            from .backends import engine as engine_backend
        except ImportError as e:
            raise PadfreeError(f"cannot serve engine {os.fspath(source)!r}: the engine backend"
                               f" (padfree.runtime.backends.engine) is not available ({e})") from e
        return engine_backend.open_engine(source, **engine_options)
    if hasattr(source, "forward_packed"):
        from .backends.encoder import EncoderBackend
        return EncoderBackend(source, max_tokens=max_tokens, max_batch=max_batch)
    if hasattr(source, "execute_packed") or hasattr(source, "generate") and hasattr(source, "limits"):
        return source
    if hasattr(source, "generate") and hasattr(source, "runner"):     # padfree.generation.Seq2SeqGenerator
        from .backends.seq2seq import TorchSeq2SeqBackend
        return TorchSeq2SeqBackend(source)
    hint = (" (an HF model: convert it with padfree.torch.from_hf first)"
            if isinstance(source, torch.nn.Module) else "")
    raise TypeError(f"Runtime serves an engine path, a PadfreeEncoder or a backend; got"
                    f" {type(source).__name__}{hint}")


def _tighten(limits: Limits, max_tokens: int | None, max_batch: int | None) -> Limits:
    """Apply the caller's chunk limits; an engine cannot be asked for more than it was built for."""
    check_chunk_limits(max_tokens, max_batch)
    for name, want in (("max_tokens", max_tokens), ("max_batch", max_batch)):
        have = getattr(limits, name)
        if want is not None and want > have:
            raise ValueError(f"{name}={want} exceeds what the backend serves ({have})")
    return dataclasses.replace(limits, max_tokens=limits.max_tokens if max_tokens is None else int(max_tokens),
                               max_batch=limits.max_batch if max_batch is None else int(max_batch))


def _as_stream(stream: Any, device: torch.device) -> torch.cuda.Stream | None:
    if stream is None:
        return None
    if device.type != "cuda":
        raise ValueError(f"a stream was given, but the backend runs on {device}")
    if isinstance(stream, int):  # a raw cudaStream_t from another library
        return torch.cuda.ExternalStream(stream, device=device)
    if not isinstance(stream, torch.cuda.Stream):
        raise TypeError(f"stream: expected a torch.cuda.Stream or a raw cudaStream_t int, got"
                        f" {type(stream).__name__}")
    if stream.device != device:
        raise ValueError(f"stream is on {stream.device}, the backend on {device}")
    return stream


class Runtime:
    """Serves variable-length batches: validates, packs on the host into pinned memory, copies
    asynchronously on the stream, splits into chunks within the backend's limits (order kept),
    executes, and returns per-sequence or padded outputs.

    source: an engine path (padfree.runtime.backends.engine), a padfree.torch PadfreeEncoder, or any object
      with the backend protocol (limits, output_names, execute_packed).
    stream: where the work is enqueued (torch.cuda.Stream or a raw cudaStream_t int); None: torch's
      current stream at each run(). Torch outputs are ready in that stream's order, unsynchronized.
    output: "torch" (tensors on the backend's device) or "numpy" (host arrays, stream synchronized).
    max_tokens, max_batch: chunk limits; for an encoder they default to EncoderBackend's, for an
      engine to what it was built for (and cannot exceed it).
    tokenizer: for tokenize() and encode(): a folder holding the model's HF tokenizer, or a tokenizer
      object; None: the one beside the source (an export folder, an engine's folder, the HF directory
      the model was loaded from), found on first use (runtime/_text.py).
    submit() enqueues a batch and returns at once (a PendingRun), so that the host packs the next
    batch while the GPU runs this one; run() is submit().result().
    A Runtime is driven from one thread at a time (its pinned staging buffers are shared): one per thread.
    """

    def __init__(self, source: Any, stream: Any = None, *, output: str = "torch",
                 max_tokens: int | None = None, max_batch: int | None = None, tokenizer: Any = None,
                 **engine_options: Any):
        if output not in OUTPUT_FORMATS:
            raise ValueError(f"output must be one of {OUTPUT_FORMATS}, got {output!r}")
        check_chunk_limits(max_tokens, max_batch)  # before an engine or a model is loaded
        self.backend = open_backend(source, max_tokens=max_tokens, max_batch=max_batch, **engine_options)
        self.limits = _tighten(limits_of(self.backend), max_tokens, max_batch)
        self.output_names = list(self.backend.output_names)
        self.per_sequence_outputs = per_sequence_outputs_of(self.backend)
        self.device = device_of(self.backend)
        self.stream = _as_stream(stream, self.device)
        self.output = output
        self._staging = Staging(self.device)
        self._streams: dict[tuple, torch.cuda.Stream] = {}
        self._source, self._tokenizer, self._text_tokenizer = source, tokenizer, None

    def __repr__(self) -> str:
        return f"Runtime({self.backend!r}, device={self.device}, limits={self.limits})"

    def generate(self, batch: Any, attention_mask: Any = None, **options: Any) -> Any:
        """Generate with an encoder-decoder backend (a seq2seq export on ONNX Runtime, or the PyTorch path's
        Seq2SeqGenerator): batch and options as Hugging Face's generate takes them (a [B, S] tensor with its
        attention_mask, or a list of token-id lists; num_beams, max_new_tokens, return_dict_in_generate, ...),
        the output as padfree.generation's generate returns it (HF's types)."""
        generate = getattr(self.backend, "generate", None)
        if generate is None:
            raise TypeError(f"{type(self.backend).__name__} encodes; generate() needs an encoder-decoder backend "
                            f"(a seq2seq export folder or padfree.torch.from_hf of an encoder-decoder)")
        return generate(batch, attention_mask, **options)

    @property
    def text_tokenizer(self) -> Any:
        """The model's tokenizer with its length limit (runtime/_text.py TextTokenizer), loaded on first use."""
        if self._text_tokenizer is None:
            from ._text import TextTokenizer
            self._text_tokenizer = TextTokenizer.for_runtime(self._tokenizer, self._source, self.backend, self.limits)
        return self._text_tokenizer

    def tokenize(self, texts: Any, *, truncate: bool = False) -> list[list[int]]:
        """The token ids of each text as the model's tokenizer makes them, without padding: run() takes
        the list as it is. A text over the model's limit is an InputError naming it, unless truncate."""
        from ._text import check_texts
        return self.text_tokenizer(check_texts(texts), truncate)

    def encode(self, texts: Any, batch_size: int = 128, *, normalize: bool = False, truncate: bool = False,
               output: str | None = None, stream: Any = None) -> Any:
        """Sentence embeddings, in the style of sentence-transformers' encode: float32 [len(texts), hidden],
        row i the embedding of texts[i] (the model's sentence_embedding output: a sentence-transformers
        model exported with its pooling, and its normalization where it has one).

        texts: a list of str, tokenized on the host without padding, batch_size texts per run().
        normalize: L2-normalize each row (as normalize_embeddings=True).
        truncate: cut texts over the model's limit (else an InputError naming the limit).
        output: "torch" (a tensor on the backend's device) or "numpy"; None: the Runtime's.
        """
        from ._text import encode
        return encode(self, texts, batch_size, normalize, truncate, output or self.output, stream)

    def run(self, batch: Any, attention_mask: Any = None, token_type_ids: Any = None, *,
            padded: bool = False, packed: bool = False, output: str | None = None,
            stream: Any = None) -> dict[str, Any]:
        """Encode a batch.

        batch: a list of token sequences (lists, 1-D numpy arrays or torch tensors of ints), or a
          padded [B, S] int array/tensor with attention_mask [B, S] (left-aligned ones, int or bool;
          None: no padding), or a mapping with those keys (an HF tokenizer's output).
        token_type_ids: like batch (a list of sequences, or [B, S]); None: all zeros.
        Returns {name: value} per backend output name: "last_hidden_state" as a list of [len_i, H]
        (padded=True: [B, S, H], zeros in padding; S = the input's width, or the longest sequence;
        packed=True: [total_tokens, H], sequence i at rows cu_seqlens[i]:cu_seqlens[i + 1], with
        "cu_seqlens" (int32 [B + 1], on the host) in the result: no view per sequence),
        "pooler_output" as [B, H]. Raises InputError (a ValueError) for malformed input.
        """
        return self.submit(batch, attention_mask, token_type_ids, padded=padded, packed=packed, output=output,
                           stream=stream).result()

    def submit(self, batch: Any, attention_mask: Any = None, token_type_ids: Any = None, *,
               padded: bool = False, packed: bool = False, output: str | None = None,
               stream: Any = None) -> PendingRun:
        """Validate, pack and enqueue a batch without waiting for the GPU; arguments as run(), which is
        submit(...).result(). Pack the next batch while this one runs (docs/RUNTIME.md):

            pending = rt.submit(batches[0])
            for batch in batches[1:]:
                following = rt.submit(batch)   # host work overlaps the GPU's work on `pending`
                use(pending.result())
                pending = following
            use(pending.result())

        Raises InputError at once for malformed input, before anything is enqueued.
        """
        if not hasattr(self.backend, "execute_packed"):
            raise TypeError(f"{type(self.backend).__name__} is an encoder-decoder: call generate(), not run()")
        output = output or self.output
        if output not in OUTPUT_FORMATS:
            raise ValueError(f"output must be one of {OUTPUT_FORMATS}, got {output!r}")
        if padded and packed:
            raise ValueError("padded=True and packed=True: choose one layout for the per-token outputs")
        host = checked_host_batch(batch, attention_mask, token_type_ids, self.limits)
        chunks = plan_chunks(host.lengths, self.limits.max_batch, self.limits.max_tokens, host.cu_seqlens)
        if self.device.type != "cuda":
            return self._submit(host, chunks, padded, packed, output, None)
        stream = _as_stream(stream, self.device) or self.stream
        if stream is None and self.device.index in (None, torch.cuda.current_device()):
            # torch's current stream on the current device: no context to enter, and the backend is
            # told None (current), which spares it a current_stream() (~4 us of host time each)
            return self._submit(host, chunks, padded, packed, output, self._current_stream(), current=True)
        stream = stream or torch.cuda.current_stream(self.device)
        with on_stream(stream):
            return self._submit(host, chunks, padded, packed, output, stream)

    def _current_stream(self) -> torch.cuda.Stream:
        """torch's current stream on the current device, one Stream object per stream: current_stream()
        builds a new one on each call (4-7 us of host time, measured on the H200 machine's host), where
        the raw (stream_id, device_index, device_type) it is made from costs ~0.3 us."""
        if _raw_current_stream is None:
            return torch.cuda.current_stream()
        raw = _raw_current_stream(torch.cuda.current_device())
        stream = self._streams.get(raw)
        if stream is None:
            if len(self._streams) >= 64:  # a caller cycling through streams: keep the cache small
                self._streams.clear()
            stream = self._streams[raw] = torch.cuda.Stream(stream_id=raw[0], device_index=raw[1], device_type=raw[2])
        return stream

    def _submit(self, host: HostBatch, chunks: list[Chunk], padded: bool, packed: bool, output: str,
                stream: torch.cuda.Stream | None, current: bool = False) -> PendingRun:
        arrays: list[np.ndarray] = []
        for c in chunks:
            arrays.append(host.input_ids[c.token_start:c.token_stop])
            cu = host.cu_seqlens[c.first:c.stop + 1]
            arrays.append(cu - c.token_start if c.token_start else cu)
            if host.token_type_ids is not None:
                arrays.append(host.token_type_ids[c.token_start:c.token_stop])
        if padded:  # the outputs are scattered into their padded rows on the backend's device
            arrays.append(padded_index(host))
        views = self._staging.upload(arrays, stream)

        per_chunk = 3 if host.token_type_ids is not None else 2
        numpy = output == "numpy"
        gather = OutputGather(self.output_names, host, views[-1] if padded else None, to_host=numpy,
                              per_sequence=self.per_sequence_outputs)
        backend_name = type(self.backend).__name__
        for i, c in enumerate(chunks):
            ids, cu, *types = views[i * per_chunk:(i + 1) * per_chunk]
            result = self.backend.execute_packed(ids, cu, c.max_seqlen, types[0] if types else None,
                                                 None if current else stream)
            gather.add(c, result, backend_name)
        outputs = gather.finish()

        ready = None
        if stream is not None:
            ready = torch.cuda.Event()
            ready.record(stream)

        def finish() -> dict[str, Any]:
            return shape_outputs(outputs, host, padded, numpy, self.per_sequence_outputs, packed)
        if needs_data(outputs, numpy):
            return PendingRun(ready, numpy, None, finish)
        return PendingRun(ready, numpy, finish())
