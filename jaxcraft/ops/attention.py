"""Flash attention: a drop-in for `jax.nn.dot_product_attention`.

Flow: `dot_product_attention` (checks, custom_vjp) -> `_fwd_p` / `_bwd_p`
(partitioned primitives: batching, sharding) -> `_fwd_kernel_p` /
`_bwd_kernel_p` (FFI targets `_ffi.ATTENTION_FWD` / `_ffi.ATTENTION_BWD`,
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
from jaxcraft.ops.attention_dropout import dropout_key_words, dropout_keep_mask
from jaxcraft.ops.attention_reference import (
  attention_backward_reference,
  attention_reference,
)

F32 = jnp.float32
U32 = jnp.uint32
I32 = jnp.int32
_UNBOUNDED = -1  # window bound meaning "no limit" in AttentionMask


# Optional operands, in the order the primitives take the present ones and
# the FFI handlers take all of them (absent: a zero-sized placeholder).
_OPTIONAL = ("q_len", "kv_len", "bias", "mask", "q_seg", "kv_seg", "dropout_key")
_PLACEHOLDER_DTYPES = dict(q_len=I32, kv_len=I32, bias=F32, mask=jnp.bool_, q_seg=I32,
                           kv_seg=I32, dropout_key=jnp.uint32)
_SEGMENT_BLOCK = 64  # kSegmentBlock in cpp/contract/attention.h


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static params shared by the forward and backward primitives."""
  scale: float
  causal: bool
  offset: int
  window_left: int
  window_right: int
  implementation: str | None
  deterministic: bool = False
  present: tuple[str, ...] = ()  # the optional operands given (_OPTIONAL order)
  softcap: float = 0.0           # 0: none
  dropout_rate: float = 0.0
  dropout_broadcast: bool = False
  precision: jax.lax.Precision | None = None  # the float32 / float64 reference's matmuls

  def ffi_attrs(self):
    return dict(scale=np.float32(self.scale), causal=self.causal, offset=np.int64(self.offset),
                window_left=np.int64(self.window_left), window_right=np.int64(self.window_right),
                softcap=np.float32(self.softcap), dropout_rate=np.float32(self.dropout_rate),
                dropout_broadcast=self.dropout_broadcast)

  @property
  def windowed(self) -> bool:
    return (self.window_left, self.window_right) != (_UNBOUNDED, _UNBOUNDED)

  def has(self, name: str) -> bool:
    return name in self.present

  def split(self, optional) -> dict:
    """The present optional operands by name (absent ones: None)."""
    given = dict(zip(self.present, optional))
    return {name: given.get(name) for name in _OPTIONAL}

  def _reference_args(self, x, shape):
    """attention_reference's keywords for optional operands `x` (a dict as
    `split` gives; empty arrays count as absent)."""
    x = {n: (None if a is None or a.size == 0 else a) for n, a in x.items()}
    keep = None
    if x["dropout_key"] is not None:
      keep = dropout_keep_mask(x["dropout_key"], self.dropout_rate, shape,
                               broadcast=self.dropout_broadcast)
    return dict(scale=self.scale, is_causal=self.causal, causal_offset=self.offset,
                query_seq_lengths=x["q_len"], key_value_seq_lengths=x["kv_len"],
                window=(self.window_left, self.window_right) if self.windowed else None,
                bias=x["bias"], mask=x["mask"], q_segment_ids=x["q_seg"],
                kv_segment_ids=x["kv_seg"], logit_soft_cap=self.softcap or None,
                dropout_rate=self.dropout_rate, dropout_keep=keep)

  def reference(self, q, k, v, x):
    B, T, N, _ = q.shape
    return attention_reference(q, k, v, precision=self.precision,
                               **self._reference_args(x, (B, N, T, k.shape[1])))

  def reference_backward(self, q, k, v, o, lse, do, x):
    B, T, N, _ = q.shape
    # Its matmuls are float32 at HIGHEST, whatever the forward's precision.
    return attention_backward_reference(q, k, v, o, lse, do,
                                        **self._reference_args(x, (B, N, T, k.shape[1])))


def cuda_unsupported(q_shape, k_shape, dtype) -> str | None:
  """Why the CUDA kernels cannot take q [B, T, N, H] and k, v [B, S, K, H]."""
  (B, T, N, H), (S, K) = q_shape, k_shape[1:3]
  return _ffi.cuda_unsupported("attention", batch=B, seqlen_q=T, seqlen_k=S, num_heads=N,
                               num_kv_heads=K, head_dim=H, dtype=np.dtype(dtype).name)


