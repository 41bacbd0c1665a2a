"""decode_attention: parity with a float32 reference (computed tolerances) on
contiguous and paged caches, semantics against dot_product_attention, lengths,
bad pages, windows, soft cap, transforms, sharding, no gradient, bad input."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxcraft
from jaxcraft.ops.decode_attention_reference import decode_attention_reference
from sharding_util import collectives, cpu_mesh

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
@pytest.fixture(autouse=True)
def _float32_matmuls():
  """float32 references at full float32 precision (GPUs default to TF32 matmuls)."""
  with jax.default_matmul_precision("highest"):
    yield


# Jitted: the reference then compiles once per shape instead of op by op.
_jitted = jax.jit(jaxcraft.decode_attention,
                  static_argnames=("scale", "logit_soft_cap", "local_window_size", "implementation"))


def _decode(impl, q, k, v, lengths, **kw):
  return _jitted(q, k, v, lengths, implementation=impl, **kw)


def _normal(rng, shape, dtype):
  """Fresh normal data, made in NumPy (no XLA compile per test shape)."""
  return jnp.asarray(rng.standard_normal(shape, np.float32).astype(dtype))


def _inputs(B, Tq, S, N, K, H, dtype, seed=0):
  rng = np.random.default_rng(seed)
  return (_normal(rng, (B, Tq, N, H), dtype), _normal(rng, (B, S, K, H), dtype),
          _normal(rng, (B, S, K, H), dtype))


def _np(a):
  return np.asarray(a).astype(np.float64)


def _lengths(B, S, seed=0):
  """Random lengths that always include 0, 1 and the full capacity."""
  rest = np.random.default_rng(seed).integers(0, S + 1, size=max(B - 3, 0))
  return jnp.asarray(np.concatenate([[0, 1, S], rest])[:B], jnp.int32)


def _reference64(q, k, v, lengths, block_tables=None, scale=None, logit_soft_cap=None,
                 local_window_size=None):
  """float64 NumPy decode attention, written from the docstring's definition."""
  q, k, v, lengths = _np(q), _np(k), _np(v), np.asarray(lengths)
  B, Tq, N, H = q.shape
  keep = None
  if block_tables is not None:
    tables = np.asarray(block_tables)
    ok = (tables >= 0) & (tables < k.shape[0])
    pages = np.where(ok, tables, 0)
    keep = np.repeat(ok, k.shape[1], axis=1)  # keys on out-of-range pages are masked
    k, v = (c[pages].reshape(B, -1, *c.shape[2:]) for c in (k, v))
  S, K = k.shape[1], k.shape[2]
  scale = 1 / np.sqrt(H) if scale is None else scale
  left = local_window_size
  left = left[0] if isinstance(left, tuple) else left
  out = np.zeros_like(q)
  for b in range(B):
    L = int(np.clip(lengths[b], 0, S))
    for t in range(Tq):
      pos = L - Tq + t
      j = np.arange(S)
      seen = (j <= pos) & (j < L) & (True if keep is None else keep[b])
      if left is not None:
        seen &= j >= pos - left
      if not seen.any():
        continue
      for n in range(N):
        kh = n // (N // K)
        logits = scale * k[b, :, kh] @ q[b, t, n]
        if logit_soft_cap is not None:
          logits = logit_soft_cap * np.tanh(logits / logit_soft_cap)
        w = np.exp(np.where(seen, logits, -np.inf) - logits[seen].max())
        out[b, t, n] = w @ v[b, :, kh] / w.sum()
  return out


def _assert_parity(out, lowp, ref, name="out"):
  """numerics.assert_parity on NumPy arrays: the kernel's error (L2) vs the
  float64 reference <= 2x the input-dtype reference's, plus fp32 slack."""
  out, lowp = _np(out), _np(lowp)
  assert np.all(np.isfinite(out)), "non-finite values"
  err, base = np.linalg.norm(out - ref), np.linalg.norm(lowp - ref)
  # The JAX reference itself must agree (a 16-bit one to ~1%): else both could be wrong.
  assert base <= 2e-2 * max(float(np.linalg.norm(ref)), 1.0), f"reference error {base:.3g}"
  slack = 1e-5 * max(float(np.linalg.norm(ref)), np.sqrt(ref.size))
  assert err <= 2 * base + slack, f"{name}: error {err:.3g} > 2 x {base:.3g} + {slack:.3g}"


