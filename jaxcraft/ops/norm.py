"""Layer norm and RMS norm over the last axis, with the fused residual add.

Flow: `layer_norm` / `rms_norm` (checks, custom_vjp) -> `_fwd_p` / `_bwd_p`
(partitioned primitives: batching, sharding) -> `_fwd_kernel_p` /
`_bwd_kernel_p` (FFI targets `_ffi.NORM_FWD` / `_ffi.NORM_BWD`,
cpp/ffi/norm.cc).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from jaxcraft import _ffi, remat
from jaxcraft.ops import _checks, _primitive

F32 = jnp.float32


# ---------------------------------------------------------------- reference
def _normalize(h, scale, bias, epsilon, rms):
  """y, mean, rstd of rows of h (any leading shape), statistics in float32
  (float64 for float64 h)."""
  compute = _checks.compute_dtype(h.dtype)
  hf = h.astype(compute)
  mean = jnp.zeros(h.shape[:-1], compute) if rms else jnp.mean(hf, axis=-1)
  centered = hf if rms else hf - mean[..., None]
  rstd = jax.lax.rsqrt(jnp.mean(jnp.square(centered), axis=-1) + epsilon)
  y = centered * rstd[..., None]
  if scale is not None:
    y = y * scale.astype(compute)
  if bias is not None:
    y = y + bias.astype(compute)
  return y.astype(h.dtype), mean, rstd


def _add_residual(x, residual):
  return x if residual is None else x + residual.astype(x.dtype)


def layer_norm_reference(x, scale=None, bias=None, *, epsilon=1e-6, residual=None):
  """Pure-JAX layer norm (the `implementation="xla"` path). Equivalent to::

      h = x + residual                      # in x.dtype, if residual is given
      hf = h.astype(jnp.float32)
      mean = hf.mean(-1, keepdims=True)
      var = jnp.square(hf - mean).mean(-1, keepdims=True)
      y = ((hf - mean) * jax.lax.rsqrt(var + epsilon) * scale + bias).astype(x.dtype)
      return (y, h) if residual is not None else y
  """
  h = _add_residual(x, residual)
  y = _normalize(h, scale, bias, epsilon, rms=False)[0]
  return y if residual is None else (y, h)


def rms_norm_reference(x, scale=None, *, epsilon=1e-6, residual=None):
  """Pure-JAX RMS norm (the `implementation="xla"` path). Equivalent to::

      h = x + residual                      # in x.dtype, if residual is given
      hf = h.astype(jnp.float32)
      y = (hf * jax.lax.rsqrt(jnp.square(hf).mean(-1, keepdims=True) + epsilon)
           * scale).astype(x.dtype)
      return (y, h) if residual is not None else y
  """
  h = _add_residual(x, residual)
  y = _normalize(h, scale, None, epsilon, rms=True)[0]
  return y if residual is None else (y, h)


# ------------------------------------------------------- kernel primitives
# Operands absent from a call travel as zero-sized arrays (one FFI signature).
def _empty(dtype=F32):
  return jnp.zeros((0,), dtype)


def _present(a):
  return a.size > 0


def _fwd_kernel_abstract(x, residual, scale, bias, *, rms, epsilon, implementation):
  rows = x.shape[0]
  rowwise = _primitive.row_spec(x, 1)
  out = lambda shape, dtype, spec=(): _primitive.result_aval(x, shape, dtype, spec)
  return (out(x.shape, x.dtype, rowwise),
          out(x.shape, x.dtype, rowwise) if residual.size else out((0,), x.dtype),
          out((0,), F32) if rms else out((rows,), F32, rowwise),
          out((rows,), F32, rowwise))


def _fwd_kernel_reference(x, residual, scale, bias, *, rms, epsilon, implementation):
  h = x + residual if _present(residual) else x
  y, mean, rstd = _normalize(h, scale if _present(scale) else None,
                             bias if _present(bias) else None, epsilon, rms)
  return y, (h if _present(residual) else _empty(x.dtype)), (_empty() if rms else mean), rstd


# What implementation=None runs per platform: the kernel, or XLA's fusion of
# the pure-JAX reference. On a GPU, XLA's norm between matmuls (as in a model)
# took 0.37-0.95 of the kernel's time at every row count from 1 to 16384 rows
# of 2048 columns, forward and forward + backward (H200): XLA fuses the norm
# with the residual add and the elementwise ops beside it, where the custom
# call is a fusion barrier and costs a launch. Regenerate the decision:
# `python bench/run.py --ops norm_rows` on the GPU (docs/benchmarks.md).
DEFAULT_IMPLEMENTATION = {"cpu": "kernel", "cuda": "xla"}


def default_implementation(platform: str) -> str:
  """"kernel" or "xla": what implementation=None runs on `platform`."""
  return DEFAULT_IMPLEMENTATION.get(platform, "xla")


def _policy(platform, avals_in, **_):
  """Why the policy table runs XLA here under implementation=None, or None."""
  if default_implementation(platform) == "xla":
    return f"the implementation=None policy runs XLA's norm on {platform}"
  return None


_fwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_norm_fwd_kernel", target=_ffi.NORM_FWD,
    abstract_eval=_fwd_kernel_abstract, reference=_fwd_kernel_reference,
    ffi_attrs=lambda *, rms, epsilon, implementation: dict(rms=rms, epsilon=np.float32(epsilon)),
    policy=_policy)


def _bwd_kernel_abstract(dy, h, scale, mean, rstd, dh_extra, *, rms, num_partials,
                         want_dscale, want_dbias, implementation):
  out = lambda shape, dtype, spec=(): _primitive.result_aval(dy, shape, dtype, spec)
  part = lambda want: out((num_partials, dy.shape[1]) if want else (0,), F32)
  return out(dy.shape, dy.dtype, _primitive.row_spec(dy, 1)), part(want_dscale), part(want_dbias)


def _bwd_kernel_reference(dy, h, scale, mean, rstd, dh_extra, *, rms, num_partials,
                          want_dscale, want_dbias, implementation):
  dyf = dy.astype(F32)
  xhat = (h.astype(F32) - (0.0 if rms else mean[:, None])) * rstd[:, None]
  g = dyf * scale if _present(scale) else dyf
  mean_gx = jnp.mean(g * xhat, axis=-1, keepdims=True)
  mean_g = 0.0 if rms else jnp.mean(g, axis=-1, keepdims=True)
  dh = rstd[:, None] * (g - mean_g - xhat * mean_gx)
  if _present(dh_extra):
    dh = dh + dh_extra.astype(F32)

  def partials(total, want):
    if not want:
      return _empty()
    return jnp.zeros((num_partials, dy.shape[1]), F32).at[0].set(total)

  return (dh.astype(dy.dtype), partials(jnp.sum(dyf * xhat, 0), want_dscale),
          partials(jnp.sum(dyf, 0), want_dbias))


_bwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_norm_bwd_kernel", target=_ffi.NORM_BWD,
    abstract_eval=_bwd_kernel_abstract, reference=_bwd_kernel_reference,
    ffi_attrs=lambda *, rms, implementation, **_: dict(rms=rms), policy=_policy)

# Rows per partial sum of dscale/dbias: the partial rows are written and read
# once more, 16 bytes per column each, so 32+ rows per partial keeps that
# traffic under ~5% of the backward's; 1024 partials fill any current GPU.
_ROWS_PER_PARTIAL = 32
_MAX_PARTIALS = 1024


def _num_partials(rows: int) -> int:
  return max(1, min(_MAX_PARTIALS, math.ceil(rows / _ROWS_PER_PARTIAL)))


# ------------------------------------------------- partitioned primitives
@dataclasses.dataclass(frozen=True)
class _FwdConfig:
  """Static params of the forward: which optional operands are present."""
  rms: bool
  epsilon: float
  has_residual: bool
  has_scale: bool
  has_bias: bool
  implementation: str | None


def _fwd_local(cfg: _FwdConfig, x, *rest):
  """The forward on one device's rows: operands in order x, residual?, scale?, bias?."""
  rest = list(rest)
  take = lambda present, dtype=F32: rest.pop(0) if present else _empty(dtype)
  residual, scale, bias = take(cfg.has_residual, x.dtype), take(cfg.has_scale), take(cfg.has_bias)
  lead, cols = x.shape[:-1], x.shape[-1]
  rows2d = lambda a: a.reshape(-1, cols) if _present(a) else a
  y, h, mean, rstd = _fwd_kernel_p.bind(
      rows2d(x), rows2d(residual), scale, bias,
      rms=cfg.rms, epsilon=cfg.epsilon, implementation=cfg.implementation)
  outs = [y.reshape(x.shape)]
  if cfg.has_residual:
    outs.append(h.reshape(x.shape))
  if not cfg.rms:
    outs.append(mean.reshape(lead))
  outs.append(rstd.reshape(lead))
  return outs


