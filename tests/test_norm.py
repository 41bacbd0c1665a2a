"""Layer norm / RMS norm: parity, gradients, transforms, edge cases, bad input."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcraft
from jaxcraft.ops import norm as norm_ops
from numerics import assert_close, f64, random

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
# C = 1, primes, non-multiples of the vector width, register-path sizes, and
# sizes that take the streaming (large-row) path on the GPU.
COLS = [1, 7, 257, 1000, 4096, 65536]
KINDS = ["layer", "rms"]


def _call(kind, x, scale, bias, residual, impl, epsilon=1e-6):
  if kind == "layer":
    return jaxcraft.layer_norm(x, scale, bias, epsilon=epsilon, residual=residual,
                               implementation=impl)
  return jaxcraft.rms_norm(x, scale, epsilon=epsilon, residual=residual, implementation=impl)


def _reference64(kind, x, scale, bias, residual, epsilon=1e-6):
  """float64 NumPy, with h rounded to x.dtype as the API defines it."""
  h = x if residual is None else (x + residual.astype(x.dtype))
  h64 = f64(h)
  mean = 0.0 if kind == "rms" else h64.mean(-1, keepdims=True)
  var = np.square(h64 - mean).mean(-1, keepdims=True)
  y = (h64 - mean) / np.sqrt(var + epsilon)
  if scale is not None:
    y = y * f64(scale)
  if bias is not None and kind == "layer":
    y = y + f64(bias)
  return y, f64(h)


def _inputs(cols, dtype, lead=(3, 5), residual=False, params=True, seed=0):
  k = jax.random.split(jax.random.key(seed), 4)
  x = random(k[0], (*lead, cols), dtype, scale=2.0, offset=0.5)
  scale = random(k[1], (cols,), jnp.float32, offset=1.0) if params else None
  bias = random(k[2], (cols,), jnp.float32) if params else None
  res = random(k[3], (*lead, cols), dtype) if residual else None
  return x, scale, bias, res


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("residual", [False, True])
def test_forward_parity(platform, kind, dtype, cols, residual):
  lead = (2,) if cols >= 4096 else (3, 5)
  x, scale, bias, res = _inputs(cols, dtype, lead, residual)
  out = _call(kind, x, scale, bias, res, platform)
  lowp = _call(kind, x, scale, bias, res, "xla")
  ref, h_ref = _reference64(kind, x, scale, bias, res)
  if residual:
    (out, h), (lowp, _) = out, lowp
    np.testing.assert_array_equal(f64(h), h_ref)  # h is x + residual in x.dtype, exactly
  assert out.dtype == x.dtype and out.shape == x.shape
  assert_close(out, lowp, ref)


@pytest.mark.parametrize("kind", KINDS)
def test_no_params_and_leading_shapes(platform, kind):
  for lead in [(), (1,), (2, 3, 4)]:
    x, _, _, _ = _inputs(96, jnp.bfloat16, lead, params=False)
    out = _call(kind, x, None, None, None, platform)
    ref, _ = _reference64(kind, x, None, None, None)
    assert_close(out, _call(kind, x, None, None, None, "xla"), ref)


def test_kernel_in_hlo(platform):
  """implementation=None follows the platform's policy; a forced kernel runs."""
  x, scale, bias, _ = _inputs(64, jnp.float32)
  for implementation, kernel in ((None, norm_ops.default_implementation(platform) == "kernel"),
                                 (platform, True)):
    for norm in (jaxcraft.layer_norm, lambda x, s, b, **kw: jaxcraft.rms_norm(x, s, **kw)):
      fn = lambda x, s, b: norm(x, s, b, implementation=implementation)
      assert ("jaxcraft_norm_fwd" in jax.jit(fn).lower(x, scale, bias).as_text()) == kernel
    loss = lambda x: jaxcraft.layer_norm(x, implementation=implementation).sum()
    assert ("jaxcraft_norm_bwd" in jax.jit(jax.grad(loss)).lower(x).as_text()) == kernel


def _loss(kind, impl, residual, x, scale, bias, res):
  out = _call(kind, x, scale, bias, res, impl)
  if residual:
    y, h = out
    return jnp.sum(jnp.sin(y.astype(jnp.float32))) + jnp.sum(jnp.cos(h.astype(jnp.float32)))
  return jnp.sum(jnp.sin(out.astype(jnp.float32)))


