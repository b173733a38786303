"""padfree.polygraphy_runners: RuntimeRunner in polygraphy's Comparator, with the backend test double
and with a real ONNX model against ONNX Runtime on the CPU."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from _runtime_double import HIDDEN, ToyBackend, export_onnx, pad, padded_feeds, tiny_bert, token_value

from padfree.runtime import Limits, Runtime

# ---------------------------------------------------------------------------------------------
# Polygraphy runners (CPU, with the test double)
# ---------------------------------------------------------------------------------------------

def _reference_runner(garbage_in_padding: bool):
    """A polygraphy runner computing ToyBackend's function on padded arrays in numpy, independently
    of the Runtime; optionally with nonzero values in padding, as ONNX exports of HF models have."""
    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata

    class Reference(BaseRunner):
        def get_input_metadata_impl(self):
            meta = TensorMetadata()
            for name in ("input_ids", "attention_mask", "token_type_ids"):
                meta.add(name, np.int64, shape=("batch", "sequence"))
            return meta

        def infer_impl(self, feed):
            ids, mask, types = feed["input_ids"], feed["attention_mask"], feed["token_type_ids"]
            positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
            hidden = token_value(ids, positions, types).astype(np.float32)
            if not garbage_in_padding:
                hidden *= mask[..., None]
            pooled = (ids * mask).sum(1, keepdims=True) + mask.sum(1, keepdims=True) * np.arange(HIDDEN)
            self.inference_time = 0.0
            return OrderedDict(last_hidden_state=hidden, pooler_output=pooled.astype(np.float32))

    return Reference(name="reference")


@pytest.mark.parametrize("garbage_in_padding", [False, True])
def test_runtime_runner_in_comparator(seed, garbage_in_padding):
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    from padfree.polygraphy_runners import RuntimeRunner, mask_padding

    feeds = padded_feeds(np.random.default_rng(seed))
    compare = SimpleCompareFunc(atol=0, rtol=0)

    def compare_with(backend):
        runners = [RuntimeRunner(lambda: Runtime(backend, max_batch=3)), _reference_runner(garbage_in_padding)]
        results = Comparator.run(runners, data_loader=feeds)
        if garbage_in_padding:
            mask_padding(results, feeds)
        return bool(Comparator.compare_accuracy(results, compare_func=compare))

    assert compare_with(ToyBackend())
    assert not compare_with(ToyBackend(position_bug=1))


def test_runtime_runner_metadata_names_and_errors():
    from padfree.polygraphy_runners import RuntimeRunner

    with RuntimeRunner(Runtime(ToyBackend(type_vocab_size=0))) as runner:
        assert list(runner.get_input_metadata(use_numpy_dtypes=False)) == ["input_ids", "attention_mask"]
    with RuntimeRunner(Runtime(ToyBackend()), output_names={"last_hidden_state": "hidden"},
                       input_names=["input_ids", "attention_mask"]) as runner:
        assert list(runner.get_input_metadata(use_numpy_dtypes=False)) == ["input_ids", "attention_mask"]
        ids, mask = pad([[5, 6, 7], [8]])
        out = runner.infer({"input_ids": ids, "attention_mask": mask})
        assert list(out) == ["hidden", "pooler_output"] and out["hidden"].shape == (2, 3, HIDDEN)
        assert runner.last_inference_time() > 0
    with pytest.raises(ValueError, match="input_names"):
        with RuntimeRunner(Runtime(ToyBackend()), input_names=["ids"]):
            pass


# ---------------------------------------------------------------------------------------------
# Polygraphy with a real ONNX model on the CPU: RuntimeRunner over an HF-eager backend double vs
# ONNX Runtime on the model's ONNX export (checks feeds, input/output names, dtypes, padding)
# ---------------------------------------------------------------------------------------------

class HfEagerBackend:
    """The backend protocol over HF eager on the CPU: unpacks to a padded batch and runs the model."""

    device = "cpu"
    output_names = ["last_hidden_state", "pooler_output"]

    def __init__(self, model, max_batch=3):
        self.model = model
        c = model.config
        self.limits = Limits(max_tokens=4096, max_batch=max_batch, max_seqlen=c.max_position_embeddings,
                             vocab_size=c.vocab_size, type_vocab_size=c.type_vocab_size)

    @torch.no_grad()
    def execute_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids, stream):
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        mask = torch.arange(max_seqlen)[None, :] < torch.tensor(lengths)[:, None]
        ids = torch.zeros(mask.shape, dtype=torch.int64)
        ids[mask] = input_ids.long()
        types = torch.zeros_like(ids)
        if token_type_ids is not None:
            types[mask] = token_type_ids.long()
        out = self.model(input_ids=ids, attention_mask=mask.long(), token_type_ids=types)
        return {"last_hidden_state": out.last_hidden_state[mask], "pooler_output": out.pooler_output}


def test_runtime_runner_vs_onnxruntime_on_cpu(seed, tmp_path):
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    from padfree.polygraphy_runners import RuntimeRunner, mask_padding

    model = tiny_bert(seed)
    path = export_onnx(model, tmp_path / "model.onnx")
    feeds = padded_feeds(np.random.default_rng(seed), batch=5, type_vocab=2)
    runners = [RuntimeRunner(Runtime(HfEagerBackend(model))), OnnxrtRunner(SessionFromOnnx(str(path)))]
    results = Comparator.run(runners, data_loader=feeds)
    mask_padding(results, feeds)
    assert bool(Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=1e-4, rtol=1e-4)))