def _check(platform, q, k, v, lengths, **kw):
  """The kernel's error vs a float64 reference is at most ~2x the error of the
  pure-JAX reference run in the input dtype (tests/numerics.py)."""
  out = _decode(platform, q, k, v, lengths, **kw)
  assert out.shape == q.shape and out.dtype == q.dtype
  _assert_parity(out, _decode("xla", q, k, v, lengths, **kw), _reference64(q, k, v, lengths, **kw))
  return out


def _page(k, v, page_size, seed=0, spare_pages=3):
  """A contiguous [B, S, K, H] cache (S a multiple of page_size) scattered over
  shuffled pages of a pool with a few unused (random) pages: (k_pages, v_pages, tables)."""
  B, S, K, H = k.shape
  per_seq = S // page_size
  num_pages = B * per_seq + spare_pages
  rng = np.random.default_rng(seed)
  perm = rng.permutation(num_pages)[:B * per_seq]

  def scatter(c):
    pool = rng.standard_normal((num_pages, page_size, K, H), np.float32).astype(c.dtype)
    pool[perm] = np.asarray(c).reshape(B * per_seq, page_size, K, H)
    return jnp.asarray(pool)

  return scatter(k), scatter(v), jnp.asarray(perm.reshape(B, per_seq), jnp.int32)


# ------------------------------------------------------------------ parity
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Tq, heads", [(1, (8, 2)), (3, (8, 1)), (16, (4, 4)), (16, (8, 2))],
                         ids=["t1-gqa", "t3-mqa", "t16-mha", "t16-gqa"])
def test_contiguous_parity(platform, dtype, Tq, heads):
  B, S = 5, 200
  q, k, v = _inputs(B, Tq, S, *heads, 64, dtype, seed=Tq + heads[1])
  lengths = _lengths(B, S, seed=Tq)
  out = _check(platform, q, k, v, lengths)
  # Sequence 0 (length 0) sees nothing; sequence 1 (length 1): only token Tq - 1 sees a key.
  np.testing.assert_array_equal(_np(out[0]), 0.0)
  np.testing.assert_array_equal(_np(out[1, :Tq - 1]), 0.0)


@pytest.mark.parametrize("head_dim", [16, 40, 80, 128, 256])
def test_head_dims(platform, head_dim):
  q, k, v = _inputs(3, 2, 130, 8, 2, head_dim, jnp.bfloat16, seed=head_dim)
  _check(platform, q, k, v, _lengths(3, 130))


@pytest.mark.parametrize("head_dim", [1, 13, 67])
def test_odd_head_dims(platform, head_dim):
  if platform == "cuda":
    pytest.skip("the CUDA kernel takes multiples of 8 (test_cuda_rejects_odd_head_dims_clearly)")
  q, k, v = _inputs(3, 2, 130, 8, 2, head_dim, jnp.float32, seed=head_dim)
  _check(platform, q, k, v, _lengths(3, 130))


@pytest.mark.parametrize("dtype", DTYPES)
def test_long_cache_uses_splits(platform, dtype):
  # One sequence and KV head: every split path (several splits + combine)
  # with ragged lengths; on the GPU also a multi-chunk row group (G * Tq > 16).
  q, k, v = _inputs(2, 4, 3000, 8, 1, 128, dtype, seed=1)
  _check(platform, q, k, v, jnp.array([2999, 1234], jnp.int32))


@pytest.mark.parametrize("page_size, dtype", [(8, jnp.float32), (16, jnp.bfloat16),
                                              (64, jnp.float16), (256, jnp.bfloat16),
                                              (24, jnp.float32)], ids=str)