def _unsupported(platform, avals_in, *, cfg):
  q, k = avals_in[:2]
  return cuda_unsupported(q.shape, k.shape, q.dtype) if platform == "cuda" else None


# ------------------------------------------------------- kernel primitives
# Kernel primitives take every optional operand (placeholders for absent
# ones) plus the segment tile ranges, in the FFI handlers' order.
_KERNEL_OPTIONAL = ("q_len", "kv_len", "bias", "mask", "q_seg", "kv_seg", "seg_key_range",
                    "seg_query_range", "dropout_key")


def _kernel_dict(optional):
  return dict(zip(_KERNEL_OPTIONAL, optional))


def _dbias_dtype(q, bias):
  """The kernels' dbias dtype (contract/attention.h): the bias's own where each element
  has one writer, float32 where several (b, n) sum into it (the bias
  broadcasts over a batch or head axis of size > 1)."""
  B, _, N, _ = q.shape
  shared = (bias.shape[0] == 1 and B > 1) or (bias.shape[1] == 1 and N > 1)
  return F32 if shared else bias.dtype


def _dbias_aval(bias, dtype):
  """Shaped and sharded as the bias."""
  return _primitive.result_aval(bias, bias.shape, dtype, _primitive.row_spec(bias, bias.ndim))


def _fwd_kernel_abstract(q, k, v, *optional, cfg):
  B, T, N, _ = q.shape
  spec = _primitive.row_spec(q, 3)
  # o, lse, and the scratch word from which the Hopper kernel's persistent
  # CTAs take their work units (zeroed by the handler on each call).
  return (_primitive.result_aval(q, q.shape, q.dtype, spec),
          _primitive.result_aval(q, (B, N, T), F32, (spec[0], spec[2])),
          _primitive.result_aval(q, (1,), U32))


def _fwd_kernel_reference(q, k, v, *optional, cfg):
  return *cfg.reference(q, k, v, _kernel_dict(optional)), jnp.zeros((1,), U32)


_fwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_attention_fwd_kernel", target=_ffi.ATTENTION_FWD,
    abstract_eval=_fwd_kernel_abstract, reference=_fwd_kernel_reference,
    ffi_attrs=lambda *, cfg: cfg.ffi_attrs(),
    unsupported=_unsupported)


def _bwd_kernel_abstract(q, k, v, o, lse, do, *optional, cfg):
  B, T, N, H = q.shape
  like = lambda a, x: _primitive.result_aval(x, a.shape, a.dtype, _primitive.row_spec(a, a.ndim))
  scratch = lambda shape: _primitive.result_aval(q, shape, F32)
  accum = (0,) if cfg.deterministic else (B, T, N, H)
  bias = _kernel_dict(optional).get("bias")
  dbias = (_dbias_aval(bias, _dbias_dtype(q, bias)) if bias is not None and bias.size
           else scratch((0,)))
  return (like(q, q), like(k, k), like(v, v), scratch((B, N, T)), scratch(accum), dbias)


def _bwd_kernel_reference(q, k, v, o, lse, do, *optional, cfg):
  # From the given o and lse, as the kernel: a ring attention block passes the
  # global ones, which differ from this block's own.
  x = _kernel_dict(optional)
  dq, dk, dv, dbias = cfg.reference_backward(q, k, v, o, lse, do, x)
  B, T, N, H = q.shape
  accum = (0,) if cfg.deterministic else (B, T, N, H)
  if dbias is None:
    dbias = jnp.zeros((0,), F32)
  else:  # summed over the axes the bias broadcasts
    dbias = jnp.sum(dbias, axis=tuple(a for a in (0, 1) if x["bias"].shape[a] == 1), keepdims=True)
    dbias = dbias.astype(_dbias_dtype(q, x["bias"]))
  return dq, dk, dv, jnp.zeros((B, N, T), F32), jnp.zeros(accum, F32), dbias


_bwd_kernel_p = _primitive.kernel_primitive(
    "jaxcraft_attention_bwd_kernel", target=_ffi.ATTENTION_BWD,
    abstract_eval=_bwd_kernel_abstract, reference=_bwd_kernel_reference,
    ffi_attrs=lambda *, cfg: dict(cfg.ffi_attrs(), deterministic=cfg.deterministic),
    unsupported=_unsupported)


