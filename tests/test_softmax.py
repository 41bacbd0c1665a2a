"""softmax: parity with jax.nn.softmax (axes, where masks, non-finite
entries), gradients, transforms, sharding, export, the implementation=None
policy, bad input."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxcraft
from jaxcraft import _ffi
from jaxcraft.ops import softmax as softmax_ops
from numerics import assert_close, f64, random
from sharding_util import collectives

F32 = jnp.float32
SCALE = 3.0  # logits' spread: exp over ~e^+-10


def _reference64(x, axis=-1, where=None, dy=None):
  """y, or with the cotangent dy, dx, in float64 (masked-out: 0)."""
  xf = f64(x)
  keep = np.ones(xf.shape, bool) if where is None else np.broadcast_to(np.asarray(where), xf.shape)
  m = np.max(np.where(keep, xf, -np.inf), axis=axis, keepdims=True)
  e = np.where(keep, np.exp(np.where(keep, xf, 0) - np.where(np.isfinite(m), m, 0)), 0)
  s = np.sum(e, axis=axis, keepdims=True)
  y = np.where(keep, e / np.where(s > 0, s, 1), 0)
  if dy is None:
    return y
  return y * (dy - np.sum(dy * y, axis=axis, keepdims=True))


# (dtype, shape): float32 and bfloat16 over rows of 1, primes, whole 16-byte
# vectors, 3000, 6000 and 10000 (CUDA: the 16-bit forward on two, four and
# eight warps of 8 vectors per lane, float32 10000 on four warps of 32;
# partly filled lanes), 4097, a ~50K vocabulary, a 128K one (sm_90: a row
# over a cluster of four warp-kernel CTAs forward, eight backward) and a
# 256K one (eight forward, sixteen backward), float32 32K (sm_90: two
# 512-thread CTAs of eight vectors); float16 over fewer.
SHAPES = ([(jnp.bfloat16, s) for s in [(7, 1), (3, 5, 13), (4, 256), (5, 3000), (2, 4097), (3, 6000),
                                        (3, 10000), (2, 50257), (2, 131072), (2, 262144)]]
          + [(jnp.float32, s) for s in [(5, 7), (6, 1000), (3, 4096), (2, 10000), (3, 32768), (2, 50257)]]
          + [(jnp.float16, s) for s in [(3, 97), (2, 4096)]])
IDS = [f"{d.__name__}-{'x'.join(map(str, s))}" for d, s in SHAPES]


@pytest.mark.parametrize("dtype,shape", SHAPES, ids=IDS)
def test_forward_parity(platform, dtype, shape):
  x = random(jax.random.key(0), shape, dtype, scale=SCALE)
  out = jaxcraft.softmax(x, implementation=platform)
  assert out.dtype == x.dtype and out.shape == x.shape
  assert_close(out, jaxcraft.softmax(x, implementation="xla"), _reference64(x))


# Masks: per element, a fully masked row, broadcast over the rows ([C]: the
# kernel's shared row) and over some axes only ([B, 1, C]: broadcast to x).
def _masks(shape):
  key = jax.random.key(1)
  full = jax.random.bernoulli(key, 0.6, shape).at[0].set(False)
  return {"full": full, "row": jax.random.bernoulli(key, 0.6, shape[-1:]),
          "lead1": jax.random.bernoulli(key, 0.6, (shape[0], 1, shape[-1]))}


@pytest.mark.parametrize("kind", ["full", "row", "lead1"])
# bfloat16 131072 (sm_90): the masked forward over eight 512-thread CTAs,
# two per SM, whose ring then takes two stages.
@pytest.mark.parametrize("dtype,cols", [(jnp.float32, 33), (jnp.bfloat16, 4096), (jnp.bfloat16, 131072)])
def test_where(platform, dtype, cols, kind):
  x = random(jax.random.key(2), (3, 4, cols), dtype, scale=SCALE)
  where = _masks(x.shape)[kind]
  out = jaxcraft.softmax(x, where=where, implementation=platform)
  ref = _reference64(x, where=where)
  assert_close(out, jax.nn.softmax(x, where=where), ref)
  keep = np.broadcast_to(np.asarray(where), x.shape)
  assert np.all(f64(out)[~keep] == 0)
  if kind == "full":
    np.testing.assert_array_equal(f64(out[0]), 0.0)  # nothing kept: zeros, not NaN
  dy = random(jax.random.key(3), x.shape, F32)
  loss = lambda impl: lambda x: jnp.sum(jaxcraft.softmax(x, where=where, implementation=impl).astype(F32) * dy)
  g, lowp = jax.grad(loss(platform))(x), jax.grad(loss("xla"))(x)
  assert_close(g, lowp, _reference64(x, where=where, dy=f64(dy)), name="dx")
  assert np.all(f64(g)[~keep] == 0)


def test_non_finite_entries_match_jax(platform):
  """-inf entries (additive masks) give 0; a row of only -inf, or with +inf,
  NaN as in jax.nn.softmax; a masked-out NaN is ignored."""
  inf, nan = np.inf, np.nan
  x = jnp.array([[-inf, 0.0, 1.0, -inf], [-inf, -inf, -inf, -inf], [inf, 1.0, 2.0, 3.0],
                 [nan, 1.0, 2.0, 3.0], [nan, 1.0, -inf, 3.0]], F32)
  where = jnp.array([[True] * 4] * 4 + [[False, True, True, True]])
  for w in (None, where):
    np.testing.assert_allclose(jaxcraft.softmax(x, where=w, implementation=platform),
                               jax.nn.softmax(x, where=w), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype,cols", [(F32, 8192), (F32, 16384), (F32, 131072), (jnp.bfloat16, 65536)])
def test_non_finite_wide_rows_match_jax(platform, dtype, cols):
  """Rows wider than a warp (CUDA: two to eight warps unmasked, one block
  masked, or a cluster at 128K; bfloat16 65536: unmasked, a cluster of two
  warp-kernel CTAs, the first all -inf in rows 0 and 2): warps whose values
  are all -inf or masked out inside a finite row, an all -inf row, a row
  that keeps only -inf entries, one that keeps nothing, +inf and NaN
  entries. bfloat16 against jax.nn in float32, to half a bfloat16 ulp."""
  inf, nan = np.inf, np.nan
  x = np.array(random(jax.random.key(12), (8, cols), F32, scale=SCALE).astype(dtype)).astype(np.float32)
  x[0, : cols // 2] = -inf
  x[1] = -inf
  x[2, : cols // 2] = -inf
  x[4, cols // 3] = inf
  x[5, cols // 5] = nan
  x[7, np.arange(cols) // 128 % 2 == 0] = -inf  # every other warp of a multi-warp row (32 vectors each)
  where = np.ones(x.shape, bool)
  where[2, cols // 2:] = False  # keeps only -inf entries
  where[3] = False
  where[6, : 3 * cols // 4] = False
  x, where = jnp.asarray(x), jnp.asarray(where)
  rtol = 1e-5 if dtype == F32 else 2.0 ** -8 + 2e-5  # half an ulp of bfloat16, relative, plus float32 math
  for w in (None, where):
    out = jaxcraft.softmax(x.astype(dtype), where=w, implementation=platform)
    assert out.dtype == dtype
    np.testing.assert_allclose(out.astype(F32), jax.nn.softmax(x, where=w), rtol=rtol, atol=1e-9)


@pytest.mark.parametrize("axis", [0, 1, -2, (1, 2), None])
def test_axes(platform, axis):
  x = random(jax.random.key(4), (6, 5, 9), F32, scale=SCALE)
  where = jax.random.bernoulli(jax.random.key(5), 0.7, (6, 1, 9))
  for w in (None, where):
    out = jaxcraft.softmax(x, axis, w, implementation=platform)
    np.testing.assert_allclose(out, jax.nn.softmax(x, axis, w), rtol=2e-6, atol=2e-7)
  g = jax.grad(lambda x: jnp.sum(jnp.sin(jaxcraft.softmax(x, axis, where, implementation=platform))))(x)
  np.testing.assert_allclose(g, jax.grad(lambda x: jnp.sum(jnp.sin(jax.nn.softmax(x, axis, where))))(x),
                             rtol=1e-5, atol=1e-6)


# The backward's kernels (CUDA): rows of 129..16384 16-byte vectors on the
# warp kernel, 8 vectors per lane: bfloat16 (5, 2000) on one warp, (3,
# 4096) on two, float32 (3, 5000) on eight, partly filled; on sm_90 clusters
# of eight-warp blocks: bfloat16 (3, 20000) on two, partly filled, float32
# (3, 32768) on four, bfloat16 (2, 131072) on eight, float16 (2, 100000) on
# eight, partly filled. float32 (2, 131072) on sixteen 512-thread rows-kernel
# CTAs; float16 (4, 1000) on a rows kernel's 64 threads; 4097 streamed.
GRADS = [(jnp.float32, (4, 7)), (jnp.float32, (2, 4097)), (jnp.float32, (3, 5000)), (jnp.float32, (3, 32768)),
         (jnp.float32, (2, 131072)), (jnp.bfloat16, (3, 4096)), (jnp.bfloat16, (5, 2000)),
         (jnp.bfloat16, (3, 20000)), (jnp.bfloat16, (3, 32768)), (jnp.bfloat16, (2, 131072)),
         (jnp.float16, (4, 1000)), (jnp.float16, (2, 100000))]


@pytest.mark.parametrize("dtype,shape", GRADS, ids=[f"{d.__name__}-{s[-1]}" for d, s in GRADS])
def test_gradients(platform, dtype, shape):
  x = random(jax.random.key(6), shape, dtype, scale=SCALE)
  dy = random(jax.random.key(7), shape, F32)
  loss = lambda impl: lambda x: jnp.sum(jaxcraft.softmax(x, implementation=impl).astype(F32) * dy)
  g = jax.grad(loss(platform))(x)
  assert g.dtype == x.dtype and g.shape == x.shape
  assert_close(g, jax.grad(loss("xla"))(x), _reference64(x, dy=f64(dy)), name="dx")


def test_kernel_in_hlo_and_residual(platform):
  x = random(jax.random.key(8), (4, 64), F32)
  fn = lambda x: jaxcraft.softmax(x, implementation=platform)
  assert _ffi.SOFTMAX_FWD in jax.jit(fn).lower(x).as_text()
  text = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(fn(x))))).lower(x).as_text()
  assert _ffi.SOFTMAX_BWD in text and text.count(_ffi.SOFTMAX_FWD) == 1


def test_policy_decides_implementation_none(platform, monkeypatch):
  x = random(jax.random.key(9), (4, 64), F32)
  lowered = lambda impl: jax.jit(jax.value_and_grad(
      lambda x: jnp.sum(jnp.sin(jaxcraft.softmax(x, implementation=impl))))).lower(x).as_text()
  for choice in [("kernel", "kernel"), ("xla", "kernel"), ("kernel", "xla"), ("xla", "xla")]:
    monkeypatch.setitem(softmax_ops.DEFAULT_IMPLEMENTATION, platform, choice)
    text = lowered(None)
    for target, want in zip((_ffi.SOFTMAX_FWD, _ffi.SOFTMAX_BWD), choice):
      assert (target in text) == (want == "kernel"), (choice, target)
    forced = lowered(platform)
    assert _ffi.SOFTMAX_FWD in forced and _ffi.SOFTMAX_BWD in forced
    np.testing.assert_allclose(jaxcraft.softmax(x), jax.nn.softmax(x), rtol=2e-6, atol=1e-7)


def test_policy_by_dtype(platform, monkeypatch):
  """An entry keyed by dtype decides by x's dtype, each pass on its own."""
  choices = {"float32": ("xla", "xla"), "bfloat16": ("kernel", "xla"), "float16": ("xla", "kernel")}
  monkeypatch.setitem(softmax_ops.DEFAULT_IMPLEMENTATION, platform, choices)
  for name, choice in choices.items():
    x = random(jax.random.key(10), (4, 64), jnp.dtype(name))
    text = jax.jit(jax.value_and_grad(
        lambda x: jnp.sum(jaxcraft.softmax(x).astype(F32) ** 2))).lower(x).as_text()
    for target, want in zip((_ffi.SOFTMAX_FWD, _ffi.SOFTMAX_BWD), choice):
      assert (target in text) == (want == "kernel"), (name, choice, target)


