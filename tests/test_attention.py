"""dot_product_attention: parity with a float32 reference (computed
tolerances), gradients, transforms, masks, lengths, bad input."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcraft
from numerics import assert_parity as _assert_parity, f64, random

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


def _kernel_dtypes(platform):
  # The CUDA kernel takes 16-bit inputs; float32 there uses the reference.
  return DTYPES if platform == "cpu" else [jnp.bfloat16, jnp.float16]


def _qkv(B, T, S, N, K, H, dtype, seed=0):
  k = jax.random.split(jax.random.key(seed), 3)
  return (random(k[0], (B, T, N, H), dtype), random(k[1], (B, S, K, H), dtype),
          random(k[2], (B, S, K, H), dtype))


def _attn(impl, q, k, v, **kw):
  return jaxcraft.dot_product_attention(q, k, v, implementation=impl, **kw)


def _check(platform, q, k, v, grads=True, **kw):
  # All three run jitted: op by op, each primitive compiles on its own
  # (slowest on the GPU). Jitted, the input-dtype reference (which sets the
  # tolerance) moved its error against the float32 reference by at most
  # 0.05% on the CPU (a few ulps in some gradient elements: XLA's order of
  # the reductions), not one way more than the other.
  up = lambda a: a.astype(jnp.float32)
  out = lambda impl: jax.jit(lambda q, k, v: _attn(impl, q, k, v, **kw))
  with jax.default_matmul_precision("highest"):
    ref = out("xla")(up(q), up(k), up(v))
  _assert_parity(out(platform)(q, k, v), out("xla")(q, k, v), ref)
  if not grads:
    return
  loss = lambda impl: lambda q, k, v: jnp.sum(jnp.sin(_attn(impl, q, k, v, **kw).astype(jnp.float32)))
  grad = lambda impl: jax.grad(loss(impl), (0, 1, 2))
  got = jax.jit(grad(platform))(q, k, v)
  lowp = jax.jit(grad("xla"))(q, k, v)
  with jax.default_matmul_precision("highest"):
    ref = jax.jit(grad("xla"))(up(q), up(k), up(v))
  for name, g, l, r in zip("qkv", got, lowp, ref):
    assert g.dtype == q.dtype
    _assert_parity(g, l, r, name=f"d{name}")


SHAPES = [  # B, T, S
    (1, 1, 1), (2, 7, 64), (1, 128, 129), (2, 129, 7), (1, 64, 1000)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bts", SHAPES)
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
def test_shapes_and_causal(platform, dtype, bts, causal):
  if dtype not in _kernel_dtypes(platform):
    pytest.skip("float32 runs the reference on CUDA")
  B, T, S = bts
  q, k, v = _qkv(B, T, S, 8, 2, 64, dtype)
  kw = dict(is_causal=bool(causal), causal_alignment=causal or "top_left")
  _check(platform, q, k, v, **kw)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("ts", [(250, 300), (256, 256), (450, 512), (512, 512), (512, 513)])
@pytest.mark.parametrize("mode", ["full", "top_left", "bottom_right", "lengths"])
def test_head_dim_64_query_tiles(platform, dtype, ts, mode):
  # The Hopper forward at head dim 64 runs 256-query tiles where they leave
  # fewer rows idle than its 192-query tiles (T in (192, 256] and (384,
  # 512], S <= 512; causal: a head's two tiles as one pair, the upper one's
  # warpgroups on reversed rows) and the 192-query tiles elsewhere (S 513).
  T, S = ts
  q, k, v = _qkv(2, T, S, 4, 2, 64, dtype, seed=T + S)
  kw = dict(is_causal=mode != "full",
            causal_alignment="bottom_right" if mode == "bottom_right" else "top_left")
  if mode == "lengths":
    kw.update(query_seq_lengths=jnp.array([T - 61, 5], jnp.int32),
              key_value_seq_lengths=jnp.array([S, S - 200], jnp.int32))
  _check(platform, q, k, v, grads=mode == "lengths", **kw)


@pytest.mark.parametrize("mode", ["full", "bottom_right"])
def test_head_dim_64_backward_steps(platform, mode):
  # The Hopper backward at head dim 64 takes 128 queries a step, and each
  # warpgroup computes a step's dQ in the next step (or after the last):
  # several steps per query head, three query heads per KV head, so that
  # the late dQ crosses from one head's last query tile to the next head's
  # first; bottom-right causal starts each key tile's steps past tile 0.
  q, k, v = _qkv(2, 300, 200, 6, 2, 64, jnp.bfloat16, seed=5)
  _check(platform, q, k, v, is_causal=mode == "bottom_right", causal_alignment="bottom_right")


@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (8, 1)])
def test_head_dims_and_gqa(platform, head_dim, heads):
  q, k, v = _qkv(2, 65, 97, *heads, head_dim, jnp.bfloat16, seed=head_dim)
  _check(platform, q, k, v, grads=head_dim in (64, 80, 256), is_causal=True)


@pytest.mark.parametrize("head_dim", [1, 13, 67])
def test_odd_head_dims(platform, head_dim):
  # The CPU kernel takes any head dim (its tile products end rows and
  # columns in single elements); the CUDA kernels take multiples of 8.
  q, k, v = _qkv(2, 19, 23, 4, 2, head_dim, jnp.float32, seed=head_dim)
  if platform == "cpu":
    _check(platform, q, k, v, is_causal=True)
    return
  q, k, v = (a.astype(jnp.bfloat16) for a in (q, k, v))
  with pytest.raises(ValueError, match=f"multiple of 8; got {head_dim}"):
    _attn("cuda", q, k, v)


def test_cuda_support_is_the_extensions_rule():
  # Python asks the C++ rule the handlers apply; on any platform.
  from jaxcraft.ops.attention import cuda_unsupported
  assert cuda_unsupported((2, 16, 4, 64), (2, 20, 2, 64), jnp.bfloat16) is None
  assert cuda_unsupported((2, 16, 4, 256), (2, 20, 2, 256), jnp.float16) is None
  assert "multiple of 8; got 13" in cuda_unsupported((2, 16, 4, 13), (2, 20, 2, 13), jnp.bfloat16)
  assert "<= 256" in cuda_unsupported((2, 16, 4, 264), (2, 20, 2, 264), jnp.bfloat16)
  assert "bfloat16 or float16" in cuda_unsupported((2, 16, 4, 64), (2, 20, 2, 64), jnp.float32)
  assert "65535" in cuda_unsupported((70000, 1, 4, 64), (70000, 1, 2, 64), jnp.bfloat16)
  assert "2^28" in cuda_unsupported((1, 2**28 + 1, 1, 64), (1, 8, 1, 64), jnp.bfloat16)


@pytest.mark.parametrize("window", [3, (5, 0), (0, 9), (20, 7)])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_windows(platform, window, alignment):
  q, k, v = _qkv(2, 100, 130, 4, 2, 64, jnp.bfloat16, seed=1)
  _check(platform, q, k, v, local_window_size=window, is_causal=alignment == "bottom_right",
         causal_alignment=alignment)


def test_windows_match_jax_nn(platform):
  q, k, v = _qkv(2, 70, 70, 4, 4, 32, jnp.float16, seed=2)
  for window in [(4, 2), 6]:
    out = _attn(platform, q, k, v, local_window_size=window, is_causal=True)
    ref = jax.nn.dot_product_attention(q, k, v, local_window_size=window, is_causal=True)
    np.testing.assert_allclose(f64(out), f64(ref), atol=4e-3, rtol=4e-3)


def test_lengths_and_fully_masked_rows(platform):
  q, k, v = _qkv(3, 50, 60, 4, 2, 64, jnp.bfloat16, seed=3)
  q_len = jnp.array([50, 17, 0], jnp.int32)
  kv_len = jnp.array([0, 33, 60], jnp.int32)
  kw = dict(query_seq_lengths=q_len, key_value_seq_lengths=kv_len, is_causal=True)
  out, lse = _attn(platform, q, k, v, return_residual=True, **kw)
  # Batch 0 sees no key at all, batch 1 rows >= 17 and batch 2 are padding: zeros.
  np.testing.assert_array_equal(f64(out[0]), 0.0)
  np.testing.assert_array_equal(f64(out[1, 17:]), 0.0)
  np.testing.assert_array_equal(f64(out[2]), 0.0)
  assert np.all(np.isneginf(f64(lse[0])))
  g = jax.grad(lambda q, k, v: jnp.sum(_attn(platform, q, k, v, **kw).astype(jnp.float32)),
               (0, 1, 2))(q, k, v)
  for a in g:
    assert np.all(np.isfinite(f64(a)))
  np.testing.assert_array_equal(f64(g[1][0]), 0.0)
  _check(platform, q, k, v, **kw)


def test_residual_matches_jax_nn(platform):
  q, k, v = _qkv(2, 33, 40, 4, 2, 64, jnp.float16, seed=4)
  out, lse = _attn(platform, q, k, v, is_causal=True, return_residual=True)
  ref_out, ref_lse = jax.nn.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
  assert lse.shape == ref_lse.shape and lse.dtype == ref_lse.dtype
  np.testing.assert_allclose(f64(lse), f64(ref_lse), atol=1e-2, rtol=1e-3)
  np.testing.assert_allclose(f64(out), f64(ref_out), atol=4e-3, rtol=4e-3)


def test_unbatched_and_jit(platform):
  q, k, v = _qkv(1, 20, 24, 4, 4, 32, jnp.bfloat16, seed=5)
  out = jax.jit(functools.partial(_attn, platform))(q[0], k[0], v[0])
  assert out.shape == q[0].shape
  np.testing.assert_array_equal(f64(out), f64(_attn(platform, q, k, v)[0]))


def test_transforms(platform):
  q, k, v = _qkv(2, 33, 47, 4, 2, 64, jnp.bfloat16, seed=6)
  fn = lambda q, k, v: _attn(platform, q, k, v, is_causal=True)
  ref = lambda q, k, v: _attn("xla", q, k, v, is_causal=True)
  tol = dict(atol=2e-2, rtol=2e-2)
  stack = lambda a: jnp.stack([a, a * 0.5])
  # vmap: an extra leading batch axis folds into B; over one operand only.
  np.testing.assert_allclose(f64(jax.vmap(fn)(stack(q), stack(k), stack(v))),
                             f64(jax.vmap(ref)(stack(q), stack(k), stack(v))), **tol)
  np.testing.assert_allclose(f64(jax.vmap(fn, (1, None, None), 1)(stack(q), k, v)),
                             f64(jax.vmap(ref, (1, None, None), 1)(stack(q), k, v)), **tol)
  loss = lambda f: lambda q, k, v: jnp.sum(jax.vmap(f, (0, None, None))(q, k, v).astype(jnp.float32) ** 2)
  for a, b in zip(jax.grad(loss(fn), (0, 1, 2))(stack(q), k, v), jax.grad(loss(ref), (0, 1, 2))(stack(q), k, v)):
    np.testing.assert_allclose(f64(a), f64(b), atol=0.25, rtol=5e-2)
  ck = jax.checkpoint(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) ** 2))
  for a, b in zip(jax.grad(ck, (0, 1, 2))(q, k, v),
                  jax.grad(lambda q, k, v: jnp.sum(ref(q, k, v).astype(jnp.float32) ** 2), (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(f64(a), f64(b), atol=0.25, rtol=5e-2)


def test_kernel_in_hlo_and_memory(platform):
  q, k, v = _qkv(1, 8, 8, 2, 2, 64, jnp.bfloat16)
  fn = lambda q, k, v: _attn(None, q, k, v, is_causal=True)
  assert "jaxcraft_attention_fwd" in jax.jit(fn).lower(q, k, v).as_text()
  grad = jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32)), (0, 1, 2))
  assert "jaxcraft_attention_bwd" in jax.jit(grad).lower(q, k, v).as_text()
  # fwd+bwd at S = 8192 must not hold S x S: compare temporaries to one S^2 f32 matrix.
  S = 8192
  big = jax.ShapeDtypeStruct((1, S, 2, 64), jnp.bfloat16)
  compiled = jax.jit(grad).lower(big, big, big).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  assert temp < S * S * 4 // 16, f"{temp} bytes of temporaries"


def test_deterministic_backward(platform):
  q, k, v = _qkv(2, 100, 100, 4, 2, 64, jnp.bfloat16, seed=7)
  loss = lambda q, k, v: jnp.sum(jnp.sin(_attn(platform, q, k, v, deterministic=True).astype(jnp.float32)))
  g1 = jax.grad(loss, (0, 1, 2))(q, k, v)
  g2 = jax.grad(loss, (0, 1, 2))(q, k, v)
  for a, b in zip(g1, g2):
    np.testing.assert_array_equal(f64(a), f64(b))
  _check(platform, q, k, v, deterministic=True)


def test_bad_input():
  q, k, v = _qkv(2, 8, 8, 6, 4, 32, jnp.float32)
  with pytest.raises(ValueError, match="multiple of the key/value heads"):
    jaxcraft.dot_product_attention(q, k, v)
  q, k, v = _qkv(2, 8, 8, 4, 2, 32, jnp.float32)
  with pytest.raises(ValueError, match="head dims differ"):
    jaxcraft.dot_product_attention(q[..., :16], k, v)
  with pytest.raises(ValueError, match="value must have key's shape"):
    jaxcraft.dot_product_attention(q, k, v[:, :4])
  with pytest.raises(TypeError, match="key and value must have query's dtype"):
    jaxcraft.dot_product_attention(q, k.astype(jnp.bfloat16), v)
  with pytest.raises(ValueError, match="implementation must be"):
    jaxcraft.dot_product_attention(q, k, v, implementation="flash")
  with pytest.raises(TypeError, match="query_seq_lengths must be int32"):
    jaxcraft.dot_product_attention(q, k, v, query_seq_lengths=jnp.ones(2, jnp.float32))
  with pytest.raises(ValueError, match="key_value_seq_lengths must have shape"):
    jaxcraft.dot_product_attention(q, k, v, key_value_seq_lengths=jnp.ones(3, jnp.int32))
  with pytest.raises(ValueError, match="causal_alignment"):
    jaxcraft.dot_product_attention(q, k, v, causal_alignment="middle")
  with pytest.raises(ValueError, match="local_window_size must be >= 0"):
    jaxcraft.dot_product_attention(q, k, v, local_window_size=(-2, 1))
  with pytest.raises(ValueError, match="must all be 4-D"):
    jaxcraft.dot_product_attention(q[0, 0], k[0, 0], v[0, 0])
  with pytest.raises(TypeError, match="query must be float32, bfloat16, float16 or float64"):
    jaxcraft.dot_product_attention(q.astype(jnp.int32), k.astype(jnp.int32), v.astype(jnp.int32))
  with pytest.raises(ValueError, match="precision must be None, a jax.lax.Precision"):
    jaxcraft.dot_product_attention(q, k, v, precision="sloppy")


@pytest.mark.gpu
def test_cuda_rejects_float32_clearly():
  q, k, v = _qkv(1, 8, 8, 2, 2, 32, jnp.float32)
  with pytest.raises(ValueError, match="bfloat16 or float16"):
    jaxcraft.dot_product_attention(q, k, v, implementation="cuda")
  # implementation=None takes the reference for float32 on the GPU: still correct.
  np.testing.assert_allclose(jaxcraft.dot_product_attention(q, k, v),
                             jax.nn.dot_product_attention(q, k, v), atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_calls_in_one_program_take_every_work_unit(causal):
  # Head dim 64's Hopper forward hands its work units out from a counter in
  # a scratch output that each call zeroes. Here the units outnumber the SMs
  # (2 x 12 heads x six 192-query tiles), and three chained calls in one
  # program (where XLA may give them one scratch buffer) must equal the same
  # calls made one by one, bit for bit (each unit's arithmetic does not
  # depend on which CTA takes it); the first matches the reference.
  q, k, v = _qkv(2, 1000, 1000, 12, 12, 64, jnp.bfloat16, seed=11)
  step = jax.jit(lambda q, k, v: _attn("cuda", q, k, v, is_causal=causal))
  chain = jax.jit(lambda q, k, v: step(step(step(q, k, v), k, v), k, v))
  one_by_one = step(step(step(q, k, v), k, v), k, v)
  np.testing.assert_array_equal(f64(chain(q, k, v)), f64(one_by_one))
  np.testing.assert_allclose(f64(step(q, k, v)), f64(_attn("xla", q, k, v, is_causal=causal)),
                             atol=2e-2, rtol=2e-2)
