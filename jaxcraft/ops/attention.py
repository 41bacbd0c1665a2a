"""Flash attention: a drop-in for `jax.nn.dot_product_attention`.

Flow: `dot_product_attention` (checks, custom_vjp) -> `_fwd_p` / `_bwd_p`
(partitioned primitives: batching, sharding) -> `_fwd_kernel_p` /
`_bwd_kernel_p` (FFI targets `jaxcraft_attention_fwd` / `_bwd`,
cpp/ffi/attention.cc). The pure-JAX reference lives in attention_reference.py.
Sequence-sharded inputs in a sharded jit partition into ring attention
(_ring.py), whose blocks are these primitives (`_ring_blocks`).
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
from jaxcraft.ops import _checks, _primitive, _ring
from jaxcraft.ops.attention_reference import (
  attention_backward_reference,
  attention_reference,
)

F32 = jnp.float32
I32 = jnp.int32
# The CUDA kernels' limits (cpp/kernels/attention/tile_config.h): head dims are
# padded up to the next of 32/64/96/128/192/256 and loaded 16 bytes at a time.
_CUDA_MAX_HEAD_DIM = 256
_CUDA_HEAD_DIM_MULTIPLE = 8
_UNBOUNDED = -1  # window bound meaning "no limit" in AttentionMask


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static params shared by the forward and backward primitives."""
  scale: float
  causal: bool
  offset: int
  window_left: int
  window_right: int
  has_q_lengths: bool
  has_kv_lengths: bool
  implementation: str | None
  deterministic: bool = False

  def ffi_attrs(self):
    return dict(scale=np.float32(self.scale), causal=self.causal, offset=np.int64(self.offset),
                window_left=np.int64(self.window_left), window_right=np.int64(self.window_right))

  @property
  def windowed(self) -> bool:
    return (self.window_left, self.window_right) != (_UNBOUNDED, _UNBOUNDED)

  def _reference_masks(self, q_len, kv_len):
    return dict(scale=self.scale, is_causal=self.causal, causal_offset=self.offset,
                query_seq_lengths=q_len if q_len.size else None,
                key_value_seq_lengths=kv_len if kv_len.size else None,
                window=(self.window_left, self.window_right) if self.windowed else None)

  def reference(self, q, k, v, q_len, kv_len):
    return attention_reference(q, k, v, **self._reference_masks(q_len, kv_len))

  def reference_backward(self, q, k, v, o, lse, do, q_len, kv_len):
    return attention_backward_reference(q, k, v, o, lse, do, **self._reference_masks(q_len, kv_len))


def _cuda_unsupported(dtype, head_dim) -> str | None:
  if np.dtype(dtype) == np.float32:
    return "the CUDA attention kernel takes bfloat16 or float16 (float32 inputs use the reference)"
  if head_dim > _CUDA_MAX_HEAD_DIM or head_dim % _CUDA_HEAD_DIM_MULTIPLE:
    return (f"the CUDA attention kernel needs a head dim <= {_CUDA_MAX_HEAD_DIM} and a "
            f"multiple of {_CUDA_HEAD_DIM_MULTIPLE}; got {head_dim}")
  return None


def _unsupported(platform, avals_in, *, cfg):
  q = avals_in[0]
  return _cuda_unsupported(q.dtype, q.shape[-1]) if platform == "cuda" else None


def _empty_lengths():
  return jnp.zeros((0,), I32)


# ------------------------------------------------------- kernel primitives
def _fwd_kernel_abstract(q, k, v, q_len, kv_len, *, cfg):
  B, T, N, _ = q.shape
  spec = _primitive.row_spec(q, 3)
  return (_primitive.result_aval(q, q.shape, q.dtype, spec),
          _primitive.result_aval(q, (B, N, T), F32, (spec[0], spec[2])))


_fwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_attention_fwd_kernel", target=_ffi.ATTENTION_FWD,
    abstract_eval=_fwd_kernel_abstract,
    reference=lambda q, k, v, ql, kl, *, cfg: cfg.reference(q, k, v, ql, kl),
    ffi_attrs=lambda *, cfg: cfg.ffi_attrs(),
    unsupported=_unsupported)


