"""`flax.linen.LayerNorm` / `RMSNorm` with the jaxcraft kernel inside.

Subclasses keep Flax's fields, defaults and parameter names, so parameter
trees are interchangeable with Flax's modules."""

from __future__ import annotations

import flax.linen as linen

from jaxcraft import _flax_norm


class LayerNorm(linen.LayerNorm):
  """Drop-in for `flax.linen.LayerNorm`, run by `jaxcraft.layer_norm`.

  Flax's attributes, defaults and parameter names. The kernel runs when
  normalizing over the last axis only, with `axis_name=None`, no mask and
  real x; other configurations run Flax's own module.

  Attributes:
    `flax.linen.LayerNorm`'s, with its defaults (epsilon, dtype, param_dtype,
    use_scale, the initializers, reduction and feature axes, ...).
  """

  @linen.compact
  def __call__(self, x, *, mask=None, residual=None):
    if not _flax_norm.use_kernel(self, x, mask, residual):
      return super().__call__(x, mask=mask)
    cols = x.shape[-1]
    scale = self.param("scale", self.scale_init, (cols,), self.param_dtype) if self.use_scale else None
    bias = self.param("bias", self.bias_init, (cols,), self.param_dtype) if self.use_bias else None
    return _flax_norm.normalize(x, scale, bias, dtype=self.dtype, epsilon=self.epsilon, rms=False,
                                residual=residual)


class RMSNorm(linen.RMSNorm):
  """Drop-in for `flax.linen.RMSNorm`, run by `jaxcraft.rms_norm`.

  Flax's attributes, defaults and parameter names. The kernel runs when
  normalizing over the last axis only, with `axis_name=None`, no mask and
  real x; other configurations run Flax's own module.

  Attributes:
    `flax.linen.RMSNorm`'s, with its defaults (epsilon, dtype, param_dtype,
    use_scale, the initializers, reduction and feature axes, ...).
  """

  @linen.compact
  def __call__(self, x, *, mask=None, residual=None):
    if not _flax_norm.use_kernel(self, x, mask, residual):
      return super().__call__(x, mask=mask)
    cols = x.shape[-1]
    scale = self.param("scale", self.scale_init, (cols,), self.param_dtype) if self.use_scale else None
    return _flax_norm.normalize(x, scale, None, dtype=self.dtype, epsilon=self.epsilon, rms=True,
                                residual=residual)


# One docstring for the four modules' __call__ (_flax_norm.call_doc).
LayerNorm.__call__.__doc__ = _flax_norm.call_doc("flax.linen.LayerNorm")
RMSNorm.__call__.__doc__ = _flax_norm.call_doc("flax.linen.RMSNorm")