def _fwd_abstract(x, *rest, cfg):
  lead = _primitive.row_spec(x, x.ndim - 1)
  out = lambda shape, dtype: _primitive.result_aval(x, shape, dtype, lead)
  stats = out(x.shape[:-1], F32)
  return [out(x.shape, x.dtype)] * (1 + cfg.has_residual) + [stats] * (1 + (not cfg.rms))


def _lead_factors(ndim):
  return " ".join(f"r{i}" for i in range(ndim - 1))


def _row_specs(spec, ndim):
  """Keep the sharding of the leading (row) axes; the normalized axis whole."""
  lead = tuple(spec)[: ndim - 1] if spec is not None else ()
  lead = lead + (None,) * (ndim - 1 - len(lead))
  return P(*lead, None), P(*lead), tuple(a for a in lead if a is not None)


def _flatten_axes(axes):
  out = []
  for a in axes:
    out.extend(a if isinstance(a, tuple) else (a,))
  return tuple(out)


def _make_fwd_partitioned(shapes, *, cfg: _FwdConfig):
  ndim = len(shapes[0])
  lead = _lead_factors(ndim)
  operands = [f"{lead} c"] + [f"{lead} c"] * cfg.has_residual + ["c"] * (cfg.has_scale + cfg.has_bias)
  results = [f"{lead} c"] * (1 + cfg.has_residual) + [lead] * (1 + (not cfg.rms))

  def choose(mesh, specs):
    row, stat, _ = _row_specs(specs[0], ndim)
    args = [row] * (1 + cfg.has_residual) + [P(None)] * (cfg.has_scale + cfg.has_bias)
    res = [row] * (1 + cfg.has_residual) + [stat] * (1 + (not cfg.rms))
    return args, res, [()] * len(res)

  return _primitive.partitioned_call(
      functools.partial(_fwd_local, cfg), sharding_rule=", ".join(operands) + " -> " + ", ".join(results),
      choose_shardings=choose, need_replication_factors=("c",))


