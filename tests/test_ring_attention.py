"""Ring attention on 2, 4 and 8 devices (8 virtual CPU devices, conftest):
parity with single-device attention (computed tolerances), gradients, causal
schedules, GQA, segment ids, the zig-zag layout, the collectives in the HLO,
and sequence-sharded dot_product_attention in a sharded jit.

Shapes stay small: each CPU kernel call runs on one thread."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxcraft
from numerics import assert_parity, f64, random

AXIS = "ring"
SPEC = P(None, AXIS)  # [B, T, ...]: the sequence split over the ring


def _mesh(platform, n):
  devices = jax.devices(platform)
  if len(devices) < n:
    pytest.skip(f"needs {n} {platform} devices")
  return jax.make_mesh((n,), (AXIS,), axis_types=(AxisType.Explicit,), devices=devices[:n])


def _qkv(B, S, N, K, H, dtype, seed=0):
  k = jax.random.split(jax.random.key(seed), 3)
  return (random(k[0], (B, S, N, H), dtype), random(k[1], (B, S, K, H), dtype),
          random(k[2], (B, S, K, H), dtype))


def _ring(mesh, segments=False, **kw):
  """ring_attention over the mesh as a function of whole (sharded) arrays."""
  if segments:
    fn = lambda q, k, v, qs, ks: jaxcraft.ring_attention(
        q, k, v, axis_name=AXIS, q_segment_ids=qs, kv_segment_ids=ks, **kw)
  else:
    fn = lambda q, k, v: jaxcraft.ring_attention(q, k, v, axis_name=AXIS, **kw)
  n_in = 5 if segments else 3
  return jax.shard_map(fn, mesh=mesh, in_specs=(SPEC,) * n_in, out_specs=SPEC)


def _put(mesh, *arrays):
  return [jax.device_put(a, NamedSharding(mesh, SPEC)) for a in arrays]


def _loss(fn):
  return lambda q, k, v, *rest: jnp.sum(jnp.sin(fn(q, k, v, *rest).astype(jnp.float32)))


def _out_and_grads(fn):
  """jit(q, k, v, *rest -> (fn(...), d loss / d(q, k, v))): one compile."""
  def run(q, k, v, *rest):
    def loss(q, k, v):
      out = fn(q, k, v, *rest)
      return jnp.sum(jnp.sin(out.astype(jnp.float32))), out
    grads, out = jax.grad(loss, (0, 1, 2), has_aux=True)(q, k, v)
    return out, grads
  return jax.jit(run)


def _check(mesh, q, k, v, extra=(), **kw):
  """The ring (kernel blocks; pure-JAX ones with segment ids) against
  dot_product_attention on the whole sequence: its error vs an fp32 reference
  <= 2x the input-dtype reference's, for the output and the gradients."""
  ring = _ring(mesh, segments=bool(extra), **kw)
  if extra:
    kw = dict(kw, q_segment_ids=extra[0], kv_segment_ids=extra[1])
  attn = _out_and_grads(lambda q, k, v: jaxcraft.dot_product_attention(
      q, k, v, implementation="xla", **kw))
  out, grads = _out_and_grads(ring)(*_put(mesh, q, k, v, *extra))
  lowp, lowp_grads = attn(q, k, v)
  with jax.default_matmul_precision("highest"):
    ref, ref_grads = attn(*(a.astype(jnp.float32) for a in (q, k, v)))
  assert_parity(out, lowp, ref)
  for name, g, l, r in zip("qkv", grads, lowp_grads, ref_grads):
    assert g.dtype == q.dtype
    assert_parity(g, l, r, name=f"d{name}")
  return out, grads


CASES = {  # devices, dtype, causal, (N, K), global length
    "2dev-f32": (2, jnp.float32, False, (4, 4), 2 * 24),
    "2dev-bf16-causal-gqa": (2, jnp.bfloat16, True, (8, 2), 2 * 16),
    "4dev-f16-causal-mqa-odd-half": (4, jnp.float16, True, (4, 1), 4 * 10),
    "4dev-f32-causal-odd-shard": (4, jnp.float32, True, (4, 2), 4 * 13),
    "8dev-bf16-causal": (8, jnp.bfloat16, True, (4, 2), 8 * 24),
    "8dev-f16-odd-shard": (8, jnp.float16, False, (8, 2), 8 * 7),
}


