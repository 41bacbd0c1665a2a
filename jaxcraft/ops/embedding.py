"""Embedding lookup: rows of a [V, D] table gathered by integer ids, whose
gradient scatter-adds the output's cotangent back into the table's rows.

Flow: `embedding_lookup` (checks, ids to int32, custom_vjp) -> `_fwd_p` /
`_bwd_p` (partitioned primitives: batching, sharding) -> `_fwd_kernel_p` /
`_bwd_kernel_p` (FFI targets `_ffi.EMBEDDING_FWD` / `_ffi.EMBEDDING_BWD`,
cpp/ffi/embedding.cc).

Sharding (sharded `jax.jit`): ids sharded over any axes run locally, each
device looking up its ids in its copy of the table; a table sharded over D
(the last axis) runs locally too, its output sharded over D (unless D's mesh
axis already shards the ids: then the table is gathered along D). A table
sharded over V (rows) is all-gathered along V before the lookup: every
device needs every row its ids may read. The table gradient is computed per
device from its ids and summed (psum) over the ids' mesh axes.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir
from jax.sharding import AxisType, PartitionSpec as P

from jaxcraft import _ffi
from jaxcraft.ops import _checks, _primitive

F32 = jnp.float32
I32 = jnp.int32
_INT32_MAX = np.iinfo(np.int32).max

# jnp.take's modes -> `enum class EmbeddingMode` in cpp/contract/embedding.h.
MODES = {"fill": 0, "clip": 1, "wrap": 2}


# --------------------------------------------- implementation=None policy
# What `implementation=None` runs, per platform and pass: "kernel"
# (jaxcraft's) or "xla" (the pure-JAX reference: XLA's gather, and its
# scatter-add into float32 zeros for the backward).
#   cuda: the kernels: on the H100 their forward is 2.0-3.2x faster than
#         XLA's gather and their fwd+bwd 3.5-8.9x faster (bf16 tables).
#   cpu:  the kernels: XLA's CPU scatter-add is slower than the kernel's
#         per-row sums, and its gather slower than or tied with the kernel.
# Regenerate with `python bench/run.py --ops embedding`, on a GPU for the
# cuda row and on a CPU-only install for the cpu row; the measurements are
# in docs/benchmarks.md.
DEFAULT_IMPLEMENTATION = {
    # platform: (forward, backward)
    "cuda": ("kernel", "kernel"),
    "cpu": ("kernel", "kernel"),
}
PASSES = ("fwd", "bwd")


def default_implementation(platform: str, pass_: str = "fwd") -> str:
  """"kernel" or "xla": what `implementation=None` runs for the forward or
  backward pass on `platform` (see DEFAULT_IMPLEMENTATION)."""
  return DEFAULT_IMPLEMENTATION.get(platform, ("xla", "xla"))[PASSES.index(pass_)]


def _policy(pass_, platform, avals_in, **_):
  """Why the policy table runs XLA here under implementation=None, or None."""
  if default_implementation(platform, pass_) == "xla":
    return f"the implementation=None policy runs XLA for the embedding {pass_} on {platform}"
  return None


# ---------------------------------------------------------------- reference
def embedding_lookup_reference(table, ids, *, mode=None, fill_value=None):
  """Pure-JAX embedding lookup (the `implementation="xla"` path). Equivalent to::

      jnp.take(table, ids, axis=0, mode=mode, fill_value=fill_value)

  Its gradient (JAX's autodiff of the gather) scatter-adds the cotangent's
  rows into zeros in table.dtype.
  """
  return jnp.take(table, ids, axis=0, mode=mode, fill_value=fill_value)


def table_rows(ids, rows: int, mode: str):
  """The table row each id reads, as the kernels compute it (`embedding_row`
  in contract/embedding.h), with `rows` where an id reads none (fill mode, out of range)."""
  if mode == "clip":
    return jnp.clip(ids, 0, rows - 1)
  if mode == "wrap":
    return jnp.mod(ids, rows)  # floor modulo: in [0, rows) for negative ids too
  r = jnp.where(ids < 0, ids + rows, ids)
  return jnp.where((r < 0) | (r >= rows), rows, r)


# ------------------------------------------------------- kernel primitives
def _empty(dtype=I32):
  return jnp.zeros((0,), dtype)


def _vma(aval) -> frozenset:
  vma = getattr(aval, "vma", None)
  if vma is None:
    vma = getattr(getattr(aval, "mat", None), "varying", frozenset())
  return frozenset(vma)


def _result(like, others, shape, dtype, spec=()):
  """`_primitive.result_aval`, varying (inside shard_map) over the manual
  axes of `like` and of every aval in `others`: the output depends on all."""
  aval = _primitive.result_aval(like, shape, dtype, spec)
  union = frozenset().union(_vma(like), *(_vma(o) for o in others))
  if union == _vma(aval):
    return aval
  if hasattr(aval, "mat"):
    return aval.update(manual_axis_type=aval.mat.update(varying=union))
  return aval.update(vma=union)


def _out_spec(table, ids):
  """The output's sharding: the ids', then D's unless an id axis uses its mesh axis."""
  lead = _primitive.row_spec(ids, ids.ndim)
  return lead + (_dim_spec(_primitive.row_spec(table, 2)[1], lead),)


def _fwd_kernel_abstract(table, ids, *, mode, fill_value, implementation):
  spec = _out_spec(table, ids)
  return (_result(ids, [table], (ids.shape[0], table.shape[1]), table.dtype, spec),)


def _fwd_kernel_reference(table, ids, *, mode, fill_value, implementation):
  return (jnp.take(table, ids, axis=0, mode=mode, fill_value=fill_value),)


_fwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_embedding_fwd_kernel", target=_ffi.EMBEDDING_FWD,
    abstract_eval=_fwd_kernel_abstract, reference=_fwd_kernel_reference,
    ffi_attrs=lambda *, mode, fill_value, implementation: dict(
        mode=np.int32(MODES[mode]), fill_value=np.float32(fill_value)),
    policy=functools.partial(_policy, "fwd"))


