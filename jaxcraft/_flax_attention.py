"""What the linen and nnx attention code shares: Flax's calling convention
for `dot_product_attention` mapped onto the jaxcraft op, and rotary position
embeddings."""

from __future__ import annotations

import math

import jax.numpy as jnp

from jaxcraft.ops import _checks
from jaxcraft.ops import attention as attention_ops


def _flatten_batch(x, batch_shape, keep: int):
  """[batch..., *last `keep` dims] -> [prod(batch), ...]. An operand whose
  batch dims are all 1 (a mask shared by the batch) stays un-broadcast."""
  x = jnp.reshape(x, (1,) * (len(batch_shape) + keep - x.ndim) + x.shape)
  lead = x.shape[:len(batch_shape)]
  if all(d == 1 for d in lead):
    return x.reshape(1, *x.shape[len(batch_shape):])
  x = jnp.broadcast_to(x, batch_shape + x.shape[len(batch_shape):])
  return x.reshape(math.prod(batch_shape), *x.shape[len(batch_shape):])


def kernel_precision(precision):
  """Flax's `precision` as `jaxcraft.dot_product_attention`'s (a
  `jax.lax.Precision` or None), or False where jaxcraft cannot honour it
  (a dot algorithm, or different precisions for the two operands): Flax's
  own implementation runs those. One precision, or a pair of equal ones,
  maps onto jaxcraft: 16-bit inputs are exact products accumulated in
  float32 under any of them, and float32 takes it in the reference's
  matmuls (the CPU kernel's float32 is full precision)."""
  if isinstance(precision, (tuple, list)):
    if len(precision) != 2 or precision[0] != precision[1]:
      return False
    precision = precision[0]
  try:
    return _checks.precision(precision)
  except ValueError:
    return False


def flax_only(query, key, value, precision, module, custom_einsums=False) -> bool:
  """Whether a call must run Flax's own implementation: it sows the weights
  (`module`), supplies its own einsums, asks for a precision jaxcraft cannot
  honour (`precision`: `kernel_precision`'s result, False), or passes
  complex inputs (Flax computes a complex softmax; jaxcraft's attention is
  real)."""
  complex_inputs = any(jnp.iscomplexobj(a) for a in (query, key, value))
  return module is not None or custom_einsums or precision is False or complex_inputs


def kernel_attention(query, key, value, bias=None, mask=None, *, is_causal=False,
                     dropout_rate=0.0, dropout_rng=None, deterministic=True,
                     broadcast_dropout=True, precision=None):
  """Flax's attention (inputs [batch..., length, heads, depth], masks
  broadcastable to [batch..., heads, q_length, kv_length], float 0/1 or bool)
  computed by `jaxcraft.dot_product_attention`, which takes one batch axis.
  Dropout (Flax's arguments; `broadcast_dropout`: one mask for all batch
  rows and heads) runs inside the kernel, with jaxcraft's own random stream
  (`jaxcraft.attention_dropout_mask`), not Flax's `random.bernoulli` draw.

  One difference from Flax: a query row whose keys are all masked out gives
  zeros (Flax gives the average of all values).
  """
  batch_shape = query.shape[:-3]
  if key.shape[:-3] != batch_shape or value.shape[:-3] != batch_shape:
    raise ValueError("query, key and value must have the same batch dimensions; got shapes "
                     f"{query.shape}, {key.shape}, {value.shape}")
  if mask is not None:
    mask = jnp.asarray(mask).astype(bool)  # Flax's float masks: nonzero = attend
  flat = lambda x, keep: None if x is None else _flatten_batch(x, batch_shape, keep)
  dropout = {}
  if dropout_rate > 0.0 and not deterministic:
    if dropout_rng is None:
      raise ValueError("dropout_rng is required when dropout_rate > 0 and not deterministic")
    dropout = dict(dropout_rate=dropout_rate, dropout_rng=dropout_rng,
                   dropout_broadcast=bool(broadcast_dropout))
  out = attention_ops.dot_product_attention(
      flat(query, 3), flat(key, 3), flat(value, 3), flat(bias, 3), flat(mask, 3),
      is_causal=is_causal, precision=precision, **dropout)
  return out.reshape(query.shape[:-1] + value.shape[-1:])


def fallback_inputs(query, key, value, mask, is_causal):
  """For Flax's own attention, which may take neither GQA nor a causal
  flag: KV heads repeated, causality (top-left aligned) spelled as a mask."""
  groups = query.shape[-2] // key.shape[-2]
  if groups > 1:
    key, value = (jnp.repeat(a, groups, axis=-2) for a in (key, value))
  if is_causal:
    T, S = query.shape[-3], key.shape[-3]
    causal = jnp.arange(S)[None, :] <= jnp.arange(T)[:, None]
    mask = causal if mask is None else jnp.logical_and(jnp.asarray(mask).astype(bool), causal)
  return key, value, mask


def apply_rope(x, positions, base: float):
  """Rotary position embedding (rotate-half form) of x [batch..., T, N, H]
  at integer `positions` [batch..., T]; angles in float32."""
  half = x.shape[-1] // 2
  if 2 * half != x.shape[-1]:
    raise ValueError(f"rotary embeddings need an even head dimension; got {x.shape[-1]}")
  inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = positions.astype(jnp.float32)[..., None, None] * inv_freq  # [..., T, 1, half]
  sin, cos = jnp.sin(angle), jnp.cos(angle)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)


def default_positions(x):
  """0..T-1 for inputs [batch..., T, features]."""
  return jnp.broadcast_to(jnp.arange(x.shape[-2]), x.shape[:-1])
