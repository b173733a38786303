#!/usr/bin/env bash
# The integration run on the device machine, in one call: build (kernel library, and the TensorRT
# plugins when headers are carried in .deps/tensorrt), every GPU test, the kernel tests under
# compute-sanitizer, and the benchmarks. Logs and result JSON go to $OUT (or out/ elsewhere, which
# .gitignore keeps out of the repository): run logs are never committed. The benchmarks also write
# their current result to bench/results/<name>-<gpu>.json; commit those only for a new current run.
#   bash scripts/device_check.sh [tests|sanitize|bench|all]...      (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-out}"; logs="$out/logs"; mkdir -p "$logs"
if [ -d .deps/tensorrt/include ]; then
  export PADFREE_BUILD_TRT_PLUGINS=ON PADFREE_CMAKE_ARGS="-DTensorRT_ROOT=$PWD/.deps/tensorrt ${PADFREE_CMAKE_ARGS:-}"
fi
source scripts/device_env.sh || { echo "build failed"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$logs/device.txt"
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$logs/device.txt"

summary=()
step() {  # step NAME COMMAND...: runs it, tees its log, records its exit status and time
  local name=$1; shift
  local start=$SECONDS
  "$@" 2>&1 | tee "$logs/$name.log"
  local rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-10s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - start)) "$(tail -n 1 "$logs/$name.log")")")
}

# Kernel tests only under the sanitizers: the encoder tests add cuBLAS and torch's own kernels,
# which the tools would also have to walk, without testing padfree's memory accesses any better.
kernel_tests=(tests/test_padding.py tests/test_layernorm.py tests/test_embedding.py
              tests/test_activation.py tests/test_attention.py tests/test_inputs.py tests/test_graph_guard.py)
# Not tests/test_graph_edges.py: under memcheck the probe found torch's elementwise consumer waiting
# (H100: the tool held it past the producer's 20 ms spin), which the test's control
# rejects; in plain runs it passes. The feature is off by default and relaxes nothing on that stack.
# torch's caching allocator off: inside its cached segments an access past a tensor's end lands in
# another live block, which memcheck cannot tell from a valid one. One test file at a time: memcheck
# keeps device memory past each cudaFree, and over the whole list the driver's free memory fell from
# 80 GB to 28 MB by test 700 while torch held none (H100), after which every test failed
# with out-of-memory. Each file in SANITIZE_PROCESSES processes (pytest --shard, tests/conftest.py):
# the tools slow the kernels 100-fold and more, and racecheck of the five kernel files took ~40 min
# of wall time over 8-18 processes on one H100 (one process gets through ~0.7 tests/s).
sanitize() {
  local tool=$1 rc=0 file k status log; shift
  local files=() args=() pids=() processes=${SANITIZE_PROCESSES:-8}
  for a in "$@"; do [[ $a == tests/*.py ]] && files+=("$a") || args+=("$a"); done
  for file in "${files[@]}"; do
    pids=()
    for ((k = 0; k < processes; k++)); do
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool "$tool" --error-exitcode 1 --target-processes all \
        python3 -m pytest -q -m gpu -p no:cacheprovider --shard "$k/$processes" "$file" "${args[@]}" \
        > "$logs/$tool-$(basename "$file" .py)-$k.log" 2>&1 &
      pids+=($!)
    done
    for k in "${!pids[@]}"; do
      wait "${pids[$k]}"; status=$?; log="$logs/$tool-$(basename "$file" .py)-$k.log"
      [ $status -eq 0 ] || [ $status -eq 5 ] || rc=1  # 5: the filter selected nothing in this shard
      echo "$file shard $k/$processes rc=$status: $(grep -E '[0-9]+ (passed|failed|skipped|deselected)' "$log" | tail -n 1) $(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -n 1)"
      [ $status -eq 0 ] || [ $status -eq 5 ] || grep -v -E "^(platform|rootdir|configfile|plugins|cachedir)" "$log" | tail -n 40
    done
  done
  return $rc
}

modes=("${@:-all}")
for mode in "${modes[@]}"; do
  case "$mode" in
    tests|all)
      step gpu-tests python3 -m pytest -q -ra -m gpu tests
      [ -x build/device/plugins/trt/padfree_trt_harness ] && step trt-harness python3 -m pytest -q tests/test_trt_plugins.py ;;&
    sanitize|all)
      step memcheck sanitize memcheck "${kernel_tests[@]}"
      # racecheck walks every shared-memory access; RACECHECK_FILTER (a -k expression) narrows it
      step racecheck sanitize racecheck "${kernel_tests[@]}" ${RACECHECK_FILTER:+-k "$RACECHECK_FILTER"} ;;&
    bench|all)
      step bench-kernels python3 bench/kernels.py
      step bench-attn python3 bench/attention.py
      step bench-bert python3 bench/bert.py
      cp bench/results/*.json "$out/" ;;
    tests|sanitize) ;;
    *) echo "unknown mode $mode (tests|sanitize|bench|all)"; exit 2 ;;
  esac
done
# The device tool brings back few files: the logs travel as one archive.
tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -r "$logs"
echo "== summary"
printf '%s\n' "${summary[@]}"
