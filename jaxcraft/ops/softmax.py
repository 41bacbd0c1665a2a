"""Softmax over any axes, with jax.nn.softmax's `where` mask.

Flow: `softmax` (checks; the softmax axes moved last and merged into one;
custom_vjp) -> `_fwd_p` / `_bwd_p` (partitioned primitives: batching,
sharding) -> `_fwd_kernel_p` / `_bwd_kernel_p` (FFI targets
`_ffi.SOFTMAX_FWD` / `_ffi.SOFTMAX_BWD`, cpp/ffi/softmax.cc). The
kernels work on the last axis of [rows, cols]: an online max and sum, then
the write; the backward is `dx = y * (dy - sum(dy * y))` from the saved
output y alone.
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

# Where masks travel to the kernel: absent, one [C] row shared by every row
# (a mask that broadcasts over all the other axes, e.g. a padding mask of
# the softmax axis only: never materialized per row), or one per row.
NO_MASK, SHARED_MASK, FULL_MASK = "none", "shared", "full"


# --------------------------------------------- implementation=None policy
# What `implementation=None` runs, per platform and pass: "kernel"
# (jaxcraft's) or "xla" (jax.nn.softmax, which XLA fuses with its producer,
# e.g. the logits' scale or bias add, and consumer; a custom call is a fusion
# barrier). Forward and backward choose independently: the backward kernel
# needs only y and dy, whichever ran the forward.
#   cuda: the kernels for rows up to 512 KiB, the widest that thread-block
#         clusters of 8 blocks hold (sm_90+; without clusters
#         BLOCK_ROW_BYTES below), XLA beyond.
#   cpu:  XLA in float32 and bfloat16 (its vectorized exp fuses and wins),
#         the kernels in float16 (rows converted through F16C: 1.6-3.8x
#         faster than XLA's forward on a 2-core AVX2 machine).
# Regenerate with `python bench/run.py --ops softmax` (forward and
# backward-alone rows), on a GPU for the cuda row and on a CPU-only install
# for the cpu row; the measurements are in docs/benchmarks.md.
DEFAULT_IMPLEMENTATION = {
    # platform: (forward, backward[, the widest row in bytes the forward
    # kernel is chosen for, the widest the backward kernel is]), or a dict
    # of them by dtype name.
    "cuda": ("kernel", "kernel", 512 * 1024, 512 * 1024),
    "cpu": {"float32": ("xla", "xla"), "bfloat16": ("xla", "xla"),
            "float16": ("kernel", "kernel")},
}
PASSES = ("fwd", "bwd")


# The widest rows (bytes: forward, backward) one block holds (the forward's
# rows kernel, the backward's warp kernel of eight warps). Wider rows split
# over thread-block clusters (sm_90+); on a GPU without them they stream
# from global memory twice, slower than XLA.
BLOCK_ROW_BYTES = (64 * 1024, 32 * 1024)


@functools.cache
def _local_gpu_has_clusters() -> bool:
  """Whether this process's first GPU is sm_90+ (False without a GPU, e.g.
  when exporting for CUDA from a CPU machine: the narrower limits)."""
  try:
    device = jax.devices("gpu")[0]
  except RuntimeError:
    return False
  return float(getattr(device, "compute_capability", "0")) >= 9.0


def default_implementation(platform: str, pass_: str = "fwd", row_bytes: int | None = None,
                           clusters: bool | None = None, dtype=jnp.float32) -> str:
  """"kernel" or "xla": what `implementation=None` runs for the forward or
  backward pass (`pass_`) on `platform` for rows of `row_bytes` bytes of
  `dtype` (see DEFAULT_IMPLEMENTATION). `clusters`: whether the GPU has
  thread-block clusters (None: ask this process's GPU)."""
  choice = _primitive.policy_choice(DEFAULT_IMPLEMENTATION.get(platform, ("xla", "xla")), dtype)
  index = PASSES.index(pass_)
  if row_bytes is not None and len(choice) > 2:
    if clusters is None:
      clusters = _local_gpu_has_clusters()
    limit = choice[2 + index] if clusters else min(choice[2 + index], BLOCK_ROW_BYTES[index])
    if row_bytes > limit:
      return "xla"
  return choice[index]

# ---------------------------------------------------------------- reference
def softmax_reference(x, axis=-1, where=None):
  """Pure-JAX softmax (the `implementation="xla"` path): exactly::

      jax.nn.softmax(x, axis=axis, where=where)

  in x's dtype: exp(x - max) / sum over the kept (`where`) elements of
  `axis`; masked-out elements are 0, a row with none kept is all zeros.
  """
  return jax.nn.softmax(x, axis=axis, where=where)


# ------------------------------------------------------- kernel primitives
# 2-D operands: x [rows, cols]; mask [0] (none), [1, cols] or [rows, cols] bool.
def _policy(pass_, platform, avals_in, **_):
  """Why the policy table runs XLA here under implementation=None, or None."""
  x = avals_in[0]  # [rows, cols] here
  row_bytes = x.shape[1] * x.dtype.itemsize
  if default_implementation(platform, pass_, row_bytes, dtype=x.dtype) == "xla":
    return f"the implementation=None policy runs XLA for softmax {pass_} on {platform}"
  return None


def _fwd_kernel_abstract(x, mask, *, implementation):
  return (_primitive.result_aval(x, x.shape, x.dtype, _primitive.row_spec(x, 1)),)


def _fwd_kernel_reference(x, mask, *, implementation):
  return jax.nn.softmax(x, axis=-1, where=mask if mask.size else None),


_fwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_softmax_fwd_kernel", target=_ffi.SOFTMAX_FWD,
    abstract_eval=_fwd_kernel_abstract, reference=_fwd_kernel_reference,
    ffi_attrs=lambda **_: {}, policy=functools.partial(_policy, "fwd"))


