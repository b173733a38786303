"""The chain-cost benchmarks (bench/sync_costs.py, bench/copy_rates.py, bench/decode_linear_phases.py) on a
machine without a GPU: their CUDA sources compile for sm_90a where nvcc is (decode_linear_phases: with the stamps
written into the current decode_linear.cu, so a kernel edit that removes a stamp's place fails here,
not on the device), and the scripts refuse with a one-line reason instead of failing in the build."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import copy_rates  # noqa: E402
import decode_linear_phases  # noqa: E402
import sync_costs  # noqa: E402


def _nvcc() -> str:
    try:
        return sync_costs.nvcc()
    except SystemExit:
        pytest.skip("no nvcc on this machine (set CUDA_HOME)")


@pytest.mark.parametrize("module", [sync_costs, copy_rates], ids=["sync_costs", "copy_rates"])
def test_benchmark_compiles_for_hopper(tmp_path, module):
    # the flags build_and_run builds it with (the kernel library's headers on the include path)
    proc = subprocess.run([_nvcc(), *sync_costs.nvcc_flags("sm_90a"), "-c", module.SOURCE, "-o",
                           str(tmp_path / "benchmark.o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_decode_linear_phases_stamps_the_current_kernel_and_compiles(tmp_path):
    _nvcc()
    source = decode_linear_phases.stamped_source()
    # the helper's definition, four stamps and the last one at the end of each path (tensor / CUDA cores)
    assert source.count("stamp()") == 7
    assert os.path.isfile(decode_linear_phases.build(str(tmp_path), "sm_90a", compile_only=True))


def test_decode_linear_phases_refuses_a_kernel_without_a_stamp_place(tmp_path):
    kernel = tmp_path / "decode_linear.cu"
    with open(decode_linear_phases.KERNEL) as f:
        kernel.write_text(f.read().replace("wait_on_producer();", "wait_on_producer_renamed();"))
    with pytest.raises(SystemExit, match="update bench/decode_linear_phases.py"):
        decode_linear_phases.stamped_source(str(kernel))


def test_decode_linear_phases_parses_the_driver_output():
    got = decode_linear_phases.parse("graph_us 354.5\ncalls 72\nrows 4\nqkv 5.26 0.44 0.03 0.66 1.54 1.64 3.61\n")
    assert got["graph_us"] == 354.5 and got["calls"] == 72
    assert got["projections"]["qkv"]["ln"] == 1.54 and got["projections"]["qkv"]["ahead"] == 3.61


@pytest.mark.parametrize("script, argv, message", [
    ("sync_costs.py", [], "runs on a CUDA device"),
    ("copy_rates.py", [], "runs on a CUDA device"),
    ("decode_linear_phases.py", [], "runs on a CUDA device"),
    ("decode_linear_phases.py", ["--rows", "4,9"], "each from 1 to 8"),
    ("decode_linear_phases.py", ["--rows", "four"], "comma-separated integers"),
])
def test_without_a_gpu_or_with_bad_arguments_it_says_so(script, argv, message):
    if torch.cuda.is_available() and "device" in message:
        pytest.skip("checks the refusal on a machine without a GPU")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr.strip().splitlines()[-1]
