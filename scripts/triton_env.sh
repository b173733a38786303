# Source on the device machine (from the repository root, after scripts/device_env.sh) to give the
# Triton tests and bench/serve.py a tritonserver and its client: installs the wheels carried in
# .whl-triton/ (nvidia-pytriton: tritonserver, the Python backend and its stubs; tritonclient) into
# /tmp/padfree-triton and puts that on PYTHONPATH.
#   source scripts/device_env.sh && source scripts/triton_env.sh
# --no-deps: only pytriton's binaries are used (padfree.triton.server finds them without importing
# pytriton, whose Python dependencies the image lacks). tritonclient.grpc needs grpcio, numpy and
# ml_dtypes (the image has them) and python-rapidjson (carried, cp312). It asks for protobuf < 7: a
# carried protobuf 6 wheel is installed only where tritonclient.grpc does not import with the image's
# protobuf, since it would shadow that one for onnx too.
# Do not pipe `source` into another command: the pipe runs it in a subshell and the exports are lost.
set -e
triton_site=/tmp/padfree-triton
if ! ls .whl-triton/nvidia_pytriton-*.whl .whl-triton/tritonclient-*.whl >/dev/null 2>&1; then
  echo "triton_env.sh: .whl-triton/ needs the nvidia-pytriton, tritonclient and python-rapidjson wheels" \
       "(pip download --no-deps nvidia-pytriton tritonclient python-rapidjson -d .whl-triton) and must be carried" >&2
  set +e; return 1 2>/dev/null || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$triton_site" \
  $(ls .whl-triton/*.whl | grep -v '/protobuf-')
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$triton_site
if ! python3 -c 'import tritonclient.grpc' >/dev/null 2>&1 && ls .whl-triton/protobuf-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$triton_site" .whl-triton/protobuf-*.whl
fi
python3 -c 'import tritonclient.grpc; from padfree.triton import server; print("tritonserver:", server.find().binary)' \
  || echo "triton_env.sh: the Triton client or server is not usable (above); the Triton tests will skip" >&2
set +e