def _scratch_shape(dout, sorted_rows):
  """The fast CUDA path's float32 sums for 16-bit tables (see contract/embedding.h)."""
  fast = sorted_rows.shape[0] == 0
  return tuple(dout.shape) if fast and dout.dtype != F32 else (0,)


def _index_shape(rows, ids):
  """The kernels' int32 row index scratch (contract/embedding.h: embedding_index_entries)."""
  return (3 * rows + 1 + ids.shape[0],)


def _bwd_kernel_abstract(dout, ids, sorted_rows, order, *, mode, rows, implementation):
  out = lambda shape, dtype, spec=(): _result(dout, [ids], shape, dtype, spec)
  dim = dout.shape[1]
  return (out((rows, dim), dout.dtype, (None, _primitive.row_spec(dout, 2)[1])),
          out(_scratch_shape(dout, sorted_rows), F32), out(_index_shape(rows, ids), I32))


def _bwd_kernel_reference(dout, ids, sorted_rows, order, *, mode, rows, implementation):
  # Float32 sums, as the kernels (XLA's own gradient of jnp.take adds in table.dtype).
  dtable = jnp.zeros((rows, dout.shape[1]), F32).at[table_rows(ids, rows, mode)].add(
      dout.astype(F32), mode="drop")
  # Unused scratch outputs: XLA removes them (the kernels' call is gone).
  return (dtable.astype(dout.dtype), jnp.zeros(_scratch_shape(dout, sorted_rows), F32),
          jnp.zeros(_index_shape(rows, ids), I32))


_bwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_embedding_bwd_kernel", target=_ffi.EMBEDDING_BWD,
    abstract_eval=_bwd_kernel_abstract, reference=_bwd_kernel_reference,
    ffi_attrs=lambda *, mode, rows, implementation: dict(mode=np.int32(MODES[mode])),
    policy=functools.partial(_policy, "bwd"))


# ------------------------------------------------- partitioned primitives
@dataclasses.dataclass(frozen=True)
class _Config:
  """Static params of a lookup (forward and backward)."""
  mode: str            # "fill", "clip" or "wrap"
  fill_value: float    # already rounded to the table's dtype
  rows: int            # V: the kernels always see whole table rows
  deterministic: bool  # backward: sorted segment sums instead of atomics
  implementation: str | None


def _fwd_local(cfg: _Config, table, ids):
  (out,) = _fwd_kernel_p.bind(table, ids.reshape(-1), mode=cfg.mode, fill_value=cfg.fill_value,
                              implementation=cfg.implementation)
  return [out.reshape(*ids.shape, table.shape[1])]


def _sort_rows(ids, *, rows, mode):
  """Ids grouped by table row, positions ascending within a row (a stable
  sort): the order in which the deterministic kernel sums each row."""
  keys = table_rows(ids, rows, mode)
  return jax.lax.sort((keys, jnp.arange(ids.shape[0], dtype=I32)), num_keys=1, is_stable=True)