def _bwd_kernel_abstract(q, k, v, o, lse, do, q_len, kv_len, *, cfg):
  B, T, N, H = q.shape
  like = lambda a, x: _primitive.result_aval(x, a.shape, a.dtype, _primitive.row_spec(a, a.ndim))
  scratch = lambda shape: _primitive.result_aval(q, shape, F32)
  accum = (0,) if cfg.deterministic else (B, T, N, H)
  return like(q, q), like(k, k), like(v, v), scratch((B, N, T)), scratch(accum)


def _bwd_kernel_reference(q, k, v, o, lse, do, q_len, kv_len, *, cfg):
  # From the given o and lse, as the kernel: a ring attention block passes the
  # global ones, which differ from this block's own.
  dq, dk, dv = cfg.reference_backward(q, k, v, o, lse, do, q_len, kv_len)
  B, T, N, H = q.shape
  accum = (0,) if cfg.deterministic else (B, T, N, H)
  return dq, dk, dv, jnp.zeros((B, N, T), F32), jnp.zeros(accum, F32)


_bwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_attention_bwd_kernel", target=_ffi.ATTENTION_BWD,
    abstract_eval=_bwd_kernel_abstract, reference=_bwd_kernel_reference,
    ffi_attrs=lambda *, cfg: dict(cfg.ffi_attrs(), deterministic=cfg.deterministic),
    unsupported=_unsupported)


# ------------------------------------------------- partitioned primitives
def _split_lengths(cfg, rest):
  rest = list(rest)
  q_len = rest.pop(0) if cfg.has_q_lengths else _empty_lengths()
  kv_len = rest.pop(0) if cfg.has_kv_lengths else _empty_lengths()
  return q_len, kv_len


def _fwd_local(cfg, q, k, v, *lengths):
  return list(_fwd_kernel_p.bind(q, k, v, *_split_lengths(cfg, lengths), cfg=cfg))


def _bwd_local(cfg, q, k, v, o, lse, do, *lengths):
  dq, dk, dv, _, _ = _bwd_kernel_p.bind(q, k, v, o, lse, do, *_split_lengths(cfg, lengths), cfg=cfg)
  return [dq, dk, dv]


def _fwd_abstract(q, k, v, *lengths, cfg):
  return list(_fwd_kernel_abstract(q, k, v, None, None, cfg=cfg))


def _bwd_abstract(q, k, v, o, lse, do, *lengths, cfg):
  return list(_bwd_kernel_abstract(q, k, v, o, lse, do, None, None, cfg=cfg)[:3])


def _ring_blocks(cfg):
  """Ring attention's block ops (_ring.Blocks) on these primitives: a ring
  step's mask is a static causal flag (offset 0) plus dynamic lengths."""
  def block_cfg(causal, q_len, kv_len):
    return dataclasses.replace(cfg, causal=causal, offset=0, window_left=_UNBOUNDED,
                               window_right=_UNBOUNDED, has_q_lengths=q_len is not None,
                               has_kv_lengths=kv_len is not None)

  def fwd(q, k, v, *, causal, q_len, kv_len, q_seg=None, kv_seg=None):
    assert q_seg is None and kv_seg is None, "the attention kernels take no segment ids"
    c = block_cfg(causal, q_len, kv_len)
    return tuple(_fwd_p.bind(q, k, v, *_lengths(c, q_len, kv_len), cfg=c))

  def bwd(q, k, v, o, lse, do, *, causal, q_len, kv_len, q_seg=None, kv_seg=None):
    assert q_seg is None and kv_seg is None, "the attention kernels take no segment ids"
    c = block_cfg(causal, q_len, kv_len)
    return tuple(_bwd_p.bind(q, k, v, o, lse, do, *_lengths(c, q_len, kv_len), cfg=c))

  return _ring.Blocks(fwd, bwd)


def _ring_fwd_local(cfg, ring, reorder, q, k, v):
  """The partitioned forward of sequence-sharded inputs: ring attention on
  contiguous shards (reordered into zig-zag ones and back when causal)."""
  if reorder:
    q, k, v = (_ring.to_zigzag(x, 1, ring) for x in (q, k, v))
  o, lse = _ring.forward(_ring_blocks(cfg), ring, q, k, v)
  if reorder:
    o, lse = _ring.from_zigzag(o, 1, ring), _ring.from_zigzag(lse, 2, ring)
  return [o, lse]


