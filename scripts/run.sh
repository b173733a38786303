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
$py -m pip install -q -e '.[export,test,trt-rtx]'

case "$job" in
  demo) exec .venv/bin/padfree demo "$@" ;;
  test) exec $py -m pytest -q -ra "$@" ;;
  *) echo "usage: bash scripts/run.sh [demo|test]" >&2; exit 2 ;;
esac