def test_paged_parity(platform, dtype, page_size):
  B, Tq, S = 4, 3, 512 if page_size < 256 else 768
  S -= S % page_size
  q, k, v = _inputs(B, Tq, S, 8, 2, 64, dtype, seed=page_size)
  lengths = _lengths(B, S, seed=page_size)
  kp, vp, tables = _page(k, v, page_size, seed=page_size)
  out = _check(platform, q, kp, vp, lengths, block_tables=tables)
  # The same cache, contiguous: the same answer.
  dense = _decode(platform, q, k, v, lengths)
  np.testing.assert_allclose(_np(out), _np(dense), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("window, soft_cap", [(None, 2.0), (5, None), ((3, 0), 2.0), ((40, 7), None)],
                         ids=str)
def test_window_and_soft_cap(platform, window, soft_cap):
  q, k, v = _inputs(4, 5, 300, 8, 2, 64, jnp.bfloat16, seed=3)
  kw = {"local_window_size": window, "logit_soft_cap": soft_cap, "scale": 0.5}
  lengths = _lengths(4, 300, seed=3)
  _check(platform, q, k, v, lengths, **kw)
  kp, vp, tables = _page(k, v, 20, seed=3)
  _check(platform, q, kp, vp, lengths, block_tables=tables, **kw)


@pytest.mark.parametrize("scale", [-0.3, 0.0], ids=str)
def test_non_positive_scale(platform, scale):
  """A scale <= 0 cannot ride in the softmax's exponent (the kernels scale
  the logits first): the row max of the scaled logits is another key's."""
  q, k, v = _inputs(4, 2, 300, 8, 2, 64, jnp.bfloat16, seed=7)
  lengths = _lengths(4, 300, seed=7)
  _check(platform, q, k, v, lengths, scale=scale)


# --------------------------------------------------------------- semantics
@pytest.mark.parametrize("window", [None, 6])
def test_matches_bottom_right_causal_attention(platform, window):
  """Sequence b's tokens are the last Tq of its L keys: dot_product_attention
  over cache[:L] with bottom-right causal alignment."""
  B, Tq, S = 3, 4, 90
  q, k, v = _inputs(B, Tq, S, 8, 2, 32, jnp.float32, seed=4)
  lengths = jnp.array([90, 37, 4], jnp.int32)
  out = _decode(platform, q, k, v, lengths, local_window_size=window)
  for b, L in enumerate(np.asarray(lengths)):
    expected = jaxcraft.dot_product_attention(
        q[b:b + 1], k[b:b + 1, :L], v[b:b + 1, :L], is_causal=True,
        causal_alignment="bottom_right", local_window_size=window,
        key_value_seq_lengths=jnp.array([L], jnp.int32), implementation="xla")
    np.testing.assert_allclose(_np(out[b]), _np(expected[0]), atol=2e-5, rtol=2e-5)


def test_reference_matches_jax_nn_with_a_mask():
  B, Tq, S = 2, 3, 40
  q, k, v = _inputs(B, Tq, S, 4, 2, 32, jnp.float32, seed=5)
  lengths = jnp.array([40, 17], jnp.int32)
  pos = lengths[:, None] - Tq + jnp.arange(Tq)
  mask = (jnp.arange(S) <= pos[..., None]) & (jnp.arange(S) < lengths[:, None, None])
  expected = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="xla")
  np.testing.assert_allclose(decode_attention_reference(q, k, v, lengths), expected, atol=1e-5)


def test_lengths_are_clamped(platform):
  q, k, v = _inputs(3, 2, 50, 4, 2, 32, jnp.float32, seed=6)
  out = _decode(platform, q, k, v, jnp.array([50, 1000, -7], jnp.int32))
  full = _decode(platform, q, k, v, jnp.array([50, 50, 0], jnp.int32))
  np.testing.assert_array_equal(_np(out), _np(full))
  np.testing.assert_array_equal(_np(out[2]), 0.0)
  np.testing.assert_allclose(_np(out), _np(_decode("xla", q, k, v, jnp.array([50, 1000, -7], jnp.int32))),
                             atol=1e-5)
  # A paged cache's capacity is max_pages * page_size.
  kp, vp, tables = _page(k[:, :48], v[:, :48], 16)
  out = _decode(platform, q, kp, vp, jnp.array([48, 99, 0], jnp.int32), block_tables=tables)
  full = _decode(platform, q, kp, vp, jnp.array([48, 48, 0], jnp.int32), block_tables=tables)
  np.testing.assert_array_equal(_np(out), _np(full))


def test_out_of_range_pages_are_masked(platform):
  q, k, v = _inputs(2, 3, 64, 4, 2, 32, jnp.float32, seed=7)
  kp, vp, tables = _page(k, v, 16)
  lengths = jnp.array([64, 64], jnp.int32)
  num_pages = kp.shape[0]
  bad = tables.at[0, 1].set(-1).at[1, 2].set(num_pages + 5).at[1, 0].set(2**31 - 1)
  out = _decode(platform, q, kp, vp, lengths, block_tables=bad)
  assert np.all(np.isfinite(_np(out)))
  np.testing.assert_allclose(_np(out), _np(_decode("xla", q, kp, vp, lengths, block_tables=bad)),
                             atol=1e-5)
  # Equivalent: the dense cache with those keys masked out.
  keep = np.ones((2, 64), bool)
  keep[0, 16:32] = keep[1, 32:48] = keep[1, 0:16] = False
  pos = lengths[:, None] - 3 + jnp.arange(3)
  mask = (jnp.arange(64) <= pos[..., None]) & jnp.asarray(keep)[:, None]
  expected = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="xla")
  np.testing.assert_allclose(_np(out), _np(expected), atol=1e-5)


