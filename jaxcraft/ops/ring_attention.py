"""Ring attention: context parallelism for `dot_product_attention` inside
`shard_map`.

Flow: `ring_attention` (checks, zig-zag reorder, custom_vjp) -> `_ring.forward`
/ `_ring.backward` (the ring schedule) -> per block, the attention kernel
primitives (`attention.ring_blocks`), or with segment ids (which the ring's
kernel blocks do not take) the pure-JAX block ops below.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Hashable

import jax
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxcraft import remat
from jaxcraft.ops import _checks, _primitive, _ring, attention
from jaxcraft.ops.attention_reference import (
  attention_backward_reference,
  attention_reference,
)

LAYOUTS = ("contiguous", "zigzag")


def _reference_blocks(scale):
  """Blocks in pure JAX (segment ids, implementation="xla"): each materializes
  one block's [B, N, T_local, S_local] logits."""
  def masks(causal, q_len, kv_len, q_seg, kv_seg):
    return dict(scale=scale, is_causal=causal, causal_offset=0, query_seq_lengths=q_len,
                key_value_seq_lengths=kv_len, window=None, q_segment_ids=q_seg,
                kv_segment_ids=kv_seg)

  def fwd(q, k, v, *, causal, q_len, kv_len, q_seg, kv_seg):
    return attention_reference(q, k, v, **masks(causal, q_len, kv_len, q_seg, kv_seg))

  def bwd(q, k, v, o, lse, do, *, causal, q_len, kv_len, q_seg, kv_seg):
    return attention_backward_reference(q, k, v, o, lse, do,
                                        **masks(causal, q_len, kv_len, q_seg, kv_seg))[:3]

  return _ring.Blocks(fwd, bwd)


@dataclasses.dataclass(frozen=True)
class _Config:
  ring: _ring.Ring
  scale: float
  implementation: str | None
  deterministic: bool
  kernel: bool  # the kernel blocks, else the pure-JAX ones

  def blocks(self):
    if not self.kernel:
      return _reference_blocks(self.scale)
    return attention.ring_blocks(self.scale, self.implementation, self.deterministic)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _ring_attention(q, k, v, q_seg, kv_seg, static):
  return _ring_attention_fwd(q, k, v, q_seg, kv_seg, static)[0]


def _ring_attention_fwd(q, k, v, q_seg, kv_seg, static):
  o, lse = _ring.forward(static.blocks(), static.ring, q, k, v, q_seg, kv_seg)
  # The names of jaxcraft.remat's policies: saving them spares the backward a ring forward.
  o = checkpoint_name(o, remat.ATTENTION_OUT)
  lse = checkpoint_name(lse, remat.ATTENTION_LSE)
  return o, (q, k, v, o, lse, q_seg, kv_seg)


def _ring_attention_bwd(static, saved, do):
  q, k, v, o, lse, q_seg, kv_seg = saved
  dq, dk, dv = _ring.backward(static.blocks(), static.ring, q, k, v, o, lse, do.astype(o.dtype),
                              q_seg, kv_seg)
  return dq, dk, dv, None, None


_ring_attention.defvjp(_ring_attention_fwd, _ring_attention_bwd)


def _axis_size(axis_name: Hashable) -> int:
  names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
  try:
    return math.prod(jax.lax.axis_size(a) for a in names)
  except NameError:
    raise ValueError(f"ring_attention: axis_name {axis_name!r} is not a bound mesh axis; call it "
                     "inside jax.shard_map with the sequence sharded over that axis") from None


def _check_segment_ids(q_segment_ids, kv_segment_ids, batch, q_rows, kv_rows):
  if (q_segment_ids is None) != (kv_segment_ids is None):
    raise ValueError("q_segment_ids and kv_segment_ids must be given together")
  if q_segment_ids is None:
    return None, None
  out = []
  for name, ids, rows in (("q_segment_ids", q_segment_ids, q_rows),
                          ("kv_segment_ids", kv_segment_ids, kv_rows)):
    ids = _checks.as_array(name, ids)
    if ids.dtype != np.int32:
      raise TypeError(f"{name} must be int32; got dtype {ids.dtype}")
    _checks.check_shape(name, ids, (batch, rows), "this device's shard: [B, local length]")
    out.append(ids)
  return tuple(out)


