"""gelu / bias_gelu / swiglu / geglu: parity, gradients, transforms, sharding,
export, the implementation=None policy, edge cases, bad input."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxcraft
from jaxcraft import _ffi
from jaxcraft.ops import activations as act_ops
from numerics import assert_close, f64, random
from sharding_util import collectives

F32 = jnp.float32
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
# (op, approximate): every activation the kernels implement.
VARIANTS = [("gelu", True), ("gelu", False), ("bias_gelu", True), ("bias_gelu", False),
            ("swiglu", None), ("geglu", True), ("geglu", False)]
IDS = [op + {True: "", False: "-erf", None: ""}[a] for op, a in VARIANTS]
GATED = ("swiglu", "geglu")
# Output columns C: 1, primes and non-multiples of the 16-byte vector (the
# CUDA scalar path), whole vectors, a wide row. Gated inputs have 2C columns.
COLS = [1, 7, 8, 257, 1000, 4096]


def _call(op, approximate, x, bias, impl):
  if op == "gelu":
    return jaxcraft.gelu(x, approximate, implementation=impl)
  if op == "bias_gelu":
    return jaxcraft.bias_gelu(x, bias, approximate, implementation=impl)
  if op == "swiglu":
    return jaxcraft.swiglu(x, implementation=impl)
  return jaxcraft.geglu(x, approximate, implementation=impl)


def _act64(op, approximate, h):
  """f(h) and f'(h) in float64."""
  if op == "swiglu":
    s = scipy.special.expit(h)
    return h * s, s + h * s * (1 - s)
  if approximate:
    # 0.5 (1 + tanh(u)) = sigmoid(2u): no cancellation in the far negative tail.
    k0, k1 = np.sqrt(2 / np.pi), 0.044715
    z = 2 * k0 * (h + k1 * h ** 3)
    s = scipy.special.expit(z)
    return h * s, s + h * s * scipy.special.expit(-z) * 2 * k0 * (1 + 3 * k1 * h * h)
  cdf = 0.5 * scipy.special.erfc(-h / np.sqrt(2))
  return h * cdf, cdf + h * np.exp(-0.5 * h * h) / np.sqrt(2 * np.pi)


def _reference64(op, approximate, x, bias, dy=None):
  """y, and with the cotangent dy, (dx, dbias) in float64 (dbias None without a bias)."""
  xf = f64(x)
  if op in GATED:
    c = xf.shape[-1] // 2
    a, b = xf[..., :c], xf[..., c:]
    f, d = _act64(op, approximate, a)
    if dy is None:
      return f * b
    return np.concatenate([dy * b * d, dy * f], axis=-1), None
  h = xf + (f64(bias) if bias is not None else 0.0)
  f, d = _act64(op, approximate, h)
  if dy is None:
    return f
  dx = dy * d
  return dx, (dx.reshape(-1, dx.shape[-1]).sum(0) if bias is not None else None)


def _inputs(op, cols, dtype, lead=(3, 5), seed=0):
  k = jax.random.split(jax.random.key(seed), 2)
  width = 2 * cols if op in GATED else cols
  # scale 2: reaches the activations' tails (|h| up to ~9).
  x = random(k[0], (*lead, width), dtype, scale=2.0)
  bias = random(k[1], (cols,), F32, scale=0.5) if op == "bias_gelu" else None
  return x, bias


# bfloat16 over all the widths; float32 (4-element vectors) and float16
# (bfloat16's code paths) over fewer.
DTYPE_COLS = ([(jnp.bfloat16, c) for c in (1, 8, 257, 1000, 4096)]
              + [(jnp.float32, c) for c in (7, 1000, 4096)] + [(jnp.float16, c) for c in (7, 4096)])


@pytest.mark.parametrize("dtype,cols", DTYPE_COLS, ids=[f"{d.__name__}-{c}" for d, c in DTYPE_COLS])
@pytest.mark.parametrize("op,approximate", VARIANTS, ids=IDS)
def test_forward_parity(platform, op, approximate, dtype, cols):
  x, bias = _inputs(op, cols, dtype, (2,) if cols >= 4096 else (3, 5))
  out = _call(op, approximate, x, bias, platform)
  lowp = _call(op, approximate, x, bias, "xla")
  ref = _reference64(op, approximate, x, bias)
  assert out.dtype == x.dtype and out.shape == ref.shape
  assert_close(out, lowp, ref)


