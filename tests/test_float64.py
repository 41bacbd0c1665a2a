"""float64 under jax.enable_x64, as jax.nn and Flax take it: implementation=None
(and "xla") runs the pure-JAX reference in float64, matching float64 math to
~1e-12 (float32 math would miss by ~1e-7); a forced kernel raises a
ValueError that names the argument."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxcraft
from conftest import KERNEL_PLATFORMS

F64 = jnp.float64
TIGHT = dict(rtol=1e-12, atol=1e-12)


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def _normal(seed, shape):
  return jax.random.normal(jax.random.key(seed), shape, F64)


def _check(got, want):
  assert got.dtype == F64, got.dtype
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), **TIGHT)


def test_norms():
  x, r = _normal(0, (5, 33)), _normal(1, (5, 33))
  scale, bias = 1 + 0.1 * _normal(2, (33,)), _normal(3, (33,))

  def layer_norm(x, scale, bias, r):
    h = x + r
    c = h - h.mean(-1, keepdims=True)
    return c / jnp.sqrt((c * c).mean(-1, keepdims=True) + 1e-6) * scale + bias

  def rms_norm(x, scale, r):
    h = x + r
    return h / jnp.sqrt((h * h).mean(-1, keepdims=True) + 1e-6) * scale

  y, h = jaxcraft.layer_norm(x, scale, bias, residual=r)
  _check(y, layer_norm(x, scale, bias, r))
  _check(h, x + r)
  _check(jaxcraft.rms_norm(x, scale, residual=r)[0], rms_norm(x, scale, r))
  loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))
  ours = jax.grad(loss(lambda x, s, b, r: jaxcraft.layer_norm(x, s, b, residual=r)[0]),
                  argnums=(0, 1, 2, 3))(x, scale, bias, r)
  for got, want in zip(ours, jax.grad(loss(layer_norm), argnums=(0, 1, 2, 3))(x, scale, bias, r)):
    _check(got, want)


def test_softmax_and_activations():
  x, bias = _normal(4, (6, 40)), _normal(5, (40,))
  where = _normal(6, (6, 40)) > -1
  _check(jaxcraft.softmax(x, where=where), jax.nn.softmax(x, where=where))
  _check(jax.grad(lambda x: jnp.sum(jnp.sin(jaxcraft.softmax(x))))(x),
         jax.grad(lambda x: jnp.sum(jnp.sin(jax.nn.softmax(x))))(x))
  a, b = x[:, :20], x[:, 20:]
  for approximate in (True, False):
    _check(jaxcraft.gelu(x, approximate), jax.nn.gelu(x, approximate))
    _check(jaxcraft.bias_gelu(x, bias, approximate), jax.nn.gelu(x + bias, approximate))
    _check(jaxcraft.geglu(x, approximate), jax.nn.gelu(a, approximate) * b)
  _check(jaxcraft.swiglu(x), jax.nn.silu(a) * b)
  _check(jax.grad(lambda x: jnp.sum(jnp.sin(jaxcraft.swiglu(x))))(x),
         jax.grad(lambda x: jnp.sum(jnp.sin(jax.nn.silu(x[:, :20]) * x[:, 20:])))(x))


def _attention(q, k, v, lengths, causal):
  """float64 attention, spelled out: GQA, causal (top-left), key lengths.
  (jax.nn's XLA path forms float32 logits even from float64 inputs.)"""
  groups = q.shape[2] // k.shape[2]
  k, v = (jnp.repeat(a, groups, axis=2) for a in (k, v))
  logits = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
  T, S = q.shape[1], k.shape[1]
  visible = jnp.arange(S)[None, None, None, :] < lengths[:, None, None, None]
  if causal:
    visible &= jnp.arange(S)[None, :] <= jnp.arange(T)[:, None]
  probs = jax.nn.softmax(jnp.where(visible, logits, -jnp.inf), axis=-1)
  return jnp.einsum("bnts,bsnh->btnh", probs, v)


def test_attention():
  q, k, v = _normal(7, (2, 9, 4, 16)), _normal(8, (2, 11, 2, 16)), _normal(9, (2, 11, 2, 16))
  lengths = jnp.array([11, 4], jnp.int32)
  ours = lambda q, k, v: jaxcraft.dot_product_attention(q, k, v, is_causal=True,
                                                        key_value_seq_lengths=lengths)
  theirs = lambda q, k, v: _attention(q, k, v, lengths, causal=True)
  _check(ours(q, k, v), theirs(q, k, v))
  loss = lambda f: lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v)))
  for got, want in zip(jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v),
                       jax.grad(loss(theirs), argnums=(0, 1, 2))(q, k, v)):
    _check(got, want)


def test_decode_attention_and_embedding():
  q, k, v = _normal(10, (2, 1, 4, 16)), _normal(11, (2, 12, 2, 16)), _normal(12, (2, 12, 2, 16))
  lengths = jnp.array([12, 5], jnp.int32)
  # One new token at position length - 1: attention over the first `length` keys.
  _check(jaxcraft.decode_attention(q, k, v, lengths), _attention(q, k, v, lengths, causal=False))
  table, ids = _normal(13, (10, 8)), jnp.array([[3, 0], [9, 3]])
  _check(jaxcraft.embedding_lookup(table, ids), jnp.take(table, ids, axis=0))


@pytest.mark.parametrize("forced", KERNEL_PLATFORMS)
def test_forced_kernel_names_the_argument(forced):
  x = _normal(14, (4, 8))
  q = _normal(15, (1, 4, 2, 8))
  calls = {
      "x": [lambda: jaxcraft.rms_norm(x, implementation=forced),
            lambda: jaxcraft.softmax(x, implementation=forced),
            lambda: jaxcraft.swiglu(x, implementation=forced)],
      "query": [lambda: jaxcraft.dot_product_attention(q, q, q, implementation=forced),
                lambda: jaxcraft.decode_attention(q[:, :1], q, q, jnp.array([4], jnp.int32),
                                                  implementation=forced)],
      "table": [lambda: jaxcraft.embedding_lookup(x, jnp.array([1]), implementation=forced)],
  }
  for name, fns in calls.items():
    for fn in fns:
      with pytest.raises(ValueError, match=f"implementation='{forced}': {name} is float64, which"):
        fn()


def test_flax_modules_compute_in_float64():
  x = _normal(16, (3, 5, 32))
  for ours, theirs in [(jaxcraft.nnx.LayerNorm, nnx.LayerNorm), (jaxcraft.nnx.RMSNorm, nnx.RMSNorm)]:
    kw = dict(dtype=F64, param_dtype=F64, rngs=nnx.Rngs(0))
    _check(ours(32, **kw)(x), theirs(32, **kw)(x))
  q, k, v = _normal(17, (2, 7, 4, 16)), _normal(18, (2, 7, 4, 16)), _normal(19, (2, 7, 4, 16))
  mask = flax.linen.make_causal_mask(jnp.ones((2, 7)))
  for ours in (jaxcraft.nn.dot_product_attention, jaxcraft.nnx.dot_product_attention):
    _check(ours(q, k, v, mask=mask), flax.linen.dot_product_attention(q, k, v, mask=mask))
