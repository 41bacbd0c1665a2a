#!/usr/bin/env bash
# Installs a jaxcraft wheel into an empty folder and runs the test suite
# against it, from a copy of tests/ and with no CUDA compiler on PATH: what a
# user who installs the wheel gets. The Python that runs it provides JAX.
#
#   bash tools/test_wheel.sh WHEEL [pytest arguments]
set -euo pipefail
wheel=$(realpath "$1"); shift
python=${PYTHON:-python3}
site=$(mktemp -d) copy=$(mktemp -d)
trap 'rm -rf "$site" "$copy"' EXIT
"$python" -m pip install -q --no-deps --no-index --target "$site" "$wheel"
# The tests, and the files tests/test_readme.py reads, without the package source.
src=$(dirname "$0")/..
mkdir "$copy/.ci" && cp -r "$src/tests" "$copy/" && cp "$src/README.md" "$copy/" && cp "$src/.ci/run" "$copy/.ci/"
cd "$copy/tests"
export PATH=$(dirname "$(command -v "$python")"):/usr/bin:/bin PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
echo "nvcc on PATH: $(command -v nvcc || echo none)"
"$python" -P -c "import jaxcraft; print('jaxcraft from', jaxcraft.__file__)"
"$python" -P -m jaxcraft
"$python" -m pytest -p no:cacheprovider "$@"