def _reference64_grads(kind, x, scale, bias, res):
  """float64 gradients of _loss: dy = cos(y), d(h output) = -sin(h)."""
  y, h = _reference64(kind, x, scale, bias, res)
  mean = 0.0 if kind == "rms" else h.mean(-1, keepdims=True)
  rstd = 1.0 / np.sqrt(np.square(h - mean).mean(-1, keepdims=True) + 1e-6)
  xhat = (h - mean) * rstd
  dy = np.cos(y)
  g = dy * f64(scale)
  mean_g = 0.0 if kind == "rms" else g.mean(-1, keepdims=True)
  dh = rstd * (g - mean_g - xhat * (g * xhat).mean(-1, keepdims=True))
  if res is not None:
    dh = dh - np.sin(h)
  rows = tuple(range(x.ndim - 1))
  return dh, (dy * xhat).sum(rows), dy.sum(rows), dh


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [7, 1000, 65536])
@pytest.mark.parametrize("residual", [False, True])
def test_gradients(platform, kind, dtype, cols, residual):
  lead = (2,) if cols >= 4096 else (4, 3)
  x, scale, bias, res = _inputs(cols, dtype, lead, residual)
  argnums = (0, 1, 2, 3) if residual else (0, 1, 2)
  grads = jax.grad(functools.partial(_loss, kind, platform, residual), argnums)(x, scale, bias, res)
  lowp = jax.grad(functools.partial(_loss, kind, "xla", residual), argnums)(x, scale, bias, res)
  ref = _reference64_grads(kind, x, scale, bias, res)
  for name, g, l, r in zip(["x", "scale", "bias", "residual"], grads, lowp, ref):
    if kind == "rms" and name == "bias":
      continue
    assert g.dtype == l.dtype, name
    assert_close(g, l, r, name=f"d{name}")