def test_policy_row_width_limits(monkeypatch):
  monkeypatch.setitem(softmax_ops.DEFAULT_IMPLEMENTATION, "cuda", ("kernel", "kernel", 524288, 262144))
  pick = softmax_ops.default_implementation
  assert [pick("cuda", "fwd", b, clusters=True) for b in (8192, 524288, 524290)] == ["kernel", "kernel", "xla"]
  assert [pick("cuda", "bwd", b, clusters=True) for b in (262144, 262146)] == ["kernel", "xla"]
  # Without thread-block clusters one block's rows are the limit.
  fwd_block, bwd_block = softmax_ops.BLOCK_ROW_BYTES
  assert [pick("cuda", "fwd", b, clusters=False) for b in (fwd_block, fwd_block + 2)] == ["kernel", "xla"]
  assert [pick("cuda", "bwd", b, clusters=False) for b in (bwd_block, bwd_block + 2)] == ["kernel", "xla"]
  assert pick("cuda", "bwd") == "kernel"  # no width given: the table's choice
  # The lowering asks with the row's bytes and this process's GPU: on sm_90+
  # 128K f32 columns fit the forward limit, 128K + 1 do not.
  lowered = lambda cols: jax.jit(jaxcraft.softmax).lower(jnp.zeros((2, cols), F32)).as_text()
  if jax.devices()[0].platform == "gpu":
    cols = (524288 if softmax_ops._local_gpu_has_clusters() else fwd_block) // 4
    assert _ffi.SOFTMAX_FWD in lowered(cols) and _ffi.SOFTMAX_FWD not in lowered(cols + 1)


