#!/usr/bin/env bash
# One entry for a fresh machine: sets up .venv (CPU torch, the export stack, TensorRT-RTX, padfree
# built with its CUDA kernels), then runs `demo` (the default) or `test`.
#   bash scripts/run.sh [demo|test] [extra args]
set -euo pipefail
cd "$(dirname "$0")/.."
job="${1:-demo}"; shift || true

if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc PATH="/usr/local/cuda/bin:$PATH"
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
py=.venv/bin/python
# torch first and pinned: a range would pull a multi-GB CUDA build on a CPU-only machine.
$py -m pip install -q --upgrade pip
$py -m pip list 2>/dev/null | grep -q '^torch ' || $py -m pip install -q torch==2.13.0
# The TensorRT plugin library (libpadfree_trt.so) compiles against TensorRT's public headers only:
# ../shared/third_party/tensorrt beside the checkout, or $TensorRT_ROOT. Without them the kernel
# library still builds and the plugin parts skip with a message.
trt_root="${TensorRT_ROOT:-}"
if [ -z "$trt_root" ] && [ -f ../shared/third_party/tensorrt/include/NvInferRuntime.h ]; then
  trt_root="$(cd ../shared/third_party/tensorrt && pwd)"
fi
if [ -n "$trt_root" ]; then
  export SKBUILD_CMAKE_DEFINE="TensorRT_ROOT=$trt_root${SKBUILD_CMAKE_DEFINE:+;$SKBUILD_CMAKE_DEFINE}"
else
  echo "padfree: no TensorRT headers (../shared/third_party/tensorrt or \$TensorRT_ROOT): libpadfree_trt.so is not" \
       "built, and engines build from the plain export only" >&2
fi
$py -m pip install -q -e '.[export,test,trt-rtx]'
# A real tritonserver for tests/test_triton_server.py: only the wheel's binaries are used, and its own
# Python dependencies pin numpy < 2, hence --no-deps. Without it those tests skip with a message.
$py -m pip install -q --no-deps nvidia-pytriton==0.7.0 ||
  echo "padfree: nvidia-pytriton not installed: the tritonserver tests skip" >&2

case "$job" in
  demo) exec .venv/bin/padfree demo "$@" ;;
  test) exec $py -m pytest -q -ra "$@" ;;
  *) echo "usage: bash scripts/run.sh [demo|test]" >&2; exit 2 ;;
esac
