"""What implementation=None lowers to on a GPU, per shape class: the policy
tables' choices reach the compiled program (checked by lowering for CUDA,
which needs no GPU, only the CUDA build)."""

import jax
import jax.numpy as jnp
import pytest

import jaxcraft
from jaxcraft import _ffi
from jaxcraft.ops import activations as act_ops
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


def test_activation_forward_runs_xla_below_the_size_threshold():
  """The kernel's forward from FORWARD_KERNEL_MIN_SIZE elements of x on; the
  backward keeps the table's choice at every size."""
  least = act_ops.FORWARD_KERNEL_MIN_SIZE["cuda"]
  pick = lambda pass_, size: act_ops.default_implementation("swiglu", "cuda", pass_,
                                                            jnp.bfloat16, size)
  assert pick("fwd", least - 1) == "xla"
  assert pick("fwd", least) == act_ops.default_implementation("swiglu", "cuda") == "kernel"
  assert pick("bwd", 1) == "kernel"
  assert act_ops.default_implementation("swiglu", "cpu", "fwd", jnp.bfloat16, 1) == "xla"
  assert act_ops.default_implementation("swiglu", "cpu", "bwd", jnp.bfloat16, 1) == "kernel"


@needs_cuda_build
@pytest.mark.parametrize("rows,fwd_kernel", [(1, False), (1024, False), (4096, True)])
def test_swiglu_decode_rows_run_xla_on_cuda(rows, fwd_kernel):
  """A decoder's SwiGLU (d_model 2048, width 5632): XLA's forward at decode and
  small-batch rows, the kernel at training sizes; the backward kernel always."""
  x = jnp.ones((rows, 2 * 5632), jnp.bfloat16)
  assert _calls(_cuda_hlo(jaxcraft.swiglu, x), _ffi.ACTIVATION_FWD) == fwd_kernel
  hlo = _cuda_hlo(jax.grad(lambda x: jaxcraft.swiglu(x).astype(jnp.float32).sum()), x)
  assert _calls(hlo, _ffi.ACTIVATION_BWD)