@pytest.mark.parametrize("case", CASES)
def test_ring_matches_attention(platform, case):
  n, dtype, causal, (N, K), S = CASES[case]
  if platform == "cuda" and dtype == jnp.float32:
    pytest.skip("float32 runs the reference on CUDA")
  q, k, v = _qkv(2, S, N, K, 32, dtype, seed=n)
  _check(_mesh(platform, n), q, k, v, is_causal=causal)


def _segments(B, S, seed):
  """Random packed-sequence ids; query ids differ from the keys' on a few
  rows, which then see no key anywhere."""
  starts = jax.random.bernoulli(jax.random.key(seed), 0.08, (B, S))
  kv_seg = jnp.cumsum(starts, axis=1).astype(jnp.int32)
  lonely = jnp.zeros((B, S), bool).at[0, 5].set(True).at[1, S - 3].set(True)
  return jnp.where(lonely, 99, kv_seg), kv_seg


@pytest.mark.parametrize("n,dtype,causal", [(4, jnp.bfloat16, True), (2, jnp.float32, False)])
def test_segment_ids(platform, n, dtype, causal):
  S = n * 12
  q, k, v = _qkv(2, S, 4, 2, 32, dtype, seed=3)
  q_seg, kv_seg = _segments(2, S, seed=n)
  out, grads = _check(_mesh(platform, n), q, k, v, extra=(q_seg, kv_seg), is_causal=causal)
  # Rows whose segment has no key anywhere: zeros and zero gradients.
  out, dq = f64(out), f64(grads[0])
  np.testing.assert_array_equal(out[0, 5], 0.0)
  np.testing.assert_array_equal(out[1, S - 3], 0.0)
  np.testing.assert_array_equal(dq[0, 5], 0.0)


