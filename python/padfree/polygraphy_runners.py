"""Polygraphy runners over padfree's Runtime, so that Comparator.run compares an engine or the
PyTorch path with any other runner (ONNX Runtime, TensorRT) on the feeds polygraphy hands out:
padded input_ids / attention_mask (/ token_type_ids) arrays in, padded numpy outputs out, named like
the ONNX model's outputs.

    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator
    runners = [TorchRunner(hf_model), OnnxrtRunner(SessionFromOnnx("model.onnx"))]
    results = Comparator.run(runners, data_loader=feeds)
    mask_padding(results, feeds)          # padfree writes zeros in padding, ONNX models do not
    Comparator.compare_accuracy(results)
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from .runtime import PER_SEQUENCE_OUTPUTS, Runtime

DEFAULT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class RuntimeRunner(BaseRunner):
    """A polygraphy runner over a padfree Runtime.

    runtime: a Runtime, or a callable returning one (built at activation, the way polygraphy's
      loaders defer work; the runner then drops it at deactivation).
    input_names: the feed names, in the order of Runtime.run's (input_ids, attention_mask,
      token_type_ids); default: input_ids, attention_mask, plus token_type_ids where the model has
      token types. Match the reference model's inputs: polygraphy checks feeds against them.
    output_names: {runtime output name: reported name}, for a reference that names them otherwise.
    index_dtype: the dtype the inputs are declared with (ONNX exports of HF models use int64).
    """

    def __init__(self, runtime: Runtime | Callable[[], Runtime], name: str | None = None,
                 input_names: Sequence[str] | None = None, output_names: Mapping[str, str] | None = None,
                 index_dtype: Any = np.int64, prefix: str = "padfree-runtime"):
        super().__init__(name=name, prefix=prefix)
        self._source = runtime
        self._input_names = None if input_names is None else tuple(input_names)
        self._rename = dict(output_names or {})
        self._index_dtype = np.dtype(index_dtype)
        self.runtime: Runtime | None = None

    def activate_impl(self):
        self.runtime = self._source if isinstance(self._source, Runtime) else self._source()
        if self._input_names is None:
            has_types = self.runtime.limits.type_vocab_size != 0
            self._resolved_inputs = DEFAULT_INPUTS if has_types else DEFAULT_INPUTS[:2]
        else:
            unknown = set(self._input_names) - set(DEFAULT_INPUTS)
            if unknown or "input_ids" not in self._input_names:
                raise ValueError(f"input_names: expected input_ids and any of attention_mask,"
                                 f" token_type_ids; got {list(self._input_names)}")
            self._resolved_inputs = self._input_names

    def get_input_metadata_impl(self):
        meta = TensorMetadata()
        for name in self._resolved_inputs:
            meta.add(name, self._index_dtype, shape=("batch", "sequence"))
        return meta

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        out = self.runtime.run(feed_dict["input_ids"], feed_dict.get("attention_mask"),
                               feed_dict.get("token_type_ids"), padded=True, output="numpy")
        self.inference_time = time.perf_counter() - start
        return OrderedDict((self._rename.get(name, name), value) for name, value in out.items())

    def deactivate_impl(self):
        del self._resolved_inputs
        self.runtime = None


def _runner_options(options: dict[str, Any]) -> dict[str, Any]:
    """Pop RuntimeRunner's own keyword arguments out of `options`; the rest go to Runtime."""
    return {k: options.pop(k) for k in ("input_names", "output_names", "index_dtype") if k in options}


class EngineRunner(RuntimeRunner):
    """RuntimeRunner over an engine file (loaded at activation); runtime_options go to Runtime."""

    def __init__(self, engine_path: str, name: str | None = None, **options: Any):
        runner_options = _runner_options(options)
        super().__init__(lambda: Runtime(engine_path, **options), name=name, prefix="padfree-engine",
                         **runner_options)


class TorchRunner(RuntimeRunner):
    """RuntimeRunner over the PyTorch path: a PadfreeEncoder, or an HF model converted at activation
    with padfree.torch.from_hf(model, **from_hf_options)."""

    def __init__(self, model: Any, name: str | None = None, from_hf_options: Mapping[str, Any] | None = None,
                 **options: Any):
        runner_options = _runner_options(options)

        def build() -> Runtime:
            encoder = model
            if not hasattr(model, "forward_packed"):
                from padfree.torch import from_hf
                encoder = from_hf(model, **dict(from_hf_options or {}))
            return Runtime(encoder, **options)

        super().__init__(build, name=name, prefix="padfree-torch", **runner_options)


def mask_padding(run_results: Any, feeds: Sequence[Mapping[str, np.ndarray]],
                 mask_name: str = "attention_mask") -> Any:
    """Zero every runner's per-token outputs at padded positions, in place, so that a reference that
    computes values there (an ONNX export of an HF model does) compares with padfree, which writes
    zeros. feeds: the data loader's feeds, in order (a list, or anything that iterates the same)."""
    masks = [np.asarray(feed[mask_name]).astype(bool) for feed in feeds]
    for _, iterations in run_results.items():
        if len(iterations) != len(masks):
            raise ValueError(f"{len(iterations)} iterations but {len(masks)} feeds")
        for result, mask in zip(iterations, masks):
            for name in list(result.keys()):
                value = result[name]
                if name in PER_SEQUENCE_OUTPUTS or value.shape[:2] != mask.shape:
                    continue
                result[name] = np.where(mask.reshape(mask.shape + (1,) * (value.ndim - 2)), value, 0)
    return run_results