def test_transforms(platform):
  x = random(jax.random.key(10), (4, 6, 40), jnp.bfloat16, scale=SCALE)
  where = jax.random.bernoulli(jax.random.key(11), 0.7, (4, 6, 40))
  fn = lambda x, w: jaxcraft.softmax(x, where=w, implementation=platform)
  # float32 math, as the kernels (jax.nn.softmax in bfloat16 is further off).
  ref = lambda x, w: jax.nn.softmax(x.astype(F32), where=w).astype(x.dtype)
  tol = dict(atol=1e-2, rtol=2e-2)
  np.testing.assert_allclose(f64(jax.jit(fn)(x, where)), f64(ref(x, where)), **tol)
  # vmap over a middle axis; over the softmax axis itself; a batched mask with
  # x unbatched; a shared [C] mask under vmap.
  np.testing.assert_allclose(f64(jax.vmap(fn, (1, 1))(x, where)), f64(jax.vmap(ref, (1, 1))(x, where)), **tol)
  np.testing.assert_allclose(f64(jax.vmap(fn, (2, 2))(x, where)), f64(jax.vmap(ref, (2, 2))(x, where)), **tol)
  np.testing.assert_allclose(f64(jax.vmap(fn, (None, 0))(x[0], where)),
                             f64(jax.vmap(ref, (None, 0))(x[0], where)), **tol)
  row = where[0, 0]
  np.testing.assert_allclose(f64(jax.vmap(fn, (0, None))(x, row)), f64(jax.vmap(ref, (0, None))(x, row)), **tol)
  masks = where[:, 0]  # [4, 40]: one shared row per example
  np.testing.assert_allclose(f64(jax.vmap(fn)(x, masks)), f64(jax.vmap(ref)(x, masks)), **tol)
  sq = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w).astype(F32) * 3))
  gv = lambda f: jax.grad(lambda x: jnp.sum(jax.vmap(sq(f), (0, None))(x, row)))(x)
  np.testing.assert_allclose(f64(gv(fn)), f64(gv(ref)), rtol=5e-2, atol=2e-2)
  gc = jax.grad(jax.checkpoint(sq(fn)))(x, where)
  np.testing.assert_allclose(f64(gc), f64(jax.grad(sq(ref))(x, where)), rtol=5e-2, atol=2e-2)


