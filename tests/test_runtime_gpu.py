"""padfree.runtime on the GPU: a tiny random BertModel served through the PyTorch path, compared with
HF eager (float64 on the CPU) and with ONNX Runtime through polygraphy."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from _runtime_double import VOCAB, export_onnx, pad, padded_feeds, tiny_bert

from padfree.runtime import Runtime

# ---------------------------------------------------------------------------------------------
# GPU: the PyTorch path
# ---------------------------------------------------------------------------------------------

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}


def _hf_reference(model, seqs, types):
    """HF eager in float64 on the CPU, per sequence (no padding: rows are exact references)."""
    model = model.to("cpu").double()
    outs = []
    with torch.no_grad():
        for s, t in zip(seqs, types):
            o = model(input_ids=torch.as_tensor(s)[None], token_type_ids=torch.as_tensor(t)[None])
            outs.append((o.last_hidden_state[0], o.pooler_output[0]))
    return outs


def _rel(a, b):
    a, b = torch.as_tensor(a).double().cpu(), torch.as_tensor(b).double().cpu()
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_runtime_vs_hf_eager(seed, dtype):
    import copy

    from padfree.torch import from_hf

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = tiny_bert(seed)
    rng = np.random.default_rng(seed)
    vocab, longest = model.config.vocab_size, model.config.max_position_embeddings
    lengths = rng.integers(1, longest + 1, size=13)
    lengths[:2] = [1, longest]
    seqs = [rng.integers(0, vocab, size=n) for n in lengths]
    types = [rng.integers(0, 2, size=n) for n in lengths]
    reference = _hf_reference(copy.deepcopy(model), seqs, types)
    tol = TOLERANCE[dtype]

    # max_batch 4 / max_tokens 300: the 13 sequences need several chunks
    rt = Runtime(from_hf(model, dtype=dtype, device="cuda"), max_batch=4, max_tokens=300)
    out = rt.run(seqs, token_type_ids=types)
    for i, (hidden, pooled) in enumerate(reference):
        assert out["last_hidden_state"][i].is_cuda and out["last_hidden_state"][i].dtype == dtype
        assert _rel(out["last_hidden_state"][i], hidden) < tol, f"sequence {i} (length {lengths[i]})"
        assert _rel(out["pooler_output"][i], pooled) < tol
    # padded in and out, numpy out; extra padding columns beyond the longest sequence
    width = longest + 3  # padding columns past the longest sequence the model serves
    ids, mask = pad(seqs, width, fill=rng.integers(0, vocab))
    type_ids = pad(types, width)[0]
    padded = rt.run(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(type_ids), padded=True,
                    output="numpy")
    hidden = padded["last_hidden_state"]
    assert hidden.shape == (13, width, model.config.hidden_size) and not np.isnan(hidden).any()
    for i, (ref_hidden, ref_pooled) in enumerate(reference):
        assert _rel(hidden[i, :lengths[i]], ref_hidden) < tol
        assert (hidden[i, lengths[i]:] == 0).all()
        assert _rel(padded["pooler_output"][i], ref_pooled) < tol


def _spy_on_streams(rt) -> list:
    """Records (the stream execute_packed is given, the current stream) on each of the backend's calls."""
    seen = []
    execute = rt.backend.execute_packed

    def spy(*args):
        seen.append((args[-1], torch.cuda.current_stream()))
        return execute(*args)

    rt.backend.execute_packed = spy
    return seen


