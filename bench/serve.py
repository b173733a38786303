"""Serving through Triton Inference Server: padfree's Python-backend model behind a real tritonserver
(nvidia-pytriton's), loaded by concurrent gRPC clients on loopback. Two paths:
- `--path onnxruntime` (default, the CPU): `padfree export MODEL` served by padfree.Runtime on ONNX
  Runtime, float32; every answer must equal the direct run's within 1e-4.
- `--path torch` (a GPU): MODEL saved as an HF directory and served on the PyTorch path
  (padfree.torch.from_hf, --dtype, KIND_GPU): the server's batches differ from the direct run's, and
  cuBLAS picks its kernels by the token count, so answers are compared relative to the output's
  scale: within 2e-2 in float16 / bfloat16 (each side is within 1e-2 of float64 in the kernel
  tests), 1e-4 in float32.

The model: MODEL, a built-in (default small-bert, the demo's BERT: 12 layers, hidden 256, 4 heads,
random weights) or an HF directory, written with `padfree triton SOURCE --repository ...`.
Requests: --requests of one sequence each, lengths lognormal (median --longest / 4, sigma 0.6, clipped
to [1, --longest]), ids uniform in [1000, vocab), numpy seed --seed; --clients threads, one gRPC client
each, each sending its next request when its last is answered (closed loop). Before the timed run,
--clients x 4 warm-up requests. Every answer is compared with a direct padfree.Runtime.run of the same
request in this process (the same computation, as above): the run fails unless all are answered and all
match. Recorded: latency per request (p50 / p90 / p99 / max, perf_counter around each gRPC call),
requests and tokens per second over the wall time, and Triton's own statistics: executions (how many
batches the requests were grouped into), the mean queue time per request, the server's compute time per
request, and per batch size its executions and mean ms per execution. `direct` runs the same requests
through Runtime.run in this process, one by one and in batches of --clients, for scale.

    python bench/serve.py [--path onnxruntime|torch] [--model NAME|DIR] [--requests 400] [--clients 16]
                          [--longest 128] [--out FILE.json]
Needs nvidia-pytriton (pip install --no-deps nvidia-pytriton) and tritonclient[grpc] (on the device
machine: source scripts/triton_env.sh). Writes bench/results/serve-cpu.json, or serve-<gpu>.json for
the PyTorch path (device, date, versions, commit, command, rows).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def make_requests(count: int, longest: int, vocab: int, seed: int):
    from padfree.triton.load import Request

    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(longest / 4), 0.6, count)), 1, longest).astype(int)
    return [Request(rng.integers(1000, vocab, (1, int(n))).astype(np.int32)) for n in lengths]


def direct_ms(runtime, requests, batch: int) -> float:
    """ms per request of Runtime.run over the requests, `batch` requests per call."""
    start = time.perf_counter()
    for i in range(0, len(requests), batch):
        runtime.run([r.ids[0] for r in requests[i:i + batch]], output="numpy")
    return (time.perf_counter() - start) * 1e3 / len(requests)


def triton_stats(url: str, model: str) -> dict:
    """Triton's cumulative counters: executions, queued requests and their queue ns, and per batch size
    (sequences) its executions and their compute ns (input + infer + output, once per execution: the
    per-request statistics charge every request of a batch the whole batch's time)."""
    import tritonclient.grpc as grpcclient

    s = grpcclient.InferenceServerClient(url).get_inference_statistics(model).model_stats[0]
    batches = {b.batch_size: (b.compute_infer.count, b.compute_input.ns + b.compute_infer.ns + b.compute_output.ns)
               for b in s.batch_stats}
    return {"executions": s.execution_count, "queued": s.inference_stats.queue.count,
            "queue_ns": s.inference_stats.queue.ns, "batches": batches}


def stats_delta(before: dict, after: dict) -> dict:
    batches = {}
    for size, (count, ns) in after["batches"].items():
        count0, ns0 = before["batches"].get(size, (0, 0))
        if count > count0:
            batches[size] = (count - count0, ns - ns0)
    return {k: after[k] - before[k] for k in ("executions", "queued", "queue_ns")} | {"batches": batches}


def serve_row(args, work: Path, runtime, max_batch: int, requests, warmup) -> tuple[dict, str]:
    """One server start with max_batch, the warm-up and the timed run, every answer checked; the row and
    the server's version."""
    import tritonclient.grpc as grpcclient

    from padfree.triton import load, write_python_model
    from padfree.triton.server import LocalServer

    write_python_model(work / "source", work / "models", name="encoder", max_batch=max_batch,
                       max_queue_delay_us=args.max_queue_delay_us, instances=args.instances, dtype=args.dtype,
                       graphs=args.graph_options or None)
    outputs = list(runtime.output_names)
    with LocalServer(work / "models") as server:
        version = grpcclient.InferenceServerClient(server.grpc_url).get_server_metadata().version
        load.send_all(server.grpc_url, "encoder", warmup, outputs, args.clients)
        before = triton_stats(server.grpc_url, "encoder")
        answers, wall = load.send_all(server.grpc_url, "encoder", requests, outputs, args.clients)
        stats = stats_delta(before, triton_stats(server.grpc_url, "encoder"))
    errors = [(i, a.error) for i, a in enumerate(answers) if a is None or a.error]
    difference = load.largest_difference if args.path == "onnxruntime" else load.relative_difference
    worst = max((difference(a, load.expected(runtime, r)) for r, a in zip(requests, answers)
                 if a is not None and not a.error), default=float("inf"))
    tokens = sum(r.ids.size for r in requests)
    return {"model": args.model, "requests": len(requests), "clients": args.clients, "tokens": int(tokens),
            "mean_length": tokens / len(requests), "longest": args.longest, "max_batch": max_batch,
            "max_queue_delay_us": args.max_queue_delay_us, "instances": args.instances,
            "answered": len(requests) - len(errors), "errors": errors[:5],
            ("max_abs_diff_vs_runtime_run" if args.path == "onnxruntime" else "max_rel_diff_vs_runtime_run"): worst,
            **load.latency_summary(answers, wall), "tokens_per_s": tokens / wall,
            "triton_executions": stats["executions"],
            "requests_per_execution": len(requests) / max(stats["executions"], 1),
            "triton_queue_ms_per_request": stats["queue_ns"] / max(stats["queued"], 1) / 1e6,
            # the server's busy time per request, and per batch size: executions and mean ms per execution
            "triton_compute_ms_per_request": sum(ns for _, ns in stats["batches"].values()) / len(requests) / 1e6,
            "triton_batches": {str(size): [count, ns / count / 1e6]
                               for size, (count, ns) in sorted(stats["batches"].items())}}, version


def torch_runtime(model_name: str, dtype: str, folder: Path, graph_options: dict):
    """The model saved as an HF directory at `folder` (what the Triton model loads) and the direct
    Runtime over the same weights on the PyTorch path, as model.py builds it."""
    import torch
    import transformers

    import padfree
    import padfree.torch as padfree_torch
    from padfree.export.models import load
    from padfree.triton.python_backend import TORCH_GRAPHS

    model, _ = load(model_name)
    model.save_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder)
    return padfree.Runtime(padfree_torch.from_hf(model, dtype=getattr(torch, dtype), device=torch.device("cuda"),
                                                 **{**TORCH_GRAPHS, **graph_options}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", choices=("onnxruntime", "torch"), default="onnxruntime",
                        help="onnxruntime: the export on the CPU (default); torch: the PyTorch path on the GPU")
    parser.add_argument("--model", default="small-bert", help="a built-in (default small-bert) or an HF directory")
    parser.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16",
                        help="--path torch: the served dtype (default float16)")
    parser.add_argument("--graphs", default="", metavar="KEY=VALUE,...",
                        help="--path torch: CUDA-graph options replacing padfree.triton's TORCH_GRAPHS (max_graphs,"
                             " capture_after, gemm_search), for the served model and the direct runs alike")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--longest", type=int, default=128)
    parser.add_argument("--max-batch", default="1,4,16", help="the Triton model's max_batch_size; a comma-separated"
                        " list runs one server per value (default 1,4,16)")
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON report (default bench/results/serve-cpu.json)")
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.max_batch.split(",")]
    except ValueError:
        parser.error(f"--max-batch {args.max_batch}: give positive integers, comma-separated")
    try:
        args.graph_options = {k: (v if k == "gemm_search" else int(v))
                              for k, v in (item.split("=", 1) for item in args.graphs.split(",") if item)}
    except ValueError:
        parser.error(f"--graphs {args.graphs}: give KEY=VALUE pairs, comma-separated (integers but gemm_search)")
    if args.graph_options and args.path != "torch":
        parser.error("--graphs applies to --path torch")
    if min(args.requests, args.clients, args.longest, args.instances, *batches) < 1:
        parser.error("--requests, --clients, --longest, --max-batch and --instances must be positive")

    from importlib import metadata

    import onnxruntime
    import torch

    import padfree
    from padfree.export.pipeline import export
    from padfree.triton.python_backend import TORCH_GRAPHS
    from padfree.triton.server import find

    def distribution() -> str:
        try:
            return f"nvidia-pytriton {metadata.version('nvidia-pytriton')}"
        except metadata.PackageNotFoundError:
            return str(find().binary)

    work = Path(tempfile.mkdtemp(prefix="padfree-serve-"))
    if args.path == "onnxruntime":
        export(args.model, work / "source")
        runtime = padfree.Runtime(str(work / "source"))
        device, tolerance = f"{cpu_name()}, {os.cpu_count()} cores", 1e-4
    else:
        if not torch.cuda.is_available():
            parser.error("--path torch serves on a GPU, and this machine has none")
        runtime = torch_runtime(args.model, args.dtype, work / "source", args.graph_options)
        device = torch.cuda.get_device_name()
        tolerance = 1e-4 if args.dtype == "float32" else 2e-2
    requests = make_requests(args.requests, args.longest, runtime.limits.vocab_size, args.seed)
    warmup = make_requests(args.clients * 4, args.longest, runtime.limits.vocab_size, args.seed + 1)
    try:
        rows, versions = zip(*[serve_row(args, work, runtime, b, requests, warmup) for b in batches])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    direct = {"one_by_one": direct_ms(runtime, requests, 1),
              f"batches_of_{args.clients}": direct_ms(runtime, requests, args.clients)}
    print(json.dumps({"rows": rows, "direct_ms_per_request": direct}, indent=1))
    import transformers

    from padfree.bench import record
    served = "ONNX Runtime, CPU" if args.path == "onnxruntime" else "the PyTorch path, GPU"
    report = {"benchmark": f"Triton Inference Server (Python backend, padfree.Runtime on {served}),"
                           " concurrent gRPC clients on loopback",
              "device": device, "host": f"{cpu_name()}, {os.cpu_count()} cores",
              "dtype": "float32" if args.path == "onnxruntime" else args.dtype,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "padfree": padfree.__version__, "tritonserver": versions[0], "distribution": distribution(),
              "tritonclient": metadata.version("tritonclient"), "onnxruntime": onnxruntime.__version__,
              "torch": torch.__version__, "transformers": transformers.__version__,
              "python": platform.python_version(), "commit": record.commit(ROOT),
              "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
              "lengths": f"lognormal, median longest/4, sigma 0.6, clipped to [1, longest], numpy seed {args.seed}",
              "timing": "perf_counter around each gRPC call (client side, loopback); closed loop, one request in"
                        f" flight per client; after {len(warmup)} warm-up requests",
              "graphs": None if args.path != "torch" else {**TORCH_GRAPHS, **args.graph_options},
              "direct_ms_per_request": direct, "rows": list(rows)}
    from padfree.bench.timing import gpu_slug
    name = "cpu" if args.path == "onnxruntime" else gpu_slug(device)
    out = args.out or os.path.join(ROOT, "bench", "results", f"serve-{name}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")
    key = "max_abs_diff_vs_runtime_run" if args.path == "onnxruntime" else "max_rel_diff_vs_runtime_run"
    return 0 if all(not r["errors"] and r[key] <= tolerance for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
