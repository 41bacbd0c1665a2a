"""Test setup: 8 virtual CPU devices for the sharding tests (must be set before
JAX starts), and the list of kernel platforms this machine can run."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

from jaxcraft import _ffi  # noqa: E402
from sharding_util import cpu_mesh  # noqa: E402


def _gpu_available() -> bool:
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


# Kernel platforms to test: CPU always (when built); CUDA on a machine with a
# GPU and a CUDA build. Tests marked `gpu` are skipped elsewhere.
# JAXCRAFT_TEST_PLATFORMS=cuda narrows the run (the GPU script: CI covers cpu).
_WANTED = os.environ.get("JAXCRAFT_TEST_PLATFORMS", "cpu,cuda").split(",")
KERNEL_PLATFORMS = [p for p in ("cpu", "cuda") if p in _WANTED
                    and _ffi.has_kernels(p) and (p == "cpu" or _gpu_available())]


def pytest_collection_modifyitems(config, items):
  if "cuda" in KERNEL_PLATFORMS:
    return
  skip = pytest.mark.skip(reason="needs a CUDA GPU and the CUDA build")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture(params=KERNEL_PLATFORMS)
def platform(request):
  """Runs the test with arrays and computation on each kernel platform."""
  device = jax.devices(request.param)[0]
  with jax.default_device(device):
    yield request.param


@pytest.fixture(params=[AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def mesh(request):
  """The 4 x 2 CPU mesh (sharding_util.cpu_mesh), in both axis-type modes."""
  return cpu_mesh(request.param)