def test_empty_and_one_dimensional(platform):
  assert jaxcraft.softmax(jnp.zeros((0, 16)), implementation=platform).shape == (0, 16)
  x = random(jax.random.key(12), (37,), F32, scale=SCALE)
  np.testing.assert_allclose(jaxcraft.softmax(x, implementation=platform), jax.nn.softmax(x),
                             rtol=2e-6, atol=1e-7)


# ------------------------------------------------------------------ sharding
@pytest.fixture
def mesh(mesh):
  with jax.default_device(jax.devices("cpu")[0]):
    yield mesh


def test_sharding(mesh):
  """Row axes shard locally (fwd and bwd, with a per-row mask); a sharded
  softmax axis is gathered first, and the result is still exact."""
  x = random(jax.random.key(13), (8, 16, 64), F32, scale=SCALE)
  where = jax.random.bernoulli(jax.random.key(14), 0.7, x.shape)
  fn = lambda x, w: jaxcraft.softmax(x, where=w, implementation="cpu")
  grad = jax.grad(lambda x, w: jnp.sum(jnp.sin(fn(x, w))))
  rows = NamedSharding(mesh, P("data", "model"))
  xs, ws = jax.device_put(x, rows), jax.device_put(where, rows)
  assert collectives(fn, xs, ws) == [] and collectives(grad, xs, ws) == []
  out = jax.jit(fn)(xs, ws)
  assert tuple(out.sharding.spec)[:2] == ("data", "model")
  np.testing.assert_array_equal(out, fn(x, where))
  np.testing.assert_array_equal(jax.jit(grad)(xs, ws), grad(x, where))
  cols = NamedSharding(mesh, P(None, None, "model"))
  xc, wc = jax.device_put(x, cols), jax.device_put(where, cols)
  np.testing.assert_array_equal(jax.jit(fn)(xc, wc), fn(x, where))
  np.testing.assert_array_equal(jax.jit(grad)(xc, wc), grad(x, where))


