"""bench/sync_costs.py on a machine without a GPU: its CUDA source compiles for sm_90a (where nvcc is),
and the script refuses with a one-line reason instead of failing inside the build or the run."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import sync_costs  # noqa: E402


def test_the_cuda_source_compiles_for_hopper(tmp_path):
    try:
        nvcc = sync_costs.nvcc()
    except SystemExit:
        pytest.skip("no nvcc on this machine (set CUDA_HOME)")
    proc = subprocess.run([nvcc, "-arch=sm_90a", "-O3", "-std=c++17", "-c", sync_costs.SOURCE, "-o",
                           str(tmp_path / "sync_costs.o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_says_so():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sync_costs.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "runs on a CUDA device" in proc.stderr.strip().splitlines()[-1]
