"""bench/encode.py (issue 38's sentence-embedding benchmark) on the CPU: the recipe of texts the GPU run
times, and the --quick smoke run end to end (a tiny sentence-transformers directory, HF in float32,
padfree on its export folder on ONNX Runtime): every column's embeddings against the float32 model,
the sorted column put back in the texts' order. The timings are the device run's, never a test's."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "encode.py"


@pytest.fixture(scope="module")
def encode():
    spec = importlib.util.spec_from_file_location("bench_encode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_texts_are_the_issues_recipe(encode):
    fields, count, (shortest, longest, median), size = encode.SHAPES["minilm"]
    shape = (fields["num_hidden_layers"], fields["hidden_size"], fields["num_attention_heads"], size)
    assert shape == (6, 384, 12, 128)
    texts = encode.text_ids(count, shortest, longest, median, fields["vocab_size"])
    lengths = np.array([len(t) for t in texts])
    assert count == 1664 and lengths.min() >= 8 and lengths.max() <= 150 and 45 <= lengths.mean() <= 55
    assert lengths.min() == 8 and lengths.max() > 140          # both ends of the range occur
    ids = np.concatenate([t[1:-1] for t in texts])
    assert all(t[0] == encode.CLS and t[-1] == encode.SEP for t in texts)
    assert ids.min() >= encode.FIRST_ID and ids.max() < fields["vocab_size"]
    assert encode.text_ids(count, shortest, longest, median, fields["vocab_size"]) == texts   # seeded


def test_quick_run_agrees_with_the_float32_model(encode, tmp_path):
    pytest.importorskip("onnx_graphsurgeon")
    pytest.importorskip("onnxruntime")
    out = tmp_path / "encode.json"
    assert encode.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {r["column"]: r for r in result["rows"]}
    assert list(rows) == ["padfree", "hf_sdpa", "hf_sdpa_sorted"]          # no torch.compile on the CPU
    assert result["device"] == "cpu" and result["accuracy"]["padfree_agrees"]
    for row in rows.values():
        # float32 throughout: the packed model on ONNX Runtime and HF's batches against HF as they come
        assert row["max_abs_diff_vs_fp32"] < 1e-4 and row["min_cosine_vs_fp32"] > 1 - 1e-6, row
        assert row["texts_per_s"] * row["ms_per_pass"] / 1e3 == pytest.approx(40)
    fields, count, (shortest, longest, median), _ = encode.SHAPES["tiny"]
    lengths = [len(t) for t in encode.text_ids(count, shortest, longest, median, fields["vocab_size"])]
    assert (result["texts"]["count"], result["texts"]["total_tokens"]) == (40, sum(lengths))
    assert result["ratios"].keys() == {"padfree_over_hf_sdpa", "padfree_over_hf_sdpa_sorted"}
    assert result["target"]["met"] is None and result["commit"] and result["command"]


def test_sorted_pass_puts_the_rows_back(encode):
    """hf_pass with sort=True over a model that returns each row's own data: the rows come back in order."""
    import torch

    def model(ids, mask):   # embedding = (first id, length): tells the rows apart
        return {"sentence_embedding": torch.stack([ids[:, 0].float(), mask.sum(1).float()], dim=1)}
    texts = [[i] + [1] * n for i, n in enumerate(np.random.default_rng(0).integers(0, 30, 19))]
    got = encode.hf_pass(model, texts, 4, torch.device("cpu"), sort=True)
    want = torch.tensor([[t[0], len(t)] for t in texts], dtype=torch.float32)
    assert torch.equal(got, want)
