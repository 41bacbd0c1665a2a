"""GELU (tanh or erf form), bias + GELU, SwiGLU and GeGLU.

Flow: `gelu` / `bias_gelu` / `swiglu` / `geglu` (checks, custom_vjp) ->
`_fwd_p` / `_bwd_p` (partitioned primitives: batching, sharding) ->
`_fwd_kernel_p` / `_bwd_kernel_p` (FFI targets `_ffi.ACTIVATION_FWD` /
`_ffi.ACTIVATION_BWD`, cpp/ffi/activations.cc). One kernel family serves
all four ops: an elementwise kernel templated on the activation, reading the
two halves of each row when gated.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxcraft import _ffi
from jaxcraft.ops import _checks, _primitive

F32 = jnp.float32

# Activation codes: `enum class Activation` in cpp/contract/activations.h.
GELU_TANH, GELU_ERF, SILU = 0, 1, 2
GATED_OPS = ("swiglu", "geglu")


# --------------------------------------------- implementation=None policy
# What `implementation=None` runs, per op variant, platform and pass:
# "kernel" (jaxcraft's) or "xla" (the pure-JAX reference below, which XLA
# fuses with neighbouring ops; a custom call is a fusion barrier). Each entry
# is the faster choice inside an MLP block (x @ w_in -> act -> @ w_out) and
# its training step, per dtype where the winner differs by dtype. Forward and
# backward choose independently: the backward kernel needs only x and dy,
# whichever ran the forward. Regenerate with
# `python bench/run.py --ops activations` ("mlp fwd" / "mlp fwd+bwd" rows),
# on a GPU for the cuda rows and on a CPU-only install for the cpu rows;
# the measurements behind the table are in docs/benchmarks.md.
# Keys: (variant, platform); variant = op, "_erf" appended for approximate=False.
# Values: (forward, backward), or a dict of them by dtype name.
_XLA_F32_KERNEL_BWD_16 = {"float32": ("xla", "xla"), "bfloat16": ("xla", "kernel"),
                          "float16": ("xla", "kernel")}
DEFAULT_IMPLEMENTATION = {
    ("gelu", "cuda"): ("kernel", "kernel"),
    ("gelu_erf", "cuda"): ("kernel", "kernel"),
    ("bias_gelu", "cuda"): ("kernel", "kernel"),
    ("bias_gelu_erf", "cuda"): ("kernel", "kernel"),
    ("swiglu", "cuda"): ("kernel", "kernel"),
    ("geglu", "cuda"): ("kernel", "kernel"),
    ("geglu_erf", "cuda"): ("kernel", "kernel"),
    ("gelu", "cpu"): ("xla", "xla"),
    ("gelu_erf", "cpu"): ("kernel", "xla"),
    ("bias_gelu", "cpu"): ("xla", "xla"),
    ("bias_gelu_erf", "cpu"): {"float32": ("kernel", "xla"), "bfloat16": ("xla", "xla"),
                               "float16": ("xla", "xla")},
    ("swiglu", "cpu"): _XLA_F32_KERNEL_BWD_16,
    ("geglu", "cpu"): _XLA_F32_KERNEL_BWD_16,
    ("geglu_erf", "cpu"): _XLA_F32_KERNEL_BWD_16,
}
# A forward "kernel" entry holds from this many elements of x on: below, a
# custom call's launch outweighs what the kernel saves, and XLA's activation
# fused beside the matmuls is faster (decode rows, inference at small
# batches). Measured between the matmuls of a decoder's MLP (d_model 2048,
# width 5632), forward, bf16, H200: at 1-1024 rows XLA is up to 20% faster
# (but for gelu at 256 rows); from 4096 rows (23M-46M elements of x) the
# kernel ties or leads:
# `python bench/run.py --ops row_counts` (docs/benchmarks.md). The backward
# runs in training steps, whose sizes the table was measured at.
FORWARD_KERNEL_MIN_SIZE = {"cuda": 1 << 24}
VARIANTS = tuple(dict.fromkeys(v for v, _ in DEFAULT_IMPLEMENTATION))
PASSES = ("fwd", "bwd")


def variant_name(op: str, activation: int) -> str:
  """The policy table's name for an op and its activation code."""
  return op + ("_erf" if activation == GELU_ERF else "")