def _loss(op, approximate, impl, x, bias):
  return jnp.sum(jnp.sin(_call(op, approximate, x, bias, impl).astype(F32)))


GRAD_COLS = [(jnp.float32, 7), (jnp.float32, 4096), (jnp.bfloat16, 4096), (jnp.float16, 1000)]


@pytest.mark.parametrize("dtype,cols", GRAD_COLS, ids=[f"{d.__name__}-{c}" for d, c in GRAD_COLS])
@pytest.mark.parametrize("op,approximate", VARIANTS, ids=IDS)
def test_gradients(platform, op, approximate, dtype, cols):
  x, bias = _inputs(op, cols, dtype, (2,) if cols >= 4096 else (4, 3), seed=1)
  argnums = (0, 1) if bias is not None else (0,)
  grads = jax.grad(functools.partial(_loss, op, approximate, platform), argnums)(x, bias)
  lowp = jax.grad(functools.partial(_loss, op, approximate, "xla"), argnums)(x, bias)
  dy = np.cos(_reference64(op, approximate, x, bias))
  ref = _reference64(op, approximate, x, bias, dy)
  for name, g, l, r in zip(["x", "bias"], grads, lowp, ref):
    assert g.dtype == l.dtype and g.shape == l.shape, name
    assert_close(g, l, r, name=f"d{name}")


@pytest.mark.parametrize("rows", [1, 65, 4097])
def test_bias_gradient_partials(platform, rows):
  """Rows around and across the 64-row partial sums, and several partials
  with a short last one; the result is bitwise reproducible."""
  x = random(jax.random.key(rows), (rows, 24), jnp.bfloat16, scale=2.0)
  bias = random(jax.random.key(1), (24,), F32)
  grad = jax.jit(jax.grad(functools.partial(_loss, "bias_gelu", True, platform), (0, 1)))
  dx, dbias = grad(x, bias)
  _, lowp = jax.grad(functools.partial(_loss, "bias_gelu", True, "xla"), (0, 1))(x, bias)
  dy = np.cos(_reference64("bias_gelu", True, x, bias))
  _, ref = _reference64("bias_gelu", True, x, bias, dy)
  assert_close(dbias, lowp, ref, name="dbias")
  np.testing.assert_array_equal(np.asarray(grad(x, bias)[1]), np.asarray(dbias))


def test_tails_are_accurate_and_finite(platform):
  """Far tails, where 1 + tanh and 1 + erf cancel in the textbook forms; and
  huge inputs (bf16 holds 1e30), where sigmoid underflows. Gated ops get
  b = 1, so that y = f(a) and da = f'(a)."""
  x = jnp.concatenate([jnp.linspace(-30.0, 30.0, 601), jnp.array([-1e4, 1e4, -1e30, 1e30])])
  for op, approximate in VARIANTS:
    xin = jnp.stack([x, jnp.ones_like(x)], -1) if op in GATED else x[:, None]
    bias = jnp.zeros((1,)) if op == "bias_gelu" else None
    out = f64(_call(op, approximate, xin, bias, platform))[:, 0]
    grad = jax.grad(lambda x: jnp.sum(_call(op, approximate, x, bias, platform)))(xin)
    f, d = _act64(op, approximate, f64(x))
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(f64(grad))), op
    # rtol: float32 rounding of the exponent z (|z| < 90) moves exp(z) by |z| ulp.
    np.testing.assert_allclose(out[:601], f[:601], rtol=2e-5, atol=1e-30, err_msg=op)
    np.testing.assert_allclose(f64(grad)[:601, 0], d[:601], rtol=2e-5, atol=1e-30, err_msg=op)
    np.testing.assert_allclose(out[601:], f[601:], rtol=1e-6, atol=1e-6, err_msg=op)


def test_leading_shapes_and_scalars(platform):
  for shape in [(), (2, 3, 4, 16)]:
    x = random(jax.random.key(2), shape, jnp.bfloat16, scale=2.0)
    ops = [("gelu", True)] + ([("swiglu", None), ("bias_gelu", False)] if shape else [])
    for op, approximate in ops:
      bias = jnp.linspace(-1, 1, shape[-1]) if op == "bias_gelu" else None
      out = _call(op, approximate, x, bias, platform)
      assert out.shape == _reference64(op, approximate, x, bias).shape
      assert_close(out, _call(op, approximate, x, bias, "xla"),
                   _reference64(op, approximate, x, bias), name=f"{op} {shape}")