# The sort as a primitive of its own: lowered (to XLA's sort) only on each
# device's ids. Traced inline, jax.lax.sort would refuse the global, sharded
# ids that custom_partitioning traces the local function with (explicit meshes).
_sort_rows_p = _primitive.new_primitive(
    "jaxcraft_embedding_sort_rows",
    lambda ids, *, rows, mode: (_result(ids, [], ids.shape, I32, _primitive.row_spec(ids, 1)),) * 2)
mlir.register_lowering(_sort_rows_p, mlir.lower_fun(
    lambda ids, **kw: list(_sort_rows(ids, **kw)), multiple_results=True))


def _bwd_local(cfg: _Config, dout, ids):
  ids = ids.reshape(-1)
  if cfg.deterministic:
    sorted_rows, order = _sort_rows_p.bind(ids, rows=cfg.rows, mode=cfg.mode)
  else:
    sorted_rows = order = _empty()
  dtable, _, _ = _bwd_kernel_p.bind(dout.reshape(-1, dout.shape[-1]), ids, sorted_rows, order,
                                    mode=cfg.mode, rows=cfg.rows,
                                    implementation=cfg.implementation)
  return [dtable]


def _id_factors(ndim):
  return " ".join(f"i{k}" for k in range(ndim))


def _flatten_axes(entries) -> tuple:
  out = []
  for a in entries:
    if a is not None:
      out.extend(a if isinstance(a, tuple) else (a,))
  return tuple(out)


def _padded(spec, ndim):
  spec = tuple(spec) if spec is not None else ()
  return (spec + (None,) * ndim)[:ndim]


def _dim_spec(spec_entry, id_entries):
  """D's sharding, kept only when it shares no mesh axis with the ids'."""
  if spec_entry is None or set(_flatten_axes([spec_entry])) & set(_flatten_axes(id_entries)):
    return None
  return spec_entry


def _make_fwd_partitioned(shapes, *, cfg: _Config):
  ndim = len(shapes[1])
  ids = _id_factors(ndim)

  def choose(mesh, specs):
    lead = _padded(specs[1], ndim)
    dim = _dim_spec(_padded(specs[0], 2)[1], lead)
    # Rows whole (V-sharded tables are gathered), D as the table has it.
    return [P(None, dim), P(*lead)], [P(*lead, dim)], [()]

  return _primitive.partitioned_call(
      functools.partial(_fwd_local, cfg), sharding_rule=f"v d, {ids} -> {ids} d",
      choose_shardings=choose, need_replication_factors=("v",))


def _make_bwd_partitioned(shapes, *, cfg: _Config):
  ndim = len(shapes[1])
  ids = _id_factors(ndim)

  def choose(mesh, specs):
    lead = _padded(specs[1], ndim)
    dim = _dim_spec(_padded(specs[0], ndim + 1)[ndim], lead)
    # Each device's ids add into a whole-table gradient: sum over their axes.
    return [P(*lead, dim), P(*lead)], [P(None, dim)], [_flatten_axes(lead)]

  return _primitive.partitioned_call(
      functools.partial(_bwd_local, cfg), sharding_rule=f"{ids} d, {ids} -> v d",
      choose_shardings=choose, reduction_factors=tuple(ids.split()))


def _fwd_abstract(table, ids, *, cfg):
  spec = _out_spec(table, ids)
  return [_result(ids, [table], (*ids.shape, table.shape[1]), table.dtype, spec)]


def _bwd_abstract(dout, ids, *, cfg):
  return [_result(dout, [ids], (cfg.rows, dout.shape[-1]), dout.dtype,
                  (None, _primitive.row_spec(dout, dout.ndim)[-1]))]


def _folded_rows(ids, batch, cfg: _Config):
  """Ids [batch, ...] into a [batch * V, D] table of `batch` stacked tables:
  example b's id reads row b * V + r; ids that read no row read none there."""
  keys = table_rows(ids, cfg.rows, cfg.mode)
  offsets = (jnp.arange(batch, dtype=I32) * cfg.rows).reshape(batch, *([1] * (ids.ndim - 1)))
  return jnp.where(keys == cfg.rows, batch * cfg.rows, keys + offsets)


def _can_fold(batch, cfg: _Config) -> bool:
  return batch * cfg.rows + 1 < _INT32_MAX


