"""Loads the compiled extension once and registers its FFI targets with JAX."""

from __future__ import annotations

import functools

import jax

# XLA's platform names (as the extension reports them) -> JAX lowering names.
_LOWERING_PLATFORM = {"cpu": "cpu", "CUDA": "cuda"}


@functools.cache
def _extension():
  try:
    from jaxcraft import _jaxcraft
  except ImportError:
    return None
  return _jaxcraft


@functools.cache
def kernel_platforms() -> frozenset[str]:
  """Lowering platforms ("cpu", "cuda") for which jaxcraft kernels are built.

  Registers every FFI target on first call; later calls are free.
  """
  ext = _extension()
  if ext is None:
    return frozenset()
  platforms = set()
  for xla_platform, targets in ext.registrations().items():
    for name, capsule in targets.items():
      jax.ffi.register_ffi_target(name, capsule, platform=xla_platform)
    if targets:
      platforms.add(_LOWERING_PLATFORM[xla_platform])
  return frozenset(platforms)


def has_kernels(platform: str) -> bool:
  return platform in kernel_platforms()


def extension_error() -> str | None:
  """Why the extension failed to import, for error messages (None if it loaded)."""
  try:
    from jaxcraft import _jaxcraft  # noqa: F401
  except ImportError as e:
    return str(e)
  return None
