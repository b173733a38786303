"""Triton Python-backend model: padfree.Runtime over the model beside this file (`padfree triton` copies
this file to REPOSITORY/NAME/1/model.py; docs/SERVING.md).

Triton's dynamic batcher hands execute() a batch of requests of different lengths (input_ids
`allow_ragged_batch`); the Python backend passes each request's tensors as sent and computes no batch
inputs, so execute() concatenates the requests itself, which gives the Runtime the batch packed
(cu_seqlens = 0, len_0, len_0 + len_1, ..., what BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO would be)
with no padding, and answers each request with its own rows.

Rules this file keeps, and why:
- Imports of padfree and torch wait for initialize(): the stub's embedded Python ignores PYTHONPATH,
  so the writing interpreter's import path (parameter python_path) is added first.
- Tensors cross the stub boundary by DLPack, never as_numpy() / Tensor(name, ndarray): the stub's
  numpy conversion is built against numpy 1 and reads numpy 2 arrays wrong (wrong values, empty
  outputs) without an error.
- One bad request fails alone: a batch the Runtime refuses is run again request by request, so each
  gets its own answer or its own error.
"""
from __future__ import annotations

import json
import os
import site
import sys

import triton_python_backend_utils as pb_utils


def _add_import_path(entries: str) -> None:
    """The writer's sys.path entries, .pth files processed (an editable install's finder), then the
    sitecustomize one of them provides, as Python's own startup would have run it."""
    added = False
    for entry in entries.split(os.pathsep):
        if entry and entry not in sys.path and os.path.isdir(entry):
            site.addsitedir(entry)
            added = True
    if added and "sitecustomize" not in sys.modules:
        try:
            import sitecustomize  # noqa: F401
        except ImportError:
            pass


def _int_params(params: dict, keys: tuple) -> dict:
    """The config's parameters `keys` that are set, as ints; a one-line error naming a bad one."""
    out = {}
    for k in keys:
        if params.get(k):
            try:
                out[k] = int(params[k])
            except ValueError:
                raise pb_utils.TritonModelException(f"config.pbtxt parameter {k}: expected an integer, got "
                                                    f"{params[k]!r}") from None
    return out


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        want = params.get("python_version")
        have = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if want and want != have:
            raise pb_utils.TritonModelException(
                f"this model was written for Python {want} (its packages' import path), but the Python backend "
                f"stub runs Python {have}: start tritonserver with the Python {want} stub (docs/SERVING.md)")
        _add_import_path(params.get("python_path", ""))
        import numpy
        import torch

        import padfree

        self.np, self.torch = numpy, torch

        here = os.path.join(args["model_repository"], args["model_version"])
        source = os.path.join(here, params["source"])
        limits = _int_params(params, ("max_tokens", "max_batch"))
        if params["runtime"] == "torch":
            import transformers

            import padfree.torch as padfree_torch

            device = torch.device("cuda", int(args["model_instance_device_id"]))
            model = transformers.AutoModel.from_pretrained(source)
            graphs = _int_params(params, ("max_graphs", "capture_after"))
            if params.get("gemm_search"):
                graphs["gemm_search"] = params["gemm_search"]
            encoder = padfree_torch.from_hf(model, dtype=getattr(torch, params["dtype"]), device=device, **graphs)
            self.runtime = padfree.Runtime(encoder, **limits)
        else:
            self.runtime = padfree.Runtime(source, **limits)
        self.InputError = padfree.runtime.InputError
        where = os.path.dirname(padfree.__file__)
        pb_utils.Logger.log_info(f"padfree {padfree.__version__} ({where}): {self.runtime!r}")
        self.outputs = [o["name"] for o in config["output"]]
        self.token_types = any(i["name"] == "token_type_ids" for i in config["input"])

    def execute(self, requests):
        parsed = [self._parse(r) for r in requests]
        good = [p for p in parsed if not isinstance(p, str)]
        responses = {}
        if good:
            try:
                answers = self._run(good)
            except self.InputError:
                answers = [self._run_alone(p) for p in good]   # name the request that is wrong
            for p, answer in zip(good, answers):
                responses[id(p)] = answer
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError(p)) if isinstance(p, str) else responses[id(p)]
                for p in parsed]

    def _parse(self, request):
        """(ids [k, len], token types [k, len] or None) of one request, or an error message."""
        ids = self.torch.from_dlpack(pb_utils.get_input_tensor_by_name(request, "input_ids").to_dlpack())
        types = pb_utils.get_input_tensor_by_name(request, "token_type_ids") if self.token_types else None
        if types is not None:
            types = self.torch.from_dlpack(types.to_dlpack())
            if types.shape != ids.shape:
                return (f"token_type_ids has shape {list(types.shape)}, input_ids {list(ids.shape)}: send one type"
                        " per token")
        if ids.dim() != 2 or ids.shape[1] < 1:
            return f"input_ids: expected [sequences, length >= 1], got {list(ids.shape)}"
        return ids, types

    def _run_alone(self, request):
        try:
            return self._run([request])[0]
        except self.InputError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))

    def _run(self, parsed):
        sequences = [row for ids, _ in parsed for row in ids]
        types = None
        if any(t is not None for _, t in parsed):
            types = [row for ids, t in parsed for row in (self.torch.zeros_like(ids) if t is None else t)]
        # one wait for the batch; per-token outputs packed: a request's rows are one contiguous block
        out = self.runtime.run(sequences, token_type_ids=types, output="numpy", packed=True)
        cu_seqlens = out["cu_seqlens"]
        answers, first = [], 0
        for ids, _ in parsed:
            count = ids.shape[0]
            tensors = []
            for name in self.outputs:
                value = out[name]
                # per token: [k, len, H] (the request's packed rows), per sequence: [k, H]
                if name in self.runtime.per_sequence_outputs:
                    rows = value[first:first + count]
                else:
                    block = value[cu_seqlens[first]:cu_seqlens[first + count]]
                    rows = block.reshape(count, ids.shape[1], *value.shape[1:])
                rows = self.torch.from_numpy(self.np.ascontiguousarray(rows))
                tensors.append(pb_utils.Tensor.from_dlpack(name, self.torch.utils.dlpack.to_dlpack(rows)))
            answers.append(pb_utils.InferenceResponse(output_tensors=tensors))
            first += count
        return answers
