"""The installed package carries its compiled kernels (catches a source tree
shadowing the install, or a build that silently dropped the extension)."""

import warnings

import jax
import pytest

from jaxcraft import _ffi


def test_cpu_kernels_built():
  assert _ffi.extension_error() is None
  assert _ffi.has_kernels("cpu")


def test_python_targets_are_the_extensions():
  """Every target the extension registers (cpp/ffi/handlers.h) has its
  role in _ffi, on every platform it was built for, and the versioned ABI
  names come from the extension."""
  registrations = _ffi._extension().registrations()
  assert registrations["cpu"]
  for targets in registrations.values():
    if targets:
      assert sorted(targets) == sorted(_ffi.TARGETS)


@pytest.mark.gpu
def test_cuda_kernels_built():
  assert _ffi.has_kernels("cuda")
  assert jax.devices("gpu")


def test_gpu_lowering_without_cuda_kernels_warns_once(monkeypatch):
  """A CPU-only build used on a GPU says so, once, instead of silently
  running every op's pure-JAX reference."""
  import jax.numpy as jnp
  import jaxcraft

  monkeypatch.setattr(_ffi, "kernel_platforms", lambda: frozenset({"cpu"}))
  _ffi.warn_cuda_kernels_missing.cache_clear()
  x = jnp.ones((4, 128), jnp.float32)
  export = lambda: jax.export.export(jax.jit(jaxcraft.rms_norm), platforms=["cuda"])(x)
  with pytest.warns(RuntimeWarning, match="CUDA kernels are not available.*pip install"):
    export()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    export()  # once per process
  _ffi.warn_cuda_kernels_missing.cache_clear()