def test_empty(platform):
  x = jnp.zeros((0, 16), jnp.float32)
  assert jaxcraft.gelu(x, implementation=platform).shape == (0, 16)
  assert jaxcraft.swiglu(x, implementation=platform).shape == (0, 8)
  g = jax.grad(lambda b: jnp.sum(jaxcraft.bias_gelu(x, b, implementation=platform)))(jnp.ones(16))
  np.testing.assert_array_equal(g, 0.0)


def test_kernel_in_hlo(platform):
  x, bias = _inputs("bias_gelu", 64, F32)
  for op, approximate in VARIANTS:
    fn = lambda x, b: _call(op, approximate, x, b, platform)
    assert "jaxcraft_activation_fwd" in jax.jit(fn).lower(x, bias).as_text(), op
    loss = lambda x, b: jnp.sum(fn(x, b))
    assert "jaxcraft_activation_bwd" in jax.jit(jax.grad(loss)).lower(x, bias).as_text(), op


@pytest.mark.parametrize("op,approximate", VARIANTS, ids=IDS)
def test_policy_decides_implementation_none(platform, op, approximate, monkeypatch):
  """implementation=None follows DEFAULT_IMPLEMENTATION for the platform the
  computation is compiled for, forward and backward independently; a forced
  kernel ignores it."""
  variant = act_ops.variant_name(op, act_ops.GELU_ERF if approximate is False else act_ops.GELU_TANH)
  assert variant in act_ops.VARIANTS
  x, bias = _inputs(op, 64, F32)
  lowered = lambda impl: jax.jit(jax.value_and_grad(
      lambda x: jnp.sum(_call(op, approximate, x, bias, impl)))).lower(x).as_text()
  monkeypatch.setattr(act_ops, "FORWARD_KERNEL_MIN_SIZE", {})  # the table alone, at any size
  for choice in [("kernel", "kernel"), ("xla", "kernel"), ("kernel", "xla"), ("xla", "xla")]:
    monkeypatch.setitem(act_ops.DEFAULT_IMPLEMENTATION, (variant, platform), choice)
    text = lowered(None)
    for target, want in zip((_ffi.ACTIVATION_FWD, _ffi.ACTIVATION_BWD), choice):
      assert (target in text) == (want == "kernel"), (choice, target)
    forced = lowered(platform)
    assert _ffi.ACTIVATION_FWD in forced and _ffi.ACTIVATION_BWD in forced
  monkeypatch.undo()
  expected = _call(op, approximate, x, bias, "xla")
  np.testing.assert_allclose(_call(op, approximate, x, bias, None), expected, rtol=2e-6, atol=2e-6)


def test_policy_table_is_complete():
  names = {act_ops.variant_name(op, code) for op, code in
           [("gelu", 0), ("gelu", 1), ("bias_gelu", 0), ("bias_gelu", 1), ("swiglu", 2),
            ("geglu", 0), ("geglu", 1)]}
  assert set(act_ops.VARIANTS) == names
  for variant in names:
    for platform in ("cpu", "cuda"):
      entry = act_ops.DEFAULT_IMPLEMENTATION[(variant, platform)]
      by_dtype = entry if isinstance(entry, dict) else {"float32": entry, "bfloat16": entry,
                                                        "float16": entry}
      assert set(by_dtype) == {"float32", "bfloat16", "float16"}, (variant, platform)
      for choice in by_dtype.values():
        assert len(choice) == 2 and all(c in ("kernel", "xla") for c in choice), (variant, platform)


def test_policy_by_dtype(platform, monkeypatch):
  """An entry keyed by dtype decides by x's dtype, each pass on its own."""
  choices = {"float32": ("xla", "xla"), "bfloat16": ("kernel", "xla"), "float16": ("xla", "kernel")}
  monkeypatch.setitem(act_ops.DEFAULT_IMPLEMENTATION, ("swiglu", platform), choices)
  monkeypatch.setattr(act_ops, "FORWARD_KERNEL_MIN_SIZE", {})
  for name, choice in choices.items():
    x, _ = _inputs("swiglu", 64, jnp.dtype(name))
    text = jax.jit(jax.value_and_grad(
        lambda x: jnp.sum(jaxcraft.swiglu(x).astype(F32)))).lower(x).as_text()
    for target, want in zip((_ffi.ACTIVATION_FWD, _ffi.ACTIVATION_BWD), choice):
      assert (target in text) == (want == "kernel"), (name, choice, target)