def _fwd_batch(args, dims, *, cfg):
  (table, ids), (table_dim, ids_dim) = args, dims
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
  ids = _primitive.move_to_front(ids, ids_dim, size)
  if table_dim is _primitive.NOT_MAPPED:
    return _fwd_p.bind(table, ids, cfg=cfg), [0]
  table = jnp.moveaxis(table, table_dim, 0)
  if not _can_fold(size, cfg):
    return jax.lax.map(lambda ops: _fwd_p.bind(*ops, cfg=cfg), (table, ids)), [0]
  # Per-example tables: one lookup into the stacked tables.
  folded = dataclasses.replace(cfg, mode="fill", rows=size * cfg.rows)
  return _fwd_p.bind(table.reshape(-1, table.shape[-1]), _folded_rows(ids, size, cfg),
                     cfg=folded), [0]


def _bwd_batch(args, dims, *, cfg):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
  dout, ids = (_primitive.move_to_front(a, d, size) for a, d in zip(args, dims))
  if not _can_fold(size, cfg):
    return jax.lax.map(lambda ops: _bwd_p.bind(*ops, cfg=cfg), (dout, ids)), [0]
  # Per-example table gradients: one backward into stacked tables.
  folded = dataclasses.replace(cfg, mode="fill", rows=size * cfg.rows)
  (dtable,) = _bwd_p.bind(dout, _folded_rows(ids, size, cfg), cfg=folded)
  return [dtable.reshape(size, cfg.rows, dtable.shape[-1])], [0]


_fwd_p = _primitive.partitioned_primitive(
    "jaxcraft_embedding_fwd", abstract_eval=_fwd_abstract, batching_rule=_fwd_batch,
    make_partitioned=_make_fwd_partitioned)

_bwd_p = _primitive.partitioned_primitive(
    "jaxcraft_embedding_bwd", abstract_eval=_bwd_abstract, batching_rule=_bwd_batch,
    make_partitioned=_make_bwd_partitioned)


# ----------------------------------------------------------------- autodiff
@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _lookup(table, ids, cfg: _Config):
  return _fwd_p.bind(table, ids, cfg=cfg)[0]


def _lookup_fwd(table, ids, cfg: _Config):
  # An empty slice of the table carries its manual-axis variance (shard_map)
  # to the backward at no cost: the gradient is summed where the table is shared.
  return _lookup(table, ids, cfg), (ids, table[:0, :0])


def _as_typed_like(grad, like):
  """With explicit mesh axes a cotangent's type carries the primal's
  sharding: the gradient (whole rows) resharded as the table is (V-sharded)."""
  want = jax.typeof(like).sharding
  explicit = any(t == AxisType.Explicit for t in getattr(want.mesh, "axis_types", ()))
  if not explicit or tuple(jax.typeof(grad).sharding.spec) == tuple(want.spec):
    return grad
  return jax.sharding.reshard(grad, want)


def _lookup_bwd(cfg: _Config, saved, dout):
  ids, table_like = saved
  (dtable,) = _bwd_p.bind(dout, ids, cfg=cfg)
  return _as_typed_like(_primitive.sum_to_match(dtable, table_like), table_like), None


_lookup.defvjp(_lookup_fwd, _lookup_bwd)


# ------------------------------------------------------------- public API
def _narrow(ids, rows, mode, xp):
  """Integer ids of a type wider than int32 (int64, uint32, uint64) as int32
  ids that read the same rows: wrap reduces them mod rows first; fill and
  clip map every id below -rows to -(rows + 1) and every id above rows to
  rows, which read (or drop, or clamp to) exactly what the original ids do."""
  info = np.iinfo(ids.dtype)
  if info.min >= np.iinfo(np.int32).min and info.max <= _INT32_MAX:
    return ids.astype(np.int32)
  if mode == "wrap":
    ids = xp.mod(ids, xp.asarray(rows, ids.dtype))
  else:
    low = max(-(rows + 1), int(info.min))
    ids = xp.clip(ids, xp.asarray(low, ids.dtype), xp.asarray(rows, ids.dtype))
  return ids.astype(np.int32)


def _checked_ids(ids, rows, mode):
  if isinstance(ids, (bool, np.bool_)):
    raise TypeError("ids must have an integer dtype; got bool")
  if isinstance(ids, (int, np.integer, np.ndarray)):
    host = np.asarray(ids)
    if not np.issubdtype(host.dtype, np.integer):
      raise TypeError(f"ids must have an integer dtype; got dtype {host.dtype}")
    # Narrowed on the host: without jax_enable_x64, jnp.asarray would wrap int64 ids.
    return jnp.asarray(_narrow(host, rows, mode, np))
  ids = _checks.as_array("ids", ids)
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise TypeError(f"ids must have an integer dtype; got dtype {ids.dtype}")
  return _narrow(ids, rows, mode, jnp)


