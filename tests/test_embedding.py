"""Embedding lookup: parity with jnp.take (every mode), gradients (both
backward paths), transforms, sharding, id dtypes, edge cases, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxcraft
from jaxcraft import _ffi
from jaxcraft.ops import embedding as emb
from numerics import assert_close, f64, random
from sharding_util import collectives

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
MODES = [None, "clip", "wrap"]
# D = 1, primes, non-multiples of the 16-byte pack (4 f32 / 8 bf16), a wide row.
DIMS = [1, 7, 64, 257, 1000]
ROWS = 37  # prime
def _ids(key, shape, rows=ROWS, spread=1.3):
  """Ids in [-spread * rows, spread * rows): in range, negative, and out of range."""
  lim = int(spread * rows)
  return jax.random.randint(key, shape, -lim, lim, jnp.int32)


def _rows64(ids, rows, mode):
  """The row each id reads (numpy, from jnp.take's documented rules), -1: none."""
  ids = np.asarray(ids, np.int64)
  if mode == "clip":
    return np.clip(ids, 0, rows - 1)
  if mode == "wrap":
    return np.mod(ids, rows)
  r = np.where(ids < 0, ids + rows, ids)
  return np.where((r < 0) | (r >= rows), -1, r)


def _dtable64(ct, ids, rows, mode):
  """float64 scatter-add of the cotangent rows."""
  r = _rows64(ids, rows, mode).reshape(-1)
  ct = f64(ct).reshape(r.size, -1)
  out = np.zeros((rows, ct.shape[1]))
  keep = r >= 0
  np.add.at(out, r[keep], ct[keep])
  return out


def _grad(table, ids, ct, **kw):
  _, vjp = jax.vjp(lambda t: jaxcraft.embedding_lookup(t, ids, **kw), table)
  return vjp(ct)[0]


def _equal(a, b):
  np.testing.assert_array_equal(f64(a), f64(b))  # NaN == NaN here


# float16 shares bfloat16's code paths (16-bit packs): one mode is enough.
@pytest.mark.parametrize("dtype,mode", [(d, m) for d in DTYPES for m in MODES
                                        if d != jnp.float16 or m is None])
@pytest.mark.parametrize("dim", DIMS)
def test_forward_parity(platform, dtype, mode, dim):
  k = jax.random.split(jax.random.key(dim), 2)
  table = random(k[0], (ROWS, dim), dtype)
  ids = _ids(k[1], (3, 5))
  out = jaxcraft.embedding_lookup(table, ids, mode=mode, implementation=platform)
  assert out.dtype == table.dtype and out.shape == (3, 5, dim)
  _equal(out, jnp.take(table, ids, axis=0, mode=mode))  # a copy: exact


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # 1e9 in float16: inf
@pytest.mark.parametrize("fill_value", [0.0, -3.25, 1e9, np.inf])
def test_fill_value(platform, fill_value):
  for dtype in DTYPES:
    table = random(jax.random.key(1), (ROWS, 24), dtype)
    ids = jnp.array([[-ROWS - 1, -ROWS, ROWS, 3], [2 ** 31 - 1, -2 ** 31, 0, -1]], jnp.int32)
    out = jaxcraft.embedding_lookup(table, ids, fill_value=fill_value, implementation=platform)
    _equal(out, jnp.take(table, ids, axis=0, fill_value=fill_value))
    clip = jaxcraft.embedding_lookup(table, ids, mode="clip", fill_value=fill_value,
                                     implementation=platform)
    _equal(clip, jnp.take(table, ids, axis=0, mode="clip"))  # fill_value ignored


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("deterministic", [False, True])
def test_gradients(platform, dtype, mode, deterministic):
  for dim in (7, 264):
    k = jax.random.split(jax.random.key(dim + 1), 3)
    table = random(k[0], (ROWS, dim), dtype)
    ids = _ids(k[1], (6, 11))  # 66 ids into 37 rows: many repeats
    ct = random(k[2], (6, 11, dim), dtype)
    kw = dict(mode=mode, deterministic=deterministic)
    g = _grad(table, ids, ct, implementation=platform, **kw)
    lowp = _grad(table, ids, ct, implementation="xla", **kw)
    assert g.dtype == table.dtype and g.shape == table.shape
    assert_close(g, lowp, _dtable64(ct, ids, ROWS, mode), name=f"dtable D={dim}")
    untouched = np.setdiff1d(np.arange(ROWS), _rows64(ids, ROWS, mode))
    np.testing.assert_array_equal(f64(g)[untouched], 0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_skewed_ids_gradient(platform, dtype):
  # 90% of the ids from 5 rows: long runs per row (sorted path); on the CUDA
  # fast path, rows of more than 32 ids summed by atomics (float32 tables in
  # place) and the other repeated rows along their chains.
  rows, dim, n = 300, 520, 1500
  k = jax.random.split(jax.random.key(7), 4)
  hot = jax.random.randint(k[0], (n,), 0, 5) * 61
  ids = jnp.where(jax.random.uniform(k[1], (n,)) < 0.9, hot, jax.random.randint(k[2], (n,), 0, rows))
  table = random(k[3], (rows, dim), dtype)
  ct = random(k[0], (n, dim), dtype)
  ref = _dtable64(ct, ids, rows, "fill")
  lowp = _grad(table, ids, ct, implementation="xla")
  for deterministic in (False, True):
    g = _grad(table, ids, ct, implementation=platform, deterministic=deterministic)
    assert_close(g, lowp, ref, name=f"dtable deterministic={deterministic}")


def test_deterministic_is_bitwise_reproducible(platform):
  k = jax.random.split(jax.random.key(3), 3)
  rows, dim = 64, 256
  ids = jax.random.randint(k[0], (4096,), 0, 8)  # 512 adds per row: order matters in fp32
  table = random(k[1], (rows, dim), jnp.float32)
  ct = random(k[2], (4096, dim), jnp.float32, scale=1e3)
  fn = jax.jit(lambda t, c: _grad(t, ids, c, implementation=platform, deterministic=True))
  first = np.asarray(fn(table, ct))
  for _ in range(3):
    np.testing.assert_array_equal(np.asarray(fn(table, ct)), first)
  # The deterministic sum is in position order: a float32 sequential sum.
  seq = np.zeros((rows, dim), np.float32)
  for i, r in enumerate(np.asarray(ids)):
    seq[r] += np.asarray(ct[i])
  np.testing.assert_array_equal(first, seq)


def test_kernel_in_hlo(platform):
  table = random(jax.random.key(0), (ROWS, 16), jnp.float32)
  ids = _ids(jax.random.key(1), (4,))
  fn = lambda t: jaxcraft.embedding_lookup(t, ids, implementation=platform)
  assert "jaxcraft_embedding_fwd" in jax.jit(fn).lower(table).as_text()
  for det in (False, True):
    loss = lambda t: jnp.sum(jaxcraft.embedding_lookup(t, ids, mode="clip", deterministic=det,
                                                       implementation=platform))
    hlo = jax.jit(jax.grad(loss)).lower(table).as_text()
    assert "jaxcraft_embedding_bwd" in hlo
    assert ("sort" in hlo) == det  # the deterministic path sorts the ids first


def test_default_policy(platform):
  table = random(jax.random.key(0), (ROWS, 16), jnp.float32)
  ids = _ids(jax.random.key(1), (4,))
  loss = lambda t: jnp.sum(jaxcraft.embedding_lookup(t, ids))
  hlo = jax.jit(jax.value_and_grad(loss)).lower(table).as_text()
  for pass_ in emb.PASSES:
    kernel = emb.default_implementation(platform, pass_) == "kernel"
    assert (f"jaxcraft_embedding_{pass_}" in hlo) == kernel
  np.testing.assert_array_equal(jax.grad(loss)(table), jax.grad(
      lambda t: jnp.sum(jaxcraft.embedding_lookup(t, ids, implementation="xla")))(table))


def test_transforms(platform):
  k = jax.random.split(jax.random.key(5), 4)
  table = random(k[0], (ROWS, 24), jnp.bfloat16)
  ids = _ids(k[1], (3, 4, 5))
  tables = random(k[2], (4, ROWS, 24), jnp.bfloat16)
  fn = lambda t, i: jaxcraft.embedding_lookup(t, i, mode="clip", implementation=platform)
  ref = lambda t, i: jnp.take(t, i, axis=0, mode="clip")
  _equal(jax.jit(fn)(table, ids), ref(table, ids))
  # vmap over a non-leading axis of ids; over tables and ids together (fill mode too).
  _equal(jax.vmap(fn, (None, 1))(table, ids), jax.vmap(ref, (None, 1))(table, ids))
  _equal(jax.vmap(fn, (0, 1))(tables, ids), jax.vmap(ref, (0, 1))(tables, ids))
  fill = lambda t, i: jaxcraft.embedding_lookup(t, i, implementation=platform)
  _equal(jax.vmap(fill, (0, 1))(tables, ids),
         jax.vmap(lambda t, i: jnp.take(t, i, axis=0), (0, 1))(tables, ids))
  # Gradients against a reference that sums in float32 as the kernels do
  # (XLA's own bf16 scatter-add on the GPU drifts by up to 0.09 here); the
  # tolerance covers the order of the float32 sums and the final rounding.
  tol = dict(rtol=2e-2, atol=5e-2)
  ref32 = lambda t, i: jnp.take(t.astype(jnp.float32), i, axis=0, mode="clip")
  w = random(k[3], (3, 4, 5, 24), jnp.float32)
  loss = lambda f: lambda t, i: jnp.sum(f(t, i).astype(jnp.float32) * w)
  # grad of vmap, per-example gradients (vmap of grad), checkpoint.
  gv = lambda f: jax.grad(lambda t: jnp.sum(jax.vmap(f, (None, 1))(t, ids).astype(jnp.float32)
                                            * jnp.moveaxis(w, 1, 0)))
  np.testing.assert_allclose(f64(gv(fn)(table)), f64(gv(ref32)(table)), **tol)
  per_example = lambda f: jax.vmap(jax.grad(lambda t, i: jnp.sum(f(t, i).astype(jnp.float32))),
                                   (None, 1))
  np.testing.assert_allclose(f64(per_example(fn)(table, ids)), f64(per_example(ref32)(table, ids)),
                             **tol)
  ck = jax.checkpoint(loss(fn))
  np.testing.assert_allclose(f64(jax.grad(ck)(table, ids)), f64(jax.grad(loss(ref32))(table, ids)),
                             **tol)


def test_scalar_and_empty_ids(platform):
  table = random(jax.random.key(0), (ROWS, 9), jnp.float32)
  out = jaxcraft.embedding_lookup(table, jnp.int32(-2), implementation=platform)
  _equal(out, table[-2])
  for shape in [(0,), (2, 0)]:
    ids = jnp.zeros(shape, jnp.int32)
    assert jaxcraft.embedding_lookup(table, ids, implementation=platform).shape == (*shape, 9)
    g = jax.grad(lambda t: jnp.sum(jaxcraft.embedding_lookup(t, ids, implementation=platform)))(table)
    np.testing.assert_array_equal(g, 0.0)
  empty_dim = jnp.zeros((ROWS, 0), jnp.float32)
  assert jaxcraft.embedding_lookup(empty_dim, jnp.arange(3), implementation=platform).shape == (3, 0)


@pytest.mark.parametrize("mode", MODES)
def test_id_dtypes(platform, mode):
  table = random(jax.random.key(0), (ROWS, 8), jnp.float32)
  big = np.array([0, 5, -1, -ROWS, -ROWS - 1, ROWS, 2 ** 40 + 3, -2 ** 40, 2 ** 31, -2 ** 31 - 7])
  lookup = lambda ids: jaxcraft.embedding_lookup(table, ids, mode=mode, implementation=platform)
  expected = lambda ids: np.where((_rows64(ids, ROWS, mode) >= 0)[:, None],
                                  np.asarray(table)[_rows64(ids, ROWS, mode)], np.nan)
  # int64 on the host (no jax_enable_x64 needed), Python ints.
  _equal(lookup(big), expected(big))
  _equal(lookup(int(big[6])), expected(big[6:7])[0])
  # Unsigned 32-bit ids on the device (ids above 2^31 - 1), and narrow types.
  u = np.array([0, 3, ROWS, 2 ** 31 + 5, 2 ** 32 - 1], np.uint32)
  _equal(lookup(jnp.asarray(u)), expected(u.astype(np.int64)))
  for dt in (jnp.int8, jnp.uint8, jnp.int16):
    small = jnp.array([0, 3, 100, -1 if dt != jnp.uint8 else 200], dt)
    _equal(lookup(small), expected(np.asarray(small).astype(np.int64)))


@pytest.mark.parametrize("deterministic", [False, True])
def test_export_round_trip(platform, monkeypatch, deterministic):
  # The artifact runs the kernels, whatever the policy.
  monkeypatch.setitem(emb.DEFAULT_IMPLEMENTATION, platform, ("kernel", "kernel"))
  table = random(jax.random.key(11), (ROWS, 24), jnp.bfloat16)
  ids = _ids(jax.random.key(12), (5, 3))

  def step(table, ids):
    loss = lambda t: jnp.sum(jnp.sin(jaxcraft.embedding_lookup(
        t, ids, mode="wrap", deterministic=deterministic).astype(jnp.float32)))
    return jax.value_and_grad(loss)(table)

  exported = jax.export.export(jax.jit(step), platforms=(platform,),
                               disabled_checks=jaxcraft.EXPORT_DISABLED_CHECKS)(table, ids)
  module = exported.mlir_module()
  for target in (_ffi.EMBEDDING_FWD, _ffi.EMBEDDING_BWD):
    assert f"@{target}(" in module, target
  restored = jax.export.deserialize(exported.serialize())
  for got, want in zip(jax.tree.leaves(restored.call(table, ids)),
                       jax.tree.leaves(jax.jit(step)(table, ids))):
    if deterministic:
      np.testing.assert_array_equal(f64(got), f64(want))
    else:  # CUDA atomics may add a repeated row's terms in another order
      np.testing.assert_allclose(f64(got), f64(want), rtol=1e-2, atol=1e-5)


def test_bad_input():
  table = jnp.ones((ROWS, 8), jnp.float32)
  ids = jnp.arange(4)
  with pytest.raises(ValueError, match=r"table must have shape \[V, D\]"):
    jaxcraft.embedding_lookup(jnp.ones(8), ids)
  with pytest.raises(TypeError, match="table must be float32, bfloat16, float16 or float64"):
    jaxcraft.embedding_lookup(jnp.ones((4, 8), jnp.int32), ids)
  with pytest.raises(TypeError, match="ids must have an integer dtype; got dtype float32"):
    jaxcraft.embedding_lookup(table, jnp.ones(3))
  with pytest.raises(TypeError, match="ids must have an integer dtype; got dtype float64"):
    jaxcraft.embedding_lookup(table, np.ones(3))
  with pytest.raises(TypeError, match="ids must have an integer dtype; got bool"):
    jaxcraft.embedding_lookup(table, True)
  with pytest.raises(TypeError, match="ids must be an array"):
    jaxcraft.embedding_lookup(table, [1, 2])
  with pytest.raises(ValueError, match="mode must be None, 'fill', 'clip' or 'wrap'"):
    jaxcraft.embedding_lookup(table, ids, mode="raise")
  with pytest.raises(TypeError, match="fill_value must be a Python float"):
    jax.jit(lambda f: jaxcraft.embedding_lookup(table, ids, fill_value=f))(1.0)
  with pytest.raises(TypeError, match="deterministic must be a Python bool"):
    jaxcraft.embedding_lookup(table, ids, deterministic=1)
  with pytest.raises(ValueError, match="implementation must be"):
    jaxcraft.embedding_lookup(table, ids, implementation="triton")
  with pytest.raises(ValueError, match=r"table has no rows \(shape \(0, 8\)\)"):
    jaxcraft.embedding_lookup(jnp.ones((0, 8)), ids)


def test_forced_platform_mismatch():
  if "cuda" in jax.extend.backend.backends():  # only meaningful without a GPU backend
    pytest.skip("a GPU backend exists")
  with pytest.raises(ValueError, match="cuda"):
    jax.block_until_ready(jaxcraft.embedding_lookup(jnp.ones((4, 8)), jnp.arange(3),
                                                    implementation="cuda"))


def test_reference_docstring_math():
  table = random(jax.random.key(0), (ROWS, 5), jnp.float32)
  ids = _ids(jax.random.key(1), (7,))
  for mode in MODES:
    _equal(emb.embedding_lookup_reference(table, ids, mode=mode),
           jnp.take(table, ids, axis=0, mode=mode))
    np.testing.assert_array_equal(emb.table_rows(ids, ROWS, mode or "fill"),
                                  np.where(_rows64(ids, ROWS, mode) < 0, ROWS,
                                           _rows64(ids, ROWS, mode)))


# ------------------------------------------------ sharding (8 virtual CPU devices)
def _sharding_inputs():
  k = jax.random.split(jax.random.key(9), 3)
  table = random(k[0], (40, 64), jnp.float32)  # rows divisible by the mesh axes
  ids = _ids(k[1], (8, 6), rows=40, spread=1.1)
  return table, ids, random(k[2], (8, 6, 64), jnp.float32)


# (ids spec, table spec, collectives expected in the forward or None: not
# checked). The gradient adds one all-reduce (the sum of the devices' table
# gradients) where the ids are sharded.
SHARDINGS = [(P("data"), P(), []),                        # batch-sharded ids, replicated table
             (P("data", "model"), P(), []),
             (P(), P(None, "model"), []),                 # table sharded over D
             (P("data"), P(None, "model"), []),
             (P("model"), P(None, "model"), None),  # one mesh axis for both: D gathered
             (P("data"), P("model", None), ["all-gather"])]  # over V: gathered


@pytest.mark.parametrize("ids_spec,table_spec,expected", SHARDINGS,
                         ids=["ids", "ids2d", "tableD", "ids+tableD", "same-axis", "tableV"])
def test_sharded_jit(mesh, ids_spec, table_spec, expected):
  table, ids, w = _sharding_inputs()
  ts = jax.device_put(table, NamedSharding(mesh, table_spec))
  is_ = jax.device_put(ids, NamedSharding(mesh, ids_spec))
  fwd = lambda t, i: jaxcraft.embedding_lookup(t, i, implementation="cpu")
  if expected is not None:
    assert collectives(fwd, ts, is_) == expected
  out = jax.jit(fwd)(ts, is_)
  _equal(out, jnp.take(table, ids, axis=0))
  spec = tuple(out.sharding.spec)
  if expected is not None:
    assert spec[:len(ids_spec)] == tuple(ids_spec)[:len(spec)]
  if table_spec == P(None, "model") and "model" not in tuple(ids_spec):
    assert spec[-1] == "model"
  for det in (False, True):
    loss = lambda t, i: jnp.sum(jnp.nan_to_num(jaxcraft.embedding_lookup(
        t, i, deterministic=det, implementation="cpu")) * w)
    if expected is not None:
      reduce = ["all-reduce"] if tuple(ids_spec) else []
      assert collectives(jax.grad(loss), ts, is_) == expected + reduce
    grad = jax.jit(jax.grad(loss))(ts, is_)
    ref = jax.grad(lambda t: jnp.sum(jnp.nan_to_num(jnp.take(t, ids, axis=0)) * w))(table)
    np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-5)


def test_in_shard_map(mesh):
  table, ids_host, w = _sharding_inputs()
  ids = jax.device_put(ids_host, NamedSharding(mesh, P("data")))
  fn = jax.shard_map(lambda t, i: jaxcraft.embedding_lookup(t, i, mode="wrap", implementation="cpu"),
                     mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"))
  with jax.set_mesh(mesh):
    out = jax.jit(fn)(table, ids)
    # The replicated table's gradient sums every shard's ids.
    g = jax.jit(jax.grad(lambda t: jnp.sum(fn(t, ids) * w)))(table)
  _equal(out, jnp.take(table, ids_host, axis=0, mode="wrap"))
  ref = jax.grad(lambda t: jnp.sum(jnp.take(t, ids_host, axis=0, mode="wrap") * w))(table)
  np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5)
