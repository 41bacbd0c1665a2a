"""A pre-norm transformer block for flax.linen built on jaxcraft kernels."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as linen
import jax.numpy as jnp

from jaxcraft.nn.attention import MultiHeadAttention
from jaxcraft.nn.normalization import LayerNorm, RMSNorm
from jaxcraft.ops import activations

ACTIVATIONS = ("swiglu", "gelu")


class MLP(linen.Module):
  """Feed-forward layer with jaxcraft's activation.

  "swiglu": Dense "wi" to 2 x hidden, `jaxcraft.swiglu`, Dense "wo".
  "gelu": Dense "wi" to hidden, tanh-form `jaxcraft.gelu`, Dense "wo".
  The activation runs in float32 math; the SwiGLU backward kernel writes the
  gradient of both halves into one array, where XLA's gradient of the split
  adds a concatenation pass.

  Attributes:
    hidden: the hidden width.
    activation: "swiglu" or "gelu".
    dtype: computation dtype (None: promoted from inputs and parameters).
    param_dtype: parameter dtype.
    kernel_init: the Dense layers' kernel initializer.
  """
  hidden: int
  activation: str = "swiglu"
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Callable = linen.linear.default_kernel_init

  @linen.compact
  def __call__(self, x):
    """Applies the layer.

    Args:
      x: [..., features].

    Returns:
      [..., features].

    Raises:
      ValueError: an unknown `activation`.
    """
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"activation must be one of {ACTIVATIONS}; got {self.activation!r}")
    dense = lambda features, name: linen.Dense(
        features, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=self.kernel_init, name=name)
    if self.activation == "swiglu":
      h = activations.swiglu(dense(2 * self.hidden, "wi")(x))
    else:
      h = activations.gelu(dense(self.hidden, "wi")(x), approximate=True)
    return dense(x.shape[-1], "wo")(h)


class TransformerBlock(linen.Module):
  """Pre-norm transformer block: h = x + attention(norm(x)); out = h + mlp(norm(h)).

  The first residual add and the second norm are one fused jaxcraft kernel
  (the norms' `residual=`). Submodules: "attention_norm", "attention"
  (`MultiHeadAttention`), "mlp_norm", "mlp" (`MLP`).

  Attributes:
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
  """
  num_heads: int
  mlp_hidden: int
  num_kv_heads: int | None = None
  activation: str = "swiglu"
  norm: str = "rms"  # or "layer"
  epsilon: float = 1e-6
  is_causal: bool = True
  rope_base: float | None = None
  dtype: Any = None
  param_dtype: Any = jnp.float32

  @linen.compact
  def __call__(self, x, *, mask=None, positions=None):
    """Applies the block.

    Args:
      x: [batch..., length, features].
      mask: optional attention mask, bool or float 0/1, broadcastable to
        [batch..., num_heads, length, length].
      positions: int [batch..., length] for RoPE (default 0..length-1).

    Returns:
      [batch..., length, features].

    Raises:
      ValueError: an unknown `norm` or `activation`, or head counts that do
        not divide (see `MultiHeadAttention`).
    """
    if self.norm not in ("rms", "layer"):
      raise ValueError(f"norm must be 'rms' or 'layer'; got {self.norm!r}")
    norm_cls = RMSNorm if self.norm == "rms" else LayerNorm
    attention_norm = norm_cls(epsilon=self.epsilon, dtype=self.dtype,
                              param_dtype=self.param_dtype, name="attention_norm")
    mlp_norm = norm_cls(epsilon=self.epsilon, dtype=self.dtype, param_dtype=self.param_dtype,
                        name="mlp_norm")
    attn = MultiHeadAttention(
        num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, dtype=self.dtype,
        param_dtype=self.param_dtype, is_causal=self.is_causal, rope_base=self.rope_base,
        name="attention")(attention_norm(x), mask=mask, positions=positions)
    y, h = mlp_norm(attn, residual=x)
    mlp = MLP(self.mlp_hidden, self.activation, dtype=self.dtype,
              param_dtype=self.param_dtype, name="mlp")(y)
    return h + mlp.astype(h.dtype)

