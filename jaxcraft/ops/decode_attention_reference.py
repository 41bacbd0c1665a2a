"""Pure-JAX reference for jaxcraft's decode attention (the `implementation="xla"`
path), and the ground truth the CPU and CUDA kernels are tested against. It
follows the semantics of cpp/contract/decode.h."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def window_left(local_window_size) -> int | None:
  """The left bound of a window: an int w means (w, w) as in jax.nn; of a
  (left, right) pair the right bound is moot (keys after a query are masked
  anyway). None: unbounded."""
  if local_window_size is None:
    return None
  if isinstance(local_window_size, (tuple, list)):
    return int(local_window_size[0])
  return int(local_window_size)


def gather_pages(cache, block_tables):
  """Paged [P, page_size, K, H] -> dense [B, max_pages * page_size, K, H], and
  a bool [B, max_pages * page_size] that is False for keys on pages outside
  [0, P) (those keys are masked; their page is never read)."""
  num_pages, page_size = cache.shape[:2]
  valid = (block_tables >= 0) & (block_tables < num_pages)
  pages = jnp.where(valid, block_tables, 0)
  B, max_pages = block_tables.shape
  dense = cache[pages].reshape(B, max_pages * page_size, *cache.shape[2:])
  return dense, jnp.repeat(valid, page_size, axis=1)


def decode_attention_reference(query, key_cache, value_cache, key_value_seq_lengths, *,
                               block_tables=None, scale=None, logit_soft_cap=None,
                               local_window_size=None):
  """Decode attention with float32 logits and softmax, materializing [B, N, Tq, S].

  Shapes: query [B, Tq, N, H]; caches contiguous [B, S, K, H] or, with
  int32 ``block_tables`` [B, max_pages], paged [P, page_size, K, H]; int32
  ``key_value_seq_lengths`` [B]. Query head n reads KV head n // (N // K).
  Equivalent JAX code::

      if block_tables is not None:          # gather each sequence's pages
        ok = (block_tables >= 0) & (block_tables < P)
        pages = jnp.where(ok, block_tables, 0)
        key = key_cache[pages].reshape(B, -1, K, H)       # same for value
        key_ok = jnp.repeat(ok, page_size, axis=1)       # bad pages: masked keys
      S = key.shape[1]                                   # the capacity
      L = jnp.clip(key_value_seq_lengths, 0, S)          # longer lengths are clamped
      pos = L[:, None] - Tq + jnp.arange(Tq)             # token t's position
      j = jnp.arange(S)
      mask = (j <= pos[..., None]) & (j < L[:, None, None]) & key_ok[:, None]
      mask &= j >= pos[..., None] - window_left          # with a window
      logits = scale * einsum("btnh,bsnh->bnts", q, k)   # float32, KV head per group
      logits = logit_soft_cap * jnp.tanh(logits / logit_soft_cap)   # if given
      probs = softmax(where(mask, logits, -inf))         # float32; no key: 0
      out = einsum("bnts,bsnh->btnh", probs.astype(v.dtype), v).astype(q.dtype)

  i.e. ``jax.nn.dot_product_attention(query, key, value, mask=mask[:, None],
  scale=scale, implementation="xla")`` without a soft cap, except that rows
  that see no key (L - Tq + t < 0, or L = 0) give zeros where jax.nn gives a
  uniform average.
  """
  B, Tq, N, H = query.shape
  K = key_cache.shape[2]
  G = N // K
  if block_tables is None:
    key, value = key_cache, value_cache
    key_ok = jnp.ones((B, key.shape[1]), bool)
  else:
    key, key_ok = gather_pages(key_cache, block_tables)
    value, _ = gather_pages(value_cache, block_tables)
  S = key.shape[1]
  scale = 1.0 / (H ** 0.5) if scale is None else scale

  lengths = jnp.clip(key_value_seq_lengths, 0, S)
  pos = lengths[:, None] - Tq + jnp.arange(Tq)[None, :]  # [B, Tq]
  j = jnp.arange(S)[None, None, :]
  visible = (j <= pos[..., None]) & (j < lengths[:, None, None]) & key_ok[:, None, :]
  left = window_left(local_window_size)
  if left is not None:
    visible &= j >= pos[..., None] - left

  # bf16 products accumulate in float32 as jax.nn's XLA path does them.
  precision = lax.DotAlgorithmPreset.BF16_BF16_F32 if query.dtype == jnp.bfloat16 else None
  logits_dtype = jnp.promote_types(query.dtype, jnp.float32)
  logits = jnp.einsum("btkgh,bskh->bkgts", query.reshape(B, Tq, K, G, H), key,
                      precision=precision, preferred_element_type=logits_dtype)
  logits = logits * scale
  if logit_soft_cap is not None:
    logits = logit_soft_cap * jnp.tanh(logits / logit_soft_cap)

  visible = visible[:, None, None]  # [B, 1, 1, Tq, S]
  has_keys = jnp.any(visible, axis=-1, keepdims=True)
  masked = jnp.where(visible, logits, -jnp.inf)
  row_max = jnp.where(has_keys, jnp.max(masked, axis=-1, keepdims=True, initial=-jnp.inf), 0.0)
  weights = jnp.exp(masked - row_max)
  probs = weights / jnp.where(has_keys, jnp.sum(weights, axis=-1, keepdims=True), 1.0)
  out = jnp.einsum("bkgts,bskh->btkgh", probs.astype(value.dtype), value)
  return out.reshape(B, Tq, N, H).astype(query.dtype)


__all__ = ["decode_attention_reference"]
