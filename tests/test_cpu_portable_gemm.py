"""The CPU tile products' portable path (cpu/blocked.cc: 4-lane vectors, the
one ARM and older x86-64 CPUs run) on a CPU with AVX2, as CI's have: with
JAXCRAFT_CPU_PORTABLE_GEMM=1 the extension takes it at its first product, so
the attention and decode parity tests that vary the tile products' shapes
run again in a subprocess with that set."""

import os
import subprocess
import sys

import pytest

from jaxcraft import _ffi

_HERE = os.path.dirname(os.path.abspath(__file__))
_TESTS = [
    f"{_HERE}/test_attention.py::test_odd_head_dims",
    f"{_HERE}/test_attention.py::test_shapes_and_causal",
    f"{_HERE}/test_decode_attention.py::test_odd_head_dims",
    f"{_HERE}/test_decode_attention.py::test_head_dims",
    f"{_HERE}/test_decode_attention.py::test_paged_parity",
    f"{_HERE}/test_cpu_portable_gemm.py::test_lanes_in_subprocess",
]


def _portable_run() -> bool:
  return os.environ.get("JAXCRAFT_CPU_PORTABLE_GEMM") == "1"


def test_portable_gemm_parity(platform):
  if platform != "cpu" or _portable_run():
    pytest.skip("runs once, for the CPU kernels, outside its own subprocess")
  if _ffi._extension().cpu_gemm_lanes() == 4:
    pytest.skip("this CPU runs the portable path in every test")
  env = dict(os.environ, JAXCRAFT_CPU_PORTABLE_GEMM="1", JAXCRAFT_TEST_PLATFORMS="cpu")
  # The float32 cases of the parametrized tests (their ids name the dtype;
  # "cpu" also matches this file's name, for test_lanes_in_subprocess).
  run = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-k", "cpu and (float32 or not bfloat16 and not float16)", *_TESTS],
                       env=env, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_lanes_in_subprocess():
  if not _portable_run():
    pytest.skip("runs in test_portable_gemm_parity's subprocess")
  assert _ffi._extension().cpu_gemm_lanes() == 4
