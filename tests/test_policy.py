"""What implementation=None lowers to on a GPU, per shape class: the policy
tables' choices reach the compiled program (checked by lowering for CUDA,
which needs no GPU, only the CUDA build)."""

import jax
import jax.numpy as jnp
import pytest

import jaxcraft
from jaxcraft import _ffi
from jaxcraft.ops import norm as norm_ops

needs_cuda_build = pytest.mark.skipif("cuda" not in _ffi.kernel_platforms(),
                                      reason="needs the CUDA build (lowering only, no GPU)")


def _calls(module: str, target: str) -> bool:
  """Whether the module calls FFI target `target` (not merely names it, as
  the primitive's location metadata does)."""
  return f"@{target}(" in module


def _cuda_hlo(fn, *args):
  return jax.export.export(jax.jit(fn), platforms=["cuda"],
                           disabled_checks=jaxcraft.EXPORT_DISABLED_CHECKS)(*args).mlir_module()


@needs_cuda_build
@pytest.mark.parametrize("rows", [1, 64, 16384])
def test_norms_run_xla_on_cuda(rows):
  """The norms' policy on CUDA: XLA's fused norm at every row count."""
  assert norm_ops.default_implementation("cuda") == "xla"
  x = jnp.ones((rows, 256), jnp.bfloat16)
  s = jnp.ones((256,), jnp.float32)
  fwd = lambda x: jaxcraft.rms_norm(x, s, residual=x)
  grad = jax.grad(lambda x: jaxcraft.layer_norm(x, s).astype(jnp.float32).sum())
  assert not _calls(_cuda_hlo(fwd, x), _ffi.NORM_FWD)
  hlo = _cuda_hlo(grad, x)
  assert not (_calls(hlo, _ffi.NORM_FWD) or _calls(hlo, _ffi.NORM_BWD))


@needs_cuda_build
def test_forced_kernel_ignores_the_policy():
  x = jnp.ones((1, 256), jnp.bfloat16)
  assert _calls(_cuda_hlo(lambda x: jaxcraft.rms_norm(x, implementation="cuda"), x), _ffi.NORM_FWD)
