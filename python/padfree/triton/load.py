"""Concurrent gRPC clients against a served padfree model, and the check of their answers (tests, bench/serve.py).

Each request is `Request(ids [k, len] int32, token_type_ids [k, len] or None)`: k sequences of one
length, as a client sends them (input_ids [k, len]); a Triton batch mixes requests of any length.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Request:
    ids: np.ndarray                     # int32 [k, len]
    token_type_ids: np.ndarray | None = None


@dataclass
class Answer:
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    error: str | None = None
    latency_s: float = 0.0


def random_requests(rng: np.random.Generator, count: int, longest: int, vocab: tuple[int, int],
                    sequences: tuple[int, int] = (1, 1), type_vocab_size: int = 0) -> list[Request]:
    """count requests of lengths uniform in [1, longest] (both ends included once each), k sequences uniform
    in `sequences`, ids uniform in [vocab[0], vocab[1]), token types where type_vocab_size > 1."""
    lengths = rng.integers(1, longest + 1, count)
    lengths[:2] = [1, longest][:count]
    out = []
    for n in lengths:
        k = int(rng.integers(sequences[0], sequences[1] + 1))
        ids = rng.integers(vocab[0], vocab[1], (k, int(n))).astype(np.int32)
        types = rng.integers(0, type_vocab_size, (k, int(n))).astype(np.int32) if type_vocab_size > 1 else None
        out.append(Request(ids, types))
    return out


def _infer(client: Any, model: str, request: Request, outputs: list[str]) -> Answer:
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, value in (("input_ids", request.ids), ("token_type_ids", request.token_type_ids)):
        if value is not None:
            tensor = grpcclient.InferInput(name, list(value.shape), "INT32")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
    start = time.perf_counter()
    try:
        result = client.infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs])
    except Exception as e:  # noqa: BLE001 - the server's answer, recorded per request
        return Answer(error=str(e), latency_s=time.perf_counter() - start)
    latency = time.perf_counter() - start
    return Answer({n: result.as_numpy(n) for n in outputs}, latency_s=latency)


def send_all(url: str, model: str, requests: list[Request], outputs: list[str],
             clients: int) -> tuple[list[Answer], float]:
    """Every request sent once by `clients` threads (one gRPC client each, each sending its next request
    when its last is answered); the answers in request order and the wall time of the whole run."""
    import tritonclient.grpc as grpcclient

    answers: list[Answer | None] = [None] * len(requests)
    next_index, lock = [0], threading.Lock()

    def worker() -> None:
        client = grpcclient.InferenceServerClient(url)
        try:
            while True:
                with lock:
                    i = next_index[0]
                    next_index[0] += 1
                if i >= len(requests):
                    return
                answers[i] = _infer(client, model, requests[i], outputs)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers, time.perf_counter() - start


def expected(runtime: Any, request: Request) -> dict[str, np.ndarray]:
    """A direct Runtime.run of the request's sequences, shaped as the served model answers ([k, len, H] per
    token, [k, H] per sequence)."""
    types = None if request.token_type_ids is None else list(request.token_type_ids)
    out = runtime.run(list(request.ids), token_type_ids=types, output="numpy")
    return {n: np.stack(v) if isinstance(v, list) else v for n, v in out.items()}


def largest_difference(answer: Answer, want: dict[str, np.ndarray]) -> float:
    """max |served - direct| over the request's outputs; inf where an output is missing or its shape differs."""
    worst = 0.0
    for name, value in want.items():
        got = answer.outputs.get(name)
        if got is None or got.shape != value.shape:
            return float("inf")
        worst = max(worst, float(np.abs(got.astype(np.float64) - value.astype(np.float64)).max(initial=0.0)))
    return worst


def relative_difference(answer: Answer, want: dict[str, np.ndarray]) -> float:
    """largest_difference over the largest |value| of `want`: for answers computed in another batch
    than the reference (fp16 GEMMs whose kernels depend on the token count)."""
    scale = max(float(np.abs(v.astype(np.float64)).max(initial=0.0)) for v in want.values())
    return largest_difference(answer, want) / max(scale, 1e-30)


def latency_summary(answers: list[Answer], wall_s: float) -> dict:
    ms = np.array([a.latency_s * 1e3 for a in answers if a is not None and a.error is None])
    if not len(ms):
        return {"requests_ok": 0}
    return {"requests_ok": int(len(ms)), "p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()), "wall_s": wall_s,
            "requests_per_s": len(ms) / wall_s}
