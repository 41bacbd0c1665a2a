"""jaxcraft.nn / jaxcraft.nnx attention and transformer modules: drop-ins for
Flax's attention functions and modules (same parameters, same results
within computed tolerances), and the kernels really run inside them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

flax = pytest.importorskip("flax")
import flax.linen as linen  # noqa: E402
from flax import nnx  # noqa: E402

import jaxcraft  # noqa: E402
from jaxcraft import _ffi  # noqa: E402
from jaxcraft.ops import norm as norm_ops  # noqa: E402
from numerics import assert_close, f64, random  # noqa: E402

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


def _qkv(shape_q, shape_kv, dtype, seed=0):
  k = jax.random.split(jax.random.key(seed), 3)
  return random(k[0], shape_q, dtype), random(k[1], shape_kv, dtype), random(k[2], shape_kv, dtype)


def _up(*arrays):
  return [None if a is None else a.astype(jnp.float32) for a in arrays]


def _check_against_flax(ours, flax_fn, q, k, v, **kw):
  """ours(q, k, v) vs flax_fn in the input dtype, both against flax_fn in
  float32 at the highest matmul precision."""
  with jax.default_matmul_precision("highest"):
    ref = f64(flax_fn(*_up(q, k, v), **kw))
  out = ours(q, k, v, **kw)
  assert out.dtype == q.dtype and out.shape == q.shape[:-1] + v.shape[-1:]
  assert_close(out, flax_fn(q, k, v, **kw), ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_linen_function_matches_flax(platform, dtype, batch):
  q, k, v = _qkv(batch + (17, 4, 32), batch + (23, 4, 32), dtype)
  # Flax's float 0/1 mask, broadcast over heads: a padding pattern per batch row.
  keep = (jnp.arange(23) < 19 - jnp.arange(int(np.prod(batch or (1,)))).reshape(batch + (1,)))
  mask = keep[..., None, None, :].astype(jnp.float32)
  _check_against_flax(jaxcraft.nn.dot_product_attention, linen.dot_product_attention,
                      q, k, v, mask=mask)
  _check_against_flax(jaxcraft.nn.dot_product_attention, linen.dot_product_attention, q, k, v)


def test_linen_function_causal_flag_and_bias(platform):
  q, k, v = _qkv((2, 33, 4, 64), (2, 33, 4, 64), jnp.bfloat16, seed=1)
  causal = linen.make_causal_mask(jnp.ones((2, 33)))
  with jax.default_matmul_precision("highest"):
    ref = f64(linen.dot_product_attention(*_up(q, k, v), mask=causal))
  assert_close(jaxcraft.nn.dot_product_attention(q, k, v, is_causal=True),
               linen.dot_product_attention(q, k, v, mask=causal), ref)
  bias = random(jax.random.key(5), (1, 4, 33, 33), jnp.float32)
  with jax.default_matmul_precision("highest"):
    ref = f64(linen.dot_product_attention(*_up(q, k, v), bias=bias))
  assert_close(jaxcraft.nn.dot_product_attention(q, k, v, bias=bias),
               linen.dot_product_attention(q, k, v, bias=bias), ref)


@pytest.mark.parametrize("broadcast", [True, False])
def test_linen_and_nnx_dropout_run_in_the_kernel(platform, broadcast):
  """Flax's dropout arguments: the kernel applies jaxcraft's keep-mask
  (broadcast over batch and heads when broadcast_dropout, as Flax does)."""
  q, k, v = _qkv((2, 9, 2, 16), (2, 9, 2, 16), jnp.float32)
  rng, rate = jax.random.key(3), 0.3
  kw = dict(dropout_rng=rng, dropout_rate=rate, deterministic=False, broadcast_dropout=broadcast)
  keep = jaxcraft.attention_dropout_mask(rng, rate, (2, 2, 9, 9), broadcast=broadcast)
  with jax.default_matmul_precision("highest"):
    logits = jnp.einsum("btnh,bsnh->bnts", q, k) / 4.0
    probs = jax.nn.softmax(logits, axis=-1) * keep / (1 - rate)
    expected = jnp.einsum("bnts,bsnh->btnh", probs, v)
    for fn in (jaxcraft.nn.dot_product_attention, jaxcraft.nnx.dot_product_attention):
      np.testing.assert_allclose(fn(q, k, v, **kw), expected, rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(fn(q, k, v, **dict(kw, deterministic=True)),
                                 jaxcraft.dot_product_attention(q, k, v), rtol=1e-6, atol=1e-6)
  # The custom call, in bfloat16: every platform's kernel takes it (the CUDA kernels take no
  # float32, which runs the reference there).
  qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
  text = jax.jit(lambda q: jaxcraft.nn.dot_product_attention(q, kb, vb, **kw)).lower(qb).as_text()
  assert "jaxcraft_attention_fwd" in text


def test_nnx_function_matches_flax(platform):
  q, k, v = _qkv((2, 40, 8, 32), (2, 40, 2, 32), jnp.bfloat16, seed=2)
  _check_against_flax(jaxcraft.nnx.dot_product_attention, nnx.dot_product_attention,
                      q, k, v, is_causal=True)


def _mhdpa_pair(attention_fn, **kw):
  return (linen.MultiHeadDotProductAttention(num_heads=4, attention_fn=attention_fn, **kw),
          linen.MultiHeadDotProductAttention(num_heads=4, **kw))


def test_linen_mhdpa_with_jaxcraft_attention_fn(platform):
  ours, theirs = _mhdpa_pair(jaxcraft.nn.dot_product_attention)
  x = random(jax.random.key(0), (2, 21, 64), jnp.float32)
  mask = linen.make_causal_mask(jnp.ones((2, 21)))
  params = theirs.init(jax.random.key(1), x)
  with jax.default_matmul_precision("highest"):
    ref = f64(theirs.apply(params, x, mask=mask))
  assert_close(ours.apply(params, x, mask=mask), theirs.apply(params, x, mask=mask), ref)
  loss = lambda m: lambda p: jnp.sum(jnp.sin(m.apply(p, x, mask=mask)))
  # Full float32 matmuls: the GPU's default (TF32) would compare rounding noise.
  with jax.default_matmul_precision("highest"):
    grads = [jax.tree.leaves(jax.grad(loss(m))(params)) for m in (ours, theirs)]
  for a, b in zip(*grads):
    np.testing.assert_allclose(f64(a), f64(b), rtol=1e-4, atol=1e-5)


def test_multi_head_attention_is_flax_layout(platform):
  """Same parameter tree as Flax's module; with is_causal it computes what
  Flax's module computes with a causal mask."""
  x = random(jax.random.key(0), (2, 30, 64), jnp.bfloat16)
  ours = jaxcraft.nn.MultiHeadAttention(num_heads=4, is_causal=True, dtype=jnp.bfloat16)
  theirs = linen.MultiHeadDotProductAttention(num_heads=4, dtype=jnp.bfloat16)
  params = theirs.init(jax.random.key(1), x)
  assert jax.tree.structure(ours.init(jax.random.key(1), x)) == jax.tree.structure(params)
  assert jax.tree.map(jnp.shape, ours.init(jax.random.key(1), x)) == jax.tree.map(jnp.shape, params)
  mask = linen.make_causal_mask(jnp.ones((2, 30)))
  with jax.default_matmul_precision("highest"):
    ref_model = linen.MultiHeadDotProductAttention(num_heads=4, dtype=jnp.float32)
    ref = f64(ref_model.apply(params, x.astype(jnp.float32), mask=mask))
  assert_close(ours.apply(params, x), theirs.apply(params, x, mask=mask), ref)