def _bwd_kernel_abstract(y, dy, *, implementation):
  return (_primitive.result_aval(y, y.shape, y.dtype, _primitive.row_spec(y, 1)),)


def _bwd_kernel_reference(y, dy, *, implementation):
  yf, dyf = y.astype(F32), dy.astype(F32)
  return (yf * (dyf - jnp.sum(dyf * yf, axis=-1, keepdims=True))).astype(y.dtype),


_bwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_softmax_bwd_kernel", target=_ffi.SOFTMAX_BWD,
    abstract_eval=_bwd_kernel_abstract, reference=_bwd_kernel_reference,
    ffi_attrs=lambda **_: {}, policy=functools.partial(_policy, "bwd"))


# ------------------------------------------------- partitioned primitives
@dataclasses.dataclass(frozen=True)
class _Config:
  """Static params: how the mask travels, and the implementation asked for."""
  mask: str
  implementation: str | None


def _rows2d(a):
  return a.reshape(-1, a.shape[-1])


def _fwd_local(cfg: _Config, x, *mask):
  """The forward on one device's rows: operands x [..., C] and, with a
  mask, mask [..., C] (FULL_MASK) or [C] (SHARED_MASK)."""
  if cfg.mask == NO_MASK:
    m = jnp.zeros((0,), jnp.bool_)
  else:
    m = _rows2d(mask[0]) if cfg.mask == FULL_MASK else mask[0].reshape(1, -1)
  (y,) = _fwd_kernel_p.bind(_rows2d(x), m, implementation=cfg.implementation)
  return [y.reshape(x.shape)]


def _fwd_abstract(x, *mask, cfg):
  # y has x's type, sharding included (with explicit mesh axes its cotangent
  # must match x's). The kernel itself never splits the softmax axis: the
  # partitioning below gathers it and slices the result back.
  return [_primitive.result_aval(x, x.shape, x.dtype, _primitive.row_spec(x, x.ndim))]


def _lead_factors(ndim):
  return " ".join(f"r{i}" for i in range(ndim - 1))


def _row_spec(spec, ndim):
  """The leading (row) axes' sharding kept, the softmax axis whole."""
  lead = tuple(spec)[: ndim - 1] if spec is not None else ()
  return P(*(lead + (None,) * (ndim - 1 - len(lead))), None)


def _make_fwd_partitioned(shapes, *, cfg: _Config):
  ndim = len(shapes[0])
  lead = _lead_factors(ndim)
  mask_operand = {NO_MASK: "", FULL_MASK: f", {lead} c", SHARED_MASK: ", c"}[cfg.mask]
  rule = f"{lead} c{mask_operand} -> {lead} c"

  def choose(mesh, specs):
    row = _row_spec(specs[0], ndim)
    args = [row] + {NO_MASK: [], FULL_MASK: [row], SHARED_MASK: [P(None)]}[cfg.mask]
    return args, [row], [()]

  return _primitive.partitioned_call(
      functools.partial(_fwd_local, cfg), sharding_rule=rule, choose_shardings=choose,
      need_replication_factors=("c",))