# bias_gelu covers gelu's primitives (and the bias' batching rules); swiglu
# the gated ones, which geglu shares.
@pytest.mark.parametrize("op,approximate", [("bias_gelu", False), ("swiglu", None)])
def test_transforms(platform, op, approximate):
  x, bias = _inputs(op, 40, jnp.bfloat16, (4, 6), seed=3)
  fn = lambda x, b: _call(op, approximate, x, b, platform)
  ref = lambda x, b: _call(op, approximate, x, b, "xla")
  tol = dict(atol=2e-2, rtol=2e-2)
  np.testing.assert_allclose(f64(jax.jit(fn)(x, bias)), f64(ref(x, bias)), **tol)
  # vmap over a non-leading axis of x; the last axis itself (elementwise gelu).
  np.testing.assert_allclose(f64(jax.vmap(fn, (1, None))(x, bias)),
                             f64(jax.vmap(ref, (1, None))(x, bias)), **tol)
  if op == "bias_gelu":  # vmap over the feature axis itself (then bias is per example)
    gelu = lambda x: jaxcraft.gelu(x, implementation=platform)
    np.testing.assert_allclose(f64(jax.vmap(gelu, 2)(x)),
                               f64(jax.vmap(lambda x: jaxcraft.gelu(x, implementation="xla"), 2)(x)), **tol)
  sq = lambda f: lambda x, b: jnp.sum(f(x, b).astype(F32) ** 2)
  # grad of vmap; checkpoint.
  g = jax.grad(lambda x, b: jnp.sum(jax.vmap(sq(fn), (0, None))(x, b)))(x, bias)
  gr = jax.grad(lambda x, b: jnp.sum(jax.vmap(sq(ref), (0, None))(x, b)))(x, bias)
  np.testing.assert_allclose(f64(g), f64(gr), rtol=5e-2, atol=5e-2)
  g = jax.grad(jax.checkpoint(sq(fn)))(x, bias)
  np.testing.assert_allclose(f64(g), f64(jax.grad(sq(ref))(x, bias)), rtol=5e-2, atol=5e-2)
  if bias is None:
    return
  # Batched biases; per-example bias gradients (vmap of grad, also nested),
  # which the kernel's partial sums keep apart.
  biases = jnp.stack([bias, 2 * bias, bias - 1, -bias])
  np.testing.assert_allclose(f64(jax.vmap(fn)(x, biases)), f64(jax.vmap(ref)(x, biases)), **tol)
  per_example = lambda f: jax.vmap(jax.grad(sq(f), (0, 1)), (0, None))
  for got, want in zip(per_example(fn)(x, bias), per_example(ref)(x, bias)):
    np.testing.assert_allclose(f64(got), f64(want), rtol=2e-2, atol=5e-2)
  nested = lambda f: jax.vmap(jax.vmap(jax.grad(sq(f), 1), (0, None)), (1, None))
  np.testing.assert_allclose(nested(fn)(x, bias), nested(ref)(x, bias), rtol=2e-2, atol=5e-2)
  batched = lambda f: jax.vmap(jax.grad(sq(f), 1))
  np.testing.assert_allclose(batched(fn)(x, biases), batched(ref)(x, biases), rtol=2e-2, atol=5e-2)
  text = jax.jit(per_example(fn)).lower(x, bias).as_text()
  assert _ffi.ACTIVATION_BWD in text and "while" not in text  # one kernel call, no loop


