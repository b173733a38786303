"""What passing data from one phase of GPU work to the next costs: a dependent kernel boundary (with and
without programmatic dependent launch), a thread-block cluster barrier, a cooperative grid barrier.

A decode step at 1x4 is a chain of ~100 small dependent operations, so what one link of the chain
costs decides which fusions pay (docs/GENERATION.md). bench/sync_costs.cu measures each way (its
header says how); this script builds it with nvcc for the current GPU (compute capability 9.0+:
clusters), runs it and records the numbers.

On the device machine:
  python bench/sync_costs.py [--out FILE.json]
Writes bench/results/sync-costs-<gpu>.json (device, date, versions, commit, command, microseconds).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "bench", "sync_costs.cu")


def nvcc() -> str:
    toolkit = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for candidate in (os.path.join(toolkit, "bin", "nvcc"), shutil.which("nvcc")):
        if candidate and os.path.isfile(candidate):
            return candidate
    raise SystemExit("sync_costs: nvcc not found; set CUDA_HOME to the CUDA toolkit")


def gpu_arch(major: int, minor: int) -> str:
    """nvcc's -arch for a compute capability: sm_90a on Hopper (its cluster and TMA instructions)."""
    return f"sm_{major}{minor}a" if major == 9 else f"sm_{major}{minor}"


def nvcc_flags(arch: str) -> list[str]:
    """nvcc's flags for a standalone CUDA benchmark: `arch` (e.g. sm_90a), and the kernel library's headers
    on the include path (plugins/kernels, plugins/capi), whose PTX helpers a benchmark may use."""
    return [f"-arch={arch}", "-O3", "-std=c++17", "-I", os.path.join(ROOT, "plugins", "kernels"),
            "-I", os.path.join(ROOT, "plugins", "capi")]


def build_and_run(source: str, arch: str) -> dict[str, float]:
    """Build a standalone CUDA benchmark (bench/*.cu printing "name value" lines) for `arch` and run it:
    {name: value}."""
    with tempfile.TemporaryDirectory() as tmp:
        binary = os.path.join(tmp, os.path.splitext(os.path.basename(source))[0])
        subprocess.run([nvcc(), *nvcc_flags(arch), source, "-o", binary], check=True)
        out = subprocess.run([binary], check=True, capture_output=True, text=True).stdout
    return {name: float(value) for name, value in (line.split() for line in out.splitlines() if line.strip())}


def device_capability(parser: argparse.ArgumentParser) -> tuple[int, int]:
    """The current CUDA device's compute capability, or the parser's one-line error without a device."""
    import torch
    if not torch.cuda.is_available():
        parser.error("the benchmark runs on a CUDA device")
    return torch.cuda.get_device_capability()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="JSON report (default bench/results/sync-costs-<gpu>.json)")
    args = parser.parse_args(argv)
    major, minor = device_capability(parser)
    if major < 9:
        parser.error(f"thread-block clusters need compute capability 9.0+, this GPU has {major}.{minor}")
    import torch

    from padfree.bench import record
    from padfree.bench.timing import gpu_slug
    values = build_and_run(SOURCE, gpu_arch(major, minor))
    for name, value in values.items():
        print(f"{name:20s} {value:g}")
    device = torch.cuda.get_device_name()
    report = {"benchmark": "the cost of one synchronization between dependent phases of GPU work",
              "device": device, **record.provenance(ROOT),
              "timing": "CUDA events, best of 20 runs; boundaries: a graph of 100 dependent kernels of one block per SM"
                        " (128 threads, each reading what the previous wrote); barriers: 1000 in one kernel less one",
              "microseconds": {k: v for k, v in values.items() if k.endswith("_us")},
              "sms": int(values.get("sms", 0))}
    record.write(report, args.out or os.path.join(ROOT, "bench", "results", f"sync-costs-{gpu_slug(device)}.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