def _fwd_batch(args, dims, *, cfg):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
  n_rows = 1 + cfg.has_residual
  if any(d is not _primitive.NOT_MAPPED for d in dims[n_rows:]):
    # Batched scale/bias: one kernel call per batch element.
    moved = [_primitive.move_to_front(a, d, size) for a, d in zip(args, dims)]
    outs = jax.lax.map(lambda ops: _fwd_p.bind(*ops, cfg=cfg), moved)
    return outs, [0] * len(outs)
  moved = [_primitive.move_to_front(a, d, size) for a, d in zip(args[:n_rows], dims[:n_rows])]
  outs = _fwd_p.bind(*moved, *args[n_rows:], cfg=cfg)
  return outs, [0] * len(outs)


_fwd_p = _primitive.partitioned_primitive(
    "jaxcraft_norm_fwd", abstract_eval=_fwd_abstract, batching_rule=_fwd_batch,
    make_partitioned=_make_fwd_partitioned)


@dataclasses.dataclass(frozen=True)
class _BwdConfig:
  rms: bool
  has_scale: bool
  want_dscale: bool
  want_dbias: bool
  has_dh_extra: bool
  implementation: str | None


def _bwd_local(cfg: _BwdConfig, dy, h, *rest):
  """Operands: dy, h, scale?, mean? (layer norm), rstd, dh_extra?."""
  rest = list(rest)
  take = lambda present, dtype=F32: rest.pop(0) if present else _empty(dtype)
  scale = take(cfg.has_scale)
  mean = take(not cfg.rms)
  rstd = take(True)
  dh_extra = take(cfg.has_dh_extra, dy.dtype)
  cols = dy.shape[-1]
  rows2d = lambda a: a.reshape(-1, cols) if _present(a) else a
  flat = lambda a: a.reshape(-1) if _present(a) else a
  rows = math.prod(dy.shape[:-1])
  dh, dscale_part, dbias_part = _bwd_kernel_p.bind(
      rows2d(dy), rows2d(h), scale, flat(mean), flat(rstd), rows2d(dh_extra),
      rms=cfg.rms, num_partials=_num_partials(rows), want_dscale=cfg.want_dscale,
      want_dbias=cfg.want_dbias, implementation=cfg.implementation)
  outs = [dh.reshape(dy.shape)]
  if cfg.want_dscale:
    outs.append(jnp.sum(dscale_part, axis=0))
  if cfg.want_dbias:
    outs.append(jnp.sum(dbias_part, axis=0))
  return outs


