# Source on the device machine (from the repository root): builds the kernel library for sm_90
# into build/device and points the Python package at it. Usage: source scripts/device_env.sh
set -e
cmake -S . -B build/device -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DPADFREE_BUILD_TRT_PLUGINS=${PADFREE_BUILD_TRT_PLUGINS:-OFF} ${PADFREE_CMAKE_ARGS:-} >/dev/null
cmake --build build/device -j 16
export PADFREE_LIBRARY=$PWD/build/device/libpadfree_kernels.so
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
set +e