def _fwd_batch(args, dims, *, cfg):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
  x = _primitive.move_to_front(args[0], dims[0], size)
  if cfg.mask == NO_MASK:
    return _fwd_p.bind(x, cfg=cfg), [0]
  if cfg.mask == SHARED_MASK and dims[1] is _primitive.NOT_MAPPED:
    return _fwd_p.bind(x, args[1], cfg=cfg), [0]
  # A batched mask (or x batched under a full one): one mask row per row.
  mask = _primitive.move_to_front(args[1], dims[1], size)
  if cfg.mask == SHARED_MASK:  # [B, C] -> x's shape
    mask = jnp.broadcast_to(mask.reshape(size, *(1,) * (x.ndim - 2), -1), x.shape)
  full = dataclasses.replace(cfg, mask=FULL_MASK)
  return _fwd_p.bind(x, mask, cfg=full), [0]


_fwd_p = _primitive.partitioned_primitive(
    "jaxcraft_softmax_fwd", abstract_eval=_fwd_abstract, batching_rule=_fwd_batch,
    make_partitioned=_make_fwd_partitioned)


def _bwd_local(cfg: _Config, y, dy):
  (dx,) = _bwd_kernel_p.bind(_rows2d(y), _rows2d(dy), implementation=cfg.implementation)
  return [dx.reshape(y.shape)]


def _bwd_abstract(y, dy, *, cfg):
  # dx has x's type, which is y's (custom_vjp requires it, sharding included).
  return [_primitive.result_aval(y, y.shape, y.dtype, _primitive.row_spec(y, y.ndim))]


def _make_bwd_partitioned(shapes, *, cfg: _Config):
  ndim = len(shapes[0])
  lead = _lead_factors(ndim)

  def choose(mesh, specs):
    row = _row_spec(specs[0], ndim)
    return [row, row], [row], [()]

  return _primitive.partitioned_call(
      functools.partial(_bwd_local, cfg), sharding_rule=f"{lead} c, {lead} c -> {lead} c",
      choose_shardings=choose, need_replication_factors=("c",))


def _bwd_batch(args, dims, *, cfg):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
  moved = [_primitive.move_to_front(a, d, size) for a, d in zip(args, dims)]
  return _bwd_p.bind(*moved, cfg=cfg), [0]


_bwd_p = _primitive.partitioned_primitive(
    "jaxcraft_softmax_bwd", abstract_eval=_bwd_abstract, batching_rule=_bwd_batch,
    make_partitioned=_make_bwd_partitioned)


# ----------------------------------------------------------------- autodiff
@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _softmax(x, mask, cfg: _Config):
  return _softmax_fwd(x, mask, cfg)[0]


def _softmax_fwd(x, mask, cfg: _Config):
  (y,) = _fwd_p.bind(x, *([] if mask is None else [mask]), cfg=cfg)
  # The backward needs y alone (masked-out elements have y = 0, so dx = 0).
  return y, y


def _softmax_bwd(cfg: _Config, y, dy):
  (dx,) = _bwd_p.bind(y, dy, cfg=cfg)
  return dx, None


_softmax.defvjp(_softmax_fwd, _softmax_bwd)


# ------------------------------------------------------------- public API
def _axes(axis, ndim):
  """`axis` (an int, a tuple of ints or None: all) as sorted non-negative axes."""
  if axis is None:
    axes = tuple(range(ndim))
  else:
    raw = axis if isinstance(axis, (tuple, list)) else (axis,)
    for a in raw:
      if not isinstance(a, (int, np.integer)) or isinstance(a, (bool, np.bool_)):
        raise TypeError(f"axis must be an int, a tuple of ints or None; got {axis!r}")
    axes = tuple(int(a) for a in raw)
    for a in axes:
      if not -ndim <= a < ndim:
        raise ValueError(f"axis {a} is out of bounds for x with {ndim} dimensions "
                         f"(axis={axis!r})")
    axes = tuple(a % ndim for a in axes)
    if len(set(axes)) != len(axes):
      raise ValueError(f"axis must not repeat an axis; got {axis!r}")
  if not axes:
    raise ValueError(f"axis must name at least one axis; got {axis!r}")
  return tuple(sorted(axes))