def _bwd_abstract(dy, *rest, cfg):
  dh = _primitive.result_aval(dy, dy.shape, dy.dtype, _primitive.row_spec(dy, dy.ndim - 1))
  param = _primitive.result_aval(dy, dy.shape[-1:], F32)
  return [dh] + [param] * (cfg.want_dscale + cfg.want_dbias)


def _make_bwd_partitioned(shapes, *, cfg: _BwdConfig):
  ndim = len(shapes[0])
  lead = _lead_factors(ndim)
  operands = ([f"{lead} c"] * 2 + ["c"] * cfg.has_scale + [lead] * (1 + (not cfg.rms))
              + [f"{lead} c"] * cfg.has_dh_extra)
  results = [f"{lead} c"] + ["c"] * (cfg.want_dscale + cfg.want_dbias)
  n_params = cfg.want_dscale + cfg.want_dbias

  def choose(mesh, specs):
    row, stat, row_axes = _row_specs(specs[0], ndim)
    args = ([row] * 2 + [P(None)] * cfg.has_scale + [stat] * (1 + (not cfg.rms))
            + [row] * cfg.has_dh_extra)
    res = [row] + [P(None)] * n_params
    # Parameter gradients sum over rows: add up the shards' sums.
    return args, res, [()] + [_flatten_axes(row_axes)] * n_params

  return _primitive.partitioned_call(
      functools.partial(_bwd_local, cfg), sharding_rule=", ".join(operands) + " -> " + ", ".join(results),
      choose_shardings=choose, need_replication_factors=("c",))


def _bwd_batch(args, dims, *, cfg):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
  moved = [_primitive.move_to_front(a, d, size) for a, d in zip(args, dims)]
  if cfg.has_scale and dims[2] is not _primitive.NOT_MAPPED:
    outs = jax.lax.map(lambda ops: _bwd_p.bind(*ops, cfg=cfg), moved)
    return outs, [0] * len(outs)
  # Row operands batched, scale shared: dh from the kernel; per-example
  # parameter gradients (which vmap must keep apart) from an XLA reduction.
  if cfg.has_scale:
    moved[2] = args[2]
  row_cfg = dataclasses.replace(cfg, want_dscale=False, want_dbias=False)
  (dh,) = _bwd_p.bind(*moved, cfg=row_cfg)
  outs = [dh]
  if cfg.want_dscale or cfg.want_dbias:
    dy, h = moved[0].astype(F32), moved[1].astype(F32)
    stats = moved[2 + cfg.has_scale:]  # mean? (layer norm), rstd
    mean = 0.0 if cfg.rms else stats[0][..., None]
    rstd = stats[0 if cfg.rms else 1][..., None]
    axes = tuple(range(1, dy.ndim - 1))
    if cfg.want_dscale:
      outs.append(jnp.sum(dy * (h - mean) * rstd, axis=axes))
    if cfg.want_dbias:
      outs.append(jnp.sum(dy, axis=axes))
  return outs, [0] * len(outs)