# -------------------------------------------------------------------- export
def _step(x, where):
  def loss(x):
    return jnp.sum(jnp.sin(jaxcraft.softmax(x, where=where).astype(F32)))
  return jax.value_and_grad(loss)(x)


def test_export_round_trip(platform, monkeypatch):
  monkeypatch.setitem(softmax_ops.DEFAULT_IMPLEMENTATION, platform, ("kernel", "kernel"))
  x = random(jax.random.key(15), (4, 8, 64), jnp.bfloat16, scale=SCALE)
  where = jax.random.bernoulli(jax.random.key(16), 0.7, (64,))
  exported = jax.export.export(jax.jit(_step), platforms=(platform,),
                               disabled_checks=jaxcraft.EXPORT_DISABLED_CHECKS)(x, where)
  module = exported.mlir_module()
  for target in (_ffi.SOFTMAX_FWD, _ffi.SOFTMAX_BWD):
    assert f"@{target}(" in module, target
  restored = jax.export.deserialize(exported.serialize())
  for got, want in zip(jax.tree.leaves(restored.call(x, where)), jax.tree.leaves(jax.jit(_step)(x, where))):
    np.testing.assert_array_equal(f64(got), f64(want))


# ----------------------------------------------------------------- bad input
def test_bad_input():
  x = jnp.ones((4, 8), F32)
  with pytest.raises(TypeError, match="x must be float32, bfloat16, float16 or float64"):
    jaxcraft.softmax(jnp.ones((4, 8), jnp.int32))
  with pytest.raises(TypeError, match="x must be an array"):
    jaxcraft.softmax("logits")
  with pytest.raises(ValueError, match="x must have at least one axis"):
    jaxcraft.softmax(jnp.float32(1.0))
  with pytest.raises(ValueError, match=r"axis 2 is out of bounds for x with 2 dimensions"):
    jaxcraft.softmax(x, axis=2)
  with pytest.raises(ValueError, match=r"axis -3 is out of bounds"):
    jaxcraft.softmax(x, axis=(0, -3))
  with pytest.raises(ValueError, match="axis must not repeat"):
    jaxcraft.softmax(x, axis=(1, -1))
  with pytest.raises(TypeError, match="axis must be an int"):
    jaxcraft.softmax(x, axis=1.0)
  with pytest.raises(TypeError, match="where must be a bool array; got dtype int32"):
    jaxcraft.softmax(x, where=jnp.ones((4, 8), jnp.int32))
  with pytest.raises(ValueError, match=r"where must be broadcastable to x's shape \(4, 8\); got shape \(3, 8\)"):
    jaxcraft.softmax(x, where=jnp.ones((3, 8), bool))
  with pytest.raises(ValueError, match=r"where must be broadcastable.*\(2, 4, 8\)"):
    jaxcraft.softmax(x, where=jnp.ones((2, 4, 8), bool))
  with pytest.raises(ValueError, match="implementation must be"):
    jaxcraft.softmax(x, implementation="triton")
  # Raised while tracing, before anything is lowered.
  with pytest.raises(ValueError, match="out of bounds"):
    jax.jit(functools.partial(jaxcraft.softmax, axis=3)).lower(jax.ShapeDtypeStruct((2, 5), jnp.bfloat16))
