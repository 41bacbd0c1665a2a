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

  Same conventions as `jaxcraft.nn.dot_product_attention`: softmax in
  float32; dropout in the kernel (jaxcraft's random stream); `module` (to
  sow the weights) or `precision` run Flax's own implementation; a fully
  masked query row gives zeros.
  """
  if module is not None or precision is not None:
    key, value, mask = _flax_attention.fallback_inputs(query, key, value, mask, is_causal)
    return nnx.dot_product_attention(query, key, value, bias, mask, broadcast_dropout,
                                     dropout_rng, dropout_rate, deterministic, dtype, precision,
                                     module, promote_dtype)
  query, key, value = promote_dtype((query, key, value), dtype=dtype)
  return _flax_attention.kernel_attention(
      query, key, value, bias, mask, is_causal=is_causal, dropout_rate=dropout_rate,
      dropout_rng=dropout_rng, deterministic=deterministic, broadcast_dropout=broadcast_dropout)


def _rope_attention(attention_fn, query, key, value, *args, rope_base, **kwargs):
  """RoPE on the projected query and key (positions 0..length-1), then attention."""
  positions = lambda x: _flax_attention.default_positions(x[..., 0])
  query = _flax_attention.apply_rope(query, positions(query), rope_base)
  key = _flax_attention.apply_rope(key, positions(key), rope_base)
  return attention_fn(query, key, value, *args, **kwargs)


class MultiHeadAttention(nnx.MultiHeadAttention):
  """`flax.nnx.MultiHeadAttention` (same constructor, parameters and call,
  `is_causal=` included) with `jaxcraft.nnx.dot_product_attention` as the
  default `attention_fn`, plus `rope_base` (rotary embeddings on the
  projected query and key; None: off)."""

  def __init__(self, *args, attention_fn=dot_product_attention, rope_base: float | None = None,
               **kwargs):
    if rope_base is not None:
      if kwargs.get("decode"):
        raise ValueError("rope_base with decode=True is not supported: positions of cached "
                         "tokens are not tracked")
      attention_fn = functools.partial(_rope_attention, attention_fn, rope_base=rope_base)
    super().__init__(*args, attention_fn=attention_fn, **kwargs)