def _checked(table, mode, fill_value, deterministic, implementation):
  _primitive.check_implementation(implementation)
  table = _checks.as_array("table", table)
  implementation = _checks.float_implementation("table", table, implementation)
  if table.ndim != 2:
    raise ValueError(f"table must have shape [V, D] (two axes); got shape {tuple(table.shape)}")
  mode = "fill" if mode is None else mode
  if mode not in MODES:
    raise ValueError(f"mode must be None, 'fill', 'clip' or 'wrap' (as jnp.take; 'raise' "
                     f"is not supported); got {mode!r}")
  if not isinstance(deterministic, (bool, np.bool_)):
    raise TypeError(f"deterministic must be a Python bool; got {deterministic!r}")
  fill = np.nan if fill_value is None else _checks.static_float("fill_value", fill_value)
  # Rounded once to the table's dtype (bfloat16 and float16 values are exact in float32).
  with np.errstate(over="ignore"):  # a value past float16's range becomes inf, as in jnp.take
    fill = float(np.asarray(fill, table.dtype).astype(np.float32))
  rows = table.shape[0]
  if rows >= _INT32_MAX - 1:
    raise ValueError(f"table has {rows} rows; the kernels take at most 2^31 - 3 (int32 row ids)")
  return table, mode, fill, bool(deterministic), implementation


def embedding_lookup(table, ids, *, mode=None, fill_value=None, deterministic=False,
                     implementation=None):
  """Rows of `table` gathered by `ids`, as `jnp.take(table, ids, axis=0, mode=mode)`.

  Differentiable in the table (ids are integers): the cotangent's rows are
  summed into a zero [V, D] table, accumulated in float32 and rounded once to
  table.dtype. Ids wider than int32 (int64, uint32, uint64) are first mapped
  to int32 ids that read the same rows under `mode`, so the conversion never
  changes the result.

  Args:
    table: [V, D] float32, bfloat16 or float16 (float64: the reference),
      V < 2^31 - 2.
    ids: any shape, any integer dtype.
    mode: what ids outside [0, V) read (jnp.take's modes):
      None or "fill": a negative id counts from the end once (id + V); an id
      still outside [0, V) reads a row of `fill_value` and gets no gradient.
      "clip": ids clamp to [0, V - 1] (negative ids read row 0); the
      gradient goes to the clamped row.
      "wrap": id mod V (floor modulo, so -1 reads row V - 1).
    fill_value: Python float (static), the row value that out-of-range ids
      read in fill mode (default NaN); ignored in the other modes.
    deterministic: Python bool: the CUDA backward sorts ids by row and sums
      each row in position order, so the gradient is bit-identical from run
      to run; the default uses float32 atomics (the order of adds varies).
      The CPU kernel is always deterministic.
    implementation: None takes the policy table's choice for the platform
      and pass (`DEFAULT_IMPLEMENTATION`: the kernel where built and chosen,
      else the reference); "cuda" or "cpu" forces that kernel; "xla" runs
      `embedding_lookup_reference` (jnp.take, whose gradient adds in
      table.dtype).

  Returns:
    ids.shape + (D,) in table.dtype.

  Raises:
    TypeError: table is not float32, bfloat16, float16 or float64; ids are not
      integers (bool included); `fill_value` is traced or not a float;
      `deterministic` is not a Python bool.
    ValueError: table is not 2-D or has 2^31 - 2 or more rows; an empty table
      (V = 0) with ids to look up (jnp.take raises IndexError there); `mode`
      is not None, "fill", "clip" or "wrap"; `implementation` forces a kernel
      on float64, is unknown, names kernels this build lacks, or names a
      platform other than the one being compiled for.
  """
  table, mode, fill, deterministic, implementation = _checked(
      table, mode, fill_value, deterministic, implementation)
  rows, dim = table.shape
  ids = _checked_ids(ids, rows, mode)
  if rows == 0 and ids.size > 0:
    raise ValueError(f"table has no rows (shape {tuple(table.shape)}); cannot look up "
                     f"{ids.size} ids")
  if ids.size == 0:
    return jnp.zeros((*ids.shape, dim), table.dtype)
  if implementation == "xla" or dim == 0:
    return embedding_lookup_reference(table, ids, mode=mode, fill_value=fill_value)
  cfg = _Config(mode=mode, fill_value=fill, rows=rows, deterministic=deterministic,
             implementation=implementation)
  if ids.ndim == 0:
    return _lookup(table, ids[None], cfg)[0]
  return _lookup(table, ids, cfg)