_bwd_p = _primitive.partitioned_primitive(
    "jaxcraft_norm_bwd", abstract_eval=_bwd_abstract, batching_rule=_bwd_batch,
    make_partitioned=_make_bwd_partitioned)


# ----------------------------------------------------------------- autodiff
@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _norm(x, residual, scale, bias, cfg: _FwdConfig):
  return _norm_fwd(x, residual, scale, bias, cfg)[0]


def _norm_fwd(x, residual, scale, bias, cfg: _FwdConfig):
  present = [a for a in (x, residual, scale, bias) if a is not None]
  outs = _fwd_p.bind(*present, cfg=cfg)
  # Named for jax.checkpoint policies (jaxcraft.remat). The statistics alone
  # would not spare a rerun of the forward kernel: the next layer's backward
  # (a matmul's weight gradient) reads y (and the fused add's h), which only
  # the kernel computes, so those are named too.
  n_out = 1 + cfg.has_residual
  outs = (checkpoint_name(list(outs[:n_out]), remat.NORM_OUT)
          + checkpoint_name(list(outs[n_out:]), remat.NORM_STATS))
  y = outs.pop(0)
  h = outs.pop(0) if cfg.has_residual else x
  mean = None if cfg.rms else outs.pop(0)
  rstd = outs.pop(0)
  primal = (y, h) if cfg.has_residual else y
  return primal, (h, scale, mean, rstd, bias)


def _norm_bwd(cfg: _FwdConfig, saved, ct):
  h, scale, mean, rstd, saved_bias = saved
  dy, dh_extra = ct if cfg.has_residual else (ct, None)
  bcfg = _BwdConfig(rms=cfg.rms, has_scale=cfg.has_scale, want_dscale=cfg.has_scale,
              want_dbias=cfg.has_bias, has_dh_extra=cfg.has_residual,
              implementation=cfg.implementation)
  operands = [a for a in (dy, h, scale, mean, rstd, dh_extra) if a is not None]
  outs = list(_bwd_p.bind(*operands, cfg=bcfg))
  dh = outs.pop(0)
  dscale = _primitive.sum_to_match(outs.pop(0), scale) if cfg.has_scale else None
  dbias = _primitive.sum_to_match(outs.pop(0), saved_bias) if cfg.has_bias else None
  return dh, (dh if cfg.has_residual else None), dscale, dbias


_norm.defvjp(_norm_fwd, _norm_bwd)


# ------------------------------------------------------------- public API
def _checked(x, scale, bias, residual, epsilon, implementation):
  _primitive.check_implementation(implementation)
  x = _checks.as_array("x", x)
  implementation = _checks.float_implementation("x", x, implementation)
  if x.ndim < 1:
    raise ValueError("x must have at least one axis (the normalized one); got a scalar")
  cols = x.shape[-1]
  params = []
  for pname, p in (("scale", scale), ("bias", bias)):
    if p is not None:
      p = _checks.as_array(pname, p)
      _checks.check_floating(pname, p)
      _checks.check_shape(pname, p, (cols,), f"the size of x's last axis, {cols}")
    params.append(p)
  if residual is not None:
    residual = _checks.as_array("residual", residual)
    _checks.check_floating("residual", residual)
    _checks.check_shape("residual", residual, x.shape, "the shape of x")
  epsilon = _checks.static_float("epsilon", epsilon)
  if not epsilon >= 0:
    raise ValueError(f"epsilon must be >= 0; got {epsilon}")
  return x, params[0], params[1], residual, epsilon, implementation