def test_multi_head_attention_gqa_equals_repeated_heads(platform):
  """GQA with K kv-heads = full multi-head attention whose key/value
  projections repeat each kv head N/K times."""
  x = random(jax.random.key(0), (2, 12, 48), jnp.float32)
  gqa = jaxcraft.nn.MultiHeadAttention(num_heads=6, num_kv_heads=2, is_causal=True)
  full = jaxcraft.nn.MultiHeadAttention(num_heads=6, is_causal=True)
  params = gqa.init(jax.random.key(1), x)
  repeat = lambda a: jnp.repeat(a, 3, axis=-2)  # heads axis of kernel [in, K, H] / bias [K, H]
  widened = jax.tree_util.tree_map_with_path(
      lambda path, a: repeat(a) if path[1].key in ("key", "value") else a, params)
  np.testing.assert_allclose(f64(gqa.apply(params, x)), f64(full.apply(widened, x)),
                             rtol=1e-5, atol=1e-5)


def test_multi_head_attention_rope_is_relative(platform):
  """RoPE makes attention depend on position differences only: shifting all
  positions changes nothing, while RoPE itself does change the output."""
  x = random(jax.random.key(0), (2, 16, 64), jnp.float32)
  rope = jaxcraft.nn.MultiHeadAttention(num_heads=4, is_causal=True, rope_base=10_000.0)
  params = rope.init(jax.random.key(1), x)
  pos = jnp.broadcast_to(jnp.arange(16), (2, 16))
  # Full float32 projections: TF32 (the GPU default) rounds away the invariance.
  with jax.default_matmul_precision("highest"):
    base = rope.apply(params, x, positions=pos)
    shifted = rope.apply(params, x, positions=pos + 37)
  np.testing.assert_allclose(f64(shifted), f64(base), rtol=2e-4, atol=2e-4)
  plain = jaxcraft.nn.MultiHeadAttention(num_heads=4, is_causal=True).apply(params, x)
  assert np.max(np.abs(f64(plain) - f64(base))) > 1e-2