@pytest.mark.parametrize("page_size, dtype, head_dim", [(64, jnp.bfloat16, 64), (128, jnp.float16, 64),
                                                        (16, jnp.bfloat16, 128), (32, jnp.float16, 64),
                                                        (8, jnp.bfloat16, 256), (24, jnp.bfloat16, 128)],
                         ids=str)
def test_out_of_range_pages_by_size(platform, page_size, dtype, head_dim):
  """Bad table entries at 16-bit dtypes, on each of the CUDA kernel's paged
  loaders: one entry per 64-key tile (pages of 64 and more), one per loader
  pass (smaller powers of two: 8 rows a pass at head dim 128, 16 at 64, 4 at
  256) and one per row (the rest, 24 here). A bad entry masks every key it
  covers, and nothing else."""
  q, k, v = _inputs(3, 2, 4 * page_size, 8, 2, head_dim, dtype, seed=page_size)
  kp, vp, tables = _page(k, v, page_size, seed=page_size)
  bad = tables.at[0, 1].set(-1).at[1, 3].set(kp.shape[0] + 5).at[2, 0].set(2**31 - 1)
  lengths = jnp.array([4 * page_size, 3 * page_size + 5, 2 * page_size - 1], jnp.int32)
  _check(platform, q, kp, vp, lengths, block_tables=bad)


def test_large_group_rows(platform):
  # MQA with 16 query heads and 16 tokens: 256 rows share one KV head.
  q, k, v = _inputs(2, 16, 100, 16, 1, 64, jnp.bfloat16, seed=8)
  _check(platform, q, k, v, jnp.array([100, 20], jnp.int32))


# -------------------------------------------------------------- transforms
def test_jit_and_kernel_in_hlo(platform):
  q, k, v = _inputs(2, 1, 64, 4, 2, 32, jnp.bfloat16, seed=9)
  lengths = jnp.array([64, 30], jnp.int32)
  fn = jax.jit(functools.partial(_decode, None))
  assert "jaxcraft_decode_attention_fwd" in fn.lower(q, k, v, lengths).as_text()
  np.testing.assert_array_equal(_np(fn(q, k, v, lengths)), _np(_decode(platform, q, k, v, lengths)))


def test_export_round_trip(platform):
  q, k, v = _inputs(2, 2, 64, 4, 2, 32, jnp.bfloat16, seed=13)
  kp, vp, tables = _page(k, v, 16, seed=13)
  lengths = jnp.array([64, 9], jnp.int32)
  fn = jax.jit(lambda q, k, v, n, t: jaxcraft.decode_attention(q, k, v, n, block_tables=t))
  exported = jax.export.export(fn, platforms=(platform,),
                               disabled_checks=jaxcraft.EXPORT_DISABLED_CHECKS)(q, kp, vp, lengths,
                                                                                tables)
  assert "@jaxcraft_decode_attention_fwd(" in exported.mlir_module()
  with pytest.raises(ValueError, match="custom call"):
    jax.export.export(fn, platforms=(platform,))(q, kp, vp, lengths, tables)
  restored = jax.export.deserialize(exported.serialize())
  np.testing.assert_array_equal(_np(restored.call(q, kp, vp, lengths, tables)),
                                _np(fn(q, kp, vp, lengths, tables)))


