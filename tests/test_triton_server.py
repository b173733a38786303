"""A real tritonserver (the nvidia-pytriton wheel's) serving `padfree triton EXPORT_DIR`'s Python-backend
model on the CPU, on loopback: concurrent gRPC clients send requests of random lengths (and some of
several sequences, with token types); every answer must equal a direct padfree.Runtime.run of the same
request (ONNX Runtime in both, so the same numbers), none lost, and Triton must have batched requests
of different lengths together (its statistics: fewer executions than requests). Bounded: ~100
requests, one server start.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("tritonclient.grpc")

from padfree.triton import server as triton_server  # noqa: E402

try:
    DIST = triton_server.find()
    triton_server.python_library_dir()
    SKIP = "" if DIST.binary.is_file() else f"{DIST.binary} is missing"
except triton_server.TritonError as e:
    SKIP = str(e)
pytestmark = pytest.mark.skipif(bool(SKIP), reason=f"no runnable tritonserver: {SKIP}")

REQUESTS, CLIENTS, LONGEST = 96, 8, 40


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """tiny-bert exported, its Python model written (a long queue delay, so that batches form), the server up."""
    from padfree.export.pipeline import export
    from padfree.triton import write_python_model

    root = tmp_path_factory.mktemp("triton")
    export("tiny-bert", root / "out")
    write_python_model(root / "out", root / "models", name="bert", max_batch=16, max_queue_delay_us=20000)
    with triton_server.LocalServer(root / "models") as server:
        yield root / "out", server


def test_concurrent_ragged_requests_answered_as_runtime_run(served, seed):
    import tritonclient.grpc as grpcclient

    import padfree
    from padfree.triton import load

    out, server = served
    runtime = padfree.Runtime(str(out))
    rng = np.random.default_rng(seed)
    requests = load.random_requests(rng, REQUESTS, LONGEST, (5, 512), sequences=(1, 3), type_vocab_size=2)
    for r in requests[::4]:
        r.token_type_ids = None               # optional: zeros
    bad = load.Request(np.array([[7, 512, 9]], np.int32))   # id 512: outside the vocabulary of 512
    requests.insert(len(requests) // 2, bad)
    answers, _ = load.send_all(server.grpc_url, "bert", requests, ["last_hidden_state", "pooler_output"], CLIENTS)

    assert answers[len(requests) // 2].error and "512" in answers[len(requests) // 2].error
    for i, (request, answer) in enumerate(zip(requests, answers)):
        if request is bad:
            continue
        assert answer is not None and answer.error is None, (i, answer)
        want = load.expected(runtime, request)
        k, n = request.ids.shape
        assert answer.outputs["last_hidden_state"].shape == (k, n, 128)
        assert load.largest_difference(answer, want) <= 1e-5, i

    stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("bert").model_stats[0]
    assert stats.inference_count == sum(r.ids.shape[0] for r in requests)  # sequences, the bad request's included
    assert stats.execution_count < len(requests), "Triton never batched two requests together"


def test_request_errors_are_one_line_answers(served):
    from padfree.triton import load

    _, server = served
    bad = [load.Request(np.zeros((1, 300), np.int32)),                                  # longer than 128 positions
           load.Request(np.ones((1, 4), np.int32), np.ones((1, 5), np.int32))]         # types of another shape
    answers, _ = load.send_all(server.grpc_url, "bert", bad, ["last_hidden_state"], 2)
    assert "128" in answers[0].error
    assert "token_type_ids has shape [1, 5], input_ids [1, 4]" in answers[1].error


@pytest.mark.gpu
def test_pytorch_path_on_the_gpu_against_hf(tmp_path, seed):
    """`padfree triton HF_DIR` (KIND_GPU, float16): concurrent ragged requests answered as HF eager computes
    them (float64 on the CPU, each sequence alone), to float16's tolerance."""
    import torch
    import transformers

    from padfree.export import models
    from padfree.triton import load, write_python_model

    config_cls, model_cls, fields = models.BUILTIN["tiny-bert"]
    models.build(config_cls, model_cls, seed=seed % 1000, **fields).save_pretrained(tmp_path / "hf")
    write_python_model(tmp_path / "hf", tmp_path / "models", name="bert", max_batch=16, max_queue_delay_us=20000)
    rng = np.random.default_rng(seed)
    requests = load.random_requests(rng, 48, LONGEST, (5, 512), sequences=(1, 2), type_vocab_size=2)
    with triton_server.LocalServer(tmp_path / "models") as server:
        answers, _ = load.send_all(server.grpc_url, "bert", requests, ["last_hidden_state", "pooler_output"], CLIENTS)
    hf = transformers.AutoModel.from_pretrained(tmp_path / "hf").double().eval()
    for i, (request, answer) in enumerate(zip(requests, answers)):
        assert answer.error is None, (i, answer.error)
        assert answer.outputs["last_hidden_state"].dtype == np.float16
        for j, ids in enumerate(request.ids):
            with torch.no_grad():
                ref = hf(input_ids=torch.as_tensor(ids, dtype=torch.long)[None],
                         token_type_ids=torch.as_tensor(request.token_type_ids[j], dtype=torch.long)[None])
            for name, want in (("last_hidden_state", ref.last_hidden_state[0]),
                               ("pooler_output", ref.pooler_output[0])):
                got = torch.as_tensor(answer.outputs[name][j].astype(np.float64))
                assert ((got - want).norm() / want.norm()).item() < 1e-2, (i, j, name)


@pytest.mark.gpu
def test_pytorch_path_model_on_the_gpu(tmp_path, seed):
    """`padfree triton HF_DIR`'s KIND_GPU model (padfree.torch.from_hf, float16) under the real server:
    concurrent ragged requests, each answer within 2e-2 of the output's scale of a direct Runtime.run on
    the same weights (the server batches requests differently, and cuBLAS picks kernels by the token
    count), none lost, requests batched together."""
    import torch
    import transformers
    import tritonclient.grpc as grpcclient

    import padfree
    import padfree.torch as padfree_torch
    from padfree.export.models import load as load_model
    from padfree.triton import load, write_python_model
    model, _ = load_model("tiny-bert")
    model.save_pretrained(tmp_path / "hf")
    write_python_model(tmp_path / "hf", tmp_path / "models", name="bert_gpu", max_batch=16,
                       max_queue_delay_us=20000, dtype="float16")
    runtime = padfree.Runtime(padfree_torch.from_hf(transformers.AutoModel.from_pretrained(tmp_path / "hf"),
                                                    dtype=torch.float16, device=torch.device("cuda")))
    rng = np.random.default_rng(seed)
    requests = load.random_requests(rng, 48, LONGEST, (5, 512), sequences=(1, 3), type_vocab_size=2)
    with triton_server.LocalServer(tmp_path / "models") as server:
        answers, _ = load.send_all(server.grpc_url, "bert_gpu", requests, ["last_hidden_state", "pooler_output"],
                                   CLIENTS)
        stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("bert_gpu")
    for i, (request, answer) in enumerate(zip(requests, answers)):
        assert answer is not None and answer.error is None, (i, answer)
        assert answer.outputs["last_hidden_state"].dtype == np.float16
        assert load.relative_difference(answer, load.expected(runtime, request)) <= 2e-2, i
    assert stats.model_stats[0].execution_count < len(requests), "Triton never batched two requests together"
