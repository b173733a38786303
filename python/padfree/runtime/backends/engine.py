"""The Runtime backend over an engine file (DESIGN.md "Runtime backends"): loads the engine after
its sidecar checks out (EngineFile, which the whole-generation engine's backend, engine_generation.py,
shares), then executes packed batches with torch device memory.

    backend = open_engine("model.engine")   # refuses unknown format, version mismatch, corrupt
    out = backend.execute_packed(input_ids, cu_seqlens, max_seqlen, token_type_ids, stream)

Packed engines (model.padfree.onnx --io packed) take the packed tensors as they are. Padded engines
(--io padded, or a plain model.onnx) are adapted here: padding is rebuilt on the way in (ids and an
attention mask [B, S]) and removed from per-token outputs on the way out, with padfree's kernels.
One execution context per optimization profile, created on first use; the smallest profile that
fits a batch runs it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from padfree.engines import plugin_library, sidecar, trt_api
from padfree.engines.errors import BackendUnavailableError, CorruptEngineError, EngineError, PluginLibraryError
from padfree.engines.profiles import Profile
from padfree.ops._tensors import PRECISION_DTYPES

from .base import check_packed, on_stream

_TORCH_DTYPES = {name: getattr(torch, name) for name in sidecar.INPUT_DTYPES}

_TRT_TO_TORCH = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT32": torch.int32,
                 "INT64": torch.int64, "BOOL": torch.bool}


def open_engine(path: str | os.PathLike, plugin_library_path: str | os.PathLike | None = None,
                backend: str | None = None, device: Any = None, allow_plugin_mismatch: bool = False,
                export_dir: str | os.PathLike | None = None, **ignored: Any) -> Any:
    """The backend for `path` (Runtime's entry for engine files): a whole-generation engine's generate()
    (export_dir: the export it was built from, where not the engine's folder), or an encoder engine's
    execute_packed."""
    if sidecar.read(path)["model"]["io"] == "generation":
        from .engine_generation import EngineGeneration
        return EngineGeneration(path, plugin_library_path=plugin_library_path, backend=backend, device=device,
                                allow_plugin_mismatch=allow_plugin_mismatch, export_dir=export_dir)
    return EngineBackend(path, plugin_library_path=plugin_library_path, backend=backend, device=device,
                         allow_plugin_mismatch=allow_plugin_mismatch)


def _encoder_io(engine: "EngineFile") -> None:
    if engine.io not in ("packed", "padded"):
        raise EngineError(f"{engine.path}: an engine of a seq2seq export's {engine.io} graph: padfree runs the"
                          " whole-generation engine (generation.padfree.onnx's) through Runtime.generate; the"
                          " per-step engines are built, not run (docs/EXPORT.md, Seq2seq: engines)")


def per_sequence_from_sidecar(metadata: dict) -> frozenset[str] | None:
    """The outputs with one row per sequence, from the shapes the sidecar records (engines/model_info.py):
    packed, those whose first axis is not input_ids' (T); padded, those without input_ids' [B, S]
    leading axes. None where the sidecar records no shapes."""
    ids = next((t for t in metadata.get("inputs", ()) if t.get("name") == "input_ids"), None)
    outputs = metadata.get("outputs", ())
    if ids is None or not isinstance(ids.get("shape"), list) or \
            any(not isinstance(t.get("shape"), list) for t in outputs):
        return None
    lead = ids["shape"][:1] if metadata["model"]["io"] == "packed" else ids["shape"][:2]
    if any(not isinstance(d, str) or d == "?" for d in lead):  # unnamed axes cannot be matched
        return None
    return frozenset(t["name"] for t in outputs if t["shape"][:len(lead)] != lead)


class EngineFile:
    """An engine file loaded after its sidecar checks out: the sidecar, the TensorRT that runs it (with
    padfree's plugin library where it uses plugins), the deserialized engine on `device`, one execution
    context per optimization profile (created on first use), and one enqueued run on named device tensors."""

    def __init__(self, path: str | os.PathLike, plugin_library_path: str | os.PathLike | None = None,
                 backend: str | None = None, device: Any = None, allow_plugin_mismatch: bool = False,
                 check: Any = None, defer_device: bool = False):
        self.path = Path(path)
        self.metadata = sidecar.read(self.path)
        self.api = self._api(backend)
        sidecar.check_backend(self.metadata, self.api.name, self.api.version, self.path)
        blob = sidecar.read_engine_bytes(self.path, self.metadata)
        if self.metadata.get("plugins"):
            self._load_plugins(plugin_library_path, allow_plugin_mismatch)
        # sidecar.read checked these fields' structure and types
        self.io = self.metadata["model"]["io"]
        if check is not None:   # the caller's refusals from the sidecar, before a GPU is looked for
            check(self)
        self.profiles = [Profile(p["max_tokens"], p["max_batch"], p["max_seqlen"]) for p in self.metadata["profiles"]]
        self.output_names = [t["name"] for t in self.metadata["outputs"]]
        self._input_dtypes = {t["name"]: _TORCH_DTYPES[t["dtype"]] for t in self.metadata["inputs"]}
        self._blob, self._device_asked = blob, device
        self.engine, self.device = None, None
        self._contexts: dict[int, Any] = {}
        if not defer_device:
            self.open_on_device()

    def open_on_device(self) -> None:
        """Deserializes the engine on its CUDA device (once): deferred, a caller checks its inputs against
        the sidecar on a machine without a GPU before this refuses."""
        if self.engine is not None:
            return
        if not torch.cuda.is_available():
            raise EngineError(f"{self.path}: the engine and its sidecar check out, but running it needs a CUDA device"
                              " and torch sees none")
        device = self._device_asked
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        self._logger = self.api.logger()
        self._runtime = self.api.trt.Runtime(self._logger)
        with torch.cuda.device(self.device):
            self.engine = self._runtime.deserialize_cuda_engine(self._blob)
        if self.engine is None:
            raise CorruptEngineError(f"{self.path}: {self.api.name} could not deserialize the engine (its messages"
                                     " are above: a missing plugin, an unsupported GPU, or no CUDA device)")
        self._blob = None

    def _api(self, backend: str | None) -> trt_api.Api:
        """The TensorRT the engine was built with if installed, else whichever is (refused just after)."""
        if backend is not None:
            return trt_api.load(backend)
        try:
            return trt_api.load(self.metadata["backend"].get("name"))
        except (BackendUnavailableError, ValueError):
            return trt_api.load()

    def _load_plugins(self, explicit: str | os.PathLike | None, allow_mismatch: bool) -> None:
        # The sidecar's recorded path is never loaded (a data file must not choose code to run): the
        # library comes from the caller, $PADFREE_TRT_LIBRARY or the installation, and its hash must
        # be the recorded one before it is loaded.
        try:
            library = plugin_library.find(explicit)
        except PluginLibraryError as e:
            plugins = ", ".join(self.metadata["plugins"])
            raise PluginLibraryError(f"{self.path} uses padfree plugins ({plugins}): {e}") from e
        plugin_library.check_recorded(library, self.metadata.get("plugin_library"), self.path, allow_mismatch)
        plugin_library.load_into(self.api.trt, library)

    def profile_for(self, tokens: int, batch: int, seqlen: int, packed: bool = True) -> int:
        """The smallest profile that takes the batch; an EngineError where none does."""
        for index, profile in enumerate(self.profiles):
            fits = profile.fits(tokens, batch, seqlen) if packed else (
                batch <= profile.max_batch and seqlen <= profile.max_seqlen)
            if fits:
                return index
        raise EngineError(f"a batch of {batch} sequences, {tokens} tokens, longest {seqlen} exceeds every profile of"
                          f" {self.path} (largest: {self.profiles[-1]})")

    def _context(self, index: int, stream: torch.cuda.Stream):
        context = self._contexts.get(index)
        if context is None:
            context = self.engine.create_execution_context()
            if context is None:
                raise EngineError(f"{self.path}: could not create an execution context (out of device memory?)")
            context.set_optimization_profile_async(index, stream.cuda_stream)
            self._contexts[index] = context
        return context

    def typed(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        want = self._input_dtypes[name]
        return tensor if tensor.dtype == want else tensor.to(want)

    def run(self, index: int, feeds: dict[str, torch.Tensor], stream: torch.cuda.Stream) -> dict[str, torch.Tensor]:
        """Enqueues one run of profile `index` on `stream` (not synchronized): feeds by input name, device
        tensors of the engine's input dtypes; the outputs in fresh device tensors."""
        context = self._context(index, stream)
        for name, tensor in feeds.items():
            tensor = tensor.contiguous()
            feeds[name] = tensor  # kept alive until enqueued
            if not context.set_input_shape(name, tuple(tensor.shape)):
                raise EngineError(f"{self.path}: input {name} of shape {tuple(tensor.shape)} is outside"
                                  f" profile {index}")
            context.set_tensor_address(name, tensor.data_ptr())
        outputs = {}
        for name in self.output_names:
            shape = tuple(context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise EngineError(f"{self.path}: output {name} has an unresolved shape {shape}")
            dtype = _TRT_TO_TORCH[self.engine.get_tensor_dtype(name).name]
            outputs[name] = torch.empty(shape, dtype=dtype, device=self.device)
            context.set_tensor_address(name, outputs[name].data_ptr())
        if not context.execute_async_v3(stream.cuda_stream):
            raise EngineError(f"{self.path}: execution failed (messages above)")
        return outputs


class EngineBackend(EngineFile):
    """limits, output_names, device and execute_packed over one engine file of an encoder."""

    def __init__(self, path: str | os.PathLike, plugin_library_path: str | os.PathLike | None = None,
                 backend: str | None = None, device: Any = None, allow_plugin_mismatch: bool = False):
        super().__init__(path, plugin_library_path, backend, device, allow_plugin_mismatch, check=_encoder_io)
        self.limits = self._limits()
        per_sequence = per_sequence_from_sidecar(self.metadata)
        if per_sequence is not None:  # a sidecar without shapes: the Runtime reads outputs by name
            self.per_sequence_outputs = per_sequence

    def __repr__(self) -> str:
        return f"EngineBackend({str(self.path)!r}, {self.api.name} {self.api.version}, io={self.io})"

    def _limits(self):
        from .base import Limits
        model = self.metadata["model"]
        largest = self.profiles[-1]
        max_tokens = largest.max_tokens
        if self.io == "padded":  # a padded engine's batch is [B, S]: it never holds more than B * S tokens
            max_tokens = min(max_tokens, largest.max_batch * largest.max_seqlen)
        precision = self.metadata["precision"]
        return Limits(max_tokens=max_tokens, max_batch=largest.max_batch, max_seqlen=largest.max_seqlen,
                      vocab_size=model.get("vocab_size"), type_vocab_size=model.get("type_vocab_size"),
                      dtype=PRECISION_DTYPES[precision], position_pad_id=model.get("position_pad_id"))

    def execute_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: torch.Tensor | None,
                       stream: torch.cuda.Stream | None) -> dict[str, torch.Tensor]:
        """input_ids, token_type_ids: int32 cuda [T]; cu_seqlens: int32 cuda [B+1] -> {"last_hidden_state":
        [T, H], "pooler_output": [B, H] where the model has one}, enqueued on `stream`, not synchronized."""
        # TensorRT takes raw addresses: a host tensor's would be read as device memory
        check_packed(input_ids, cu_seqlens, max_seqlen, token_type_ids, self.device)
        stream = stream or torch.cuda.current_stream(self.device)
        tokens, batch = int(input_ids.shape[0]), int(cu_seqlens.shape[0]) - 1
        index = self.profile_for(tokens, batch, int(max_seqlen), packed=self.io == "packed")
        with on_stream(stream):
            if self.io == "packed":
                feeds = self._packed_feeds(input_ids, cu_seqlens, max_seqlen, token_type_ids)
            else:
                feeds = self._padded_feeds(input_ids, cu_seqlens, max_seqlen, token_type_ids)
            outputs = self.run(index, feeds, stream)
            if self.io == "padded":
                outputs = self._unpad(outputs, cu_seqlens, tokens, batch)
        return outputs

    def _packed_feeds(self, ids, cu_seqlens, max_seqlen, token_type_ids) -> dict[str, torch.Tensor]:
        feeds = {"input_ids": ids, "cu_seqlens": cu_seqlens,
                 # a shape input: only its length (the longest sequence) is read by the attention plugin
                 "max_seqlen": torch.empty(int(max_seqlen), dtype=self._input_dtypes["max_seqlen"], device=self.device)}
        if "token_type_ids" in self._input_dtypes:
            feeds["token_type_ids"] = token_type_ids if token_type_ids is not None else torch.zeros_like(ids)
        return {name: self.typed(name, t) for name, t in feeds.items()}

    def _padded_feeds(self, ids, cu_seqlens, max_seqlen, token_type_ids) -> dict[str, torch.Tensor]:
        from padfree.ops import padding
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        positions = torch.arange(int(max_seqlen), device=self.device, dtype=torch.int32)
        feeds = {"input_ids": padding.rebuild_padding(ids, cu_seqlens, int(max_seqlen)),
                 "attention_mask": (positions[None, :] < lengths[:, None]).to(torch.int32)}
        if "token_type_ids" in self._input_dtypes:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(ids)
            feeds["token_type_ids"] = padding.rebuild_padding(types, cu_seqlens, int(max_seqlen))
        return {name: self.typed(name, t) for name, t in feeds.items() if name in self._input_dtypes}

    def _unpad(self, outputs: dict[str, torch.Tensor], cu_seqlens: torch.Tensor, tokens: int, batch: int):
        from padfree.ops import padding
        out = {}
        per_sequence = getattr(self, "per_sequence_outputs", None)
        for name, value in outputs.items():
            # question answering's start_logits [B, S] are per token with two dims
            per_token = value.dim() >= 3 and value.shape[0] == batch if per_sequence is None else \
                name not in per_sequence
            out[name] = padding.remove_padding(value.contiguous(), cu_seqlens, tokens) if per_token else value
        return out
