"""Attention dropout's keep-mask in jax.numpy: the same Philox4x32-10 draw as
the kernels (cpp/math/philox.h), so the reference path and the tests see
exactly the mask the CPU and CUDA kernels apply.

Element (b, n, i, j) of the [B, N, T, S] probabilities (n the query head) is
kept when word j % 4 of philox(counter=(j // 4, i, n, b), key) is at least
floor(rate * 2^32); with `broadcast` (Flax's broadcast_dropout) b = n = 0 for
every batch row and head. Kept probabilities are scaled by 1 / (1 - rate).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_U32 = jnp.uint32
_ROUND_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_KEY_INCREMENTS = (0x9E3779B9, 0xBB67AE85)


def dropout_key_words(rng) -> jax.Array:
  """The two uint32 words keying the kernels' Philox stream, from a JAX PRNG
  key (typed or legacy uint32 [2])."""
  return jax.random.bits(rng, (2,), _U32)


def dropout_threshold(rate: float) -> int:
  """Words below this are dropped: floor(rate * 2^32), saturated."""
  return min(int(np.float64(np.float32(rate)) * 2.0**32), 0xFFFFFFFF)


def _mul_hi_lo(a: int, b):
  """(hi, lo) words of the 64-bit product of the constant a and uint32 b,
  in 16-bit halves: uint32 arithmetic only (no x64 needed)."""
  lo = _U32(a) * b
  a_hi, a_lo = _U32(a >> 16), _U32(a & 0xFFFF)
  b_hi, b_lo = b >> 16, b & 0xFFFF
  ll, lh, hl = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo
  mid = (ll >> 16) + (lh & 0xFFFF) + (hl & 0xFFFF)
  hi = a_hi * b_hi + (lh >> 16) + (hl >> 16) + (mid >> 16)
  return hi, lo


def philox4x32_10(counter, key):
  """Philox4x32 with 10 rounds on 4 broadcastable uint32 counter words."""
  c0, c1, c2, c3 = (jnp.asarray(c, _U32) for c in counter)
  k0, k1 = jnp.asarray(key[0], _U32), jnp.asarray(key[1], _U32)
  for _ in range(10):
    hi0, lo0 = _mul_hi_lo(_ROUND_MULTIPLIERS[0], c0)
    hi1, lo1 = _mul_hi_lo(_ROUND_MULTIPLIERS[1], c2)
    c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    k0 = k0 + _U32(_KEY_INCREMENTS[0])
    k1 = k1 + _U32(_KEY_INCREMENTS[1])
  return c0, c1, c2, c3


def dropout_keep_mask(key_words, rate: float, shape, *, broadcast: bool = False) -> jax.Array:
  """Bool keep-mask [B, N, T, S] (or [1, 1, T, S] when `broadcast`) that the
  kernels draw for `key_words` (dropout_key_words) and `rate`."""
  B, N, T, S = shape
  if broadcast:
    B = N = 1
  groups = -(-S // 4)
  b = jnp.arange(B, dtype=_U32)[:, None, None, None]
  n = jnp.arange(N, dtype=_U32)[None, :, None, None]
  i = jnp.arange(T, dtype=_U32)[None, None, :, None]
  j4 = jnp.arange(groups, dtype=_U32)[None, None, None, :]
  words = jnp.stack(philox4x32_10((j4, i, n, b), key_words), axis=-1)  # [..., groups, 4]
  words = jnp.broadcast_to(words, (B, N, T, groups, 4)).reshape(B, N, T, groups * 4)[..., :S]
  return words >= _U32(dropout_threshold(rate))


def attention_dropout_mask(rng, rate: float, shape, *, broadcast: bool = False) -> jax.Array:
  """The dropout keep-mask that `dot_product_attention` applies.

  `dot_product_attention(..., dropout_rate=rate, dropout_rng=rng,
  dropout_broadcast=broadcast)` zeroes its [B, N, T, S] probabilities (N the
  query heads) where this mask is False and scales the others by
  1 / (1 - rate), on every implementation.

  Args:
    rng: JAX PRNG key (typed, or a legacy uint32 [2] key).
    rate: Python float, the dropout rate.
    shape: (B, N, T, S), the probabilities' shape.
    broadcast: one mask for every batch row and head.

  Returns:
    bool [B, N, T, S], or [1, 1, T, S] with `broadcast`; True = kept.
  """
  return dropout_keep_mask(dropout_key_words(rng), rate, shape, broadcast=broadcast)


__all__ = ["attention_dropout_mask", "dropout_keep_mask", "dropout_key_words", "philox4x32_10"]
