"""`flax.nnx.LayerNorm` / `RMSNorm` with the jaxcraft kernel inside (same
constructor signatures and parameters as Flax's, inherited)."""

from __future__ import annotations

from flax import nnx

from jaxcraft import _flax_norm


def _promote(module, x, scale, bias):
  """The module's `promote_dtype` applied to its inputs before the norm, as
  Flax's modules do (casting x to `dtype` first). Flax versions without the
  attribute promote inside the norm only, as `_flax_norm.normalize` does."""
  promote = getattr(module, "promote_dtype", None)
  if promote is None:
    return x, scale, bias
  return promote((x, scale, bias), dtype=module.dtype)


class LayerNorm(nnx.LayerNorm):
  """Drop-in for `flax.nnx.LayerNorm`, run by `jaxcraft.layer_norm`.

  Flax's constructor and parameters. The kernel runs when normalizing over
  the last axis only, with `axis_name=None`, no mask and real x; other
  configurations run Flax's own module.

  Args:
    `flax.nnx.LayerNorm`'s constructor arguments, with its defaults
    (num_features, epsilon, dtype, param_dtype, the initializers,
    promote_dtype, rngs, ...).
  """

  def __call__(self, x, *, mask=None, residual=None):
    if not _flax_norm.use_kernel(self, x, mask, residual):
      return super().__call__(x, mask=mask)
    scale = self.scale[...] if self.scale else None
    bias = self.bias[...] if self.bias else None
    x, scale, bias = _promote(self, x, scale, bias)
    return _flax_norm.normalize(x, scale, bias, dtype=self.dtype, epsilon=self.epsilon, rms=False,
                                residual=residual)


class RMSNorm(nnx.RMSNorm):
  """Drop-in for `flax.nnx.RMSNorm`, run by `jaxcraft.rms_norm`.

  Flax's constructor and parameters. The kernel runs when normalizing over
  the last axis only, with `axis_name=None`, no mask and real x; other
  configurations run Flax's own module.

  Args:
    `flax.nnx.RMSNorm`'s constructor arguments, with its defaults
    (num_features, epsilon, dtype, param_dtype, the initializers,
    promote_dtype, rngs, ...).
  """

  def __call__(self, x, *, mask=None, residual=None):
    if not _flax_norm.use_kernel(self, x, mask, residual):
      return super().__call__(x, mask=mask)
    scale = self.scale[...] if self.scale else None
    x, scale, _ = _promote(self, x, scale, None)
    return _flax_norm.normalize(x, scale, None, dtype=self.dtype, epsilon=self.epsilon, rms=True,
                                residual=residual)


# One docstring for the four modules' __call__ (_flax_norm.call_doc).
LayerNorm.__call__.__doc__ = _flax_norm.call_doc("flax.nnx.LayerNorm")
RMSNorm.__call__.__doc__ = _flax_norm.call_doc("flax.nnx.RMSNorm")
