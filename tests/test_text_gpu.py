"""Text in on the GPU: tokenized texts through the PyTorch path against HF, and an engine built into
an export folder (which holds the tokenizer) encoding texts against sentence-transformers' mean
pooling computed in float32 torch. The CPU side is tests/test_text.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx_graphsurgeon")

import torch  # noqa: E402
from _tokenizers import write_wordpiece  # noqa: E402
from test_text import LIMIT, hf_embeddings, random_texts  # noqa: E402

from padfree.export import models  # noqa: E402
from padfree.runtime import Runtime  # noqa: E402
from padfree.runtime._text import TextError  # noqa: E402


@pytest.mark.gpu
def test_gpu_pytorch_path_runs_tokenized_texts(tmp_path, seed, no_tf32):
    """The tokenizer is found through the HF directory the model was loaded from."""
    import transformers

    from padfree.torch import from_hf

    config_cls, model_cls, fields = models.BUILTIN["tiny-bert"]
    models.build(config_cls, model_cls, seed=seed % 1000, **fields).save_pretrained(tmp_path / "hf")
    write_wordpiece(tmp_path / "hf")
    model = transformers.AutoModel.from_pretrained(str(tmp_path / "hf")).float().eval()
    texts = random_texts(np.random.default_rng(seed), 9, longest=60)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = model(**batch)
    rt = Runtime(from_hf(model, dtype=torch.float32, device="cuda"), max_batch=4)
    got = rt.run(rt.tokenize(texts))
    for i, n in enumerate(batch["attention_mask"].sum(1).tolist()):
        torch.testing.assert_close(got["last_hidden_state"][i].cpu(), want.last_hidden_state[i, :n], rtol=1e-4,
                                   atol=1e-4)
    with pytest.raises(TextError, match="has none"):
        rt.encode(texts)


@pytest.mark.gpu
def test_gpu_engine_in_the_export_folder_encodes_texts(tmp_path, seed, no_tf32):
    """padfree export of a sentence-transformers directory, padfree build into the same folder, then
    Runtime(engine).encode finds the tokenizer beside the engine."""
    from test_e2e_engine import _library
    from test_export_sentence import sentence_dir

    from padfree.cli import main
    from padfree.engines import trt_api
    from padfree.export.pipeline import export

    if not trt_api.available() or _library() is None:
        pytest.skip("needs TensorRT Python bindings and libpadfree_trt.so (see tests/test_e2e_engine.py)")
    st = sentence_dir(tmp_path / "st", "mean", normalize=True)
    write_wordpiece(st, lowercase=False)
    (st / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": LIMIT, "do_lower_case": True}))
    out = tmp_path / "out"
    export(st, out)
    assert main(["build", str(out / "model.padfree.onnx"), "-o", str(out / "model.engine"), "--precision", "fp32",
                 "--max-tokens", "256", "--max-batch", "8", "--max-seqlen", str(LIMIT), "--no-progress",
                 "--plugin-library", str(_library())]) == 0
    texts = random_texts(np.random.default_rng(seed), 21)
    rt = Runtime(str(out / "model.engine"), plugin_library_path=str(_library()))
    got = rt.encode(texts, batch_size=16)       # 16 texts -> 2 chunks of at most 8
    assert got.is_cuda and got.dtype == torch.float32 and got.shape[0] == len(texts)
    want = hf_embeddings(st, texts, lower=True, normalize=True)
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rt.encode(texts, output="numpy"), want, rtol=1e-4, atol=1e-5)
