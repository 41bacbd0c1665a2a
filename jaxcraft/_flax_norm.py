"""What the linen and nnx norm modules share: when the kernel applies, and in
which dtype it runs so that results match Flax's own modules."""

from __future__ import annotations

import jax.numpy as jnp
from flax.linen import dtypes

from jaxcraft.ops import norm as norm_ops


def call_doc(flax_module: str) -> str:
  """The docstring of the linen and nnx norm modules' `__call__`."""
  return f"""Normalizes x, as `{flax_module}.__call__`.

    Args:
      x: [..., features].
      mask: Flax's; given, Flax's own module runs.
      residual: optional array of x's shape (jaxcraft extension): normalize
        h = x + residual in one fused kernel.

    Returns:
      The normalized x in Flax's result dtype; with `residual`, the pair
      (norm(h), h).

    Raises:
      ValueError: `residual` with a mask or a configuration the kernel does
        not take.
    """


def kernel_applies(module) -> bool:
  """The kernel normalizes over the last axis of one device's array; other
  configurations (several axes, cross-device statistics) stay with Flax."""
  last_only = lambda axes: axes in (-1, (-1,), [-1])
  return (last_only(module.reduction_axes) and last_only(module.feature_axes)
          and module.axis_name is None)


def use_kernel(module, x, mask, residual) -> bool:
  """Whether a call runs the kernel (else Flax's own module, which also
  takes complex x). The fused residual form exists only where the kernel
  applies: asking for it elsewhere is an error, not a silent fallback."""
  applies = mask is None and not jnp.iscomplexobj(x) and kernel_applies(module)
  if residual is not None and not applies:
    raise ValueError("residual= needs the kernel's configuration: real x, no mask, normalization "
                     "over the last axis only, axis_name=None")
  return applies


def normalize(x, scale, bias, *, dtype, epsilon: float, rms: bool, residual=None):
  """Flax's result dtype (`dtype`, else promoted from x and the params), with
  the kernel running in the wider of that and x's dtype, as Flax computes.
  With `residual` (a jaxcraft extension), returns (norm(x + residual),
  x + residual) from one fused kernel, the sum in that compute dtype."""
  out_dtype = dtypes.canonicalize_dtype(*[a for a in (x, scale, bias) if a is not None],
                                        dtype=dtype)
  compute_dtype = jnp.promote_types(x.dtype, out_dtype)
  x = x.astype(compute_dtype)
  if residual is not None:
    residual = residual.astype(compute_dtype)
  if rms:
    out = norm_ops.rms_norm(x, scale, epsilon=epsilon, residual=residual)
  else:
    out = norm_ops.layer_norm(x, scale, bias, epsilon=epsilon, residual=residual)
  if residual is None:
    return out.astype(out_dtype)
  return out[0].astype(out_dtype), out[1]
