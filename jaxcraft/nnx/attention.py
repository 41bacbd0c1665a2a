"""Attention for flax.nnx: `dot_product_attention` with the signature of
`flax.nnx.dot_product_attention` (pass it as `attention_fn=` of
`flax.nnx.MultiHeadAttention`), and `MultiHeadAttention`: Flax's module with
that function as its default `attention_fn` and optional RoPE."""

from __future__ import annotations

import functools

from flax import nnx
from flax.nnx.nn import dtypes

from jaxcraft import _flax_attention


def dot_product_attention(query, key, value, bias=None, mask=None, broadcast_dropout=True,
                          dropout_rng=None, dropout_rate=0.0, deterministic=False, dtype=None,
                          precision=None, module=None, promote_dtype=dtypes.promote_dtype,
                          is_causal=False):
  """Drop-in for `flax.nnx.dot_product_attention`, run by the jaxcraft kernel.

  Pass it as `attention_fn=` of `flax.nnx.MultiHeadAttention`. Softmax is
  always float32. `module` (to sow the weights), a `precision` jaxcraft
  cannot honour, or complex inputs run Flax's own implementation. A query
  whose keys are all masked gives zeros, where Flax gives the mean of the
  values.

  Args:
    query: [batch..., q_length, heads, depth] float32, bfloat16, float16 or
      float64 (after promotion to `dtype`; complex: Flax's implementation).
    key: [batch..., kv_length, kv_heads, depth]; heads must be a multiple
      of kv_heads (grouped-query attention).
    value: key's shape.
    bias: optional, broadcastable to [batch..., heads, q_length, kv_length].
    mask: optional bool or Flax's float 0/1 (nonzero = attend),
      broadcastable to [batch..., heads, q_length, kv_length].
    broadcast_dropout: one dropout mask for every batch row and head.
    dropout_rng: JAX PRNG key; required for dropout.
    dropout_rate: the attention dropout rate. Dropout runs inside the
      kernel with jaxcraft's own random stream
      (`jaxcraft.attention_dropout_mask`), not Flax's bernoulli draw.
    deterministic: True disables dropout.
    dtype: the computation dtype (default: promoted from the inputs).
    precision: Flax's. One `jax.lax.Precision` (or a pair of equal ones)
      runs jaxcraft: 16-bit inputs are exact products accumulated in
      float32 under any precision, float32 takes it (see
      `jaxcraft.dot_product_attention`); a dot algorithm, or two different
      precisions, run Flax's implementation.
    module: Flax's (to sow the weights); given, Flax's implementation runs.
    promote_dtype: Flax's dtype promotion function for (query, key, value).
    is_causal: query i attends to keys j <= i without a mask array (the
      kernel skips the masked tiles).

  Returns:
    [batch..., q_length, heads, depth] in the computation dtype.

  Raises:
    ValueError: query, key and value have different batch dimensions;
      dropout without `dropout_rng`; and `jaxcraft.dot_product_attention`'s
      errors for the shapes.
    TypeError: `jaxcraft.dot_product_attention`'s dtype errors.
  """
  kernel_precision = _flax_attention.kernel_precision(precision)
  if _flax_attention.flax_only(query, key, value, kernel_precision, module):
    key, value, mask = _flax_attention.fallback_inputs(query, key, value, mask, is_causal)
    return nnx.dot_product_attention(query, key, value, bias, mask, broadcast_dropout,
                                     dropout_rng, dropout_rate, deterministic, dtype, precision,
                                     module, promote_dtype)
  query, key, value = promote_dtype((query, key, value), dtype=dtype)
  return _flax_attention.kernel_attention(
      query, key, value, bias, mask, is_causal=is_causal, dropout_rate=dropout_rate,
      dropout_rng=dropout_rng, deterministic=deterministic, broadcast_dropout=broadcast_dropout,
      precision=kernel_precision)


def _rope_attention(attention_fn, query, key, value, *args, rope_base, **kwargs):
  """RoPE on the projected query and key (positions 0..length-1), then attention."""
  positions = lambda x: _flax_attention.default_positions(x[..., 0])
  query = _flax_attention.apply_rope(query, positions(query), rope_base)
  key = _flax_attention.apply_rope(key, positions(key), rope_base)
  return attention_fn(query, key, value, *args, **kwargs)


class MultiHeadAttention(nnx.MultiHeadAttention):
  """`flax.nnx.MultiHeadAttention` run by the jaxcraft kernel, with optional RoPE.

  Flax's constructor, parameters and call (`is_causal=` included), with
  `jaxcraft.nnx.dot_product_attention` as the default `attention_fn`.
  """

  def __init__(self, *args, attention_fn=dot_product_attention, rope_base: float | None = None,
               **kwargs):
    """Builds the module.

    Args:
      *args: `flax.nnx.MultiHeadAttention`'s positional arguments
        (num_heads, in_features, ...).
      attention_fn: the attention function (default: this module's
        `dot_product_attention`).
      rope_base: rotary position embeddings on the projected query and key
        (positions 0..length-1) with this base; None: off.
      **kwargs: `flax.nnx.MultiHeadAttention`'s keyword arguments (`rngs`
        required).

    Raises:
      ValueError: `rope_base` with `decode=True` (cached tokens' positions
        are not tracked).
    """
    if rope_base is not None:
      if kwargs.get("decode"):
        raise ValueError("rope_base with decode=True is not supported: positions of cached "
                         "tokens are not tracked")
      attention_fn = functools.partial(_rope_attention, attention_fn, rope_base=rope_base)
    super().__init__(*args, attention_fn=attention_fn, **kwargs)
