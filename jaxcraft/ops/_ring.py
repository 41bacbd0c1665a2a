"""Ring attention's schedule (context parallelism), independent of how one
block of attention is computed.

Each of the `size` devices on the ring axis holds one shard of the queries
and one of the keys/values. At step s a device attends its queries to the K/V
shard of the device s places before it, while that shard travels on to the
next device (`ppermute`, issued before the step's compute so that XLA can
overlap the two). Partial results merge by logsumexp in float32.

The backward is the same ring given the *global* out and logsumexp: each
block's probabilities are exp(logits - lse), so a block's share of dQ, dK and
dV comes out of one backward call per block. dQ is summed where it lives; dK
and dV accumulate in float32 into a buffer that travels with the K/V shard and
reaches its owner after one more hop.

Schedules (static; the device index is dynamic, so each step's causal case
becomes dynamic sequence lengths of one kernel call, never control flow):
- "full": not causal; every step sees the whole block.
- "causal": contiguous shards (device d holds chunk d). Step 0 is the causal
  diagonal; a later step's block is either all visible (it came from an
  earlier device) or all hidden (kv length 0). Unbalanced: the last device does
  `size` blocks, the first one.
- "zigzag": the sequence cut into 2 * size chunks, device d holding chunks d
  and 2 * size - 1 - d (low half, high half). Step 0 is causal on the local
  [lo; hi]; afterwards a block from an earlier device is seen by all queries
  but only through its low half (kv length = half), and one from a later device
  is seen only by the high-half queries, completely. Both are half a block of
  work on every device at every step. Those steps take the queries in
  [hi; lo] order, so that "high half only" is q length = half.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Hashable
from typing import NamedTuple

import jax
import jax.numpy as jnp

F32 = jnp.float32
SCHEDULES = ("full", "causal", "zigzag")


class Blocks(NamedTuple):
  """One block of attention, forward and backward, on local arrays.

  fwd(q, k, v, *, causal, q_len, kv_len, q_seg, kv_seg) -> (o, lse [B, N, T] f32)
  bwd(q, k, v, o, lse, do, *, causal, q_len, kv_len, q_seg, kv_seg) -> (dq, dk, dv)
  `q_len` / `kv_len`: int32 [B] or None (all rows / keys); causal has offset 0;
  `o`/`lse` given to bwd are the global ones.
  """
  fwd: Callable
  bwd: Callable


@dataclasses.dataclass(frozen=True)
class Ring:
  axis_name: Hashable  # a mesh axis name, or a tuple of them
  size: int
  schedule: str

  def __post_init__(self):
    if self.schedule not in SCHEDULES:
      raise ValueError(f"unknown ring schedule {self.schedule!r}")


def plan(axis_name, size, *, causal, local_len, zigzag_input):
  """(Ring, reorder): the schedule for these shards, and whether contiguous
  shards must first be reordered into zig-zag ones (`to_zigzag`).
  Zig-zag needs an even local length; odd ones run the unbalanced schedule."""
  if not causal:
    return Ring(axis_name, size, "full"), False
  if zigzag_input or local_len % 2 == 0:
    return Ring(axis_name, size, "zigzag"), not zigzag_input
  return Ring(axis_name, size, "causal"), False


_transfers = True  # False inside compute_only()


@contextlib.contextmanager
def compute_only():
  """Rings traced inside have no transfers: every step attends to the
  device's own K/V and partial sums stay put. The ring's compute alone, for
  benchmarks (bench/ring.py)."""
  global _transfers
  _transfers = False
  try:
    yield
  finally:
    _transfers = True


def shift(tree, ring, step=1):
  """Every device's `tree` to the device `step` places after it."""
  if not _transfers:
    return tree
  n = ring.size
  perm = [(d, (d + step) % n) for d in range(n)]
  return jax.tree.map(lambda x: jax.lax.ppermute(x, ring.axis_name, perm), tree)


def _halves(x, axis):
  c = x.shape[axis] // 2
  return jax.lax.slice_in_dim(x, 0, c, axis=axis), jax.lax.slice_in_dim(x, c, None, axis=axis)


def _swap(x, axis):
  """[lo; hi] <-> [hi; lo] along `axis` (None passes through)."""
  if x is None:
    return None
  lo, hi = _halves(x, axis)
  return jnp.concatenate([hi, lo], axis=axis)


def _lengths(batch, value):
  return jnp.full((batch,), value, jnp.int32)


def _step_masks(ring, s, index, q_rows, kv_rows, batch):
  """(causal, q_len, kv_len, swapped) of step s on the device at `index`."""
  if s == 0:
    return ring.schedule != "full", None, None, False
  if ring.schedule == "full":
    return False, None, None, False
  # The K/V shard held at step s belongs to device index - s: an earlier part
  # of the sequence unless the ring wrapped around.
  earlier = index >= s
  if ring.schedule == "causal":
    return False, None, _lengths(batch, jnp.where(earlier, kv_rows, 0)), False
  half_q, half_kv = q_rows // 2, kv_rows // 2
  q_len = _lengths(batch, jnp.where(earlier, q_rows, half_q))
  kv_len = _lengths(batch, jnp.where(earlier, half_kv, kv_rows))
  return False, q_len, kv_len, True


def _merge(acc, o, lse):
  """Softmax-weighted sum of two normalized partial results (fp32)."""
  if acc is None:
    return o.astype(F32), lse
  o_acc, lse_acc = acc
  total = jnp.logaddexp(lse_acc, lse)
  base = jnp.where(jnp.isfinite(total), total, 0.0)  # rows that saw no key yet: weights 0
  weight = lambda part: jnp.swapaxes(jnp.exp(part - base), 1, 2)[..., None]  # [B,N,T] -> [B,T,N,1]
  return o_acc * weight(lse_acc) + o.astype(F32) * weight(lse), total


