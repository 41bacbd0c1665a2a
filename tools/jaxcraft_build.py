"""PEP 517 build backend: scikit-build-core, plus CUDA 13's compiler wheels
when this build should compile the CUDA kernels and no CUDA toolkit is
installed.

Build requirements cannot depend on what is installed, so the choice is made
here, when pip asks the backend what the build needs:
- JAXCRAFT_ENABLE_CUDA=OFF, or a CUDA compiler CMake finds (CUDACXX, nvcc on
  PATH, CUDA_PATH/bin): nothing extra; CMake uses that nvcc.
- otherwise, when JAXCRAFT_ENABLE_CUDA=ON, or when the Python that runs pip
  has JAX's CUDA 13 plugin, or when the machine has an NVIDIA driver for
  CUDA 13: the CUDA 13 compiler wheels (tools/build_inputs.py lists them),
  which CMake then uses as the toolkit.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys

from scikit_build_core.build import *  # noqa: F403 - the hooks this module does not change
from scikit_build_core import build as _scikit_build

import build_inputs

# A driver reports its newest CUDA as 1000 * major + 10 * minor.
_CUDA13_DRIVER = 13000


def _system_nvcc() -> bool:
  """Whether CMake will find a CUDA compiler by itself: the places it looks."""
  cuda_path = os.environ.get("CUDA_PATH")
  return bool(os.environ.get("CUDACXX") or shutil.which("nvcc")
              or (cuda_path and os.path.exists(os.path.join(cuda_path, "bin", "nvcc"))))


def _has_jax_cuda13_plugin() -> bool:
  """Whether the Python that runs the install has JAX's CUDA 13 plugin.
  pip builds in an isolated environment that hides that Python's packages
  through PYTHONPATH; a child without it sees them."""
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
  probe = "import importlib.metadata as m; m.version('jax-cuda13-plugin')"
  try:
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          timeout=60).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


def _driver_cuda_version() -> int:
  try:
    version = ctypes.c_int(0)
    ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
    return version.value
  except (OSError, AttributeError):
    return 0


def cuda_build_requirements() -> list[str]:
  mode = os.environ.get("JAXCRAFT_ENABLE_CUDA", "AUTO").upper()
  if mode == "OFF" or _system_nvcc():
    return []
  if mode == "ON" or _has_jax_cuda13_plugin() or _driver_cuda_version() >= _CUDA13_DRIVER:
    return build_inputs.cuda_requirements()
  return []


def get_requires_for_build_wheel(config_settings=None):
  return _scikit_build.get_requires_for_build_wheel(config_settings) + cuda_build_requirements()


def get_requires_for_build_editable(config_settings=None):
  return _scikit_build.get_requires_for_build_editable(config_settings) + cuda_build_requirements()