def test_nnx_multi_head_attention_matches_flax(platform):
  x = random(jax.random.key(0), (2, 19, 64), jnp.float32)
  ours = jaxcraft.nnx.MultiHeadAttention(4, 64, decode=False, rngs=nnx.Rngs(0))
  theirs = nnx.MultiHeadAttention(4, 64, decode=False, rngs=nnx.Rngs(0))
  assert jax.tree.map(jnp.shape, nnx.state(ours, nnx.Param)) == \
      jax.tree.map(jnp.shape, nnx.state(theirs, nnx.Param))
  with jax.default_matmul_precision("highest"):
    ref = f64(theirs(x, is_causal=True))
  assert_close(ours(x, is_causal=True), theirs(x, is_causal=True), ref)
  # Flax's own module with jaxcraft's attention_fn: the same numbers.
  dropin = nnx.MultiHeadAttention(4, 64, decode=False, rngs=nnx.Rngs(0),
                                  attention_fn=jaxcraft.nnx.dot_product_attention)
  np.testing.assert_array_equal(dropin(x, is_causal=True), ours(x, is_causal=True))


def _linen_to_nnx(params, module):
  """Copy a linen param tree into an nnx module with the same names."""
  state = nnx.state(module, nnx.Param)
  state.replace_by_pure_dict(params["params"])
  nnx.update(module, state)


@pytest.mark.parametrize("activation,norm", [("swiglu", "rms"), ("gelu", "layer")])
def test_transformer_block_linen_equals_nnx(platform, activation, norm):
  x = random(jax.random.key(0), (2, 24, 64), jnp.float32)
  kw = dict(num_kv_heads=2, activation=activation, norm=norm, rope_base=500.0)
  block = jaxcraft.nn.TransformerBlock(num_heads=4, mlp_hidden=96, **kw)
  params = block.init(jax.random.key(1), x)
  nnx_block = jaxcraft.nnx.TransformerBlock(64, 4, 96, **kw, rngs=nnx.Rngs(0))
  _linen_to_nnx(params, nnx_block)
  np.testing.assert_allclose(f64(nnx_block(x)), f64(block.apply(params, x)), rtol=1e-5, atol=1e-5)
  grads = jax.grad(lambda p: jnp.sum(block.apply(p, x) ** 2))(params)
  assert all(np.all(np.isfinite(f64(g))) for g in jax.tree.leaves(grads))


def test_transformer_block_is_causal(platform):
  """Changing a later token must not change earlier outputs."""
  block = jaxcraft.nn.TransformerBlock(num_heads=2, mlp_hidden=64)
  x = random(jax.random.key(0), (1, 10, 32), jnp.float32)
  params = block.init(jax.random.key(1), x)
  y = block.apply(params, x)
  y2 = block.apply(params, x.at[:, 6:].add(1.0))
  np.testing.assert_array_equal(f64(y[:, :6]), f64(y2[:, :6]))
  assert np.max(np.abs(f64(y[:, 6:]) - f64(y2[:, 6:]))) > 1e-3