def forward(blocks, ring, q, k, v, q_seg=None, kv_seg=None):
  """(o in q.dtype, lse [B, N, T] f32) of the local queries against all keys."""
  index = jax.lax.axis_index(ring.axis_name)
  zigzag = ring.schedule == "zigzag"
  swapped = (_swap(q, 1), _swap(q_seg, 1)) if zigzag else None
  kv = (k, v, kv_seg)
  diagonal = rest = None
  for s in range(ring.size):
    following = shift(kv, ring) if s + 1 < ring.size else None
    causal, q_len, kv_len, swap = _step_masks(ring, s, index, q.shape[1], k.shape[1], q.shape[0])
    q_s, q_seg_s = swapped if swap else (q, q_seg)
    o_b, lse_b = blocks.fwd(q_s, kv[0], kv[1], causal=causal, q_len=q_len, kv_len=kv_len,
                            q_seg=q_seg_s, kv_seg=kv[2])
    if s == 0:
      diagonal = _merge(None, o_b, lse_b)
    else:
      rest = _merge(rest, o_b, lse_b)
    kv = following
  if rest is not None:
    if zigzag:
      rest = (_swap(rest[0], 1), _swap(rest[1], 2))
    diagonal = _merge(diagonal, *rest)
  o, lse = diagonal
  return o.astype(q.dtype), lse


def backward(blocks, ring, q, k, v, o, lse, do, q_seg=None, kv_seg=None):
  """(dq, dk, dv) of the local shards, given the global o and lse."""
  index = jax.lax.axis_index(ring.axis_name)
  zigzag = ring.schedule == "zigzag"
  natural = (q, o, lse, do, q_seg)
  swapped = (_swap(q, 1), _swap(o, 1), _swap(lse, 2), _swap(do, 1), _swap(q_seg, 1)) if zigzag else None
  kv = (k, v, kv_seg)
  dq_diagonal = dq_rest = dkv = None
  for s in range(ring.size):
    following = shift(kv, ring) if s + 1 < ring.size else None
    # Step s-1's dK/dV partial sums move on while this step computes.
    arriving = shift(dkv, ring) if s > 0 else None
    causal, q_len, kv_len, swap = _step_masks(ring, s, index, q.shape[1], k.shape[1], q.shape[0])
    q_s, o_s, lse_s, do_s, q_seg_s = swapped if swap else natural
    dq_b, dk_b, dv_b = blocks.bwd(q_s, kv[0], kv[1], o_s, lse_s, do_s, causal=causal, q_len=q_len,
                                  kv_len=kv_len, q_seg=q_seg_s, kv_seg=kv[2])
    if s == 0:
      dq_diagonal, dkv = dq_b.astype(F32), (dk_b.astype(F32), dv_b.astype(F32))
    else:
      dq_rest = dq_b.astype(F32) if dq_rest is None else dq_rest + dq_b
      dkv = (arriving[0] + dk_b, arriving[1] + dv_b)
    kv = following
  dq = dq_diagonal
  if dq_rest is not None:
    dq = dq + (_swap(dq_rest, 1) if zigzag else dq_rest)
  # The sums are complete; the owner is one hop on. Cast first: half the bytes.
  dk, dv = (x.astype(k.dtype) for x in dkv)
  if ring.size > 1:
    dk, dv = shift((dk, dv), ring)
  return dq.astype(q.dtype), dk, dv


# ------------------------------------------ contiguous <-> zig-zag shards
def _zigzag_home(chunk, size):
  """The device that holds global chunk `chunk` (of 2 * size) in zig-zag order."""
  return chunk if chunk < size else 2 * size - 1 - chunk


def to_zigzag(x, axis, ring):
  """Contiguous shards (device d: chunks 2d, 2d+1 of 2 * size) -> zig-zag
  ones (device d: chunks d, 2 * size - 1 - d). Every device sends its two
  halves to their zig-zag homes; each device receives one even and one odd
  chunk, its low one being the even one on even devices."""
  if x is None:
    return None
  n = ring.size
  first, second = _halves(x, axis)
  from_first = jax.lax.ppermute(first, ring.axis_name, [(d, _zigzag_home(2 * d, n)) for d in range(n)])
  from_second = jax.lax.ppermute(second, ring.axis_name,
                                 [(d, _zigzag_home(2 * d + 1, n)) for d in range(n)])
  even = jax.lax.axis_index(ring.axis_name) % 2 == 0
  lo = jnp.where(even, from_first, from_second)
  hi = jnp.where(even, from_second, from_first)
  return jnp.concatenate([lo, hi], axis=axis)


def from_zigzag(x, axis, ring):
  """The inverse of `to_zigzag`."""
  n = ring.size
  lo, hi = _halves(x, axis)
  even = jax.lax.axis_index(ring.axis_name) % 2 == 0
  even_chunk = jnp.where(even, lo, hi)
  odd_chunk = jnp.where(even, hi, lo)
  first = jax.lax.ppermute(even_chunk, ring.axis_name,
                           [(_zigzag_home(2 * d, n), d) for d in range(n)])
  second = jax.lax.ppermute(odd_chunk, ring.axis_name,
                            [(_zigzag_home(2 * d + 1, n), d) for d in range(n)])
  return jnp.concatenate([first, second], axis=axis)