@pytest.mark.gpu
def test_gpu_runtime_honours_the_callers_stream(seed):
    from padfree.torch import from_hf

    torch.backends.cuda.matmul.allow_tf32 = False
    model = tiny_bert(seed)
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, VOCAB, size=n) for n in rng.integers(1, 129, size=9)]
    encoder = from_hf(model, dtype=torch.float32, device="cuda")
    stream = torch.cuda.Stream()
    rt = Runtime(encoder, stream=stream, max_batch=4)
    seen = _spy_on_streams(rt)
    expected = Runtime(encoder).run(seqs)["last_hidden_state"]  # one chunk, on the current stream
    rt.run(seqs)  # captures the graphs of this chunking first: a capture synchronizes the device
    torch.cuda.synchronize()
    seen.clear()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time queued ahead of the run on the stream
    out = rt.run(seqs)
    assert not stream.query(), "run() waited for the stream: it should only enqueue"
    stream.synchronize()
    assert seen and all(s == stream and cur == stream for s, cur in seen)
    for got, want in zip(out["last_hidden_state"], expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_runtime_without_a_stream_enqueues_on_the_current_one(seed):
    """No stream given: each run goes on whatever stream is current at the call (the one Stream object
    per stream that the Runtime keeps is that stream), and the backend is told None (current)."""
    from padfree.torch import from_hf

    model = tiny_bert(seed)
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(0, VOCAB, size=n) for n in rng.integers(1, 65, size=5)]
    rt = Runtime(from_hf(model, dtype=torch.float32, device="cuda"))
    expected = rt.run(seqs, packed=True)["last_hidden_state"].clone()
    torch.cuda.synchronize()
    seen = _spy_on_streams(rt)
    for stream in (torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.current_stream()):
        with torch.cuda.stream(stream):
            assert rt._current_stream() == stream and rt._current_stream() is rt._current_stream()
            torch.cuda._sleep(100_000_000)  # queued ahead: the run must wait behind it on this stream
            pending = rt.submit(seqs, packed=True)
            assert not stream.query(), "submit() waited: it should only enqueue"
        pending.synchronize()
        assert stream.query()  # the batch's event was recorded on this stream
        torch.testing.assert_close(pending.result()["last_hidden_state"], expected, rtol=0, atol=0)
        assert seen[-1] == (None, stream)


@pytest.mark.gpu
def test_gpu_torch_runner_vs_onnxruntime(seed, tmp_path):
    pytest.importorskip("polygraphy", reason="polygraphy is not installed (carry its wheel to the device)")
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    from padfree.polygraphy_runners import TorchRunner, mask_padding

    torch.backends.cuda.matmul.allow_tf32 = False
    model = tiny_bert(seed)
    path = export_onnx(model, tmp_path / "model.onnx")
    feeds = padded_feeds(np.random.default_rng(seed), batch=6, type_vocab=2)
    runners = [TorchRunner(model, from_hf_options={"dtype": torch.float32, "device": "cuda"}, max_batch=4),
               OnnxrtRunner(SessionFromOnnx(str(path)))]
    results = Comparator.run(runners, data_loader=feeds)
    mask_padding(results, feeds)
    assert bool(Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=1e-4, rtol=1e-3)))


@pytest.mark.gpu
@pytest.mark.parametrize("output", ["torch", "numpy"])
def test_gpu_submitted_batches_overlap_and_keep_their_inputs(seed, output):
    """Three batches submitted behind ~0.1 s of queued GPU work: the first two return without waiting,
    the third packs into the first one's staging buffer only after the copy out of it ran (else the
    first batch would be computed on the third's ids). Each equals its batch run alone."""
    from padfree.torch import from_hf

    torch.backends.cuda.matmul.allow_tf32 = False
    model = tiny_bert(seed)
    rng = np.random.default_rng(seed)
    encoder = from_hf(model, dtype=torch.float32, device="cuda")
    batches = [[rng.integers(0, VOCAB, size=n) for n in rng.integers(1, 129, size=int(b))]
               for b in rng.integers(2, 12, size=3)]
    expected = [Runtime(encoder, output="numpy").run(b) for b in batches]  # also captures the graphs
    stream = torch.cuda.Stream()
    rt = Runtime(encoder, stream=stream, output=output)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)
    pending = [rt.submit(batches[0]), rt.submit(batches[1])]
    assert not stream.query(), "submit() waited for the GPU"
    assert not pending[0].done()
    pending.append(rt.submit(batches[2]))
    for p, want in zip(pending, expected):
        p.synchronize()
        got = p.result()
        assert p.done()
        for g, w in zip(got["last_hidden_state"], want["last_hidden_state"]):
            np.testing.assert_allclose(torch.as_tensor(g).cpu().numpy(), w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(torch.as_tensor(got["pooler_output"]).cpu().numpy(), want["pooler_output"],
                                   rtol=1e-5, atol=1e-5)