def _check_where(where, shape):
  where = _checks.as_array("where", where)
  if where.dtype != jnp.bool_:
    raise TypeError(f"where must be a bool array; got dtype {where.dtype}")
  try:
    np.broadcast_shapes(tuple(where.shape), tuple(shape))
    ok = np.broadcast_shapes(tuple(where.shape), tuple(shape)) == tuple(shape)
  except ValueError:
    ok = False
  if not ok:
    raise ValueError(f"where must be broadcastable to x's shape {tuple(shape)}; "
                     f"got shape {tuple(where.shape)}")
  return where


def softmax(x, axis=-1, where=None, *, implementation=None):
  """Softmax over `axis`, as `jax.nn.softmax(x, axis, where)`.

  exp(x - max) / sum(exp(x - max)) over the softmax axes in float32 math,
  output in x.dtype. Masked-out elements (`where` False) are 0, and a row
  with no element kept is all zeros. The gradient is the fused
  y * (dy - sum(dy * y)), computed from the output alone.

  Softmax axes other than the last single axis are moved last (a transpose,
  merged by a reshape); a `where` that broadcasts over all the other axes
  travels to the kernel as one row, any other is broadcast to x's shape.

  Args:
    x: array of at least one axis, float32, bfloat16 or float16; float64
      and complex x run jax.nn.softmax.
    axis: an int, a tuple of distinct ints, or None (all axes).
    where: optional bool array broadcastable to x's shape: the elements to
      include.
    implementation: None takes the policy table's choice for the platform
      and pass (`DEFAULT_IMPLEMENTATION`: the kernel, or XLA where XLA is
      faster); "cuda" or "cpu" forces that kernel; "xla" runs
      jax.nn.softmax itself.

  Returns:
    x's shape and dtype.

  Raises:
    TypeError: x is not float32, bfloat16, float16, float64 or complex;
      `axis` is not an int, a tuple of ints or None; `where` is not bool.
    ValueError: x is a scalar; an axis is out of bounds or repeated, or `axis`
      names none; `where` does not broadcast to x's shape; `implementation`
      forces a kernel on float64, is unknown, names kernels this build lacks,
      or names a platform other than the one being compiled for; it forces a
      kernel on complex x.
  """
  _primitive.check_implementation(implementation)
  x = _checks.as_array("x", x)
  if _checks.runs_jax_nn("x", x, implementation):
    return jax.nn.softmax(x, axis=axis, where=where)
  implementation = _checks.float_implementation("x", x, implementation)
  if x.ndim < 1:
    raise ValueError("x must have at least one axis (the softmax one); got a scalar")
  axes = _axes(axis, x.ndim)
  if where is not None:
    where = _check_where(where, x.shape)
  if implementation == "xla" or x.size == 0:
    return softmax_reference(x, axes, where)

  ndim = x.ndim
  rest = tuple(a for a in range(ndim) if a not in axes)
  perm = rest + axes
  moved = perm != tuple(range(ndim))
  rest_shape = tuple(x.shape[a] for a in rest)
  cols = math.prod(x.shape[a] for a in axes)

  def to_rows(a):
    a = jnp.transpose(a, perm) if moved else a
    return a.reshape(*rest_shape, cols)

  mask, kind = None, NO_MASK
  if where is not None:
    w = where.reshape((1,) * (ndim - where.ndim) + tuple(where.shape))
    if all(w.shape[a] == 1 for a in rest):
      kind = SHARED_MASK
      mask = jnp.broadcast_to(w, tuple(1 if a in rest else x.shape[a] for a in range(ndim)))
      mask = (jnp.transpose(mask, perm) if moved else mask).reshape(cols)
    else:
      kind = FULL_MASK
      mask = to_rows(jnp.broadcast_to(w, x.shape))
  cfg = _Config(mask=kind, implementation=implementation)
  y = _softmax(to_rows(x), mask, cfg)
  y = y.reshape(*rest_shape, *(x.shape[a] for a in axes))
  return jnp.transpose(y, np.argsort(perm)) if moved else y
