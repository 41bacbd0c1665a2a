"""Decode attention: split-K flash decoding over contiguous and paged KV caches.

Flow: `decode_attention` (checks, defaults, no-gradient rule) -> `_fwd_p`
(partitioned primitive: batching, sharding) -> `_fwd_kernel_p` (FFI target
`_ffi.DECODE_ATTENTION_FWD`, cpp/ffi/decode_attention.cc). The pure-JAX
reference lives in decode_attention_reference.py; the semantics (positions,
masks, clamped lengths, bad pages) are spelled out in
cpp/contract/decode.h.
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
from jaxcraft.ops.decode_attention_reference import decode_attention_reference

F32 = jnp.float32
I32 = jnp.int32
_UNBOUNDED = -1  # window_left meaning "no window"

# The split-K scratch: an upper bound on the splits the CUDA launcher may pick,
# from shapes alone (it picks from the shape and the SM count, never more than
# the scratch holds). Splits only serve to fill the GPU: past ~1024 resident
# CTAs (more than any current GPU holds: H100 132 SMs x 2) they add nothing,
# and a split is never shorter than one 64-key tile. The CUDA CTA covers 16 query
# rows of a KV head's group. So the scratch stays under 1024 x 16 rows of
# H + 1 floats (8.4 MB at H = 128) for any shape.
_ROWS_PER_CTA = 16
_MAX_RESIDENT_CTAS = 1024
_TILE_KEYS = 64
_MAX_SPLITS = 128

_NO_GRADIENT = ("decode_attention is inference-only: it has no gradient (no backward kernel). "
                "Train with jaxcraft.dot_product_attention, or apply jax.lax.stop_gradient to "
                "its inputs.")


@dataclasses.dataclass(frozen=True)
class _Config:
  scale: float
  soft_cap: float | None
  window_left: int
  paged: bool
  implementation: str | None

  def ffi_attrs(self):
    return {"scale": np.float32(self.scale), "soft_cap": np.float32(self.soft_cap or 0.0),
                "window_left": np.int64(self.window_left), "paged": self.paged}

  def reference(self, q, k, v, lengths, tables):
    return decode_attention_reference(
        q, k, v, lengths, block_tables=tables if self.paged else None, scale=self.scale,
        logit_soft_cap=self.soft_cap,
        local_window_size=None if self.window_left == _UNBOUNDED else self.window_left)


def _capacity(cfg, k_shape, tables_shape):
  return tables_shape[1] * k_shape[1] if cfg.paged else k_shape[1]


def _max_splits(cfg, q_shape, k_shape, tables_shape) -> int:
  """Leading dim of the split scratch (0: one split, no scratch)."""
  B, Tq, N, _ = q_shape
  K = k_shape[2]
  ctas = B * K * math.ceil(N // K * Tq / _ROWS_PER_CTA)
  span = _capacity(cfg, k_shape, tables_shape)
  if cfg.window_left != _UNBOUNDED:
    span = min(span, Tq + cfg.window_left)
  bound = min(_MAX_SPLITS, math.ceil(_MAX_RESIDENT_CTAS / max(ctas, 1)),
              math.ceil(span / _TILE_KEYS))
  return bound if bound > 1 else 0


def _cuda_unsupported(head_dim, cache_rows, capacity) -> str | None:
  return _ffi.cuda_unsupported("decode_attention", head_dim=head_dim, cache_rows=cache_rows,
                               capacity=capacity)


def _unsupported(platform, avals_in, *, cfg):
  if platform != "cuda":
    return None
  q, k, _, _, tables = avals_in
  return _cuda_unsupported(q.shape[-1], k.shape[0] * k.shape[1],
                           _capacity(cfg, k.shape, tables.shape))


# -------------------------------------------------------- kernel primitive
def _fwd_kernel_abstract(q, k, v, lengths, tables, *, cfg):
  B, Tq, N, H = q.shape
  splits = _max_splits(cfg, q.shape, k.shape, tables.shape)
  spec = _primitive.row_spec(q, 3)
  scratch = lambda shape: _primitive.result_aval(q, shape, F32)
  return (_primitive.result_aval(q, q.shape, q.dtype, spec),
          scratch((splits, B, Tq, N, H)), scratch((splits, B, Tq, N)))


def _fwd_kernel_reference(q, k, v, lengths, tables, *, cfg):
  B, Tq, N, H = q.shape
  splits = _max_splits(cfg, q.shape, k.shape, tables.shape)
  return (cfg.reference(q, k, v, lengths, tables), jnp.zeros((splits, B, Tq, N, H), F32),
          jnp.zeros((splits, B, Tq, N), F32))


_fwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_decode_attention_fwd_kernel", target=_ffi.DECODE_ATTENTION_FWD,
    abstract_eval=_fwd_kernel_abstract, reference=_fwd_kernel_reference,
    ffi_attrs=lambda *, cfg: cfg.ffi_attrs(), unsupported=_unsupported)


# --------------------------------------------------- partitioned primitive
def _local(cfg, q, k, v, lengths, *tables):
  tables = tables[0] if cfg.paged else jnp.zeros((0,), I32)
  out, _, _ = _fwd_kernel_p.bind(q, k, v, lengths, tables, cfg=cfg)
  return [out]


def _abstract(q, *rest, cfg):
  return [_primitive.result_aval(q, q.shape, q.dtype, _primitive.row_spec(q, 3))]


def _mesh_axes(entry):
  if entry is None:
    return ()
  return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _usable(mesh, entry, size, taken=()):
  """`entry` (a spec entry) if it splits `size` evenly and shares no mesh axis
  with `taken`, else None (that dimension is gathered)."""
  axes = _mesh_axes(entry)
  if not axes or set(axes) & set(taken) or size % math.prod(mesh.shape[a] for a in axes):
    return None
  return entry


def _make_partitioned(shapes, *, cfg):
  """Batch and KV-head sharding run locally (no collectives): a head axis is
  kept only if it splits the KV heads evenly (GQA groups stay whole), and a
  paged cache is replicated over the batch axis (any sequence may own any
  page). Sequence, page and head-dim sharding are gathered."""
  B, _, N, _ = shapes[0]
  K = shapes[1][2]
  q_rule = "b t (k g) d"
  cache_rule = "p s k d" if cfg.paged else "b s k d"
  operands = [q_rule, cache_rule, cache_rule, "b"] + ["b m"] * cfg.paged

  def choose(mesh, specs):
    spec = lambda i: tuple(specs[i] or ()) + (None,) * 4
    # The batch axis of q or of a contiguous cache (the large operands: the
    # lengths and tables follow them); the KV-head axis of q or the cache.
    batch = next((e for i in ([0] if cfg.paged else [0, 1])
                  if (e := _usable(mesh, spec(i)[0], B))), None)
    heads = next((e for i in (0, 1) if (e := _usable(mesh, spec(i)[2], K, _mesh_axes(batch)))),
                 None)
    q_out = P(batch, None, heads, None)
    cache = P(None if cfg.paged else batch, None, heads, None)
    args = [q_out, cache, cache, P(batch)] + [P(batch, None)] * cfg.paged
    return args, [q_out], [()]

  return _primitive.partitioned_call(
      functools.partial(_local, cfg), sharding_rule=", ".join(operands) + " -> " + q_rule,
      choose_shardings=choose, g=N // K)


def _batch(args, dims, *, cfg):
  """vmap: extra leading axes fold into the batch B. A batched cache is one
  cache per vmapped instance; an unbatched cache is shared by all of them.
  Shared contiguous caches are read as paged ones (one page per sequence),
  so they are never copied per instance."""
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
  front = lambda i: _primitive.move_to_front(args[i], dims[i], size)
  fold = lambda x: x.reshape(size * x.shape[1], *x.shape[2:])
  q, lengths = front(0), front(3)
  B = q.shape[1]
  cache_batched = any(dims[i] is not _primitive.NOT_MAPPED for i in (1, 2))
  if cache_batched and not cfg.paged:
    operands = [fold(q), fold(front(1)), fold(front(2)), fold(lengths)]
  elif cache_batched:
    # Instance i's pages move to [i * P, (i + 1) * P) of the folded cache;
    # out-of-range entries stay out of range (masked), never land on a neighbour's page.
    k, v, tables = front(1), front(2), front(4)
    num_pages = k.shape[1]
    offsets = (jnp.arange(size, dtype=I32) * num_pages)[:, None, None]
    tables = jnp.where((tables >= 0) & (tables < num_pages), tables + offsets, -1)
    operands = [fold(q), fold(k), fold(v), fold(lengths), fold(tables)]
  else:
    if cfg.paged:
      tables = front(4)
    else:
      tables = jnp.broadcast_to(jnp.arange(B, dtype=I32)[None, :, None], (size, B, 1))
      cfg = dataclasses.replace(cfg, paged=True)
    operands = [fold(q), args[1], args[2], fold(lengths), fold(tables)]
  (out,) = _fwd_p.bind(*operands, cfg=cfg)
  return [out.reshape(size, B, *out.shape[1:])], [0]


_fwd_p = _primitive.partitioned_primitive(
    "jaxcraft_decode_attention", abstract_eval=_abstract, batching_rule=_batch,
    make_partitioned=_make_partitioned)


# ----------------------------------------------------------- no gradient
@functools.partial(jax.custom_jvp, nondiff_argnums=(5,))
def _decode(q, k, v, lengths, tables, cfg):
  if cfg.implementation == "xla":
    return cfg.reference(q, k, v, lengths, tables)
  operands = [q, k, v, lengths] + ([tables] if cfg.paged else [])
  return _fwd_p.bind(*operands, cfg=cfg)[0]


@_decode.defjvp
def _decode_jvp(cfg, primals, tangents):
  # Called only when some input carries a real tangent (jax.grad, jvp).
  raise TypeError(_NO_GRADIENT)


# ------------------------------------------------------------- public API
def _window_left(local_window_size) -> int:
  window = _checks.window(local_window_size)  # the right bound is moot under causality
  return _UNBOUNDED if window is None else window[0]


def _check_int32(name, x, expected_ndim, what):
  x = _checks.as_array(name, x)
  if x.dtype != np.int32:
    raise TypeError(f"{name} must be int32; got dtype {x.dtype}")
  if x.ndim != expected_ndim:
    raise ValueError(f"{name} must be {expected_ndim}-D ({what}); got shape {tuple(x.shape)}")
  return x


def _checked(query, key_cache, value_cache, key_value_seq_lengths, block_tables):
  q = _checks.as_array("query", query)
  k = _checks.as_array("key_cache", key_cache)
  v = _checks.as_array("value_cache", value_cache)
  if q.ndim != 4:
    raise ValueError(f"query must be 4-D [B, Tq, N, H]; got shape {tuple(q.shape)}")
  _checks.check_float("query", q)
  for name, c in (("key_cache", k), ("value_cache", v)):
    if c.ndim != 4:
      raise ValueError(f"{name} must be 4-D: [B, S, K, H] (contiguous) or [P, page_size, K, H] "
                       f"(paged, with block_tables); got shape {tuple(c.shape)}")
  if k.dtype != q.dtype or v.dtype != q.dtype:
    raise TypeError(f"key_cache and value_cache must have query's dtype {q.dtype}; "
                    f"got {k.dtype} and {v.dtype}")
  if k.shape != v.shape:
    raise ValueError(f"value_cache must have key_cache's shape {tuple(k.shape)}; "
                     f"got {tuple(v.shape)}")
  B, _, N, H = q.shape
  K = k.shape[2]
  if k.shape[3] != H:
    raise ValueError(f"query and key_cache head dims differ: {H} vs {k.shape[3]}")
  if K == 0 or N % K:
    raise ValueError("the number of query heads must be a multiple of the key/value heads; "
                     f"got {N} and {K}")
  lengths = _check_int32("key_value_seq_lengths", key_value_seq_lengths, 1, "one length per sequence")
  _checks.check_shape("key_value_seq_lengths", lengths, (B,), "one length per sequence")
  if block_tables is None:
    if k.shape[0] != B:
      raise ValueError(f"key_cache has {k.shape[0]} sequences but query has {B}: a contiguous "
                       "cache is [B, S, K, H] (pass block_tables for a paged [P, page_size, K, H] "
                       "cache)")
    return q, k, v, lengths, None
  tables = _check_int32("block_tables", block_tables, 2, "[B, max_pages]")
  if tables.shape[0] != B:
    raise ValueError(f"block_tables must have shape ({B}, max_pages) (one row per sequence); "
                     f"got {tuple(tables.shape)}")
  if k.shape[1] == 0 or (k.shape[0] == 0 and tables.shape[1] > 0):
    raise ValueError("with block_tables, key_cache is paged [P, page_size, K, H] and needs at "
                     f"least one page of at least one row; got shape {tuple(k.shape)}")
  return q, k, v, lengths, tables


def decode_attention(query, key_cache, value_cache, key_value_seq_lengths, *, block_tables=None,
                     scale=None, logit_soft_cap=None, local_window_size=None,
                     implementation=None):
  """Attention of a few new tokens over a KV cache (split-K flash decoding).

  Query token t of sequence b sits at position L - Tq + t, where L is the
  sequence's length clamped to [0, capacity] (capacity: S, or
  max_pages * page_size), and sees the keys j <= its position (so j < L).
  logits = scale * q.k, soft-capped if asked, softmax in float32. Each K/V
  head is read once for all N / K query heads and Tq tokens of its group.
  Rows that see no key give zeros. Inference only: there is no gradient.

  Args:
    query: [B, Tq, N, H] float32, bfloat16 or float16 (float64: the
      reference, in float64): the new tokens.
    key_cache: contiguous [B, S, K, H], or paged [P, page_size, K, H] with
      `block_tables`; query's dtype. N must be a multiple of K (GQA / MQA).
    value_cache: key_cache's shape and dtype.
    key_value_seq_lengths: int32 [B]: each sequence's length, counting the
      Tq new tokens.
    block_tables: optional int32 [B, max_pages]: key j of sequence b is row
      j % page_size of page block_tables[b, j // page_size]. Entries outside
      [0, P) mask their page's keys (the page is never read).
    scale: Python float (static); default 1 / sqrt(H).
    logit_soft_cap: optional Python float > 0: logits become
      cap * tanh(logits / cap).
    local_window_size: None, an int w, or a (left, right) pair of
      non-negative ints: a query also sees only keys j >= position - left
      (the right bound is moot under causality).
    implementation: None runs the kernel for the platform being compiled
      for where it is built and takes the inputs (the CUDA kernel: head dim
      <= 256 and a multiple of 8, caches under 2^31 rows), else the pure-JAX
      reference. "cuda" or "cpu" forces that kernel and raises where it
      cannot run; "xla" runs the pure-JAX reference
      (`decode_attention_reference`).

  Returns:
    [B, Tq, N, H] in query's dtype.

  Raises:
    TypeError: an input is not an array; query is not float32, bfloat16,
      float16 or float64, or a cache differs from its dtype; lengths or block
      tables are not int32; `scale` or `logit_soft_cap` is traced or not a
      float; differentiating through the op (`jax.grad`, `jax.jvp`).
    ValueError: query or a cache is not 4-D, the caches' shapes differ, head
      dims or batch sizes do not match, N is not a multiple of K; lengths are
      not [B] or block tables not [B, max_pages]; a paged cache has no rows; a
      negative window; `logit_soft_cap` <= 0; `implementation` forces a kernel
      on float64, is unknown, names kernels this build lacks, or is "cuda" for
      inputs the CUDA kernel does not take.
  """
  _primitive.check_implementation(implementation)
  q, k, v, lengths, tables = _checked(query, key_cache, value_cache, key_value_seq_lengths,
                                      block_tables)
  implementation = _checks.float_implementation("query", q, implementation)
  B, Tq, N, H = q.shape
  scale = 1.0 / math.sqrt(H) if scale is None else _checks.static_float("scale", scale)
  if logit_soft_cap is not None:
    logit_soft_cap = _checks.static_float("logit_soft_cap", logit_soft_cap)
    if not logit_soft_cap > 0:
      raise ValueError(f"logit_soft_cap must be > 0; got {logit_soft_cap}")
  paged = tables is not None
  cfg = _Config(scale=scale, soft_cap=logit_soft_cap, window_left=_window_left(local_window_size),
                paged=paged, implementation=implementation)
  if implementation == "cuda":
    capacity = tables.shape[1] * k.shape[1] if paged else k.shape[1]
    if why := _cuda_unsupported(H, k.shape[0] * k.shape[1], capacity):
      raise ValueError(f"implementation='cuda': {why}")
  if 0 in (B, Tq, N, H):
    cfg = dataclasses.replace(cfg, implementation="xla")
  return _decode(q, k, v, lengths, tables, cfg)
