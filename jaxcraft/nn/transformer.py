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
  """Feed-forward layer: "swiglu" (Dense "wi" to 2 x hidden, silu(a) * b,
  Dense "wo") or "gelu" (Dense "wi" to hidden, tanh-GELU, Dense "wo").

  The activation is jaxcraft's op (float32 math; on the GPU the SwiGLU
  backward kernel writes the gradient of both halves into one array, where
  XLA's gradient of the split adds a concatenation pass)."""
  hidden: int
  activation: str = "swiglu"
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Callable = linen.linear.default_kernel_init

  @linen.compact
  def __call__(self, x):
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
  """x -> h = x + attention(norm(x)); out = h + mlp(norm(h)).

  The first residual add and the second norm are one fused jaxcraft kernel
  (the norms' `residual=`). Submodules: "attention_norm", "attention" (jaxcraft
  `MultiHeadAttention`), "mlp_norm", "mlp" (`MLP`).
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