def ring_attention(query, key, value, *, axis_name, is_causal=False, scale=None,
                   q_segment_ids=None, kv_segment_ids=None, layout="contiguous",
                   implementation=None, deterministic=False):
  """`dot_product_attention` over a sequence sharded along `axis_name`.

  Call it inside `jax.shard_map`: the arguments are this device's shards,
  and the result is this device's shard of the output, matching
  `dot_product_attention` on the whole sequence. K/V shards circulate around
  the ring (`ppermute` to the next device while the current block computes);
  partial results merge by logsumexp in float32. Forward and gradients run
  jaxcraft's attention kernels per block; with segment ids each block is
  pure JAX, materializing one block's [B, N, T, S] logits. Rows that see no
  key anywhere give zeros (and zero gradients). Differentiable in query, key
  and value.

  Args:
    query: this device's [B, T, N, H] (or unbatched [T, N, H]) float32,
      bfloat16 or float16.
    key: [B, S, K, H] (or [S, K, H]) with query's dtype; N must be a
      multiple of K.
    value: key's shape and dtype.
    axis_name: the mesh axis name (or tuple of names) the sequence is
      sharded over.
    is_causal: causal attention, top-left aligned on the whole sequence;
      needs T == S.
    scale: Python float (static); default 1 / sqrt(H).
    q_segment_ids: optional int32 [B, T] (or [T]), this device's shard;
      attend only within equal ids.
    kv_segment_ids: int32 [B, S] (or [S]); given together with
      `q_segment_ids`.
    layout: how the sequence is split over the devices; matters only with
      `is_causal`. "contiguous" (default; what shard_map's in_specs
      produce): device d holds the d-th slice; causal attention reorders
      the shards into zig-zag ones for a balanced ring (one exchange of half
      of q, k, v and of the output, and in the backward of dO and the
      gradients); an odd local length runs the unbalanced contiguous ring.
      "zigzag": the data is already in zig-zag order (the sequence cut into
      2n chunks, device d holding chunks d and 2n-1-d, concatenated); no
      reorder, and the local length must be even.
    implementation: None runs the kernel blocks where they apply, else the
      pure-JAX blocks; "cuda" or "cpu" forces the kernel blocks (not with
      segment ids); "xla" runs pure-JAX blocks.
    deterministic: backward kernels without floating-point atomics, as in
      `dot_product_attention`.

  Returns:
    This device's output shard, query's shape and dtype.

  Raises:
    TypeError: as `dot_product_attention` for the inputs; segment ids are
      not int32; `scale` is traced or not a float.
    ValueError: as `dot_product_attention` for the shapes; segment ids of
      the wrong shape or given alone; `axis_name` is not a bound mesh axis;
      an unknown `layout`; `is_causal` with T != S; "zigzag" with an odd
      causal local length; a forced kernel with segment ids, or "cuda" for
      inputs the CUDA kernel does not take.
  """
  _primitive.check_implementation(implementation)
  q, k, v = attention.check_qkv(query, key, value)
  implementation = _checks.float_implementation("query", q, implementation)
  unbatched = q.ndim == 3
  if unbatched:
    q, k, v = q[None], k[None], v[None]
    q_segment_ids, kv_segment_ids = (None if a is None else _checks.as_array(n, a)[None]
                                     for n, a in (("q_segment_ids", q_segment_ids),
                                                  ("kv_segment_ids", kv_segment_ids)))
  B, T, _, H = q.shape
  S = k.shape[1]
  q_seg, kv_seg = _check_segment_ids(q_segment_ids, kv_segment_ids, B, T, S)
  if layout not in LAYOUTS:
    raise ValueError(f"layout must be 'contiguous' or 'zigzag'; got {layout!r}")
  is_causal = bool(is_causal)
  if is_causal and T != S:
    raise ValueError(f"ring_attention: is_causal needs equal query and key/value shard lengths; "
                     f"got {T} and {S}")
  if is_causal and layout == "zigzag" and T % 2:
    raise ValueError(f"layout='zigzag': the local length must be even (two chunks); got {T}")
  scale = 1.0 / math.sqrt(H) if scale is None else _checks.static_float("scale", scale)
  if implementation in _primitive.KERNEL_PLATFORMS and q_seg is not None:
    raise ValueError(f"implementation={implementation!r}: the attention kernel does not support "
                     "q_segment_ids yet; use implementation=None or 'xla'")
  if implementation == "cuda" and (why := attention.cuda_unsupported(q.shape, k.shape, q.dtype)):
    raise ValueError(f"implementation='cuda': {why}")

  ring, reorder = _ring.plan(axis_name, _axis_size(axis_name), causal=is_causal, local_len=T,
                             zigzag_input=layout == "zigzag")
  static = _Config(ring, scale, implementation, bool(deterministic),
                   kernel=q_seg is None and implementation != "xla")
  if reorder:
    q, k, v, q_seg, kv_seg = (_ring.to_zigzag(x, 1, ring) for x in (q, k, v, q_seg, kv_seg))
  out = _ring_attention(q, k, v, q_seg, kv_seg, static)
  if reorder:
    out = _ring.from_zigzag(out, 1, ring)
  return out[0] if unbatched else out
