"""Computed tolerances: the kernel's error against a
float64 reference must be at most ~2x the error of the same math done by the
pure-JAX reference in the input dtype, plus a tiny absolute slack."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Rounding of fp32 statistics itself: ~1e-6 relative to the largest value.
F32_SLACK = 2e-6


def random(key, shape, dtype, scale=1.0, offset=0.0):
  """Fresh normal data (never zeros: they hide unwritten outputs)."""
  return (jax.random.normal(key, shape, jnp.float32) * scale + offset).astype(dtype)


def f64(a) -> np.ndarray:
  return np.asarray(jnp.asarray(a).astype(jnp.float32), dtype=np.float64)


def max_err(a, ref: np.ndarray) -> float:
  a = f64(a)
  assert np.all(np.isfinite(a)), "non-finite values in the result"
  return float(np.max(np.abs(a - ref))) if ref.size else 0.0


def assert_close(out, lowp, ref: np.ndarray, factor: float = 2.0, name: str = "output"):
  """`out`: the kernel; `lowp`: the reference in the input dtype; `ref`: float64."""
  scale = float(np.max(np.abs(ref))) if ref.size else 0.0
  err, base = max_err(out, ref), max_err(lowp, ref)
  bound = factor * base + F32_SLACK * max(scale, 1.0)
  assert err <= bound, f"{name}: error {err:.3g} > bound {bound:.3g} (reference error {base:.3g})"


def norm_err(a, ref: np.ndarray) -> float:
  a = f64(a)
  assert np.all(np.isfinite(a)), "non-finite values"
  return float(np.linalg.norm(a - ref))


def assert_parity(out, lowp, ref, name="out"):
  """Whole-tensor version of `assert_close`: kernel error (L2 norm) vs the fp32
  reference <= 2x the input-dtype reference's, plus fp32-rounding slack (1e-5
  relative; per element where ref is ~0, e.g. dq with a single visible key,
  where dP - delta cancels)."""
  ref = f64(ref)
  err, base = norm_err(out, ref), norm_err(lowp, ref)
  slack = 1e-5 * max(float(np.linalg.norm(ref)), np.sqrt(ref.size))
  assert err <= 2 * base + slack, f"{name}: error {err:.3g} > 2 x {base:.3g} + {slack:.3g}"