def _ring_bwd_local(cfg, ring, reorder, q, k, v, o, lse, do):
  if reorder:
    q, k, v, o, do = (_ring.to_zigzag(x, 1, ring) for x in (q, k, v, o, do))
    lse = _ring.to_zigzag(lse, 2, ring)
  grads = _ring.backward(_ring_blocks(cfg), ring, q, k, v, o, lse, do)
  return [_ring.from_zigzag(g, 1, ring) if reorder else g for g in grads]


def _sequence_ring(cfg, mesh, spec, shapes):
  """(Ring, reorder) when q is sharded along the sequence and the ring
  applies, else None (the sequence is gathered). The ring needs T and S split
  evenly, T == S when causal (its blocks' masks assume aligned shards), and no
  lengths or window (their masks are not shifted per block)."""
  seq = (tuple(spec or ()) + (None,) * 4)[1]
  if seq is None:
    return None
  T, S = shapes[0][1], shapes[1][1]
  size = math.prod(mesh.shape[a] for a in (seq if isinstance(seq, tuple) else (seq,)))
  if (cfg.has_q_lengths or cfg.has_kv_lengths or cfg.windowed or T % size or S % size
      or (cfg.causal and T != S)):
    return None
  return _ring.plan(seq, size, causal=cfg.causal, local_len=T // size, zigzag_input=False)


def _head_specs(mesh, spec, num_kv_heads):
  """Batch and head mesh axes of q's sharding that the kernel can keep: a
  head axis only if it splits the KV heads evenly (GQA groups stay whole).
  Sequence and head-dim sharding are undone (gathered)."""
  spec = tuple(spec or ()) + (None,) * 4
  batch, heads = spec[0], spec[2]
  if heads is not None:
    names = heads if isinstance(heads, tuple) else (heads,)
    if num_kv_heads % math.prod(mesh.shape[a] for a in names):
      heads = None
  return batch, heads


def _partitioned_maker(kind, local, ring_local):
  """make_partitioned for the fwd or bwd primitive. Shardy's rule relates the
  query heads to the KV heads as (k g): sharding KV heads shards their groups.
  A sequence-sharded q keeps its sequence axis (q, k, v, o, dO on axis 1, lse
  on axis 2) and runs `ring_local` over it: the fwd and bwd primitives are
  each partitioned into their half of ring attention."""
  def make(shapes, *, cfg):
    num_heads, num_kv_heads = shapes[0][2], shapes[1][2]
    n_len = cfg.has_q_lengths + cfg.has_kv_lengths
    # Shardy rejects a size-1 factor in a compound one: without GQA (g = 1)
    # the query heads are the KV heads' factor itself.
    groups = num_heads // num_kv_heads
    heads = "(k g)" if groups > 1 else "k"
    q_rule, kv_rule, lse_rule = f"b t {heads} d", "b s k d", f"b {heads} t"
    if kind == "fwd":
      operands, results = [q_rule, kv_rule, kv_rule], [q_rule, lse_rule]
    else:
      operands = [q_rule, kv_rule, kv_rule, q_rule, lse_rule, q_rule]
      results = [q_rule, kv_rule, kv_rule]

    def choose(mesh, specs):
      b, h = _head_specs(mesh, specs[0], num_kv_heads)
      ring = _sequence_ring(cfg, mesh, specs[0], shapes)
      t = ring[0].axis_name if ring else None
      blocks = {q_rule: P(b, t, h, None), kv_rule: P(b, t, h, None), lse_rule: P(b, h, t)}
      res = [blocks[r] for r in results]
      body = functools.partial(ring_local, cfg, *ring) if ring else None
      return [blocks[r] for r in operands] + [P(b)] * n_len, res, [()] * len(res), body

    return _primitive.partitioned_call(
        functools.partial(local, cfg),
        sharding_rule=", ".join(operands + ["b"] * n_len) + " -> " + ", ".join(results),
        choose_shardings=choose, **({"g": groups} if groups > 1 else {}))
  return make


def _batch_rule(prim, n_outputs):
  """Extra leading batch axes (vmap) fold into the batch dimension B."""
  def rule(args, dims, *, cfg):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
    moved = [_primitive.move_to_front(a, d, size) for a, d in zip(args, dims)]
    folded = [a.reshape(size * a.shape[1], *a.shape[2:]) for a in moved]
    outs = prim.bind(*folded, cfg=cfg)
    return [o.reshape(size, o.shape[0] // size, *o.shape[1:]) for o in outs], [0] * n_outputs
  return rule


_fwd_p = _primitive.partitioned_primitive(
    "jaxcraft_attention_fwd", abstract_eval=_fwd_abstract,
    batching_rule=lambda args, dims, *, cfg: _batch_rule(_fwd_p, 2)(args, dims, cfg=cfg),
    make_partitioned=_partitioned_maker("fwd", _fwd_local, _ring_fwd_local))
_bwd_p = _primitive.partitioned_primitive(
    "jaxcraft_attention_bwd", abstract_eval=_bwd_abstract,
    batching_rule=lambda args, dims, *, cfg: _batch_rule(_bwd_p, 3)(args, dims, cfg=cfg),
    make_partitioned=_partitioned_maker("bwd", _bwd_local, _ring_bwd_local))


# ----------------------------------------------------------------- autodiff
@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(q, k, v, q_len, kv_len, cfg):
  return _attention_fwd(q, k, v, q_len, kv_len, cfg)[0]


def _lengths(cfg, q_len, kv_len):
  return [a for a, present in ((q_len, cfg.has_q_lengths), (kv_len, cfg.has_kv_lengths)) if present]


def _attention_fwd(q, k, v, q_len, kv_len, cfg):
  o, lse = _fwd_p.bind(q, k, v, *_lengths(cfg, q_len, kv_len), cfg=cfg)
  # Named for jax.checkpoint policies (jaxcraft.remat): the backward kernel
  # needs o and lse, so keeping both spares a rerun of the forward kernel.
  o = checkpoint_name(o, remat.ATTENTION_OUT)
  lse = checkpoint_name(lse, remat.ATTENTION_LSE)
  return (o, lse), (q, k, v, o, lse, q_len, kv_len)


def _attention_bwd(cfg, saved, cts):
  q, k, v, o, lse, q_len, kv_len = saved
  do, _ = cts  # lse is returned without gradient (stop_gradient outside)
  dq, dk, dv = _bwd_p.bind(q, k, v, o, lse, do.astype(o.dtype), *_lengths(cfg, q_len, kv_len),
                           cfg=cfg)
  return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


# ------------------------------------------------------------- public API
_ALIGNMENTS = ("top_left", "bottom_right")


def _window(local_window_size):
  window = _checks.window(local_window_size)
  return window if window is not None else (_UNBOUNDED, _UNBOUNDED)


def _check_lengths(name, lengths, batch):
  if lengths is None:
    return None
  lengths = _checks.as_array(name, lengths)
  if lengths.dtype != np.int32:
    raise TypeError(f"{name} must be int32; got dtype {lengths.dtype}")
  _checks.check_shape(name, lengths, (batch,), "one length per batch row")
  return lengths


def _check_qkv(query, key, value):
  q, k, v = (_checks.as_array(n, a) for n, a in (("query", query), ("key", key), ("value", value)))
  if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
    raise ValueError("query, key and value must all be 4-D [B, T|S, N|K, H] (or 3-D, unbatched); "
                     f"got shapes {q.shape}, {k.shape}, {v.shape}")
  _checks.check_float("query", q)
  if k.dtype != q.dtype or v.dtype != q.dtype:
    raise TypeError(f"key and value must have query's dtype {q.dtype}; got {k.dtype} and {v.dtype}")
  if k.shape != v.shape:
    raise ValueError(f"value must have key's shape {k.shape}; got {v.shape}")
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(f"query and key head dims differ: {q.shape[-1]} vs {k.shape[-1]}")
  if q.ndim == 4 and q.shape[0] != k.shape[0]:
    raise ValueError(f"query and key batch sizes differ: {q.shape[0]} vs {k.shape[0]}")
  if k.shape[-2] == 0 or q.shape[-2] % k.shape[-2]:
    raise ValueError("the number of query heads must be a multiple of the key/value heads; got "
                     f"{q.shape[-2]} and {k.shape[-2]}")
  return q, k, v


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None,
                          is_causal=False, query_seq_lengths=None, key_value_seq_lengths=None,
                          local_window_size=None, q_segment_ids=None, kv_segment_ids=None,
                          logit_soft_cap=None, causal_alignment="top_left",
                          return_residual=False, implementation=None, deterministic=False):
  """Scaled dot-product attention; same arguments and results as
  `jax.nn.dot_product_attention`, computed by a flash-attention kernel.

  Beyond jax.nn: `q_segment_ids` / `kv_segment_ids` (int32 [B, T] / [B, S]:
  attend only within equal ids), `logit_soft_cap` (logits = cap *
  tanh(logits / cap), after `scale`), `causal_alignment` ("bottom_right":
  query i sees keys <= i + S - T; windows shift the same way), and
  `deterministic` (a backward pass without float atomics). Rows that see no
  key give zeros (jax.nn gives an average of all values); their logsumexp is
  -inf. `implementation`: None (the kernel where it applies, else the
  reference), "cuda" / "cpu" (force the kernel; a clear error names what it
  does not support) or "xla" (the pure-JAX reference).
  """
  _primitive.check_implementation(implementation)
  q, k, v = _check_qkv(query, key, value)
  unbatched = q.ndim == 3
  if unbatched:
    q, k, v = q[None], k[None], v[None]
  B, T, N, H = q.shape
  S = k.shape[1]
  q_len = _check_lengths("query_seq_lengths", query_seq_lengths, B)
  kv_len = _check_lengths("key_value_seq_lengths", key_value_seq_lengths, B)
  window_left, window_right = _window(local_window_size)
  if causal_alignment not in _ALIGNMENTS:
    raise ValueError(f"causal_alignment must be 'top_left' or 'bottom_right'; got {causal_alignment!r}")
  scale = 1.0 / math.sqrt(H) if scale is None else _checks.static_float("scale", scale)
  if logit_soft_cap is not None:
    logit_soft_cap = _checks.static_float("logit_soft_cap", logit_soft_cap)
    if not logit_soft_cap > 0:
      raise ValueError(f"logit_soft_cap must be > 0; got {logit_soft_cap}")
  if (q_segment_ids is None) != (kv_segment_ids is None):
    raise ValueError("q_segment_ids and kv_segment_ids must be given together")
  extras = dict(bias=bias, mask=mask, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                logit_soft_cap=logit_soft_cap)
  for name in ("bias", "mask", "q_segment_ids", "kv_segment_ids"):
    if extras[name] is not None:
      extras[name] = _checks.as_array(name, extras[name])
      if unbatched and name in ("bias", "mask") and extras[name].ndim == 3:
        extras[name] = extras[name][None]
  if extras["mask"] is not None and extras["mask"].dtype != np.bool_:
    raise TypeError(f"mask must be boolean (True = attend); got dtype {extras['mask'].dtype}")
  offset = S - T if causal_alignment == "bottom_right" else 0

  in_kernel = [n for n in ("bias", "mask", "q_segment_ids", "logit_soft_cap") if extras[n] is not None]
  if implementation in _primitive.KERNEL_PLATFORMS and in_kernel:
    raise ValueError(f"implementation={implementation!r}: the attention kernel does not support "
                     f"{', '.join(in_kernel)} yet; use implementation=None or 'xla'")
  if implementation == "cuda" and (why := _cuda_unsupported(q.dtype, H)):
    raise ValueError(f"implementation='cuda': {why}")

  if implementation == "xla" or in_kernel or 0 in (B, T, S, N, H):
    window = None if (window_left, window_right) == (_UNBOUNDED, _UNBOUNDED) else (window_left, window_right)
    out, lse = attention_reference(
        q, k, v, extras["bias"], extras["mask"], scale=scale, is_causal=bool(is_causal),
        causal_offset=offset, query_seq_lengths=q_len, key_value_seq_lengths=kv_len, window=window,
        q_segment_ids=extras["q_segment_ids"], kv_segment_ids=extras["kv_segment_ids"],
        logit_soft_cap=logit_soft_cap)
  else:
    cfg = _Config(scale=scale, causal=bool(is_causal), offset=offset, window_left=window_left,
                  window_right=window_right, has_q_lengths=q_len is not None,
                  has_kv_lengths=kv_len is not None, implementation=implementation,
                  deterministic=bool(deterministic))
    out, lse = _attention(q, k, v, q_len, kv_len, cfg)
  if unbatched:
    out, lse = out[0], lse[0]
  if not return_residual:
    return out
  # jax.nn's residual: logsumexp as [B, T, N] in the input dtype, no gradient.
  return out, jax.lax.stop_gradient(jnp.swapaxes(lse, -1, -2).astype(k.dtype))