def default_implementation(variant: str, platform: str, pass_: str = "fwd",
                           dtype=jnp.float32, size: int | None = None) -> str:
  """"kernel" or "xla": what `implementation=None` runs for the forward or
  backward pass (`pass_`) of an op variant (see DEFAULT_IMPLEMENTATION) on
  `platform`, for x of `dtype` with `size` elements (None: any size the
  table holds for, see FORWARD_KERNEL_MIN_SIZE)."""
  choice = _primitive.policy_choice(
      DEFAULT_IMPLEMENTATION.get((variant, platform), ("xla", "xla")), dtype)
  if pass_ == "fwd" and size is not None and size < FORWARD_KERNEL_MIN_SIZE.get(platform, 0):
    return "xla"
  return choice[PASSES.index(pass_)]


# ---------------------------------------------------------------- reference
def _act(code: int, h):
  """The activation in float32 (h is float32)."""
  if code == SILU:
    return jax.nn.silu(h)
  return jax.nn.gelu(h, approximate=code == GELU_TANH)


def _halves(x):
  c = x.shape[-1] // 2
  return x[..., :c], x[..., c:]


def _compute(x):
  """float32, or float64 for float64 x (the references' math)."""
  return _checks.compute_dtype(x.dtype)


def gelu_reference(x, approximate=True):
  """Pure-JAX GELU (the `implementation="xla"` path). Equivalent to::

      jax.nn.gelu(x.astype(jnp.float32), approximate).astype(x.dtype)
  """
  return jax.nn.gelu(x.astype(_compute(x)), approximate=approximate).astype(x.dtype)


def bias_gelu_reference(x, bias, approximate=True):
  """Pure-JAX bias + GELU (the `implementation="xla"` path). Equivalent to::

      h = x.astype(jnp.float32) + bias.astype(jnp.float32)
      jax.nn.gelu(h, approximate).astype(x.dtype)
  """
  h = x.astype(_compute(x)) + bias.astype(_compute(x))
  return jax.nn.gelu(h, approximate=approximate).astype(x.dtype)


# The gated references split before they cast: the gradient of the split is
# then a concatenation in x.dtype, where a split of a float32 copy would
# transpose to two float32 pads and an add (3x slower under XLA on CPU).
def swiglu_reference(x):
  """Pure-JAX SwiGLU (the `implementation="xla"` path). Equivalent to::

      a, b = jnp.split(x, 2, axis=-1)
      (jax.nn.silu(a.astype(jnp.float32)) * b.astype(jnp.float32)).astype(x.dtype)
  """
  a, b = _halves(x)
  return (jax.nn.silu(a.astype(_compute(x))) * b.astype(_compute(x))).astype(x.dtype)


def geglu_reference(x, approximate=True):
  """Pure-JAX GeGLU (the `implementation="xla"` path). Equivalent to::

      a, b = jnp.split(x, 2, axis=-1)
      (jax.nn.gelu(a.astype(jnp.float32), approximate) * b.astype(jnp.float32)).astype(x.dtype)
  """
  a, b = _halves(x)
  return (jax.nn.gelu(a.astype(_compute(x)), approximate=approximate)
          * b.astype(_compute(x))).astype(x.dtype)


# ------------------------------------------------------- kernel primitives
# Operands are 2-D rows; an absent bias travels as a zero-sized array.
def _empty(dtype=F32):
  return jnp.zeros((0,), dtype)


def _present(a):
  return a.size > 0


def _policy(pass_, platform, avals_in, *, op, activation, **_):
  """Why the policy table runs XLA here under implementation=None, or None."""
  variant = variant_name(op, activation)
  x = avals_in[0]  # the forward's x, the backward's dy
  if default_implementation(variant, platform, pass_, x.dtype, x.size) == "xla":
    return (f"the implementation=None policy runs XLA for {variant} {pass_} on {platform} "
            f"({jnp.dtype(x.dtype).name}, {x.size} elements)")
  return None