# ------------------------------------------------- partitioned primitives
def _block_min_max(ids):
  """Per 64-position block of ids [B, L]: (min, max), each [B, ceil(L / 64)]."""
  B, L = ids.shape
  pad = -L % _SEGMENT_BLOCK
  if pad:  # repeat the last id: the block's range stays the same
    ids = jnp.concatenate([ids, jnp.repeat(ids[:, -1:], pad, axis=1)], axis=1)
  blocks = ids.reshape(B, -1, _SEGMENT_BLOCK)
  return blocks.min(-1), blocks.max(-1)


def _first_last_ranges(overlap, length):
  """For overlap [B, R, C] (block r may share an id with block c): per r the
  element range [first c * 64, (last c + 1) * 64) clipped to `length`, or
  (length, 0) when no block overlaps. Int32 [B, R, 2]."""
  C = overlap.shape[-1]
  any_ = overlap.any(-1)
  first = jnp.argmax(overlap, -1)
  last = C - 1 - jnp.argmax(overlap[..., ::-1], -1)
  lo = jnp.where(any_, first * _SEGMENT_BLOCK, length)
  hi = jnp.where(any_, jnp.minimum((last + 1) * _SEGMENT_BLOCK, length), 0)
  return jnp.stack([lo, hi], -1).astype(I32)


def _segment_ranges(q_seg, kv_seg):
  """The kernels' tile ranges for segment ids (contract/attention.h: AttentionMask):
  which keys each 64-row block may see and which rows each 64-key block may
  be seen by. Exact for sorted ids; a superset (still correct) otherwise."""
  q_min, q_max = _block_min_max(q_seg)
  k_min, k_max = _block_min_max(kv_seg)
  overlap = (q_min[:, :, None] <= k_max[:, None, :]) & (k_min[:, None, :] <= q_max[:, :, None])
  return (_first_last_ranges(overlap, kv_seg.shape[1]),
          _first_last_ranges(jnp.swapaxes(overlap, 1, 2), q_seg.shape[1]))


def _kernel_operands(cfg, optional):
  """The kernel primitives' optional operands from the present ones."""
  x = cfg.split(optional)
  if x["q_seg"] is not None:
    x["seg_key_range"], x["seg_query_range"] = _segment_ranges(x["q_seg"], x["kv_seg"])
  placeholder = lambda n: jnp.zeros((0,), _PLACEHOLDER_DTYPES.get(n, I32))
  return [x.get(n) if x.get(n) is not None else placeholder(n) for n in _KERNEL_OPTIONAL]


def _fwd_local(cfg, q, k, v, *optional):
  o, lse, _ = _fwd_kernel_p.bind(q, k, v, *_kernel_operands(cfg, optional), cfg=cfg)
  return [o, lse]


def _bwd_local(cfg, q, k, v, o, lse, do, *optional):
  dq, dk, dv, _, _, dbias = _bwd_kernel_p.bind(q, k, v, o, lse, do,
                                               *_kernel_operands(cfg, optional), cfg=cfg)
  # In the bias's dtype (_bwd_abstract); a float32 sum is cast here.
  bias = cfg.split(optional)["bias"]
  if bias is None:
    return [dq, dk, dv]
  return [dq, dk, dv, dbias.astype(bias.dtype) if bias.size else jnp.zeros_like(bias)]


def _fwd_abstract(q, k, v, *optional, cfg):
  return list(_fwd_kernel_abstract(q, k, v, cfg=cfg)[:2])


def _bwd_abstract(q, k, v, o, lse, do, *optional, cfg):
  outs = _bwd_kernel_abstract(q, k, v, o, lse, do, cfg=cfg)[:3]
  bias = cfg.split(optional)["bias"]
  return list(outs) + ([_dbias_aval(bias, bias.dtype)] if bias is not None else [])


def _ring_blocks(cfg):
  """Ring attention's block ops (_ring.Blocks) on these primitives: a ring
  step's mask is a static causal flag (offset 0) plus dynamic lengths."""
  def block_cfg(causal, q_len, kv_len):
    present = tuple(n for n, a in (("q_len", q_len), ("kv_len", kv_len)) if a is not None)
    return dataclasses.replace(cfg, causal=causal, offset=0, window_left=_UNBOUNDED,
                               window_right=_UNBOUNDED, present=present)

  def given(q_len, kv_len):
    return [a for a in (q_len, kv_len) if a is not None]

  def fwd(q, k, v, *, causal, q_len, kv_len, q_seg=None, kv_seg=None):
    assert q_seg is None and kv_seg is None, "ring blocks take no segment ids"
    c = block_cfg(causal, q_len, kv_len)
    return tuple(_fwd_p.bind(q, k, v, *given(q_len, kv_len), cfg=c))

  def bwd(q, k, v, o, lse, do, *, causal, q_len, kv_len, q_seg=None, kv_seg=None):
    assert q_seg is None and kv_seg is None, "ring blocks take no segment ids"
    c = block_cfg(causal, q_len, kv_len)
    return tuple(_bwd_p.bind(q, k, v, o, lse, do, *given(q_len, kv_len), cfg=c))

  return _ring.Blocks(fwd, bwd)


