"""Loads the compiled extension once and registers its FFI targets with JAX."""

from __future__ import annotations

import functools
import re
import warnings

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


def _target(role: str) -> str:
  """The FFI target the extension registers for `role` ("<op>_<fwd|bwd>"):
  "jaxcraft_<role>", with the "_vN" suffix of its current signature where it
  has one (cpp/ffi/handlers.h declares the names; they are an ABI, so a
  changed signature gets a new N; the newest is taken). Without the
  extension no kernel lowers, and the unversioned name stands in."""
  ext = _extension()
  names = set().union(*ext.registrations().values()) if ext is not None else set()
  versions = {}
  for name in names:
    if m := re.fullmatch(rf"jaxcraft_{role}(?:_v(\d+))?", name):
      versions[int(m.group(1) or 0)] = name
  return versions[max(versions)] if versions else f"jaxcraft_{role}"


NORM_FWD = _target("norm_fwd")
NORM_BWD = _target("norm_bwd")
ATTENTION_FWD = _target("attention_fwd")
ATTENTION_BWD = _target("attention_bwd")
DECODE_ATTENTION_FWD = _target("decode_attention_fwd")
ACTIVATION_FWD = _target("activation_fwd")
ACTIVATION_BWD = _target("activation_bwd")
EMBEDDING_FWD = _target("embedding_fwd")
EMBEDDING_BWD = _target("embedding_bwd")
SOFTMAX_FWD = _target("softmax_fwd")
SOFTMAX_BWD = _target("softmax_bwd")
TARGETS = (NORM_FWD, NORM_BWD, ATTENTION_FWD, ATTENTION_BWD, DECODE_ATTENTION_FWD)
TARGETS += (ACTIVATION_FWD, ACTIVATION_BWD, EMBEDDING_FWD, EMBEDDING_BWD, SOFTMAX_FWD, SOFTMAX_BWD)

# jax.export refuses custom calls it does not know to be stable; ours are,
# as long as jaxcraft (which registers them) is installed where the artifact runs.
EXPORT_DISABLED_CHECKS = tuple(jax.export.DisabledSafetyCheck.custom_call(t) for t in TARGETS)


@functools.cache
def kernel_platforms() -> frozenset[str]:
  """Lowering platforms ("cpu", "cuda") for which jaxcraft kernels are built.

  Registers every FFI target on first call (at import, below); later calls are free.
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


def cuda_kernels_missing() -> str:
  """Why this installation has no CUDA kernels, and how to get them."""
  why = extension_error()
  reason = (f"the compiled extension failed to import ({why})" if why else
            "jaxcraft was built without them: no CUDA compiler was found when it was installed")
  return (f"jaxcraft's CUDA kernels are not available: {reason}. Every jaxcraft op runs its "
          "pure-JAX reference on the GPU. To build them, reinstall jaxcraft on this machine "
          "with JAX's CUDA 13 plugin installed (pip install 'jax[cuda13]'; the build then "
          "fetches CUDA 13's compiler wheels) or with a CUDA toolkit's nvcc on PATH, e.g. "
          "JAXCRAFT_ENABLE_CUDA=ON pip install --force-reinstall --no-deps <jaxcraft source>; "
          "or install a jaxcraft wheel built with CUDA.")


@functools.cache
def warn_cuda_kernels_missing() -> None:
  """Warns once per process (an op lowering for a GPU without the CUDA
  kernels: every jaxcraft op then runs its pure-JAX reference)."""
  warnings.warn(cuda_kernels_missing(), RuntimeWarning, stacklevel=2)


def cuda_unsupported(op: str, **inputs) -> str | None:
  """Why the CUDA kernels of `op` cannot take these inputs (None: they can),
  by the rule the handlers apply (`<op>_cuda_unsupported`, cpp/contract/)."""
  ext = _extension()
  if ext is None:
    return f"the jaxcraft extension did not load ({extension_error()})"
  return getattr(ext, f"{op}_cuda_unsupported")(**inputs)


def extension_error() -> str | None:
  """Why the extension failed to import, for error messages (None if it loaded)."""
  try:
    from jaxcraft import _jaxcraft  # noqa: F401
  except ImportError as e:
    return str(e)
  return None


# Registered at import rather than at the first lowering: a deserialized
# jax.export artifact calls the targets in a process that may lower no
# jaxcraft op. Registering costs ~1 ms and initializes no backend.
kernel_platforms()
