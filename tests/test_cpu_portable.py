"""The CPU kernels' portable paths on a CPU with AVX2 and F16C, as CI's has:
the 4-lane tile products (cpu/blocked.cc) and the float16 row conversions by
integer selects (cpu/row_convert.cc), which ARM and older x86-64 CPUs run.
With JAXCRAFT_CPU_PORTABLE=1 the extension takes them at their first use, so
the parity tests that vary the tile products' shapes (float32) and the
float16 cases of the row kernels run again in a subprocess with that set:
the odd head dimensions (every tile product's edges) rather than every
shape, which the default paths' tests cover."""

import os
import subprocess
import sys

import pytest

from jaxcraft import _ffi

_HERE = os.path.dirname(os.path.abspath(__file__))
_TESTS = [
    f"{_HERE}/test_attention.py::test_odd_head_dims",
    f"{_HERE}/test_decode_attention.py::test_odd_head_dims",
    f"{_HERE}/test_decode_attention.py::test_paged_parity",
    f"{_HERE}/test_norm.py::test_forward_parity",
    f"{_HERE}/test_norm.py::test_gradients",
    f"{_HERE}/test_norm.py::test_residual_sum_keeps_every_value",
    f"{_HERE}/test_softmax.py::test_forward_parity",
    f"{_HERE}/test_softmax.py::test_gradients",
    f"{_HERE}/test_activations.py::test_forward_parity",
    f"{_HERE}/test_activations.py::test_gradients",
    f"{_HERE}/test_embedding.py::test_gradients",
    f"{_HERE}/test_cpu_portable.py::test_paths_in_subprocess",
]
# The float32 cases of the products' tests, the float16 ones of the row
# kernels' (ids name the dtype where a test has several; "cpu" also matches
# this file's name).
_SELECT = ("cpu and ((attention or decode) and not bfloat16 and not float16"
           " or (norm or softmax or activations or embedding) and float16 and not bfloat16"
           " or paths_in_subprocess)")


def _portable_run() -> bool:
  return os.environ.get("JAXCRAFT_CPU_PORTABLE") == "1"


def test_portable_paths_parity(platform):
  if platform != "cpu" or _portable_run():
    pytest.skip("runs once, for the CPU kernels, outside its own subprocess")
  ext = _ffi._extension()
  if ext.cpu_gemm_lanes() == 4 and not ext.cpu_f16c_rows():
    pytest.skip("this CPU runs the portable paths in every test")
  env = dict(os.environ, JAXCRAFT_CPU_PORTABLE="1", JAXCRAFT_TEST_PLATFORMS="cpu")
  run = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-k", _SELECT, *_TESTS],
                       env=env, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_paths_in_subprocess():
  if not _portable_run():
    pytest.skip("runs in test_portable_paths_parity's subprocess")
  assert _ffi._extension().cpu_gemm_lanes() == 4
  assert not _ffi._extension().cpu_f16c_rows()