def ring_blocks(scale, implementation, deterministic):
  """The kernel block ops of ring attention (ring_attention.py), unmasked
  but for each step's causal flag and lengths."""
  return _ring_blocks(_Config(scale=scale, causal=False, offset=0, window_left=_UNBOUNDED,
                              window_right=_UNBOUNDED, implementation=implementation,
                              deterministic=deterministic))


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
  optional operand or window (their masks are not shifted per block)."""
  seq = (tuple(spec or ()) + (None,) * 4)[1]
  if seq is None:
    return None
  T, S = shapes[0][1], shapes[1][1]
  size = math.prod(mesh.shape[a] for a in (seq if isinstance(seq, tuple) else (seq,)))
  # Lengths, windows, segment ids, bias, mask and dropout all index the
  # global sequence, which ring blocks do not see.
  if (cfg.present or cfg.windowed or T % size or S % size or (cfg.causal and T != S)):
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


def _optional_rules(cfg, shapes, heads):
  """Shardy factors of the present optional operands (`shapes` lists them
  after q, k, v): lengths and segment ids follow the batch; bias and mask
  [1|B, 1|N, T, S] the batch and query heads where not broadcast."""
  B, N = shapes[0][0], shapes[0][2]
  broadcastable = lambda shape: (f"{'b' if shape[0] == B else 'b1'} "
                                 f"{heads if shape[1] == N else 'n1'} t s")
  rules = dict(q_len="b", kv_len="b", q_seg="b t", kv_seg="b s", dropout_key="r")
  shape_of = dict(zip(cfg.present, shapes[-len(cfg.present):] if cfg.present else ()))
  return [rules.get(n) or broadcastable(shape_of[n]) for n in cfg.present]


def _optional_specs(cfg, shapes, b, h):
  B, N = shapes[0][0], shapes[0][2]
  shape_of = dict(zip(cfg.present, shapes[-len(cfg.present):] if cfg.present else ()))
  specs = dict(q_len=P(b), kv_len=P(b), q_seg=P(b, None), kv_seg=P(b, None),
               dropout_key=P(None))
  broadcastable = lambda shape: P(b if shape[0] == B else None, h if shape[1] == N else None,
                                  None, None)
  return [specs.get(n) or broadcastable(shape_of[n]) for n in cfg.present]


def _partitioned_maker(kind, local, ring_local):
  """make_partitioned for the fwd or bwd primitive. Shardy's rule relates the
  query heads to the KV heads as (k g): sharding KV heads shards their groups.
  A sequence-sharded q keeps its sequence axis (q, k, v, o, dO on axis 1, lse
  on axis 2) and runs `ring_local` over it: the fwd and bwd primitives are
  each partitioned into their half of ring attention."""
  def make(shapes, *, cfg):
    num_heads, num_kv_heads = shapes[0][2], shapes[1][2]
    # Shardy rejects a size-1 factor in a compound one: without GQA (g = 1)
    # the query heads are the KV heads' factor itself.
    groups = num_heads // num_kv_heads
    heads = "(k g)" if groups > 1 else "k"
    q_rule, kv_rule, lse_rule = f"b t {heads} d", "b s k d", f"b {heads} t"
    optional = _optional_rules(cfg, shapes, heads)
    if kind == "fwd":
      operands, results = [q_rule, kv_rule, kv_rule], [q_rule, lse_rule]
    else:
      operands = [q_rule, kv_rule, kv_rule, q_rule, lse_rule, q_rule]
      results = [q_rule, kv_rule, kv_rule]
    dbias = kind == "bwd" and cfg.has("bias")  # the bias's gradient, laid out as the bias

    def choose(mesh, specs):
      b, h = _head_specs(mesh, specs[0], num_kv_heads)
      if cfg.has("dropout_key") and not cfg.dropout_broadcast:
        # Dropout's RNG counter holds the global batch row and head, which a
        # shard does not know: gathered, the mask matches the unsharded one.
        b = h = None
      ring = _sequence_ring(cfg, mesh, specs[0], shapes)
      t = ring[0].axis_name if ring else None
      blocks = {q_rule: P(b, t, h, None), kv_rule: P(b, t, h, None), lse_rule: P(b, h, t)}
      extra = _optional_specs(cfg, shapes, b, h)
      res = [blocks[r] for r in results]
      if dbias:
        res.append(extra[cfg.present.index("bias")])
      body = functools.partial(ring_local, cfg, *ring) if ring else None
      return [blocks[r] for r in operands] + extra, res, [()] * len(res), body

    return _primitive.partitioned_call(
        functools.partial(local, cfg),
        sharding_rule=", ".join(operands + optional) + " -> " + ", ".join(
            results + ([optional[cfg.present.index("bias")]] if dbias else [])),
        choose_shardings=choose, **({"g": groups} if groups > 1 else {}))
  return make


# Bias and mask may broadcast over the batch (leading dim 1); the batch rule
# keeps them so when they are not mapped.
_BROADCASTABLE = ("bias", "mask")


def _batch_rule(prim, n_fixed):
  """Extra leading batch axes (vmap) fold into the batch dimension B, except
  where that would change the result: dropout drawn per batch row (its RNG
  counter holds the row) and a batch-broadcast bias or mask that is mapped,
  or whose gradient is wanted, run one vmapped slice at a time."""
  def rule(args, dims, *, cfg):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not _primitive.NOT_MAPPED)
    lead = lambda a, d: a.shape[1 if d == 0 else 0]  # the first unbatched dim
    B = lead(args[0], dims[0])
    names = ("",) * n_fixed + cfg.present
    shared = lambda a, d, n: n in _BROADCASTABLE and lead(a, d) == 1 and B > 1
    sequential = (cfg.has("dropout_key") and not cfg.dropout_broadcast) or any(
        shared(a, d, n) and (d is not _primitive.NOT_MAPPED or (n == "bias" and prim is _bwd_p))
        for a, d, n in zip(args, dims, names))
    if sequential:
      moved = [a if d is _primitive.NOT_MAPPED else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
      mapped = [d is not _primitive.NOT_MAPPED for d in dims]

      def one(xs):
        it = iter(xs)
        return prim.bind(*[next(it) if m else a for a, m in zip(moved, mapped)], cfg=cfg)

      outs = jax.lax.map(one, [a for a, m in zip(moved, mapped) if m])
      return list(outs), [0] * len(outs)

    folded = []
    for a, d, n in zip(args, dims, names):
      if n == "dropout_key" or (d is _primitive.NOT_MAPPED and shared(a, d, n)):
        folded.append(a)  # no batch axis / broadcast over the folded batch
        continue
      a = _primitive.move_to_front(a, d, size)
      folded.append(a.reshape(size * a.shape[1], *a.shape[2:]))
    outs = prim.bind(*folded, cfg=cfg)
    return [o.reshape(size, o.shape[0] // size, *o.shape[1:]) for o in outs], [0] * len(outs)
  return rule


_fwd_p = _primitive.partitioned_primitive(
    "jaxcraft_attention_fwd", abstract_eval=_fwd_abstract,
    batching_rule=lambda args, dims, *, cfg: _batch_rule(_fwd_p, 3)(args, dims, cfg=cfg),
    make_partitioned=_partitioned_maker("fwd", _fwd_local, _ring_fwd_local))
_bwd_p = _primitive.partitioned_primitive(
    "jaxcraft_attention_bwd", abstract_eval=_bwd_abstract,
    batching_rule=lambda args, dims, *, cfg: _batch_rule(_bwd_p, 6)(args, dims, cfg=cfg),
    make_partitioned=_partitioned_maker("bwd", _bwd_local, _ring_bwd_local))


# ----------------------------------------------------------------- autodiff
@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, optional, cfg):
  return _attention_fwd(q, k, v, optional, cfg)[0]


def _attention_fwd(q, k, v, optional, cfg):
  o, lse = _fwd_p.bind(q, k, v, *optional, cfg=cfg)
  # Named for jax.checkpoint policies (jaxcraft.remat): the backward kernel
  # needs o and lse, so keeping both spares a rerun of the forward kernel.
  o = checkpoint_name(o, remat.ATTENTION_OUT)
  lse = checkpoint_name(lse, remat.ATTENTION_LSE)
  return (o, lse), (q, k, v, o, lse, optional)


def _attention_bwd(cfg, saved, cts):
  q, k, v, o, lse, optional = saved
  do, _ = cts  # lse is returned without gradient (stop_gradient outside)
  grads = _bwd_p.bind(q, k, v, o, lse, do.astype(o.dtype), *optional, cfg=cfg)
  # Only the bias among the optional operands is differentiable.
  bias = cfg.split(optional)["bias"]
  d_optional = tuple(grads[3].astype(bias.dtype) if n == "bias" else None for n in cfg.present)
  return grads[0], grads[1], grads[2], d_optional


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


def check_qkv(query, key, value):
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


def _check_broadcastable(name, x, target, unbatched):
  """bias / mask: broadcastable to [B, N, T, S] (jax.nn's rule; fewer dims
  are padded on the left) -> [1|B, 1|N, T, S], expanded over T and S only."""
  x = _checks.as_array(name, x)
  if unbatched and x.ndim == 3:
    x = x[None]
  if x.ndim > 4 or any(d not in (1, t) for d, t in zip(x.shape[::-1], target[::-1])):
    raise ValueError(f"{name} must be broadcastable to [B, N, T, S] = {tuple(target)}; "
                     f"got shape {tuple(x.shape)}")
  x = x.reshape((1,) * (4 - x.ndim) + tuple(x.shape))
  return jnp.broadcast_to(x, x.shape[:2] + tuple(target[2:]))


def _check_bias(bias, target, q_dtype, unbatched, deterministic):
  bias = _check_broadcastable("bias", bias, target, unbatched)
  _checks.check_floating("bias", bias)
  # The kernels read the inputs' dtype or float32; anything else is widened
  # (losslessly: the reference adds the bias in float32 too).
  if bias.dtype not in (np.dtype(q_dtype), np.dtype(np.float32)):
    bias = bias.astype(F32)
  if deterministic:  # a broadcast bias's gradient would sum with atomics
    bias = jnp.broadcast_to(bias, target)
  return bias


def _check_mask(mask, target, unbatched):
  mask = _check_broadcastable("mask", mask, target, unbatched)
  if mask.dtype != np.bool_:
    raise TypeError(f"mask must be boolean (True = attend); got dtype {mask.dtype}")
  return mask


def _check_segment_ids(q_segment_ids, kv_segment_ids, B, T, S, unbatched):
  if (q_segment_ids is None) != (kv_segment_ids is None):
    raise ValueError("q_segment_ids and kv_segment_ids must be given together")
  if q_segment_ids is None:
    return None, None
  out = []
  for name, ids, L in (("q_segment_ids", q_segment_ids, T), ("kv_segment_ids", kv_segment_ids, S)):
    ids = _checks.as_array(name, ids)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
      raise TypeError(f"{name} must be an integer array; got dtype {ids.dtype}")
    if unbatched and ids.ndim == 1:
      ids = ids[None]
    _checks.check_shape(name, ids, (B, L), "one id per batch row and position")
    out.append(ids.astype(I32))
  return tuple(out)


def _check_dropout(dropout_rate, dropout_rng):
  """The dropout key words, or None when there is no dropout."""
  rate = _checks.static_float("dropout_rate", dropout_rate)
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1); got {rate}")
  if rate == 0.0:
    return rate, None
  if dropout_rng is None:
    raise ValueError("dropout_rng (a JAX PRNG key) is required when dropout_rate > 0")
  return rate, dropout_key_words(dropout_rng)


def _complex_attention(query, key, value, bias, mask, extensions, **jax_nn_args):
  """Complex inputs: jax.nn's own computation (complex logits, a float32
  softmax of their real part, complex probabilities times the values).
  jaxcraft's extensions (`extensions`: name -> whether given) have no
  meaning there and raise a TypeError naming the first."""
  if given := [name for name, used in extensions.items() if used]:
    raise TypeError(f"{given[0]} is not supported with complex inputs (they run "
                    "jax.nn.dot_product_attention, which has no such argument)")
  return jax.nn.dot_product_attention(query, key, value, bias, mask, implementation="xla",
                                      **jax_nn_args)


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None,
                          is_causal=False, query_seq_lengths=None, key_value_seq_lengths=None,
                          local_window_size=None, q_segment_ids=None, kv_segment_ids=None,
                          logit_soft_cap=None, causal_alignment="top_left",
                          dropout_rate=0.0, dropout_rng=None, dropout_broadcast=False,
                          return_residual=False, implementation=None, deterministic=False,
                          precision=None):
  """Scaled dot-product attention computed by a flash-attention kernel.

  A drop-in for `jax.nn.dot_product_attention`: its arguments with the same
  meaning (but `implementation`, which picks jaxcraft's kernel or
  reference), plus the keyword-only extensions below. Differentiable in query, key, value and bias (custom VJP whose
  backward is a kernel too); works under `jax.jit`, `jax.vmap`, sharded
  `jax.jit` (sequence-sharded inputs run as ring attention) and
  `jax.export` (with `jaxcraft.EXPORT_DISABLED_CHECKS`).

  Rows that see no key (fully masked, or past `query_seq_lengths`) return
  zeros and a logsumexp of -inf, where jax.nn returns an average of all
  values.

  Args:
    query: [B, T, N, H] (or unbatched [T, N, H]) float32, bfloat16 or
      float16; float64 runs the reference in float64; complex inputs run
      `jax.nn.dot_product_attention`'s own computation (which takes the
      softmax of the logits' real part), with jax.nn's arguments only.
    key: [B, S, K, H] (or [S, K, H]) with query's dtype; N must be a
      multiple of K (grouped-query attention: query head n reads KV head
      n // (N // K)).
    value: key's shape and dtype.
    bias: optional floating array broadcastable to [B, N, T, S] (fewer
      dims pad on the left, as in jax.nn), added to the logits in float32.
      Differentiable: its gradient is summed over the axes it broadcasts.
    mask: optional bool array broadcastable to [B, N, T, S]; True = attend.
    scale: Python float multiplying the logits (static); default
      1 / sqrt(H).
    is_causal: query i attends to keys j <= i (shifted by
      `causal_alignment`).
    query_seq_lengths: optional int32 [B] ([1] unbatched): rows
      i >= length see no key.
    key_value_seq_lengths: optional int32 [B] ([1] unbatched): keys
      j >= length are hidden.
    local_window_size: None, an int w (meaning (w, w)), or a (left, right)
      pair of non-negative ints: query i sees keys i - left <= j <= i + right
      (shifted by `causal_alignment`).
    q_segment_ids: optional integer [B, T] (or [T] unbatched); query i sees
      key j only where q_segment_ids[b, i] == kv_segment_ids[b, j]. Sorted
      ids, as in packed documents, let the kernel skip whole tiles.
    kv_segment_ids: integer [B, S] (or [S]); given together with
      `q_segment_ids`.
    logit_soft_cap: optional Python float > 0: logits become
      cap * tanh(logits / cap), after `scale` and before `bias`.
    causal_alignment: "top_left" (default, as jax.nn) or "bottom_right":
      query i sees keys j <= i + S - T; windows shift the same way.
    dropout_rate: Python float in [0, 1); dropout on the probabilities,
      kept ones scaled by 1 / (1 - rate). The kernel regenerates the mask in
      the backward pass; `jaxcraft.attention_dropout_mask` reproduces it.
    dropout_rng: JAX PRNG key; required when `dropout_rate` > 0.
    dropout_broadcast: one dropout mask shared by every batch row and head
      (Flax's `broadcast_dropout`).
    return_residual: also return the logsumexp, as jax.nn does.
    implementation: None runs the kernel for the platform being compiled
      for where it is built and takes the inputs (the CUDA kernel:
      bfloat16 or float16, head dim <= 256 and a multiple of 8; the CPU
      kernel: every supported dtype and head dim), else the pure-JAX
      reference. "cuda" or "cpu" forces that kernel and raises where it
      cannot run; "xla" runs the pure-JAX reference
      (`jaxcraft.ops.attention_reference.attention_reference`).
    deterministic: a backward pass without floating-point atomics, so the
      gradients are the same from run to run (a broadcast bias is then
      materialized to [B, N, T, S] for its gradient).
    precision: None, or a `jax.lax.Precision` (or its name): the matmul
      precision of float32 and float64 inputs where the pure-JAX reference
      runs them (float32 on a GPU; float64; implementation="xla"). The CPU
      kernel computes float32 at full precision; 16-bit inputs are exact
      products accumulated in float32 under any precision.

  Returns:
    The output, query's shape and dtype. With `return_residual=True` the
    pair (output, logsumexp): the logsumexp is [B, T, N] (or [T, N]) in the
    inputs' dtype, the natural-log logsumexp over the visible keys of the
    scaled, soft-capped and biased logits (before dropout), -inf for rows
    that see no key, with no gradient (`jax.lax.stop_gradient`).

  Raises:
    TypeError: an input is not an array; query is not float32, bfloat16,
      float16, float64 or complex, or key/value differ from its dtype; a
      jaxcraft extension is given with complex inputs; bias is not
      floating; mask is not bool; sequence lengths are not int32; segment ids
      are not integers; `scale`, `logit_soft_cap` or `dropout_rate` is traced
      or not a float; `local_window_size` is not an int or a pair of ints.
    ValueError: query, key and value are not all 3-D or all 4-D, or their
      batch sizes, head dims or head counts do not match (key and value shapes
      must be equal); bias or mask does not broadcast to [B, N, T, S]; lengths
      or segment ids have the wrong shape, or only one kind of segment ids is
      given; a negative window; `causal_alignment` is unknown;
      `logit_soft_cap` <= 0; `dropout_rate` outside [0, 1) or no
      `dropout_rng`; `precision` is not a precision; `implementation` forces a
      kernel on float64 or complex inputs, is unknown, names kernels this
      build lacks, or is "cuda" for inputs the CUDA kernel does not take (or
      for a computation compiled for another platform).
  """
  _primitive.check_implementation(implementation)
  if any(_checks.runs_jax_nn(name, a, implementation)
         for name, a in (("query", query), ("key", key), ("value", value))):
    extensions = dict(q_segment_ids=q_segment_ids is not None, kv_segment_ids=kv_segment_ids is not None,
                      logit_soft_cap=logit_soft_cap is not None,
                      causal_alignment=causal_alignment != "top_left", dropout_rate=dropout_rate != 0.0,
                      precision=precision is not None)
    return _complex_attention(query, key, value, bias, mask, extensions, scale=scale,
                              is_causal=is_causal, query_seq_lengths=query_seq_lengths,
                              key_value_seq_lengths=key_value_seq_lengths,
                              local_window_size=local_window_size, return_residual=return_residual)
  q, k, v = check_qkv(query, key, value)
  implementation = _checks.float_implementation("query", q, implementation)
  unbatched = q.ndim == 3
  if unbatched:
    q, k, v = q[None], k[None], v[None]
  B, T, N, H = q.shape
  S = k.shape[1]
  target = (B, N, T, S)
  q_len = _check_lengths("query_seq_lengths", query_seq_lengths, B)
  kv_len = _check_lengths("key_value_seq_lengths", key_value_seq_lengths, B)
  window_left, window_right = _window(local_window_size)
  if causal_alignment not in _ALIGNMENTS:
    raise ValueError(f"causal_alignment must be 'top_left' or 'bottom_right'; got {causal_alignment!r}")
  scale = 1.0 / math.sqrt(H) if scale is None else _checks.static_float("scale", scale)
  softcap = 0.0
  if logit_soft_cap is not None:
    softcap = _checks.static_float("logit_soft_cap", logit_soft_cap)
    if not softcap > 0:
      raise ValueError(f"logit_soft_cap must be > 0; got {softcap}")
  optional = dict(
      q_len=q_len, kv_len=kv_len,
      bias=None if bias is None else _check_bias(bias, target, q.dtype, unbatched, deterministic),
      mask=None if mask is None else _check_mask(mask, target, unbatched))
  optional["q_seg"], optional["kv_seg"] = _check_segment_ids(q_segment_ids, kv_segment_ids, B, T,
                                                             S, unbatched)
  dropout_rate, optional["dropout_key"] = _check_dropout(dropout_rate, dropout_rng)
  precision = _checks.precision(precision)
  offset = S - T if causal_alignment == "bottom_right" else 0
  if implementation == "cuda" and (why := cuda_unsupported(q.shape, k.shape, q.dtype)):
    raise ValueError(f"implementation='cuda': {why}")

  present = tuple(n for n in _OPTIONAL if optional[n] is not None)
  cfg = _Config(scale=scale, causal=bool(is_causal), offset=offset, window_left=window_left,
                window_right=window_right, implementation=implementation,
                deterministic=bool(deterministic), present=present, softcap=softcap,
                dropout_rate=dropout_rate, dropout_broadcast=bool(dropout_broadcast),
                precision=precision)
  if implementation == "xla" or 0 in (B, T, S, N, H):
    out, lse = cfg.reference(q, k, v, optional)
  else:
    out, lse = _attention(q, k, v, tuple(optional[n] for n in present), cfg)
  if unbatched:
    out, lse = out[0], lse[0]
  if not return_residual:
    return out
  # jax.nn's residual: logsumexp as [B, T, N] in the input dtype, no gradient.
  return out, jax.lax.stop_gradient(jnp.swapaxes(lse, -1, -2).astype(k.dtype))