def _kernel_attrs(*, activation, gated, **_):
  return dict(activation=np.int32(activation), gated=gated)


def _fwd_kernel_abstract(x, bias, *, op, activation, gated, implementation):
  cols = x.shape[1] // 2 if gated else x.shape[1]
  return (_primitive.result_aval(x, (x.shape[0], cols), x.dtype, _primitive.row_spec(x, 1)),)


def _fwd_kernel_reference(x, bias, *, op, activation, gated, implementation):
  if gated:
    a, b = _halves(x)
    return (_act(activation, a.astype(F32)) * b.astype(F32)).astype(x.dtype),
  xf = x.astype(F32)
  if _present(bias):
    xf = xf + bias
  return _act(activation, xf).astype(x.dtype),


_fwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_activation_fwd_kernel", target=_ffi.ACTIVATION_FWD,
    abstract_eval=_fwd_kernel_abstract, reference=_fwd_kernel_reference,
    ffi_attrs=_kernel_attrs, policy=functools.partial(_policy, "fwd"))


def _bwd_kernel_abstract(dy, x, bias, *, op, activation, gated, num_partials, implementation):
  dx = _primitive.result_aval(x, x.shape, x.dtype, _primitive.row_spec(x, 1))
  part = _primitive.result_aval(x, (num_partials, dy.shape[1]) if _present(bias) else (0,), F32)
  return dx, part


def _bwd_kernel_reference(dy, x, bias, *, op, activation, gated, num_partials, implementation):
  dyf = dy.astype(F32)
  if gated:
    a, b = (h.astype(F32) for h in _halves(x))
    f, vjp = jax.vjp(functools.partial(_act, activation), a)
    dx = [vjp(dyf * b)[0].astype(x.dtype), (dyf * f).astype(x.dtype)]
    return jnp.concatenate(dx, axis=-1), _empty()
  h = x.astype(F32) + bias if _present(bias) else x.astype(F32)
  dh = jax.vjp(functools.partial(_act, activation), h)[1](dyf)[0]
  if not _present(bias):
    return dh.astype(x.dtype), _empty()
  partials = jnp.zeros((num_partials, dy.shape[1]), F32).at[0].set(jnp.sum(dh, axis=0))
  return dh.astype(x.dtype), partials


_bwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_activation_bwd_kernel", target=_ffi.ACTIVATION_BWD,
    abstract_eval=_bwd_kernel_abstract, reference=_bwd_kernel_reference,
    ffi_attrs=_kernel_attrs, policy=functools.partial(_policy, "bwd"))


# Rows per partial sum of dbias: the partials are written and read once more
# (8 bytes per column and partial), so 64+ rows per partial keeps that under
# ~2% of the backward's traffic (6 bytes per element in bf16); 1024 partials
# are plenty of blocks for any current GPU.
_ROWS_PER_PARTIAL = 64
_MAX_PARTIALS = 1024