def test_kernels_run_inside_the_block(platform):
  block = jaxcraft.nn.TransformerBlock(num_heads=4, mlp_hidden=64, dtype=jnp.bfloat16)
  x = random(jax.random.key(0), (2, 16, 64), jnp.bfloat16)
  params = block.init(jax.random.key(1), x)
  hlo = jax.jit(jax.grad(lambda p: jnp.sum(block.apply(p, x).astype(jnp.float32)))).lower(
      params).as_text()
  targets = ["jaxcraft_attention_fwd", "jaxcraft_attention_bwd"]
  if norm_ops.default_implementation(platform) == "kernel":  # XLA's norm on CUDA (its policy)
    targets += ["jaxcraft_norm_fwd", "jaxcraft_norm_bwd"]
  if platform == "cuda":  # SwiGLU's backward kernel (implementation=None runs XLA's on CPU)
    targets.append("jaxcraft_activation_bwd")
  for target in targets:
    assert f'"{target}"' in hlo or f"@{target}" in hlo, target


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_precision_maps_onto_the_kernel(platform, dtype):
  """Flax's modules given `precision=` run jaxcraft's attention (the kernel,
  where the platform's kernel takes the dtype, else its reference), matching
  Flax at that precision; a precision jaxcraft cannot honour (two different
  ones) runs Flax's own implementation, bit for bit."""
  hi = jax.lax.Precision.HIGHEST
  x = random(jax.random.key(0), (2, 19, 64), dtype)
  mask = linen.make_causal_mask(jnp.ones((2, 19)))
  kernel_runs = platform == "cpu" or dtype != jnp.float32  # CUDA's float32: the reference
  calls_kernel = lambda fn, *a: f"@{_ffi.ATTENTION_FWD}(" in jax.jit(fn).lower(*a).as_text()
  with jax.default_matmul_precision("highest"):
    linen_ref = linen.MultiHeadDotProductAttention(num_heads=4, dtype=jnp.float32)
  for precision, honoured in [(hi, True), ((hi, jax.lax.Precision.DEFAULT), False)]:
    kernel = honoured and kernel_runs
    kw = dict(num_heads=4, dtype=dtype, precision=precision)
    ours = linen.MultiHeadDotProductAttention(attention_fn=jaxcraft.nn.dot_product_attention, **kw)
    theirs = linen.MultiHeadDotProductAttention(**kw)
    params = theirs.init(jax.random.key(1), x)
    assert calls_kernel(lambda p: ours.apply(p, x, mask=mask), params) == kernel, precision
    with jax.default_matmul_precision("highest"):
      ref = f64(linen_ref.apply(params, x.astype(jnp.float32), mask=mask))
    if honoured:  # jaxcraft computes it: the kernel, or its reference
      assert_close(ours.apply(params, x, mask=mask), theirs.apply(params, x, mask=mask), ref)
    else:
      np.testing.assert_array_equal(ours.apply(params, x, mask=mask),
                                    theirs.apply(params, x, mask=mask))
    kw = dict(decode=False, dtype=dtype, precision=precision)
    ours = nnx.MultiHeadAttention(4, 64, attention_fn=jaxcraft.nnx.dot_product_attention,
                                  rngs=nnx.Rngs(0), **kw)
    theirs = nnx.MultiHeadAttention(4, 64, rngs=nnx.Rngs(0), **kw)
    assert calls_kernel(lambda x: ours(x, mask=mask), x) == kernel, precision
    if honoured:
      with jax.default_matmul_precision("highest"):
        ref = f64(nnx.MultiHeadAttention(4, 64, decode=False, rngs=nnx.Rngs(0))(
            x.astype(jnp.float32), mask=mask))
      assert_close(ours(x, mask=mask), theirs(x, mask=mask), ref)
    else:
      np.testing.assert_array_equal(ours(x, mask=mask), theirs(x, mask=mask))


def test_complex_inputs_run_flax(platform):
  """Flax's attention takes complex inputs (a complex softmax); the drop-ins
  run Flax's own implementation for them, bit for bit."""
  q, k, v = (a + 1j * b for a, b in zip(_qkv((2, 7, 2, 8), (2, 9, 2, 8), jnp.float32),
                                        _qkv((2, 7, 2, 8), (2, 9, 2, 8), jnp.float32, seed=1)))
  for ours, theirs in [(jaxcraft.nn.dot_product_attention, linen.dot_product_attention),
                       (jaxcraft.nnx.dot_product_attention, nnx.dot_product_attention)]:
    out = ours(q, k, v)
    assert out.dtype == jnp.complex64
    np.testing.assert_array_equal(out, theirs(q, k, v))
