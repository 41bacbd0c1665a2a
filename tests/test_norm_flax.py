"""jaxcraft.nn / jaxcraft.nnx norms are drop-ins for Flax's own modules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

flax = pytest.importorskip("flax")
import flax.linen as linen  # noqa: E402
from flax import nnx  # noqa: E402

import jaxcraft  # noqa: E402
from numerics import f64, random  # noqa: E402

LINEN = [
    (lambda **kw: jaxcraft.nn.LayerNorm(**kw), lambda **kw: linen.LayerNorm(**kw)),
    (lambda **kw: jaxcraft.nn.RMSNorm(**kw), lambda **kw: linen.RMSNorm(**kw)),
]
CONFIGS = [{}, {"dtype": jnp.bfloat16}, {"epsilon": 1e-3}, {"use_scale": False}]
# Flax's default variance is E[x^2] - E[x]^2; ours is two-pass: both fp32.
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pair", LINEN)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_linen_matches_flax(platform, pair, config, dtype):
  ours, theirs = pair[0](**config), pair[1](**config)
  x = random(jax.random.key(0), (4, 9, 96), dtype, scale=2.0, offset=0.3)
  params = theirs.init(jax.random.key(1), x)
  assert jax.tree.structure(ours.init(jax.random.key(1), x)) == jax.tree.structure(params)
  a, b = ours.apply(params, x), theirs.apply(params, x)
  assert a.dtype == b.dtype
  tol = TOL if b.dtype == jnp.float32 else dict(rtol=2e-2, atol=2e-2)
  np.testing.assert_allclose(f64(a), f64(b), **tol)
  loss = lambda m: lambda p, x: jnp.sum(jnp.sin(m.apply(p, x).astype(jnp.float32)))
  ga, gb = jax.grad(loss(ours), (0, 1))(params, x), jax.grad(loss(theirs), (0, 1))(params, x)
  for u, v in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(f64(u), f64(v), rtol=5e-2, atol=5e-2)


def test_linen_in_hlo():
  x = jnp.ones((2, 16), jnp.float32)
  m = jaxcraft.nn.LayerNorm()
  p = m.init(jax.random.key(0), x)
  # Lowered for CPU, where implementation=None runs the kernel.
  module = jax.export.export(jax.jit(m.apply), platforms=["cpu"],
                             disabled_checks=jaxcraft.EXPORT_DISABLED_CHECKS)(p, x).mlir_module()
  assert "@jaxcraft_norm_fwd(" in module


def test_linen_other_axes_fall_back_to_flax():
  x = random(jax.random.key(0), (4, 6, 8), jnp.float32)
  ours, theirs = jaxcraft.nn.LayerNorm(reduction_axes=(-2, -1)), linen.LayerNorm(reduction_axes=(-2, -1))
  p = theirs.init(jax.random.key(1), x)
  np.testing.assert_allclose(ours.apply(p, x), theirs.apply(p, x), **TOL)


@pytest.mark.parametrize("cls", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_nnx_matches_flax(platform, cls, dtype):
  ours = getattr(jaxcraft.nnx, cls)(96, rngs=nnx.Rngs(0))
  theirs = getattr(nnx, cls)(96, rngs=nnx.Rngs(0))
  x = random(jax.random.key(0), (3, 96), dtype, scale=2.0, offset=0.3)
  assert jax.tree.structure(nnx.state(ours)) == jax.tree.structure(nnx.state(theirs))
  np.testing.assert_allclose(f64(ours(x)), f64(theirs(x)), **TOL)
  nnx.update(ours, nnx.state(theirs))
  g1 = nnx.grad(lambda m: jnp.sum(jnp.sin(m(x))))(ours)
  g2 = nnx.grad(lambda m: jnp.sum(jnp.sin(m(x))))(theirs)
  for u, v in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(f64(u), f64(v), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("cls", ["LayerNorm", "RMSNorm"])
def test_nnx_promote_dtype_and_dtype_match_flax(platform, cls):
  """nnx's `promote_dtype` runs first and `dtype` casts x before the norm,
  as in Flax: the same dtype and, but for a rare last-bit rounding of the
  statistics, the same float16 values (normalizing before the cast changes
  about 30% of them by one bit)."""
  if "promote_dtype" not in getattr(nnx, cls).__init__.__code__.co_varnames:
    pytest.skip("this Flax has no promote_dtype")
  x = random(jax.random.key(2), (8, 96), jnp.float32, scale=2.0, offset=0.3)
  to_f16 = lambda args, dtype=None, **_: tuple(None if a is None else a.astype(jnp.float16)
                                               for a in args)
  for kw in (dict(promote_dtype=to_f16), dict(dtype=jnp.float16)):
    ours = getattr(jaxcraft.nnx, cls)(96, rngs=nnx.Rngs(0), **kw)(x)
    theirs = getattr(nnx, cls)(96, rngs=nnx.Rngs(0), **kw)(x)
    assert ours.dtype == theirs.dtype == jnp.float16, kw
    assert np.mean(f64(ours) != f64(theirs)) < 0.01, kw
    np.testing.assert_allclose(f64(ours), f64(theirs), rtol=2e-3, atol=2e-3)
