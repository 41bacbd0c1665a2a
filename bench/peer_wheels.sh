#!/usr/bin/env bash
# The peers the GPU machine lacks (tokamax's Mosaic GPU attention), as wheels for its Python 3.12, into .whl/ (git-ignored).
# Run here, where PyPI is reachable; then carry .whl in the device call:
# bench/gpu_check.sh installs them before its stages, and bench/attention.py
# adds a tokamax column when it can import it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# tokamax's own needs that the machine's image lacks (pydantic wants a newer
# typing_extensions than the image's).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl tokamax==0.0.17 einshape pydantic pydantic-core annotated-types typing-inspection \
  typing_extensions qwix immutabledict tensorboardx
# tokamax imports xprof's kernel-stats tool at module level; its attention
# never calls it.
mkdir -p .whl/stub/xprof/cli
touch .whl/stub/xprof/__init__.py .whl/stub/xprof/cli/__init__.py
echo "get_kernel_stats_tool = None  # stub: see bench/peer_wheels.sh" > .whl/stub/xprof/cli/tools.py
ls .whl