def test_vmap(platform):
  B, Tq, S = 3, 2, 64
  q, k, v = _inputs(B, Tq, S, 4, 2, 32, jnp.float32, seed=10)
  kp, vp, tables = _page(k, v, 8)
  qs = jnp.stack([q, -q, 0.5 * q])
  lens = jnp.stack([_lengths(B, S, seed=s) for s in range(3)])
  tab = jnp.stack([tables, tables[::-1], jnp.roll(tables, 1, axis=1)])
  fn = functools.partial(_decode, platform)
  loop = lambda f, n: jnp.stack([f(i) for i in range(n)])
  tol = {"atol": 1e-5, "rtol": 1e-5}

  # Shared contiguous cache: vmap over queries and lengths.
  got = jax.vmap(fn, (0, None, None, 0))(qs, k, v, lens)
  np.testing.assert_allclose(got, loop(lambda i: fn(qs[i], k, v, lens[i]), 3), **tol)
  # Shared contiguous cache, one lengths vector, queries on axis 1.
  got = jax.vmap(fn, (1, None, None, None), 1)(jnp.moveaxis(qs, 0, 1), k, v, lens[0])
  np.testing.assert_allclose(jnp.moveaxis(got, 1, 0), loop(lambda i: fn(qs[i], k, v, lens[0]), 3),
                             **tol)
  # One contiguous cache per instance.
  ks, vs = jnp.stack([k, v, k]), jnp.stack([v, k, v])
  got = jax.vmap(fn)(qs, ks, vs, lens)
  np.testing.assert_allclose(got, loop(lambda i: fn(qs[i], ks[i], vs[i], lens[i]), 3), **tol)
  # Shared page pool: vmap over queries, lengths and block tables.
  paged = lambda q, k, v, n, t: fn(q, k, v, n, block_tables=t)
  got = jax.vmap(paged, (0, None, None, 0, 0))(qs, kp, vp, lens, tab)
  np.testing.assert_allclose(got, loop(lambda i: paged(qs[i], kp, vp, lens[i], tab[i]), 3), **tol)
  # One page pool per instance; a bad entry stays masked (never another pool's page).
  kps, vps = jnp.stack([kp, vp, kp]), jnp.stack([vp, kp, vp])
  tab = tab.at[0, 0, 0].set(kp.shape[0])
  got = jax.vmap(paged)(qs, kps, vps, lens, tab)
  np.testing.assert_allclose(got, loop(lambda i: paged(qs[i], kps[i], vps[i], lens[i], tab[i]), 3),
                             **tol)


def test_grad_raises():
  q, k, v = _inputs(1, 1, 16, 2, 1, 16, jnp.float32)
  lengths = jnp.array([16], jnp.int32)
  for impl in (None, "xla"):
    loss = functools.partial(lambda impl, q, k: jnp.sum(_decode(impl, q, k, v, lengths)), impl)
    with pytest.raises(TypeError, match="decode_attention is inference-only"):
      jax.grad(loss)(q, k)
    with pytest.raises(TypeError, match="decode_attention is inference-only"):
      jax.grad(loss, 1)(q, k)
  # Gradients of other inputs, with decode_attention's output held constant, are fine.
  g = jax.grad(lambda x: jnp.sum(x * _decode(None, q, k, v, lengths)))(q)
  np.testing.assert_allclose(g, _decode(None, q, k, v, lengths))
  stop = jax.lax.stop_gradient
  g = jax.grad(lambda q: jnp.sum(_decode(None, stop(q), k, v, lengths) * q))(q)
  assert g.shape == q.shape


# ---------------------------------------------------------------- sharding
@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_sharding(paged, axis_type):
  mesh = cpu_mesh(axis_type)
  B, Tq, S = 8, 2, 64
  q, k, v = _inputs(B, Tq, S, 8, 4, 32, jnp.float32, seed=11)
  lengths = _lengths(B, S, seed=11)
  kw = {}
  if paged:
    k, v, tables = _page(k, v, 16)
    kw["block_tables"] = tables
  fn = lambda q, k, v, n, **kw: jaxcraft.decode_attention(q, k, v, n, **kw)
  expected = fn(q, k, v, lengths, **kw)
  put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
  for q_spec, cache_spec in [(("data",), (None if paged else "data",)),
                             ((None, None, "model"), (None, None, "model")),
                             (("data", None, "model"), (None if paged else "data", None, "model"))]:
    # Lengths and tables follow q's batch sharding.
    args = (put(q, *q_spec), put(k, *cache_spec), put(v, *cache_spec), put(lengths, q_spec[0]))
    kws = {n: put(t, q_spec[0]) for n, t in kw.items()}
    assert collectives(functools.partial(fn, **kws), *args) == [], (q_spec, cache_spec)
    out = jax.jit(functools.partial(fn, **kws))(*args)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
  # Sequence (page row) sharding is gathered: still the right answer.
  args = (put(q, None, None, "data"), put(k, None, "model"), put(v, None, "model"), lengths)
  np.testing.assert_allclose(jax.jit(functools.partial(fn, **kw))(*args), expected, atol=1e-5,
                             rtol=1e-5)


