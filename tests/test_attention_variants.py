"""dot_product_attention's variants inside the kernels: bias (with its
gradient), boolean mask, segment ids, logit soft cap and dropout, alone and
combined, forward and gradients, against the pure-JAX reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcraft
from numerics import assert_parity, f64, random
from test_attention import DTYPES, _kernel_dtypes as _dtypes, _qkv


def _attn(impl, q, k, v, bias=None, **kw):
  return jaxcraft.dot_product_attention(q, k, v, bias, implementation=impl, **kw)


def _check(platform, q, k, v, bias=None, grads=True, **kw):
  """Output and gradients (q, k, v and bias) within 2x the error of the
  input-dtype reference, against the float32 reference at highest precision."""
  up = lambda a: None if a is None else a.astype(jnp.float32)
  # All three jitted, as in test_attention.py.
  out = lambda impl: jax.jit(lambda q, k, v, b: _attn(impl, q, k, v, b, **kw))
  with jax.default_matmul_precision("highest"):
    ref = out("xla")(up(q), up(k), up(v), up(bias))
  assert_parity(out(platform)(q, k, v, bias), out("xla")(q, k, v, bias), ref)
  if not grads:
    return
  argnums = (0, 1, 2) + ((3,) if bias is not None else ())
  loss = lambda impl: lambda q, k, v, b: jnp.sum(
      jnp.sin(_attn(impl, q, k, v, b, **kw).astype(jnp.float32)))
  grad = lambda impl: jax.grad(loss(impl), argnums)
  got = jax.jit(grad(platform))(q, k, v, bias)
  lowp = jax.jit(grad("xla"))(q, k, v, bias)
  with jax.default_matmul_precision("highest"):
    ref = jax.jit(grad("xla"))(up(q), up(k), up(v), up(bias))
  for name, g, l, r in zip(["dq", "dk", "dv", "dbias"], got, lowp, ref):
    assert np.all(np.isfinite(f64(g))), name
    assert_parity(g, l, r, name=name)


def _packed_ids(B, L, docs, seed):
  """Sorted segment ids: each row packs `docs` documents of random lengths."""
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(B):
    cuts = np.sort(rng.choice(np.arange(1, L), size=docs - 1, replace=False))
    rows.append(np.searchsorted(cuts, np.arange(L), side="right"))
  return jnp.asarray(np.stack(rows), jnp.int32)


# ------------------------------------------------------------- soft cap
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 67, 130)])
@pytest.mark.parametrize("causal", [False, True])
def test_soft_cap(platform, dtype, shape, causal):
  if dtype not in _dtypes(platform):
    pytest.skip("float32 runs the reference on CUDA")
  B, T, S = shape
  q, k, v = _qkv(B, T, S, 4, 2, 64, dtype, seed=T)
  # Scores of order 10 so that the cap (5) bends them.
  _check(platform, 3 * q, k, v, logit_soft_cap=5.0, is_causal=causal)


# ----------------------------------------------------------------- bias
BIAS_SHAPES = {
    "full": (2, 4, 67, 130), "batch1": (1, 4, 67, 130), "head1": (2, 1, 67, 130),
    "both1": (1, 1, 67, 130), "3d": (4, 67, 130), "keys_only": (1, 1, 1, 130), "2d": (67, 130)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias_shape", list(BIAS_SHAPES), ids=list(BIAS_SHAPES))
def test_bias(platform, dtype, bias_shape):
  if dtype not in _dtypes(platform):
    pytest.skip("float32 runs the reference on CUDA")
  q, k, v = _qkv(2, 67, 130, 4, 2, 64, dtype, seed=3)
  bias = random(jax.random.key(7), BIAS_SHAPES[bias_shape], dtype, scale=2.0)
  _check(platform, q, k, v, bias, is_causal=True, causal_alignment="bottom_right")


def test_bias_float32_with_16bit_inputs_and_deterministic(platform):
  q, k, v = _qkv(2, 33, 70, 4, 4, 64, jnp.bfloat16, seed=5)
  bias = random(jax.random.key(8), (1, 4, 33, 70), jnp.float32, scale=3.0)
  _check(platform, q, k, v, bias)
  _check(platform, q, k, v, bias, deterministic=True)
  g = lambda: jax.grad(lambda b: jnp.sum(_attn(platform, q, k, v, b, deterministic=True)
                                         .astype(jnp.float32)))(bias)
  np.testing.assert_array_equal(f64(g()), f64(g()))


# ----------------------------------------------------------------- mask
def test_mask_broadcast_and_fully_masked_rows(platform):
  q, k, v = _qkv(2, 40, 75, 4, 2, 64, jnp.bfloat16, seed=9)
  mask = jax.random.bernoulli(jax.random.key(1), 0.6, (2, 1, 40, 75))
  mask = mask.at[:, :, 5].set(False)  # row 5 sees no key
  out = _attn(platform, q, k, v, mask=mask)
  np.testing.assert_array_equal(f64(out[:, 5]), 0.0)
  _check(platform, q, k, v, mask=mask)
  keys_only = jax.random.bernoulli(jax.random.key(2), 0.5, (75,))
  _check(platform, q, k, v, mask=keys_only, is_causal=True)


def test_mask_matches_jax_nn(platform):
  q, k, v = _qkv(2, 48, 48, 4, 4, 64, jnp.float16, seed=2)
  mask = jax.random.bernoulli(jax.random.key(3), 0.7, (2, 4, 48, 48)) | jnp.eye(48, dtype=bool)
  np.testing.assert_allclose(f64(_attn(platform, q, k, v, mask=mask)),
                             f64(jax.nn.dot_product_attention(q, k, v, mask=mask)), atol=2e-3)


# ---------------------------------------------------------- segment ids
@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_segment_ids_causal_window(platform, dtype):
  if dtype not in _dtypes(platform):
    pytest.skip("float32 runs the reference on CUDA")
  B, L = 2, 300
  q, k, v = _qkv(B, L, L, 4, 2, 64, dtype, seed=11)
  ids = _packed_ids(B, L, 5, seed=1)
  kw = dict(q_segment_ids=ids, kv_segment_ids=ids)
  _check(platform, q, k, v, **kw)
  _check(platform, q, k, v, is_causal=True, **kw)
  _check(platform, q, k, v, is_causal=True, local_window_size=(40, 0), **kw)


def test_unsorted_segment_ids_and_lengths(platform):
  q, k, v = _qkv(2, 97, 131, 8, 2, 128, jnp.bfloat16, seed=12)
  q_ids = jax.random.randint(jax.random.key(4), (2, 97), 0, 3)
  kv_ids = jax.random.randint(jax.random.key(5), (2, 131), 0, 3)
  kw = dict(q_segment_ids=q_ids, kv_segment_ids=kv_ids)
  _check(platform, q, k, v, **kw)
  lengths = jnp.array([60, 131], jnp.int32)
  _check(platform, q, k, v, key_value_seq_lengths=lengths, query_seq_lengths=jnp.array([97, 1],
                                                                                      jnp.int32), **kw)
  # A query whose id no key has sees nothing: zeros.
  out = _attn(platform, q, k, v, q_segment_ids=q_ids.at[0, 3].set(7), kv_segment_ids=kv_ids)
  np.testing.assert_array_equal(f64(out[0, 3]), 0.0)


# ------------------------------------------------------------- dropout
@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_matches_reference(platform, dtype, broadcast):
  if dtype not in _dtypes(platform):
    pytest.skip("float32 runs the reference on CUDA")
  q, k, v = _qkv(2, 45, 70, 4, 2, 64, dtype, seed=13)
  kw = dict(dropout_rate=0.3, dropout_rng=jax.random.key(42), dropout_broadcast=broadcast,
            is_causal=True)
  _check(platform, q, k, v, **kw)


def test_dropout_mask_is_reproducible_and_fair():
  shape = (2, 3, 64, 96)
  keep = jaxcraft.attention_dropout_mask(jax.random.key(0), 0.25, shape)
  assert keep.shape == shape
  np.testing.assert_array_equal(keep, jaxcraft.attention_dropout_mask(jax.random.key(0), 0.25, shape))
  assert abs(float(jnp.mean(keep)) - 0.75) < 0.01
  assert not np.array_equal(keep, jaxcraft.attention_dropout_mask(jax.random.key(1), 0.25, shape))
  shared = jaxcraft.attention_dropout_mask(jax.random.key(0), 0.25, shape, broadcast=True)
  assert shared.shape == (1, 1, 64, 96)
  np.testing.assert_array_equal(shared[0, 0], keep[0, 0])


def test_dropout_equals_masked_attention(platform):
  # Out = softmax(x) * keep / (1 - rate) @ v: spelled with the mask by hand.
  q, k, v = _qkv(1, 16, 24, 2, 2, 32, jnp.float32 if platform == "cpu" else jnp.float16, seed=1)
  rng, rate = jax.random.key(3), 0.5
  keep = jaxcraft.attention_dropout_mask(rng, rate, (1, 2, 16, 24))
  logits = jnp.einsum("btnh,bsnh->bnts", q.astype(jnp.float32), k.astype(jnp.float32)) / np.sqrt(32)
  probs = jax.nn.softmax(logits, axis=-1) * keep / (1 - rate)
  expected = jnp.einsum("bnts,bsnh->btnh", probs, v.astype(jnp.float32))
  out = _attn(platform, q, k, v, dropout_rate=rate, dropout_rng=rng)
  np.testing.assert_allclose(f64(out), f64(expected), atol=1e-2 if q.dtype == jnp.float16 else 1e-5)


# -------------------------------------------------------- combinations
def test_bias_mask_gqa(platform):
  q, k, v = _qkv(2, 50, 64, 8, 2, 64, jnp.bfloat16, seed=21)
  bias = random(jax.random.key(1), (2, 8, 50, 64), jnp.bfloat16)
  mask = jax.random.bernoulli(jax.random.key(2), 0.8, (1, 8, 50, 64))
  _check(platform, q, k, v, bias, mask=mask)


def test_everything_at_once(platform):
  B, L = 2, 200
  q, k, v = _qkv(B, L, L, 4, 2, 64, jnp.float16, seed=22)
  ids = _packed_ids(B, L, 3, seed=2)
  bias = random(jax.random.key(3), (1, 4, L, L), jnp.float16)
  mask = jax.random.bernoulli(jax.random.key(4), 0.9, (B, 1, L, L))
  _check(platform, 2 * q, k, v, bias, mask=mask, q_segment_ids=ids, kv_segment_ids=ids,
         is_causal=True, local_window_size=(64, 0), logit_soft_cap=4.0, dropout_rate=0.2,
         dropout_rng=jax.random.key(5))


# -------------------------------------------------- kernel, transforms
def test_every_variant_lowers_to_the_kernel():
  # bfloat16: the kernel dtype on every platform (float32 takes the reference on CUDA).
  q, k, v = _qkv(1, 16, 16, 2, 2, 32, jnp.bfloat16)
  ids = jnp.zeros((1, 16), jnp.int32)
  kw = dict(mask=jnp.ones((16, 16), bool), q_segment_ids=ids, kv_segment_ids=ids,
            logit_soft_cap=5.0, dropout_rate=0.1, dropout_rng=jax.random.key(0))
  fn = lambda q, b: jnp.sum(jaxcraft.dot_product_attention(q, k, v, b, **kw))
  text = jax.jit(jax.grad(fn, (0, 1))).lower(q, jnp.zeros((1, 2, 16, 16), q.dtype)).as_text()
  assert "jaxcraft_attention_fwd_v3" in text and "jaxcraft_attention_bwd_v2" in text


@pytest.mark.parametrize("bias_shape, kernel_dbias", [((1, 2, 16, 16), "bf16"),
                                                      ((1, 1, 16, 16), "f32")])
def test_dbias_dtype_of_the_kernel(bias_shape, kernel_dbias):
  # One writer per element: the kernel writes dbias in the bias's dtype (no
  # float32 round trip); a bias shared by the two heads sums in float32.
  q, k, v = _qkv(1, 16, 16, 2, 2, 32, jnp.bfloat16)
  fn = lambda b: jnp.sum(jaxcraft.dot_product_attention(q, k, v, b).astype(jnp.float32))
  text = jax.jit(jax.grad(fn)).lower(jnp.zeros(bias_shape, jnp.bfloat16)).as_text()
  line = next(l for l in text.splitlines() if "custom_call @jaxcraft_attention_bwd_v2" in l)
  dims = "x".join(map(str, bias_shape))
  assert line.rstrip().endswith(f"tensor<{dims}x{kernel_dbias}>)"), line


def test_vmap_jit_checkpoint(platform):
  q, k, v = _qkv(2, 33, 40, 4, 2, 64, jnp.bfloat16, seed=31)
  bias = random(jax.random.key(1), (1, 4, 33, 40), jnp.bfloat16)
  ids = _packed_ids(2, 40, 3, seed=3)
  kw = dict(dropout_rate=0.25, dropout_rng=jax.random.key(7), q_segment_ids=ids[:, :33],
            kv_segment_ids=ids)

  def attn(q, k, v, b, impl=platform):
    return _attn(impl, q[None], k[None], v[None], b, **{n: a[:1] if n.endswith("ids") else a
                                                         for n, a in kw.items()})[0]

  # vmap over the batch: each slice equals its own call (dropout included).
  stacked = jax.vmap(attn, (0, 0, 0, None))(q, k, v, bias)
  for i in range(2):
    np.testing.assert_allclose(f64(stacked[i]), f64(attn(q[i], k[i], v[i], bias)), atol=1e-6)
  loss = lambda q, k, v, b: jnp.sum(jnp.sin(jax.vmap(attn, (0, 0, 0, None))(q, k, v, b)
                                            .astype(jnp.float32)))
  got = jax.jit(jax.grad(jax.checkpoint(loss), (0, 3)))(q, k, v, bias)
  ref_loss = lambda q, k, v, b: jnp.sum(jnp.sin(
      jax.vmap(lambda *a: attn(*a, impl="xla"), (0, 0, 0, None))(q, k, v, b).astype(jnp.float32)))
  up = lambda a: a.astype(jnp.float32)
  lowp = jax.grad(ref_loss, (0, 3))(q, k, v, bias)
  with jax.default_matmul_precision("highest"):
    ref = jax.grad(ref_loss, (0, 3))(up(q), up(k), up(v), up(bias))
  for name, g, l, r in zip(["dq", "dbias"], got, lowp, ref):
    assert_parity(g, l, r, name=name)


# ------------------------------------------------------------ bad input
def test_bad_variant_input():
  q, k, v = _qkv(2, 8, 10, 4, 2, 32, jnp.float32)
  ids = jnp.zeros((2, 8), jnp.int32)
  with pytest.raises(ValueError, match="bias must be broadcastable"):
    jaxcraft.dot_product_attention(q, k, v, jnp.zeros((2, 3, 8, 10)))
  with pytest.raises(TypeError, match="bias must have a floating dtype"):
    jaxcraft.dot_product_attention(q, k, v, jnp.zeros((8, 10), jnp.int32))
  with pytest.raises(TypeError, match="mask must be boolean"):
    jaxcraft.dot_product_attention(q, k, v, mask=jnp.ones((8, 10)))
  with pytest.raises(ValueError, match="mask must be broadcastable"):
    jaxcraft.dot_product_attention(q, k, v, mask=jnp.ones((9, 10), bool))
  with pytest.raises(ValueError, match="given together"):
    jaxcraft.dot_product_attention(q, k, v, q_segment_ids=ids)
  with pytest.raises(TypeError, match="kv_segment_ids must be an integer array"):
    jaxcraft.dot_product_attention(q, k, v, q_segment_ids=ids, kv_segment_ids=jnp.zeros((2, 10)))
  with pytest.raises(ValueError, match="kv_segment_ids must have shape"):
    jaxcraft.dot_product_attention(q, k, v, q_segment_ids=ids, kv_segment_ids=ids)
  with pytest.raises(ValueError, match="logit_soft_cap must be > 0"):
    jaxcraft.dot_product_attention(q, k, v, logit_soft_cap=0.0)
  with pytest.raises(ValueError, match="dropout_rate must be in"):
    jaxcraft.dot_product_attention(q, k, v, dropout_rate=1.0, dropout_rng=jax.random.key(0))
  with pytest.raises(ValueError, match="dropout_rng"):
    jaxcraft.dot_product_attention(q, k, v, dropout_rate=0.1)