def _zigzag_order(S, n):
  """Global positions in zig-zag order: device d's shard is chunks d, 2n-1-d."""
  chunks = np.arange(S).reshape(2 * n, S // (2 * n))
  return np.concatenate([np.concatenate([chunks[d], chunks[2 * n - 1 - d]]) for d in range(n)])


def test_zigzag_layout(platform):
  n, S = 4, 4 * 16
  mesh = _mesh(platform, n)
  q, k, v = _qkv(1, S, 4, 2, 32, jnp.float32, seed=5)
  order = _zigzag_order(S, n)
  ring = jax.jit(_ring(mesh, is_causal=True, layout="zigzag"))
  out = ring(*_put(mesh, q[:, order], k[:, order], v[:, order]))
  expected = jaxcraft.dot_product_attention(q, k, v, is_causal=True)
  np.testing.assert_allclose(f64(out), f64(expected)[:, order], rtol=1e-5, atol=1e-5)


def _collectives(fn, *args):
  text = jax.jit(fn).lower(*args).compile().as_text()
  return {c for c in ("all-gather", "all-to-all", "collective-permute") if c in text}, text


def test_ring_hlo_has_permutes_and_kernels(platform):
  mesh = _mesh(platform, 4)
  q, k, v = _put(mesh, *_qkv(1, 4 * 16, 4, 2, 32, jnp.bfloat16))
  ring = _ring(mesh, is_causal=True)
  found, text = _collectives(ring, q, k, v)
  assert found == {"collective-permute"} and "jaxcraft_attention_fwd" in text
  found, text = _collectives(jax.grad(_loss(ring), (0, 1, 2)), q, k, v)
  assert found == {"collective-permute"} and "jaxcraft_attention_bwd" in text


def test_transforms_and_xla_blocks():
  """vmap and the pure-JAX blocks (implementation="xla") on a 2-device ring."""
  # Exact float32 matmuls: on a GPU XLA defaults to TF32, and both sides
  # of these float32 comparisons go through XLA matmuls somewhere.
  with jax.default_matmul_precision("highest"):
    mesh = _mesh("cpu", 2)
    q, k, v = _qkv(1, 2 * 8, 4, 2, 32, jnp.float32, seed=7)
    q2 = jnp.stack([q, q * 0.5])
    spec = P(None, None, AXIS)
    fn = lambda impl: jax.shard_map(
        jax.vmap(lambda q, k, v: jaxcraft.ring_attention(q, k, v, axis_name=AXIS, is_causal=True,
                                                         implementation=impl), (0, None, None)),
        mesh=mesh, in_specs=(spec, SPEC, SPEC), out_specs=spec)
    ref = jax.vmap(lambda q: jaxcraft.dot_product_attention(q, k, v, is_causal=True))(q2)
    for impl in (None, "xla"):
      out = jax.jit(fn(impl))(jax.device_put(q2, NamedSharding(mesh, spec)), *_put(mesh, k, v))
      np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_bad_input():
  q, k, v = _qkv(1, 8, 4, 2, 32, jnp.float32)
  with pytest.raises(ValueError, match="not a bound mesh axis"):
    jaxcraft.ring_attention(q, k, v, axis_name=AXIS)
  with pytest.raises(ValueError, match="layout"):
    jaxcraft.ring_attention(q, k, v, axis_name=AXIS, layout="striped")
  with pytest.raises(ValueError, match="equal query and key/value shard lengths"):
    jaxcraft.ring_attention(q, k[:, :4], v[:, :4], axis_name=AXIS, is_causal=True)
  with pytest.raises(ValueError, match="local length must be even"):
    jaxcraft.ring_attention(q[:, :7], k[:, :7], v[:, :7], axis_name=AXIS, is_causal=True,
                            layout="zigzag")
  seg = jnp.zeros((1, 8), jnp.int32)
  with pytest.raises(ValueError, match="does not support q_segment_ids"):
    jaxcraft.ring_attention(q, k, v, axis_name=AXIS, q_segment_ids=seg, kv_segment_ids=seg,
                            implementation="cpu")
  with pytest.raises(TypeError, match="int32"):
    jaxcraft.ring_attention(q, k, v, axis_name=AXIS, q_segment_ids=seg.astype(jnp.float32),
                            kv_segment_ids=seg)


# ------------------------------- sequence-sharded dot_product_attention (jit)
@pytest.mark.parametrize("spec,causal,shape", [
    (P(None, "data"), True, (64, 64, 8, 4)), (P("model", "data"), False, (64, 64, 8, 4)),
    (P(None, "data", "model"), True, (64, 64, 8, 4)), (P(None, "data"), True, (64, 64, 4, 4)),
    (P(None, "data"), False, (64, 32, 4, 2))],
    ids=["seq-causal", "batch+seq", "seq+heads-causal", "seq-causal-mha", "seq-cross"])
def test_sequence_sharded_jit_runs_the_ring(mesh, spec, causal, shape):
  # Exact float32 matmuls: on a GPU XLA defaults to TF32, and both sides
  # of these float32 comparisons go through XLA matmuls somewhere.
  with jax.default_matmul_precision("highest"):
    T, S, N, K = shape
    q = _qkv(2, T, N, K, 32, jnp.float32, seed=11)[0]
    _, k, v = _qkv(2, S, N, K, 32, jnp.float32, seed=12)
    put = lambda a: jax.device_put(a, NamedSharding(mesh, spec))
    fn = functools.partial(jaxcraft.dot_product_attention, is_causal=causal)
    assert _collectives(fn, put(q), put(k), put(v))[0] == {"collective-permute"}
    out = jax.jit(fn)(put(q), put(k), put(v))
    np.testing.assert_allclose(out, fn(q, k, v), rtol=1e-5, atol=1e-5)
    assert tuple(out.sharding.spec)[:len(spec)] == tuple(spec)
    grad = jax.grad(_loss(fn), (0, 1, 2))
    assert _collectives(grad, put(q), put(k), put(v))[0] == {"collective-permute"}
    for a, b in zip(jax.jit(grad)(put(q), put(k), put(v)), grad(q, k, v)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
