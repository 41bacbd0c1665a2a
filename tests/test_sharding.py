"""Sharded jit and shard_map on 8 virtual CPU devices (conftest sets them)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxcraft
from numerics import random
from sharding_util import collectives


@pytest.fixture(autouse=True)
def _unsharded_on_the_mesh_platform():
  """The mesh holds CPU devices; the unsharded references run there too. On a
  GPU machine the default device is the GPU, whose float32 attention differs
  from the CPU kernel's by ~1e-3 (the sharded and unsharded runs would compare
  two platforms, not two shardings)."""
  with jax.default_device(jax.devices("cpu")[0]):
    yield


def _norm_inputs():
  k = jax.random.split(jax.random.key(0), 3)
  return (random(k[0], (8, 16, 128), jnp.float32), random(k[1], (128,), jnp.float32),
          random(k[2], (128,), jnp.float32))


@pytest.mark.parametrize("spec", [P("data"), P("data", "model")], ids=["batch", "batch+seq"])
def test_norm_row_sharding_runs_locally(mesh, spec):
  x, scale, bias = _norm_inputs()
  xs = jax.device_put(x, NamedSharding(mesh, spec))
  fwd = lambda x, s, b: jaxcraft.layer_norm(x, s, b, residual=x)
  assert collectives(fwd, xs, scale, bias) == []
  out, h = jax.jit(fwd)(xs, scale, bias)
  ref, _ = fwd(x, scale, bias)
  np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
  assert tuple(out.sharding.spec)[:len(spec)] == tuple(spec)
  # Backward: dx stays local; the parameter gradients are a sum over rows,
  # so one all-reduce of [C] values is expected and nothing else.
  loss = lambda x, s, b: jnp.sum(jnp.sin(jaxcraft.rms_norm(x, s, residual=x)[0]))
  grad = jax.grad(loss, (0, 1))
  assert collectives(grad, xs, scale, bias) == ["all-reduce"]
  for a, b in zip(jax.jit(grad)(xs, scale, bias), grad(x, scale, bias)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_norm_feature_sharding_is_correct(mesh):
  x, scale, bias = _norm_inputs()
  xs = jax.device_put(x, NamedSharding(mesh, P("data", None, "model")))
  np.testing.assert_allclose(jax.jit(jaxcraft.layer_norm)(xs, scale, bias),
                             jaxcraft.layer_norm(x, scale, bias), rtol=1e-6, atol=1e-6)


def test_norm_in_shard_map(mesh):
  x, scale, bias = _norm_inputs()
  x = jax.device_put(x, NamedSharding(mesh, P("data", "model")))
  scale = jax.device_put(scale, NamedSharding(mesh, P()))
  fn = jax.shard_map(lambda x, s: jaxcraft.rms_norm(x, s), mesh=mesh,
                     in_specs=(P("data", "model"), P()), out_specs=P("data", "model"))
  with jax.set_mesh(mesh):
    np.testing.assert_allclose(jax.jit(fn)(x, scale), jaxcraft.rms_norm(x, scale), rtol=1e-6, atol=1e-6)
    # The gradient of the replicated scale sums over all shards' rows.
    g = jax.jit(jax.grad(lambda s: jnp.sum(fn(x, s))))(scale)
    ref = jax.grad(lambda s: jnp.sum(jaxcraft.rms_norm(x, s, implementation="xla")))(scale)
  np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5)


def _attention_inputs():
  k = jax.random.split(jax.random.key(1), 3)
  return (random(k[0], (8, 32, 8, 32), jnp.float32), random(k[1], (8, 40, 4, 32), jnp.float32),
          random(k[2], (8, 40, 4, 32), jnp.float32))


@pytest.mark.parametrize("spec", [P("data"), P("data", None, "model"), P(None, None, "data")],
                         ids=["batch", "batch+heads", "heads"])
def test_attention_batch_and_head_sharding_run_locally(mesh, spec):
  q, k, v = _attention_inputs()
  put = lambda a: jax.device_put(a, NamedSharding(mesh, spec))
  fn = lambda q, k, v: jaxcraft.dot_product_attention(q, k, v, is_causal=True)
  assert collectives(fn, put(q), put(k), put(v)) == []
  np.testing.assert_allclose(jax.jit(fn)(put(q), put(k), put(v)), fn(q, k, v), rtol=1e-5, atol=1e-5)
  grad = jax.grad(lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v))), (0, 1, 2))
  assert collectives(grad, put(q), put(k), put(v)) == []
  for a, b in zip(jax.jit(grad)(put(q), put(k), put(v)), grad(q, k, v)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _variant_inputs():
  k = jax.random.split(jax.random.key(41), 3)
  return (random(k[0], (8, 32, 4, 32), jnp.float32), random(k[1], (8, 40, 2, 32), jnp.float32),
          random(k[2], (8, 40, 2, 32), jnp.float32))


def test_attention_variants_batch_sharded_run_locally(mesh):
  """Bias (broadcast over heads), segment ids and soft cap keep batch sharding."""
  q, k, v = _variant_inputs()
  bias = random(jax.random.key(1), (8, 1, 32, 40), jnp.float32)
  ids = jnp.repeat(jnp.arange(2, dtype=jnp.int32), 20)[None].repeat(8, 0)
  put = lambda a: jax.device_put(a, NamedSharding(mesh, P("data")))
  fn = lambda q, k, v, b, qi, ki: jnp.sum(jnp.sin(jaxcraft.dot_product_attention(
      q, k, v, b, q_segment_ids=qi, kv_segment_ids=ki, logit_soft_cap=3.0)))
  grad = jax.grad(fn, (0, 3))
  args = (q, k, v, bias, ids[:, :32], ids)
  assert collectives(grad, *map(put, args)) == []
  for a, b in zip(jax.jit(grad)(*map(put, args)), grad(*args)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)



def test_attention_sequence_sharding_is_correct(mesh):
  # Causal with T != S: the ring (tests/test_ring_attention.py) does not apply
  # and the sequence is gathered.
  q, k, v = _attention_inputs()
  put = lambda a: jax.device_put(a, NamedSharding(mesh, P(None, "data")))
  fn = lambda q, k, v: jaxcraft.dot_product_attention(q, k, v, is_causal=True)
  np.testing.assert_allclose(jax.jit(fn)(put(q), put(k), put(v)), fn(q, k, v), rtol=1e-5, atol=1e-5)


def test_attention_in_shard_map(mesh):
  q, k, v = _attention_inputs()
  spec = P("data", None, "model")
  q, k, v = (jax.device_put(a, NamedSharding(mesh, spec)) for a in (q, k, v))
  fn = jax.shard_map(lambda q, k, v: jaxcraft.dot_product_attention(q, k, v), mesh=mesh,
                     in_specs=(spec,) * 3, out_specs=spec)
  with jax.set_mesh(mesh):
    out = jax.jit(fn)(q, k, v)
    g = jax.jit(jax.grad(lambda q: jnp.sum(fn(q, k, v))))(q)
    expected = jaxcraft.dot_product_attention(q, k, v)
    ref = jax.grad(lambda q: jnp.sum(jaxcraft.dot_product_attention(q, k, v, implementation="xla")))(q)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-4)
