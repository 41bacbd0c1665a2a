"""Attention for flax.linen: `dot_product_attention` with the signature of
`flax.linen.dot_product_attention` (pass it as `attention_fn=` of
`flax.linen.MultiHeadDotProductAttention`), and `MultiHeadAttention`, which
has Flax's parameter layout plus grouped KV heads, a causal flag and RoPE."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as linen
import jax.numpy as jnp
from flax.linen import dtypes

from jaxcraft import _flax_attention


def dot_product_attention(query, key, value, bias=None, mask=None, broadcast_dropout=True,
                          dropout_rng=None, dropout_rate=0.0, deterministic=False, dtype=None,
                          precision=None, module=None, force_fp32_for_softmax=False,
                          einsum_dot_general=None, qk_attn_weights_einsum=None,
                          attn_weights_value_einsum=None, *, is_causal=False):
  """Drop-in for `flax.linen.dot_product_attention`, run by the jaxcraft kernel.

  Pass it as `attention_fn=` of `flax.linen.MultiHeadDotProductAttention`.
  Softmax is always computed in float32 (as with
  `force_fp32_for_softmax=True`). Calls that need the attention weights
  themselves (`module` to sow them, custom einsums), a `precision`
  jaxcraft cannot honour, or complex inputs run Flax's own implementation.
  A query whose keys are all masked gives zeros, where Flax gives the mean
  of the values.

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
    force_fp32_for_softmax: accepted for Flax's signature; softmax is float32
      anyway.
    einsum_dot_general: Flax's; given, Flax's implementation runs.
    qk_attn_weights_einsum: Flax's; given, Flax's implementation runs.
    attn_weights_value_einsum: Flax's; given, Flax's implementation runs.
    is_causal: keyword-only extension: query i attends to keys j <= i
      without a mask array (the kernel skips the masked tiles).

  Returns:
    [batch..., q_length, heads, depth] in the computation dtype.

  Raises:
    ValueError: query, key and value have different batch dimensions;
      dropout without `dropout_rng`; and `jaxcraft.dot_product_attention`'s
      errors for the shapes.
    TypeError: `jaxcraft.dot_product_attention`'s dtype errors.
  """
  custom_einsums = any(f is not None for f in (einsum_dot_general, qk_attn_weights_einsum,
                                               attn_weights_value_einsum))
  kernel_precision = _flax_attention.kernel_precision(precision)
  if _flax_attention.flax_only(query, key, value, kernel_precision, module, custom_einsums):
    key, value, mask = _flax_attention.fallback_inputs(query, key, value, mask, is_causal)
    return linen.dot_product_attention(
        query, key, value, bias, mask, broadcast_dropout, dropout_rng, dropout_rate,
        deterministic, dtype, precision, module, force_fp32_for_softmax, einsum_dot_general,
        qk_attn_weights_einsum, attn_weights_value_einsum)
  query, key, value = dtypes.promote_dtype(query, key, value, dtype=dtype)
  return _flax_attention.kernel_attention(
      query, key, value, bias, mask, is_causal=is_causal, dropout_rate=dropout_rate,
      dropout_rng=dropout_rng, deterministic=deterministic, broadcast_dropout=broadcast_dropout,
      precision=kernel_precision)


class MultiHeadAttention(linen.Module):
  """Multi-head attention run by the jaxcraft kernel, in Flax's layout.

  Its parameters are those of `flax.linen.MultiHeadDotProductAttention`
  ("query", "key", "value", "out" DenseGeneral layers), so checkpoints are
  interchangeable when `num_kv_heads` is None.

  Attributes:
    num_heads: query heads.
    num_kv_heads: key/value heads (grouped-query attention; a divisor of
      `num_heads`); None means `num_heads`.
    qkv_features: total query/key/value projection width, divisible by
      `num_heads`; None means the input feature size.
    out_features: output width; None means the query input's feature size.
    dtype: computation dtype (None: promoted from inputs and parameters).
    param_dtype: parameter dtype.
    kernel_init: the Dense layers' kernel initializer.
    bias_init: the Dense layers' bias initializer.
    use_bias: whether the Dense layers have biases.
    is_causal: causal attention without a mask array (the kernel skips the
      masked tiles).
    rope_base: rotary position embeddings on query and key with this base;
      None: off.
    dropout_rate: attention dropout rate.
    deterministic: disables dropout; may be given at call time instead.
    attention_fn: the attention function (default: this module's
      `dot_product_attention`).
  """
  num_heads: int
  num_kv_heads: int | None = None
  qkv_features: int | None = None
  out_features: int | None = None
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Callable = linen.linear.default_kernel_init
  bias_init: Callable = linen.initializers.zeros_init()
  use_bias: bool = True
  is_causal: bool = False
  rope_base: float | None = None
  dropout_rate: float = 0.0
  deterministic: bool | None = None
  attention_fn: Callable = dot_product_attention

  @linen.compact
  def __call__(self, inputs_q, inputs_k=None, inputs_v=None, *, mask=None, positions=None,
               deterministic: bool | None = None):
    """Applies attention.

    Args:
      inputs_q: [batch..., q_length, features].
      inputs_k: [batch..., kv_length, features]; None means `inputs_q`.
      inputs_v: [batch..., kv_length, features]; None means `inputs_k`.
      mask: optional bool or float 0/1, broadcastable to
        [batch..., num_heads, q_length, kv_length].
      positions: int [batch..., q_length], the query positions for RoPE
        (default 0..q_length-1; also the key positions in self-attention).
      deterministic: disables dropout; merged with the attribute.

    Returns:
      [batch..., q_length, out_features].

    Raises:
      ValueError: `qkv_features` is not divisible by `num_heads`, or
        `num_heads` is not a multiple of `num_kv_heads`; an odd head
        dimension with `rope_base`.
    """
    inputs_k = inputs_q if inputs_k is None else inputs_k
    inputs_v = inputs_k if inputs_v is None else inputs_v
    qkv_features = self.qkv_features or inputs_q.shape[-1]
    if qkv_features % self.num_heads:
      raise ValueError(f"qkv_features ({qkv_features}) must be divisible by num_heads "
                       f"({self.num_heads})")
    kv_heads = self.num_kv_heads or self.num_heads
    if self.num_heads % kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                       f"({kv_heads})")
    head_dim = qkv_features // self.num_heads
    dense = lambda heads, name: linen.DenseGeneral(
        features=(heads, head_dim), axis=-1, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=self.kernel_init, bias_init=self.bias_init, use_bias=self.use_bias,
        name=name)
    query = dense(self.num_heads, "query")(inputs_q)
    key = dense(kv_heads, "key")(inputs_k)
    value = dense(kv_heads, "value")(inputs_v)
    if self.rope_base is not None:
      q_pos = _flax_attention.default_positions(inputs_q) if positions is None else positions
      k_pos = q_pos if inputs_k is inputs_q else _flax_attention.default_positions(inputs_k)
      query = _flax_attention.apply_rope(query, q_pos, self.rope_base)
      key = _flax_attention.apply_rope(key, k_pos, self.rope_base)
    # As Flax: `deterministic` is needed only when there is dropout to apply.
    deterministic = (linen.merge_param("deterministic", self.deterministic, deterministic)
                     if self.dropout_rate > 0 else True)
    dropout_rng = None if deterministic else self.make_rng("dropout")
    x = self.attention_fn(query, key, value, mask=mask, dropout_rng=dropout_rng,
                          dropout_rate=self.dropout_rate, deterministic=deterministic,
                          dtype=self.dtype, is_causal=self.is_causal)
    return linen.DenseGeneral(
        features=self.out_features or inputs_q.shape[-1], axis=(-2, -1),
        kernel_init=self.kernel_init, bias_init=self.bias_init, use_bias=self.use_bias,
        dtype=self.dtype, param_dtype=self.param_dtype, name="out")(x)