def test_vmap_of_grad_with_prime_rows(platform):
  """Per-example bias gradients when the rows per example (127) have no
  divisor near 64: one-row partials, still exact."""
  x = random(jax.random.key(4), (3, 127, 16), F32, scale=2.0)
  bias = random(jax.random.key(5), (16,), F32)
  per_example = lambda impl: jax.vmap(jax.grad(
      lambda x, b: jnp.sum(jnp.sin(jaxcraft.bias_gelu(x, b, implementation=impl))), 1), (0, None))
  np.testing.assert_allclose(per_example(platform)(x, bias), per_example("xla")(x, bias),
                             rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ sharding
@pytest.fixture
def mesh(mesh):
  # The tests force the CPU kernels (the policy may pick XLA on CPU), so their
  # unsharded comparisons run on a CPU device too, also where a GPU is the default.
  with jax.default_device(jax.devices("cpu")[0]):
    yield mesh


@pytest.mark.parametrize("spec", [P("data", "model"), P("data", None, "model")],
                         ids=["rows", "rows+features"])
def test_elementwise_sharding_runs_locally(mesh, spec):
  """gelu and bias_gelu are elementwise: rows and features shard locally; the
  bias gradient needs one all-reduce over the row axes, nothing else."""
  x = random(jax.random.key(6), (8, 16, 128), F32, scale=2.0)
  bias = random(jax.random.key(7), (128,), F32)
  xs = jax.device_put(x, NamedSharding(mesh, spec))
  bs = jax.device_put(bias, NamedSharding(mesh, P(spec[2] if len(spec) > 2 else None)))
  fwd = lambda x, b: jaxcraft.bias_gelu(jaxcraft.gelu(x, implementation="cpu"), b,
                                        implementation="cpu")
  assert collectives(fwd, xs, bs) == []
  out = jax.jit(fwd)(xs, bs)
  np.testing.assert_allclose(out, fwd(x, bias), rtol=1e-6, atol=1e-6)
  assert tuple(out.sharding.spec)[:len(spec)] == tuple(spec)
  grad = jax.grad(lambda x, b: jnp.sum(jnp.sin(fwd(x, b))), (0, 1))
  assert collectives(grad, xs, bs) == ["all-reduce"]
  for a, b in zip(jax.jit(grad)(xs, bs), grad(x, bias)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # A replicated bias with sharded features: its gradient keeps the bias' type.
  replicated = jax.device_put(bias, NamedSharding(mesh, P()))
  for a, b in zip(jax.jit(grad)(xs, replicated), grad(x, bias)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_gated_sharding(mesh):
  """Gated ops keep row sharding locally; a sharded last axis is gathered
  first (its halves must sit on one device) and still correct."""
  x = random(jax.random.key(8), (8, 16, 64), jnp.bfloat16, scale=2.0)
  fn = lambda x: jaxcraft.geglu(jaxcraft.swiglu(x, implementation="cpu"), implementation="cpu")
  rows = jax.device_put(x, NamedSharding(mesh, P("data", "model")))
  assert collectives(fn, rows) == []
  grad = jax.grad(lambda x: jnp.sum(fn(x).astype(F32) ** 2))
  assert collectives(grad, rows) == []
  np.testing.assert_array_equal(f64(jax.jit(fn)(rows)), f64(fn(x)))
  np.testing.assert_array_equal(f64(jax.jit(grad)(rows)), f64(grad(x)))
  cols = jax.device_put(x, NamedSharding(mesh, P(None, None, "model")))
  np.testing.assert_array_equal(f64(jax.jit(fn)(cols)), f64(fn(x)))
  np.testing.assert_array_equal(f64(jax.jit(grad)(cols)), f64(grad(x)))


def test_bias_gelu_in_shard_map(mesh):
  x = random(jax.random.key(9), (8, 16, 32), F32, scale=2.0)
  bias = random(jax.random.key(10), (32,), F32)
  x = jax.device_put(x, NamedSharding(mesh, P("data", "model")))
  fn = jax.shard_map(lambda x, b: jaxcraft.bias_gelu(x, b, implementation="cpu"), mesh=mesh,
                     in_specs=(P("data", "model"), P()), out_specs=P("data", "model"))
  with jax.set_mesh(mesh):
    np.testing.assert_allclose(jax.jit(fn)(x, bias), jaxcraft.bias_gelu(x, bias, implementation="xla"),
                               rtol=1e-6, atol=1e-6)
    # The replicated bias' gradient sums over every shard's rows.
    g = jax.jit(jax.grad(lambda b: jnp.sum(fn(x, b))))(bias)
    ref = jax.grad(lambda b: jnp.sum(jaxcraft.bias_gelu(x, b, implementation="xla")))(bias)
  np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5)


# -------------------------------------------------------------------- export
def _step(x, bias):
  """Loss and gradients through all four ops with the default dispatch."""
  def loss(x, bias):
    h = jaxcraft.bias_gelu(jaxcraft.gelu(x, False), bias)
    return jnp.sum(jaxcraft.geglu(jaxcraft.swiglu(h)).astype(F32) ** 2)
  return jax.value_and_grad(loss, (0, 1))(x, bias)


def test_export_round_trip(platform, monkeypatch):
  for variant in act_ops.VARIANTS:  # the artifact runs the kernels, whatever the policy
    monkeypatch.setitem(act_ops.DEFAULT_IMPLEMENTATION, (variant, platform), ("kernel", "kernel"))
  monkeypatch.setattr(act_ops, "FORWARD_KERNEL_MIN_SIZE", {})
  x = random(jax.random.key(11), (4, 8, 64), jnp.bfloat16, scale=2.0)
  bias = random(jax.random.key(12), (64,), F32)
  exported = jax.export.export(jax.jit(_step), platforms=(platform,),
                               disabled_checks=jaxcraft.EXPORT_DISABLED_CHECKS)(x, bias)
  module = exported.mlir_module()
  for target in (_ffi.ACTIVATION_FWD, _ffi.ACTIVATION_BWD):
    assert f"@{target}(" in module, target
  restored = jax.export.deserialize(exported.serialize())
  for got, want in zip(jax.tree.leaves(restored.call(x, bias)), jax.tree.leaves(jax.jit(_step)(x, bias))):
    np.testing.assert_array_equal(f64(got), f64(want))


# ----------------------------------------------------------------- bad input
def test_bad_input():
  x = jnp.ones((4, 8), F32)
  with pytest.raises(TypeError, match="x must be float32, bfloat16, float16 or float64"):
    jaxcraft.gelu(jnp.ones((4, 8), jnp.int32))
  with pytest.raises(TypeError, match="x must be an array"):
    jaxcraft.swiglu("not an array")
  with pytest.raises(TypeError, match="approximate must be a Python bool"):
    jaxcraft.gelu(x, approximate=jnp.array(True))
  with pytest.raises(TypeError, match="approximate must be a Python bool"):
    jaxcraft.geglu(x, approximate="tanh")
  with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
    jaxcraft.bias_gelu(x, jnp.ones(7))
  with pytest.raises(ValueError, match=r"bias must have shape \(8,\).*got \(1, 8\)"):
    jaxcraft.bias_gelu(x, jnp.ones((1, 8)))
  with pytest.raises(TypeError, match="bias must have a floating dtype"):
    jaxcraft.bias_gelu(x, jnp.ones(8, jnp.int32))
  with pytest.raises(ValueError, match="x must have at least one axis"):
    jaxcraft.bias_gelu(jnp.float32(1.0), jnp.ones(1))
  with pytest.raises(ValueError, match=r"last axis must have an even size.*\(4, 7\)"):
    jaxcraft.swiglu(jnp.ones((4, 7)))
  with pytest.raises(ValueError, match="x must have at least one axis"):
    jaxcraft.geglu(jnp.float32(1.0))
  with pytest.raises(ValueError, match="implementation must be"):
    jaxcraft.gelu(x, implementation="triton")
  # Raised while tracing, before anything is lowered.
  with pytest.raises(ValueError, match="even size"):
    jax.jit(jaxcraft.geglu).lower(jax.ShapeDtypeStruct((2, 5), jnp.bfloat16))


def test_forced_platform_mismatch():
  if "cuda" in jax.extend.backend.backends():  # only meaningful without a GPU backend
    pytest.skip("a GPU backend exists")
  with pytest.raises(ValueError, match="cuda"):
    jax.block_until_ready(jaxcraft.swiglu(jnp.ones((4, 8)), implementation="cuda"))


def test_reference_docstring_math():
  x = random(jax.random.key(13), (5, 16), F32, scale=2.0)
  bias = random(jax.random.key(14), (16,), F32)
  a, b = jnp.split(x, 2, axis=-1)
  for approximate in (True, False):
    np.testing.assert_array_equal(act_ops.gelu_reference(x, approximate),
                                  jax.nn.gelu(x, approximate))
    np.testing.assert_array_equal(act_ops.bias_gelu_reference(x, bias, approximate),
                                  jax.nn.gelu(x + bias, approximate))
    np.testing.assert_array_equal(act_ops.geglu_reference(x, approximate),
                                  jax.nn.gelu(a, approximate) * b)
  np.testing.assert_array_equal(act_ops.swiglu_reference(x), jax.nn.silu(a) * b)