def _apply(x, scale, bias, residual, epsilon, rms, implementation, reference):
  if implementation == "xla" or x.shape[-1] == 0:
    kwargs = dict(epsilon=epsilon, residual=residual)
    return reference(x, scale, **kwargs) if rms else reference(x, scale, bias, **kwargs)
  cfg = _FwdConfig(rms=rms, epsilon=epsilon, has_residual=residual is not None,
             has_scale=scale is not None, has_bias=bias is not None,
             implementation=implementation)
  # The kernels take parameters in float32 and h in x.dtype; the casts sit
  # outside the custom_vjp so their transposes restore the callers' dtypes.
  f32 = lambda p: None if p is None else p.astype(F32)
  residual = None if residual is None else residual.astype(x.dtype)
  return _norm(x, residual, f32(scale), f32(bias), cfg)


def layer_norm(x, scale=None, bias=None, *, epsilon=1e-6, residual=None, implementation=None):
  """Layer norm over the last axis, with an optional fused residual add.

  y = (h - mean(h)) / sqrt(var(h) + epsilon) * scale + bias over the last
  axis, statistics in float32 (float64 for float64 x), where h = x, or
  h = x + residual (added in x.dtype) with `residual`: the pre-norm
  transformer's add + norm in one kernel. Differentiable in x, scale, bias
  and residual.

  Args:
    x: [..., C] float32, bfloat16 or float16 (at least one axis); float64
      runs the reference in float64.
    scale: optional floating [C]; None means ones.
    bias: optional floating [C]; None means zeros.
    epsilon: Python float >= 0 (static), added to the variance.
    residual: optional floating array of x's shape, cast to x.dtype.
    implementation: None runs what `DEFAULT_IMPLEMENTATION` names for the
      platform being compiled for: the CPU kernel on CPU; on CUDA the
      pure-JAX reference, which XLA fuses with the ops beside it and which
      measured faster inside a model; elsewhere the reference. "cuda" or
      "cpu" forces that kernel; "xla" runs the pure-JAX reference
      (`layer_norm_reference`).

  Returns:
    y, x's shape and dtype; with `residual`, the pair (y, h), both of x's
    shape and dtype.

  Raises:
    TypeError: x is not float32, bfloat16, float16 or float64; scale, bias or
      residual is not a floating array; epsilon is traced or not a float.
    ValueError: x is a scalar; scale or bias is not [C]; residual does not
      have x's shape; epsilon < 0; `implementation` forces a kernel on
      float64, is unknown, names kernels this build lacks, or names a platform
      other than the one being compiled for.
  """
  x, scale, bias, residual, epsilon, implementation = _checked(
      x, scale, bias, residual, epsilon, implementation)
  return _apply(x, scale, bias, residual, epsilon, False, implementation, layer_norm_reference)


def rms_norm(x, scale=None, *, epsilon=1e-6, residual=None, implementation=None):
  """RMS norm over the last axis, with an optional fused residual add.

  y = h / sqrt(mean(h^2) + epsilon) * scale over the last axis, statistics
  in float32 (float64 for float64 x), where h = x, or h = x + residual
  (added in x.dtype) with `residual`. Differentiable in x, scale and residual.

  Args:
    x: [..., C] float32, bfloat16 or float16 (at least one axis); float64
      runs the reference in float64.
    scale: optional floating [C]; None means ones.
    epsilon: Python float >= 0 (static), added to the mean square.
    residual: optional floating array of x's shape, cast to x.dtype.
    implementation: as in `layer_norm` (the reference is
      `rms_norm_reference`).

  Returns:
    y, x's shape and dtype; with `residual`, the pair (y, h), both of x's
    shape and dtype.

  Raises:
    TypeError: as `layer_norm`.
    ValueError: as `layer_norm`.
  """
  x, scale, _, residual, epsilon, implementation = _checked(
      x, scale, None, residual, epsilon, implementation)
  return _apply(x, scale, None, residual, epsilon, True, implementation, rms_norm_reference)