def test_shard_map():
  mesh = cpu_mesh(AxisType.Auto)
  q, k, v = _inputs(8, 2, 64, 8, 4, 32, jnp.float32, seed=12)
  lengths = _lengths(8, 64, seed=12)
  kp, vp, tables = _page(k, v, 16, seed=12)
  rows, heads = P("data", None, "model"), P(None, None, "model")
  fn = jax.shard_map(lambda q, k, v, n, t: jaxcraft.decode_attention(q, k, v, n, block_tables=t),
                     mesh=mesh, in_specs=(rows, heads, heads, P("data"), P("data")), out_specs=rows)
  with jax.set_mesh(mesh):
    out = jax.jit(fn)(q, kp, vp, lengths, tables)
  np.testing.assert_allclose(out, _decode(None, q, k, v, lengths), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------- bad input
def test_bad_input():
  q, k, v = _inputs(2, 1, 16, 4, 2, 32, jnp.float32)
  lengths = jnp.array([16, 3], jnp.int32)
  kp, vp, tables = _page(k, v, 8)
  bad = [
      ({"query": q[0]}, ValueError, "query must be 4-D"),
      ({"key_cache": k[0]}, ValueError, "key_cache must be 4-D"),
      ({"query": q.astype(jnp.int32)}, TypeError, "query must be float32"),
      ({"key_cache": k.astype(jnp.bfloat16)}, TypeError, "must have query's dtype"),
      ({"value_cache": v[:, :8]}, ValueError, "value_cache must have key_cache's shape"),
      ({"query": q[..., :16]}, ValueError, "head dims differ"),
      ({"query": jnp.zeros((2, 1, 3, 32))}, ValueError, "multiple of the key/value heads"),
      ({"lengths": lengths.astype(jnp.int64) if jax.config.jax_enable_x64
            else lengths.astype(jnp.float32)}, TypeError, "key_value_seq_lengths must be int32"),
      ({"lengths": lengths[:1]}, ValueError, "key_value_seq_lengths must have shape"),
      ({"key_cache": k[:1], "value_cache": v[:1]}, ValueError, "pass block_tables"),
      ({"tables": tables.astype(jnp.float32)}, TypeError, "block_tables must be int32"),
      ({"tables": tables[0]}, ValueError, "block_tables must be 2-D"),
      ({"tables": tables[:1]}, ValueError, "block_tables must have shape"),
      ({"key_cache": kp[:, :0], "value_cache": vp[:, :0], "tables": tables}, ValueError,
       "at least one page"),
      ({"key_cache": kp[:0], "value_cache": vp[:0], "tables": tables}, ValueError, "at least one page"),
      ({"local_window_size": (-1, 0)}, ValueError, "local_window_size must be >= 0"),
      ({"local_window_size": "wide"}, TypeError, "local_window_size must be an int"),
      ({"logit_soft_cap": 0.0}, ValueError, "logit_soft_cap must be > 0"),
      ({"implementation": "triton"}, ValueError, "implementation must be"),
  ]
  for change, error, match in bad:
    args = {"query": q, "key_cache": k, "value_cache": v, "lengths": lengths, "tables": None}
    args.update(change)
    if "tables" in change and "key_cache" not in change:
      args.update(key_cache=kp, value_cache=vp)
    kw = {n: args.pop(n) for n in ("local_window_size", "logit_soft_cap", "implementation")
          if n in args}
    with pytest.raises(error, match=match):
      jaxcraft.decode_attention(args["query"], args["key_cache"], args["value_cache"],
                                args["lengths"], block_tables=args["tables"], **kw)


def test_cuda_support_is_the_extensions_rule():
  from jaxcraft.ops.decode_attention import _cuda_unsupported
  assert _cuda_unsupported(128, cache_rows=4096, capacity=4096) is None
  assert "multiple of 8; got 20" in _cuda_unsupported(20, cache_rows=16, capacity=16)
  assert "<= 256" in _cuda_unsupported(264, cache_rows=16, capacity=16)
  assert "32-bit" in _cuda_unsupported(128, cache_rows=2**31, capacity=16)
  assert "32-bit" in _cuda_unsupported(128, cache_rows=16, capacity=2**31)


@pytest.mark.gpu
def test_cuda_rejects_odd_head_dims_clearly():
  q, k, v = _inputs(1, 1, 16, 2, 2, 20, jnp.bfloat16)
  with pytest.raises(ValueError, match="multiple of 8"):
    _decode("cuda", q, k, v, jnp.array([16], jnp.int32))
  # implementation=None takes the reference there: still correct.
  np.testing.assert_allclose(_np(_decode(None, q, k, v, jnp.array([16], jnp.int32))),
                             _np(_decode("xla", q, k, v, jnp.array([16], jnp.int32))), atol=1e-2)
