"""Input validation shared by the ops: every message names the argument, what
was seen, and what was expected, and fails in Python before lowering."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.float16))
_KERNEL_DTYPE_NAMES = "float32, bfloat16 or float16"


def as_array(name: str, value):
  if isinstance(value, (jax.Array, np.ndarray, np.generic, float, int)):
    return jnp.asarray(value)
  if hasattr(value, "shape") and hasattr(value, "dtype"):  # tracers, ShapeDtypeStruct-likes
    return value
  raise TypeError(f"{name} must be an array; got {type(value).__name__}")


# Dtypes no kernel takes but the pure-JAX references compute in (jax.nn and
# Flax accept them under jax.enable_x64).
REFERENCE_DTYPES = (np.dtype(np.float64),)


def check_float(name: str, x) -> None:
  """x's dtype is one the kernels or the references take."""
  if np.dtype(x.dtype) not in KERNEL_DTYPES + REFERENCE_DTYPES:
    raise TypeError(f"{name} must be float32, bfloat16, float16 or float64; got dtype {x.dtype}")


def float_implementation(name: str, x, implementation):
  """The implementation to run for floating input `x`: `implementation`
  itself for the kernels' dtypes, "xla" (the reference) for float64 under
  None. A float64 x with a forced kernel raises a ValueError (as any input
  a forced kernel does not take), any other dtype a TypeError, each naming
  the argument."""
  check_float(name, x)
  dtype = np.dtype(x.dtype)
  if dtype in KERNEL_DTYPES or implementation == "xla":
    return implementation
  if implementation is None:
    return "xla"
  raise ValueError(f"implementation={implementation!r}: {name} is {dtype}, which the kernels do "
                   f"not take (they take {_KERNEL_DTYPE_NAMES}); implementation=None or 'xla' "
                   f"computes in {dtype}")


def runs_jax_nn(name: str, x, implementation) -> bool:
  """Whether `x` is complex, which jax.nn's functions take (computing with
  complex values, or as attention a softmax of the logits' real part) and
  no kernel does: the op then calls jax.nn's function. A forced kernel
  raises a ValueError naming the argument."""
  if not jnp.iscomplexobj(x):
    return False
  if implementation in ("cuda", "cpu"):
    raise ValueError(f"implementation={implementation!r}: {name} is complex, which the kernels do not "
                     "take; implementation=None or 'xla' computes as jax.nn does")
  return True


def compute_dtype(dtype):
  """The dtype the references compute in: float32 for the kernels' dtypes
  (as the kernels accumulate), float64 for float64."""
  return jnp.promote_types(dtype, jnp.float32)


def precision(value):
  """`value` (None, a `jax.lax.Precision` or its name) as a Precision, or None."""
  if value is None:
    return None
  try:
    return jax.lax.Precision(value)
  except (TypeError, ValueError):
    raise ValueError("precision must be None, a jax.lax.Precision or its name ('default', "
                     f"'high', 'highest', 'float32', ...); got {value!r}") from None


def check_floating(name: str, x) -> None:
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"{name} must have a floating dtype; got dtype {x.dtype}")


def check_shape(name: str, x, expected: tuple[int, ...], what: str) -> None:
  if tuple(x.shape) != tuple(expected):
    raise ValueError(f"{name} must have shape {tuple(expected)} ({what}); got {tuple(x.shape)}")


def static_float(name: str, value) -> float:
  if isinstance(value, jax.core.Tracer):
    raise TypeError(f"{name} must be a Python float (static), not a traced value")
  try:
    return float(value)
  except (TypeError, ValueError):
    raise TypeError(f"{name} must be a float; got {value!r}") from None


def window(local_window_size) -> tuple[int, int] | None:
  """`local_window_size` (None, an int w meaning (w, w) as in jax.nn, or a
  (left, right) pair of non-negative ints) as (left, right), or None."""
  if local_window_size is None:
    return None
  if isinstance(local_window_size, (int, np.integer)):
    local_window_size = (local_window_size, local_window_size)
  try:
    left, right = (int(w) for w in local_window_size)
  except (TypeError, ValueError):
    raise TypeError("local_window_size must be an int or a (left, right) pair of ints; "
                    f"got {local_window_size!r}") from None
  if left < 0 or right < 0:
    raise ValueError(f"local_window_size must be >= 0; got {(left, right)}")
  return left, right
