"""NaN inputs propagate as in jax.nn (the references): a NaN in a query, or
in a key or value a row sees, reaches exactly the outputs, logsumexps and
gradients that jax.nn's computation makes NaN. A row that sees no key still
gives zeros. (A NaN in a key or value no row sees, padding past a length,
never reaches the kernels' outputs; jax.nn's dense path multiplies it by 0.)
An infinite input gives jax.nn's NaNs and infinities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcraft

DTYPES = [jnp.float32, jnp.bfloat16]


def _nan_pattern(a):
  return np.isnan(np.asarray(jnp.asarray(a, jnp.float32)))


def _same_nans(fn, dtype, platform):
  got, want = fn(platform, dtype), fn("xla", dtype)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert _nan_pattern(w).any()  # the case has NaNs to propagate
    np.testing.assert_array_equal(_nan_pattern(g), _nan_pattern(w))


def _same_infs(got, want):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    g, w = (np.asarray(jnp.asarray(a, jnp.float32)) for a in (g, w))
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    np.testing.assert_array_equal(np.isposinf(g), np.isposinf(w))
    np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w))


@pytest.mark.parametrize("dtype", DTYPES)
def test_infinities(platform, dtype):
  """+-inf in a query or key (the row's logits hold inf - inf: NaN) or in a
  value (an infinite output), and in the row ops' inputs."""
  if platform == "cuda" and dtype == jnp.float32:
    pytest.skip("float32 runs the reference on CUDA")
  k = jax.random.split(jax.random.key(3), 3)
  q, kv = jax.random.normal(k[0], (1, 6, 2, 16)), jax.random.normal(k[1], (1, 6, 2, 16))
  cases = [(q.at[0, 2, 1, 5].set(jnp.inf), kv, kv), (q.at[0, 2, 1, 5].set(-jnp.inf), kv, kv),
           (q, kv.at[0, 3, 1, 2].set(jnp.inf), kv), (q, kv, kv.at[0, 3, 1, 2].set(-jnp.inf))]
  attend = lambda impl, *args: jaxcraft.dot_product_attention(*args, implementation=impl)
  for args in cases:
    args = [a.astype(dtype) for a in args]
    _same_infs(attend(platform, *args), attend("xla", *args))
    _same_infs(_grad(attend, platform, *args), _grad(attend, "xla", *args))
  x = jax.random.normal(k[2], (4, 64)).at[1, 3].set(jnp.inf).at[2, 7].set(-jnp.inf).astype(dtype)
  for op in (jaxcraft.rms_norm, jaxcraft.layer_norm, jaxcraft.softmax, jaxcraft.gelu):
    apply = lambda impl, x: op(x, implementation=impl)
    _same_infs(apply(platform, x), apply("xla", x))
    _same_infs(_grad(apply, platform, x), _grad(apply, "xla", x))


def _grad(fn, impl, *args):
  """The gradients of sum(sin(fn)) (sin: a cotangent that varies by element)."""
  loss = lambda *a: jnp.sum(jnp.sin(fn(impl, *a).astype(jnp.float32)))
  return jax.grad(loss, argnums=tuple(range(len(args))))(*args)


def _inputs(dtype, head_dim=16):
  k = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(k[0], (2, 6, 4, head_dim)).at[0, 2, 1, 5].set(jnp.nan)  # one query row
  kv = jax.random.normal(k[1], (2, 6, 2, head_dim))
  return q.astype(dtype), kv.astype(dtype), kv.at[0, 4, 0, 2].set(jnp.nan).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 64])  # CUDA: the portable and the Hopper kernels
def test_attention(platform, dtype, head_dim):
  if platform == "cuda" and dtype == jnp.float32:
    pytest.skip("float32 runs the reference on CUDA")
  if platform == "cpu" and head_dim != 16:
    pytest.skip("the CPU kernel takes every head dim on one path")
  q, kv, kv_nan = _inputs(dtype, head_dim)
  lengths = jnp.array([6, 3], jnp.int32)
  attend = lambda impl, q, k, v, **kw: jaxcraft.dot_product_attention(
      q, k, v, implementation=impl, key_value_seq_lengths=lengths, **kw)
  ones = jnp.ones_like(q)
  # A NaN query row; a NaN key, seen by the causal rows from its position on;
  # a NaN value, seen by every row of its sequence.
  _same_nans(lambda i, d: attend(i, q, kv, kv, return_residual=True), dtype, platform)
  _same_nans(lambda i, d: attend(i, ones, kv_nan, kv, is_causal=True), dtype, platform)
  _same_nans(lambda i, d: attend(i, ones, kv, kv_nan), dtype, platform)
  grad = lambda i, d: jax.grad(lambda q, k, v: jnp.sum(attend(i, q, k, v).astype(jnp.float32)),
                               argnums=(0, 1, 2))(q, kv, kv)
  _same_nans(grad, dtype, platform)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache", [6, 3000])  # one split; several splits and their combine
def test_decode_attention(platform, dtype, cache):
  q, _, _ = _inputs(dtype)
  q = q[:, 2:3]  # the NaN row: one new token
  kv = jax.random.normal(jax.random.key(1), (2, cache, 2, 16), dtype)
  lengths = jnp.array([cache, cache // 2], jnp.int32)
  decode = lambda i, q, k: jaxcraft.decode_attention(q, k, kv, lengths, implementation=i)
  _same_nans(lambda i, d: decode(i, q, kv), dtype, platform)
  _same_nans(lambda i, d: decode(i, jnp.ones_like(q), kv.at[0, 1, 1, 3].set(jnp.nan)), dtype,
             platform)


def test_masked_rows_still_give_zeros(platform):
  q, kv, _ = _inputs(jnp.bfloat16)
  out = jaxcraft.dot_product_attention(jnp.ones_like(q), kv, kv, implementation=platform,
                                       key_value_seq_lengths=jnp.array([6, 0], jnp.int32))
  np.testing.assert_array_equal(np.asarray(out[1]), 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_ops(platform, dtype):
  """Norms, softmax and activations: a NaN element's row (or element), and
  the gradients it reaches."""
  x = jax.random.normal(jax.random.key(2), (4, 64)).at[1, 3].set(jnp.nan).astype(dtype)
  ops = {
      "rms_norm": lambda i, x: jaxcraft.rms_norm(x, implementation=i),
      "layer_norm": lambda i, x: jaxcraft.layer_norm(x, implementation=i),
      "softmax": lambda i, x: jaxcraft.softmax(x, implementation=i),
      "swiglu": lambda i, x: jaxcraft.swiglu(x, implementation=i),
      "gelu": lambda i, x: jaxcraft.gelu(x, implementation=i),
  }
  for op in ops.values():
    _same_nans(lambda i, d: op(i, x), dtype, platform)
    _same_nans(lambda i, d: jax.grad(lambda x: jnp.sum(jnp.sin(op(i, x).astype(jnp.float32))))(x),
               dtype, platform)