def _num_partials(groups: int, rows: int) -> int:
  """Partials for `groups` consecutive groups of `rows` rows each, whose
  bias gradients are wanted separately (groups > 1 under vmap): every partial
  then lies within one group (contract/activations.h fixes their row split)."""
  if groups == 1:
    return max(1, min(_MAX_PARTIALS, math.ceil(rows / _ROWS_PER_PARTIAL)))
  per_partial = max(d for d in range(1, min(_ROWS_PER_PARTIAL, rows) + 1) if rows % d == 0)
  return groups * (rows // per_partial)


# ------------------------------------------------- partitioned primitives
@dataclasses.dataclass(frozen=True)
class _Config:
  """Static params: the op (the policy table's key) and its activation."""
  op: str
  activation: int
  implementation: str | None

  @property
  def gated(self) -> bool:
    return self.op in GATED_OPS

  @property
  def has_bias(self) -> bool:
    return self.op == "bias_gelu"

  def kernel_params(self):
    return dict(op=self.op, activation=self.activation, gated=self.gated,
                implementation=self.implementation)


# A flat elementwise op (gelu without bias) runs on rows of this many columns
# when its size allows: whole 16-byte vectors on the GPU and many rows to
# spread over CPU threads, whatever the caller's last axis (say 7).
_FLAT_COLS = 4096
_MIN_FLAT_COLS = 8  # one 16-byte vector of a 16-bit type


def _sharded(a) -> bool:
  """Whether a's type carries a sharding (explicit mesh axes, traced before
  partitioning): then only the leading axes may be merged."""
  spec = getattr(jax.typeof(a).sharding, "spec", None) or ()
  return any(s is not None for s in spec)


def _rows2d(cfg: _Config, a):
  """a as the kernels' [rows, cols]."""
  if cfg.op == "gelu" and not _sharded(a):
    cols = math.gcd(a.size, _FLAT_COLS)
    if cols >= _MIN_FLAT_COLS:
      return a.reshape(-1, cols)
  if a.ndim == 0:
    return a.reshape(1, 1)
  return a.reshape(-1, a.shape[-1])


def _out_shape(cfg: _Config, x_shape):
  return (*x_shape[:-1], x_shape[-1] // 2) if cfg.gated else tuple(x_shape)


def _fwd_local(cfg: _Config, x, *bias):
  """The forward on one device's shard: operands x, bias? (no defaults:
  custom_partitioning would pass them as operands)."""
  (y,) = _fwd_kernel_p.bind(_rows2d(cfg, x), *(bias or [_empty()]), **cfg.kernel_params())
  return [y.reshape(_out_shape(cfg, x.shape))]


def _fwd_abstract(x, *rest, cfg):
  # Elementwise ops keep every axis' sharding; gated ones keep only the rows'
  # (the halves of the last axis must sit on one device).
  keep = x.ndim - 1 if cfg.gated else x.ndim
  return [_primitive.result_aval(x, _out_shape(cfg, x.shape), x.dtype, _primitive.row_spec(x, keep))]


def _lead_factors(ndim):
  return " ".join(f"r{i}" for i in range(ndim - 1))


def _specs(spec, ndim):
  """A PartitionSpec (None: unsharded) padded to ndim entries."""
  spec = tuple(spec) if spec is not None else ()
  return (spec + (None,) * ndim)[:ndim]


def _full_spec(aval, ndim):
  """An abstract value's sharding spec, padded to ndim entries."""
  return _specs(getattr(aval.sharding, "spec", None), ndim)


def _flatten_axes(axes):
  out = []
  for a in axes:
    if a is not None:
      out.extend(a if isinstance(a, tuple) else (a,))
  return tuple(out)


def _make_fwd_partitioned(shapes, *, cfg: _Config):
  ndim = len(shapes[0])
  lead = _lead_factors(ndim)
  if cfg.gated:
    # k: the input's last axis (both halves), c: the output's; neither split
    # (listed in the order of first appearance, as Shardy requires).
    rule = f"{lead} k -> {lead} c"
    replicated = ("k", "c")
  else:
    rule = f"{lead} c" + (", c" if cfg.has_bias else "") + f" -> {lead} c"
    replicated = ()

  def choose(mesh, specs):
    s = _specs(specs[0], ndim)
    if cfg.gated:
      s = s[:-1] + (None,)
    args = [P(*s)] + [P(s[-1])] * cfg.has_bias
    return args, [P(*s)], [()]

  return _primitive.partitioned_call(
      functools.partial(_fwd_local, cfg), sharding_rule=rule, choose_shardings=choose,
      need_replication_factors=replicated)


def _fwd_batch(args, dims, *, cfg):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
  moved = [_primitive.move_to_front(a, d, size) for a, d in zip(args, dims)]
  if cfg.has_bias and dims[1] is not _primitive.NOT_MAPPED:
    # A bias per batch element: one kernel call per element.
    return [jax.lax.map(lambda ops: _fwd_p.bind(*ops, cfg=cfg)[0], moved)], [0]
  return _fwd_p.bind(moved[0], *args[1:], cfg=cfg), [0]


_fwd_p = _primitive.partitioned_primitive(
    "jaxcraft_activation_fwd", abstract_eval=_fwd_abstract, batching_rule=_fwd_batch,
    make_partitioned=_make_fwd_partitioned)


def _bwd_local(cfg: _Config, keep: int, dy, x, *bias):
  """dx, and with a bias its gradient summed over all row axes but the first
  `keep` (vmapped axes: per-example gradients)."""
  bias = bias[0] if bias else None
  if not cfg.has_bias:
    dx, _ = _bwd_kernel_p.bind(_rows2d(cfg, dy), _rows2d(cfg, x), _empty(), num_partials=1,
                               **cfg.kernel_params())
    return [dx.reshape(x.shape)]
  cols = x.shape[-1]
  lead = x.shape[:-1]
  groups, rows = math.prod(lead[:keep]), math.prod(lead[keep:])
  if groups * rows == 0:
    return [jnp.zeros(x.shape, x.dtype), jnp.zeros((*lead[:keep], cols), F32)]
  num_partials = _num_partials(groups, rows)
  dx, partials = _bwd_kernel_p.bind(dy.reshape(-1, cols), x.reshape(-1, cols), bias,
                                    num_partials=num_partials, **cfg.kernel_params())
  dbias = jnp.sum(partials.reshape(groups, num_partials // groups, cols), axis=1)
  return [dx.reshape(x.shape), dbias.reshape(*lead[:keep], cols)]


def _bwd_abstract(dy, x, *rest, cfg, keep):
  # dx has x's type (custom_vjp requires it, sharding included).
  dx = _primitive.result_aval(x, x.shape, x.dtype, _primitive.row_spec(x, x.ndim))
  if not cfg.has_bias:
    return [dx]
  # dbias has the bias' type along the feature axis (custom_vjp requires it),
  # the rows' along the kept (vmapped) axes.
  spec = _full_spec(x, x.ndim)[:keep] + _full_spec(rest[0], 1)
  dbias = _primitive.result_aval(x, (*x.shape[:keep], x.shape[-1]), F32, spec)
  return [dx, dbias]


def _make_bwd_partitioned(shapes, *, cfg: _Config, keep: int):
  ndim = len(shapes[1])
  lead = _lead_factors(ndim)
  if cfg.gated:
    rule = f"{lead} c, {lead} k -> {lead} k"
    replicated = ("c", "k")  # in the order of first appearance, as Shardy requires
  elif cfg.has_bias:
    kept = " ".join(f"r{i}" for i in range(keep))
    rule = f"{lead} c, {lead} c, c -> {lead} c, {kept} c"
    replicated = ()
  else:
    rule = f"{lead} c, {lead} c -> {lead} c"
    replicated = ()

  def choose(mesh, specs):
    s = _specs(specs[1], ndim)
    if cfg.gated:
      s = s[:-1] + (None,)
    args = [P(*s), P(*s)] + [P(s[-1])] * cfg.has_bias
    res, psum = [P(*s)], [()]
    if cfg.has_bias:
      # The bias gradient sums over the row axes (but the kept ones): add up
      # the shards' sums.
      res.append(P(*s[:keep], s[-1]))
      psum.append(_flatten_axes(s[keep:-1]))
    return args, res, psum

  return _primitive.partitioned_call(
      functools.partial(_bwd_local, cfg, keep), sharding_rule=rule, choose_shardings=choose,
      need_replication_factors=replicated)


def _bwd_batch(args, dims, *, cfg, keep):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
  moved = [_primitive.move_to_front(a, d, size) for a, d in zip(args, dims)]
  if cfg.has_bias and dims[2] is not _primitive.NOT_MAPPED:
    outs = jax.lax.map(lambda ops: _bwd_p.bind(*ops, cfg=cfg, keep=keep), moved)
    return outs, [0] * len(outs)
  if cfg.has_bias:
    # Shared bias: per-example bias gradients (vmap keeps them apart) are
    # the kernel's partial sums of each example's rows.
    outs = _bwd_p.bind(moved[0], moved[1], args[2], cfg=cfg, keep=keep + 1)
    return outs, [0, 0]
  return _bwd_p.bind(*moved, cfg=cfg, keep=keep), [0]


_bwd_p = _primitive.partitioned_primitive(
    "jaxcraft_activation_bwd", abstract_eval=_bwd_abstract, batching_rule=_bwd_batch,
    make_partitioned=_make_bwd_partitioned)


# ----------------------------------------------------------------- autodiff
@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _activation(x, bias, cfg: _Config):
  return _activation_fwd(x, bias, cfg)[0]


def _activation_fwd(x, bias, cfg: _Config):
  (y,) = _fwd_p.bind(x, *([] if bias is None else [bias]), cfg=cfg)
  # The backward recomputes f(x) from x: nothing but the inputs is saved.
  return y, (x, bias)


def _activation_bwd(cfg: _Config, saved, dy):
  x, bias = saved
  outs = _bwd_p.bind(dy, x, *([] if bias is None else [bias]), cfg=cfg, keep=0)
  dbias = None if bias is None else _primitive.sum_to_match(outs[1], bias)
  return outs[0], dbias


_activation.defvjp(_activation_fwd, _activation_bwd)


# ------------------------------------------------------------- public API
def _check_x(x, implementation, what):
  _primitive.check_implementation(implementation)
  x = _checks.as_array("x", x)
  implementation = _checks.float_implementation("x", x, implementation)
  if what and x.ndim < 1:
    raise ValueError(f"x must have at least one axis ({what}); got a scalar")
  return x, implementation


def _check_approximate(approximate):
  if not isinstance(approximate, (bool, np.bool_)):
    raise TypeError(f"approximate must be a Python bool (static); got {type(approximate).__name__}")
  return bool(approximate)


def _check_gated(x):
  if x.shape[-1] % 2:
    raise ValueError("x's last axis must have an even size (split into halves a, b); "
                     f"got shape {tuple(x.shape)}")


def _gelu_code(approximate):
  return GELU_TANH if approximate else GELU_ERF


def _apply(op, code, x, bias, implementation, reference):
  if implementation == "xla" or x.size == 0:
    return reference()
  cfg = _Config(op=op, activation=code, implementation=implementation)
  # The kernels take the bias in float32; the cast sits outside the
  # custom_vjp so its transpose restores the caller's dtype.
  return _activation(x, None if bias is None else bias.astype(F32), cfg)


def gelu(x, approximate=True, *, implementation=None):
  """GELU, as `jax.nn.gelu(x, approximate)`, in float32 math.

  Differentiable; the backward recomputes the activation from x, so only x
  is saved.

  Args:
    x: any shape, float32, bfloat16 or float16; float64 runs the
      reference in float64; complex x runs jax.nn.gelu.
    approximate: Python bool (static): the tanh form if True, else the
      exact erf form.
    implementation: None takes the policy table's choice for the platform,
      pass, dtype and size (`DEFAULT_IMPLEMENTATION`, `FORWARD_KERNEL_MIN_SIZE`:
      the kernel, or the pure-JAX reference, which XLA fuses, where that is
      faster); "cuda" or "cpu" forces that kernel; "xla" runs the pure-JAX
      reference (`gelu_reference`).

  Returns:
    x's shape and dtype.

  Raises:
    TypeError: x is not float32, bfloat16, float16, float64 or complex;
      `approximate` is not a Python bool.
    ValueError: `implementation` forces a kernel on float64 or complex x, is
      unknown, names kernels this build lacks, or names a platform other
      than the one being compiled for.
  """
  approximate = _check_approximate(approximate)
  _primitive.check_implementation(implementation)  # before jax.nn takes a complex x
  x = _checks.as_array("x", x)
  if _checks.runs_jax_nn("x", x, implementation):
    return jax.nn.gelu(x, approximate)
  x, implementation = _check_x(x, implementation, None)
  return _apply("gelu", _gelu_code(approximate), x, None, implementation,
                lambda: gelu_reference(x, approximate))


def bias_gelu(x, bias, approximate=True, *, implementation=None):
  """GELU of x + bias, the bias added in float32, in one pass.

  Differentiable in x and bias; the bias gradient is summed in float32 inside
  the backward kernel (deterministic partial sums, no atomics).

  Args:
    x: [..., C] float32, bfloat16 or float16 (at least one axis); float64
      runs the reference in float64.
    bias: floating [C].
    approximate: Python bool (static): the tanh form if True, else erf.
    implementation: None takes the policy table's choice for the platform,
      pass, dtype and size (`DEFAULT_IMPLEMENTATION`, `FORWARD_KERNEL_MIN_SIZE`:
      the kernel, or the pure-JAX reference, which XLA fuses, where that is
      faster); "cuda" or "cpu" forces that kernel; "xla" runs the pure-JAX
      reference (`bias_gelu_reference`).

  Returns:
    x's shape and dtype.

  Raises:
    TypeError: x is not float32, bfloat16, float16 or float64; bias is not a
      floating array; `approximate` is not a Python bool.
    ValueError: x is a scalar; bias is not [C]; `implementation` forces a
      kernel on float64, is unknown, names kernels this build lacks, or
      names a platform other than the one being compiled for.
  """
  x, implementation = _check_x(x, implementation, "the bias axis")
  approximate = _check_approximate(approximate)
  bias = _checks.as_array("bias", bias)
  _checks.check_floating("bias", bias)
  cols = x.shape[-1]
  _checks.check_shape("bias", bias, (cols,), f"the size of x's last axis, {cols}")
  return _apply("bias_gelu", _gelu_code(approximate), x, bias, implementation,
                lambda: bias_gelu_reference(x, bias, approximate))


def swiglu(x, *, implementation=None):
  """SwiGLU: silu(a) * b for the halves a, b of x's last axis.

  a = x[..., :C] and b = x[..., C:] (x's last axis is 2C), float32 math.
  Differentiable; the backward recomputes from x.

  Args:
    x: [..., 2C] float32, bfloat16 or float16; float64 runs the reference
      in float64.
    implementation: None takes the policy table's choice for the platform,
      pass, dtype and size (`DEFAULT_IMPLEMENTATION`, `FORWARD_KERNEL_MIN_SIZE`:
      the kernel, or the pure-JAX reference, which XLA fuses, where that is
      faster); "cuda" or "cpu" forces that kernel; "xla" runs the pure-JAX
      reference (`swiglu_reference`).

  Returns:
    [..., C] in x.dtype.

  Raises:
    TypeError: x is not float32, bfloat16, float16 or float64.
    ValueError: x is a scalar or its last axis is odd; `implementation`
      forces a kernel on float64, is unknown, names kernels this build
      lacks, or names a platform other than the one being compiled for.
  """
  x, implementation = _check_x(x, implementation, "the axis split into halves")
  _check_gated(x)
  return _apply("swiglu", SILU, x, None, implementation, lambda: swiglu_reference(x))


def geglu(x, approximate=True, *, implementation=None):
  """GeGLU: gelu(a, approximate) * b for the halves a, b of x's last axis.

  a = x[..., :C] and b = x[..., C:] (x's last axis is 2C), float32 math.
  Differentiable; the backward recomputes from x.

  Args:
    x: [..., 2C] float32, bfloat16 or float16; float64 runs the reference
      in float64.
    approximate: Python bool (static): the tanh form if True, else erf.
    implementation: None takes the policy table's choice for the platform,
      pass, dtype and size (`DEFAULT_IMPLEMENTATION`, `FORWARD_KERNEL_MIN_SIZE`:
      the kernel, or the pure-JAX reference, which XLA fuses, where that is
      faster); "cuda" or "cpu" forces that kernel; "xla" runs the pure-JAX
      reference (`geglu_reference`).

  Returns:
    [..., C] in x.dtype.

  Raises:
    TypeError: x is not float32, bfloat16, float16 or float64; `approximate`
      is not a Python bool.
    ValueError: x is a scalar or its last axis is odd; `implementation`
      forces a kernel on float64, is unknown, names kernels this build
      lacks, or names a platform other than the one being compiled for.
  """
  x, implementation = _check_x(x, implementation, "the axis split into halves")
  approximate = _check_approximate(approximate)
  _check_gated(x)
  return _apply("geglu", _gelu_code(approximate), x, None, implementation,
                lambda: geglu_reference(x, approximate))
