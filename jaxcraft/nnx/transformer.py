"""A pre-norm transformer block for flax.nnx built on jaxcraft kernels (the
same structure and parameter names as `jaxcraft.nn.TransformerBlock`)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx

from jaxcraft.nn.transformer import ACTIVATIONS
from jaxcraft.nnx.attention import MultiHeadAttention
from jaxcraft.nnx.normalization import LayerNorm, RMSNorm
from jaxcraft.ops import activations


class MLP(nnx.Module):
  """Feed-forward layer with jaxcraft's activation (see `jaxcraft.nn.MLP`).

  "swiglu": Linear `wi` to 2 x hidden, `jaxcraft.swiglu`, Linear `wo`.
  "gelu": Linear `wi` to hidden, tanh-form `jaxcraft.gelu`, Linear `wo`.
  """

  def __init__(self, features: int, hidden: int, activation: str = "swiglu", *,
               dtype: Any = None, param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
    """Builds the layer.

    Args:
      features: input and output width.
      hidden: the hidden width.
      activation: "swiglu" or "gelu".
      dtype: computation dtype (None: promoted from inputs and parameters).
      param_dtype: parameter dtype.
      rngs: parameter initialization keys.

    Raises:
      ValueError: an unknown `activation`.
    """
    if activation not in ACTIVATIONS:
      raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    self.activation = activation
    width = 2 * hidden if activation == "swiglu" else hidden
    linear = lambda i, o: nnx.Linear(i, o, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.wi = linear(features, width)
    self.wo = linear(hidden, features)

  def __call__(self, x):
    """[..., features] -> [..., features]."""
    if self.activation == "swiglu":
      return self.wo(activations.swiglu(self.wi(x)))
    return self.wo(activations.gelu(self.wi(x), approximate=True))


class TransformerBlock(nnx.Module):
  """Pre-norm transformer block: h = x + attention(norm(x)); out = h + mlp(norm(h)).

  The first residual add and the second norm are one fused jaxcraft kernel.
  The same structure and attribute names as `jaxcraft.nn.TransformerBlock`:
  `attention_norm`, `attention` (`MultiHeadAttention`), `mlp_norm`, `mlp`
  (`MLP`).
  """

  def __init__(self, features: int, num_heads: int, mlp_hidden: int, *,
               num_kv_heads: int | None = None, activation: str = "swiglu", norm: str = "rms",
               epsilon: float = 1e-6, is_causal: bool = True, rope_base: float | None = None,
               dtype: Any = None, param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
    """Builds the block.

    Args:
      features: the model width.
      num_heads: query heads.
      mlp_hidden: the MLP's hidden width.
      num_kv_heads: key/value heads (grouped-query attention); None means
        `num_heads`.
      activation: the MLP's, "swiglu" or "gelu".
      norm: "rms" (`RMSNorm`) or "layer" (`LayerNorm`).
      epsilon: the norms' epsilon.
      is_causal: causal self-attention.
      rope_base: rotary position embeddings with this base; None: off.
      dtype: computation dtype (None: promoted from inputs and parameters).
      param_dtype: parameter dtype.
      rngs: parameter initialization keys.

    Raises:
      ValueError: an unknown `norm` or `activation`, or head counts that do
        not divide.
    """
    if norm not in ("rms", "layer"):
      raise ValueError(f"norm must be 'rms' or 'layer'; got {norm!r}")
    norm_cls = RMSNorm if norm == "rms" else LayerNorm
    make_norm = lambda: norm_cls(features, epsilon=epsilon, dtype=dtype,
                                 param_dtype=param_dtype, rngs=rngs)
    self.is_causal = is_causal
    self.attention_norm = make_norm()
    kv_heads = {} if num_kv_heads is None else dict(num_kv_heads=num_kv_heads)
    self.attention = MultiHeadAttention(
        num_heads, features, dtype=dtype, param_dtype=param_dtype, rope_base=rope_base,
        decode=False, rngs=rngs, **kv_heads)
    self.mlp_norm = make_norm()
    self.mlp = MLP(features, mlp_hidden, activation, dtype=dtype, param_dtype=param_dtype,
                   rngs=rngs)

  def __call__(self, x, *, mask=None):
    """Applies the block.

    Args:
      x: [batch..., length, features].
      mask: optional attention mask, bool or float 0/1, broadcastable to
        [batch..., num_heads, length, length].

    Returns:
      [batch..., length, features].
    """
    attn = self.attention(self.attention_norm(x), mask=mask, is_causal=self.is_causal)
    y, h = self.mlp_norm(attn, residual=x)
    return h + self.mlp(y).astype(h.dtype)
