"""`flax.nnx.LayerNorm` / `RMSNorm` with the jaxcraft kernel inside (same
constructor signatures and parameters as Flax's, inherited)."""

from __future__ import annotations

from flax import nnx

from jaxcraft import _flax_norm


class LayerNorm(nnx.LayerNorm):
  """Drop-in for `flax.nnx.LayerNorm`."""

  def __call__(self, x, *, mask=None, residual=None):
    """Flax's call; `residual=r` returns (norm(x + r), x + r) from one kernel."""
    if not _flax_norm.use_kernel(self, mask, residual):
      return super().__call__(x, mask=mask)
    scale = self.scale[...] if self.scale else None
    bias = self.bias[...] if self.bias else None
    return _flax_norm.normalize(x, scale, bias, dtype=self.dtype, epsilon=self.epsilon, rms=False,
                                residual=residual)


class RMSNorm(nnx.RMSNorm):
  """Drop-in for `flax.nnx.RMSNorm`."""

  def __call__(self, x, *, mask=None, residual=None):
    """Flax's call; `residual=r` returns (norm(x + r), x + r) from one kernel."""
    if not _flax_norm.use_kernel(self, mask, residual):
      return super().__call__(x, mask=mask)
    scale = self.scale[...] if self.scale else None
    return _flax_norm.normalize(x, scale, None, dtype=self.dtype, epsilon=self.epsilon, rms=True,
                                residual=residual)