@pytest.mark.parametrize("kind", KINDS)
def test_transforms(platform, kind):
  x, scale, bias, _ = _inputs(129, jnp.bfloat16, (4, 6))
  fn = lambda x, s: _call(kind, x, s, bias, None, platform)
  ref = lambda x, s: _call(kind, x, s, bias, None, "xla")
  tol = dict(atol=2e-2, rtol=2e-2)
  np.testing.assert_allclose(f64(jax.jit(fn)(x, scale)), f64(ref(x, scale)), **tol)
  # vmap over a non-leading axis of x; over x and scale together.
  np.testing.assert_allclose(f64(jax.vmap(fn, (1, None))(x, scale)),
                             f64(jax.vmap(ref, (1, None))(x, scale)), **tol)
  scales = jnp.stack([scale, scale * 2, scale - 1, -scale])
  np.testing.assert_allclose(f64(jax.vmap(fn)(x, scales)), f64(jax.vmap(ref)(x, scales)), **tol)
  # grad of vmap, vmap of grad (per-example parameter gradients), checkpoint.
  loss = lambda f: lambda s, x: jnp.sum(jax.vmap(f, (0, None))(x, s).astype(jnp.float32) ** 2)
  np.testing.assert_allclose(jax.grad(loss(fn))(scale, x), jax.grad(loss(ref))(scale, x), rtol=2e-2, atol=1e-1)
  per_example = lambda f: jax.vmap(jax.grad(lambda s, xi: jnp.sum(f(xi, s).astype(jnp.float32) ** 2)), (None, 0))
  np.testing.assert_allclose(per_example(fn)(scale, x), per_example(ref)(scale, x), rtol=2e-2, atol=1e-1)
  ck = jax.checkpoint(lambda x, s: jnp.sum(fn(x, s).astype(jnp.float32) ** 2))
  np.testing.assert_allclose(f64(jax.grad(ck)(x, scale)),
                             f64(jax.grad(lambda x, s: jnp.sum(ref(x, s).astype(jnp.float32) ** 2))(x, scale)),
                             rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cols", [8, 1024, 65536])
def test_zero_variance_rows(platform, kind, cols):
  x = jnp.full((3, cols), 3.25, jnp.bfloat16)
  scale = jnp.linspace(0.5, 1.5, cols)
  y = _call(kind, x, scale, None, None, platform)
  g = jax.grad(lambda x: jnp.sum(_call(kind, x, scale, None, None, platform).astype(jnp.float32)))(x)
  assert np.all(np.isfinite(f64(y))) and np.all(np.isfinite(f64(g)))
  if kind == "layer":
    np.testing.assert_array_equal(f64(y), 0.0)


@pytest.mark.parametrize("cols", [1000, 65536])
def test_large_mean_rows(platform, cols):
  # 1e4 + noise: a one-pass E[x^2] - E[x]^2 in fp32 would lose the variance.
  x = random(jax.random.key(3), (4, cols), jnp.float32, scale=1.0, offset=1e4)
  out = jaxcraft.layer_norm(x, implementation=platform)
  ref, _ = _reference64("layer", x, None, None, None)
  assert np.max(np.abs(f64(out) - ref)) < 1e-2


def test_empty_rows(platform):
  x = jnp.zeros((0, 64), jnp.float32)
  assert jaxcraft.layer_norm(x, implementation=platform).shape == (0, 64)
  g = jax.grad(lambda s: jaxcraft.rms_norm(x, s, implementation=platform).sum())(jnp.ones(64))
  np.testing.assert_array_equal(g, 0.0)


@pytest.mark.parametrize("cols", [256, 7])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_residual_sum_keeps_every_value(platform, dtype, cols):
  if platform != "cpu":
    pytest.skip("checks the CPU kernels' conversions; CUDA converts in hardware")
  # h = x + 0 in x's dtype, for every finite 16-bit pattern: on the CPU each
  # goes through the kernels' row conversions (cpu/row_convert.h) one way
  # and back, float16 subnormals included. Bit for bit as XLA's sum (which
  # gives +0 for -0, and on the CPU flushes bfloat16's subnormals, float32
  # subnormals, to zero). Rows of 256 elements go through the conversions'
  # vector loops, rows of 7 through their scalar tails (F16C's loop takes 8).
  x = np.arange(1 << 16, dtype=np.uint16).view(jnp.dtype(dtype))
  x = x[np.isfinite(x.astype(np.float32))]
  x = jnp.asarray(np.concatenate([x, np.ones(-len(x) % cols, x.dtype)]).reshape(-1, cols))
  zeros = jnp.zeros_like(x)  # an argument, so that XLA cannot fold x + 0 into x
  _, h = jaxcraft.rms_norm(x, residual=zeros, implementation=platform)
  _, expected = jax.jit(lambda x, z: norm_ops.rms_norm_reference(x, residual=z))(x, zeros)
  np.testing.assert_array_equal(np.asarray(h).view(np.uint16), np.asarray(expected).view(np.uint16))


def test_bad_input():
  x = jnp.ones((4, 8), jnp.float32)
  with pytest.raises(ValueError, match="scale must have shape"):
    jaxcraft.layer_norm(x, jnp.ones(7))
  with pytest.raises(ValueError, match="bias must have shape"):
    jaxcraft.layer_norm(x, None, jnp.ones((1, 8)))
  with pytest.raises(TypeError, match="x must be float32, bfloat16, float16 or float64"):
    jaxcraft.rms_norm(jnp.ones((4, 8), jnp.int32))
  with pytest.raises(ValueError, match="x must have at least one axis"):
    jaxcraft.layer_norm(jnp.float32(1.0))
  with pytest.raises(ValueError, match="residual must have shape"):
    jaxcraft.rms_norm(x, residual=jnp.ones((4, 9)))
  with pytest.raises(TypeError, match="scale must have a floating dtype"):
    jaxcraft.rms_norm(x, jnp.ones(8, jnp.int32))
  with pytest.raises(ValueError, match="implementation must be"):
    jaxcraft.layer_norm(x, implementation="triton")
  with pytest.raises(ValueError, match="epsilon must be >= 0"):
    jaxcraft.layer_norm(x, epsilon=-1.0)
  with pytest.raises(TypeError, match="epsilon must be a Python float"):
    jax.jit(lambda e: jaxcraft.layer_norm(x, epsilon=e))(1e-5)
  with pytest.raises(TypeError, match="x must be an array"):
    jaxcraft.layer_norm("not an array")


def test_forced_platform_mismatch():
  if "cuda" in jax.extend.backend.backends():  # only meaningful without a GPU backend
    pytest.skip("a GPU backend exists")
  x = jnp.ones((4, 8), jnp.float32)
  with pytest.raises(ValueError, match="cuda"):
    jax.block_until_ready(jaxcraft.layer_norm(x, implementation="cuda"))


def test_reference_docstring_math():
  # The reference equals its documented formula.
  x, scale, bias, _ = _inputs(33, jnp.float32)
  hf = x.astype(jnp.float32)
  mean = hf.mean(-1, keepdims=True)
  var = jnp.square(hf - mean).mean(-1, keepdims=True)
  doc = (hf - mean) * jax.lax.rsqrt(var + 1e-6) * scale + bias
  np.testing.assert_allclose(norm_ops.layer_norm_reference(x, scale, bias), doc, rtol=1e-6, atol=1e-6)
