# Source on the device machine (from the repository root): builds the kernel library for sm_90a
# into build/device and points the Python package at it. Usage: source scripts/device_env.sh
set -e
cmake -S . -B build/device -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a-real -DPADFREE_BUILD_TRT_PLUGINS=${PADFREE_BUILD_TRT_PLUGINS:-OFF} \
  -DPython_EXECUTABLE="$(command -v python3)" ${PADFREE_CMAKE_ARGS:-} >/dev/null
cmake --build build/device -j 16
export PADFREE_LIBRARY=$PWD/build/device/libpadfree_kernels.so
[ -f build/device/plugins/trt/libpadfree_trt.so ] && export PADFREE_TRT_LIBRARY=$PWD/build/device/plugins/trt/libpadfree_trt.so

# The package as pip lays it out (padfree.export = export/, padfree.engines = engines/), made of
# links so that no install step runs: the device image has no pip access.
pkg=build/device/python/padfree
rm -rf "$pkg" && mkdir -p "$pkg"
for entry in python/padfree/*; do ln -s "$PWD/$entry" "$pkg/"; done
ln -s "$PWD/export" "$pkg/export" && ln -s "$PWD/engines" "$pkg/engines"
for ext in build/device/_hostpack*.so; do [ -f "$ext" ] && ln -s "$PWD/$ext" "$pkg/"; done
export PYTHONPATH=$PWD/build/device/python${PYTHONPATH:+:$PYTHONPATH}

# Pure-Python packages the image lacks (polygraphy, onnx-graphsurgeon), carried as wheels in .whl.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/padfree-site .whl/*.whl
  export PYTHONPATH=$PYTHONPATH:/tmp/padfree-site
fi
export PYTHONUNBUFFERED=1
set +e
