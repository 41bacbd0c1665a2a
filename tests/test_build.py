"""The installed package carries its compiled kernels (catches a source tree
shadowing the install, or a build that silently dropped the extension)."""

import jax
import pytest

from jaxcraft import _ffi


def test_cpu_kernels_built():
  assert _ffi.extension_error() is None
  assert _ffi.has_kernels("cpu")


@pytest.mark.gpu
def test_cuda_kernels_built():
  assert _ffi.has_kernels("cuda")
  assert jax.devices("gpu")
