# Source on the device machine (from the repository root, after scripts/device_env.sh) to give
# bench/generate.py --ctranslate2 its peer: installs the CTranslate2 wheel carried in .whl-ct2/ into
# /tmp/padfree-ct2 and puts it on PYTHONPATH.
#   source scripts/device_env.sh && source scripts/ctranslate2_env.sh
# Why the links: the wheel is built for CUDA 12 and opens libcublas.so.12 at run time (its CUDA runtime
# is linked in statically), while the device image has CUDA 13. CTranslate2 uses only cuBLAS calls that
# cuBLAS 13 keeps, so libcublas.so.12 / libcublasLt.so.12 link to the image's cuBLAS 13 in a folder
# put first on LD_LIBRARY_PATH. Only the .so.12 names go there: a .so.13 name in that folder would be
# found before torch's own cuBLAS (LD_LIBRARY_PATH outranks a library's RUNPATH) and pair its
# libcublas with the image's libcublasLt. numpy and pyyaml, its dependencies, come with torch and
# transformers.
set -e
ct2_site=/tmp/padfree-ct2
cuda=${CUDA_HOME:-/usr/local/cuda}
wheel=$(ls .whl-ct2/ctranslate2-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
  echo "ctranslate2_env.sh: no .whl-ct2/ctranslate2-*.whl here: copy the wheel (cp$(python3 -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')," \
       "manylinux x86_64) into .whl-ct2/ and carry that folder" >&2
  set +e; return 1 2>/dev/null || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$ct2_site" "$wheel"
mkdir -p "$ct2_site/cuda-links"
for lib in libcublas libcublasLt; do
  if [ ! -e "$cuda/lib64/$lib.so.13" ]; then
    echo "ctranslate2_env.sh: $cuda/lib64/$lib.so.13 not found (set CUDA_HOME to the CUDA 13 toolkit)" >&2
    set +e; return 1 2>/dev/null || exit 1
  fi
  ln -sf "$cuda/lib64/$lib.so.13" "$ct2_site/cuda-links/$lib.so.12"
done
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$ct2_site
export LD_LIBRARY_PATH=$ct2_site/cuda-links${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
python3 -c 'import ctranslate2 as c; n = c.get_cuda_device_count(); print("ctranslate2", c.__version__, "CUDA devices:", n, "compute types:", sorted(c.get_supported_compute_types("cuda")) if n else "-")' \
  || echo "ctranslate2_env.sh: ctranslate2 does not import (above); bench/generate.py --ctranslate2 will skip it" >&2
set +e
