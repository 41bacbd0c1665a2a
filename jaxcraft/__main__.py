"""`python -P -m jaxcraft`: a self-check to run first.

Prints the backend and, for each op, its largest error against the pure-JAX
reference (computed in float32) and its time against the pure-JAX version.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxcraft
from jaxcraft import _ffi
from jaxcraft.ops import norm as norm_ops


def _time_pair(fns, args, reps=20, warmup=3):
  """Median seconds per call of each function, their calls taken in turn:
  on a shared or few-core machine the speed drifts over a second (the first
  function timed alone read 3-4x slow on a 2-core development machine), and
  alternating calls give both the same conditions."""
  fns = [jax.jit(fn) for fn in fns]
  for fn in fns:
    for _ in range(warmup):
      jax.block_until_ready(fn(*args))
  times = [[] for _ in fns]
  for _ in range(reps):
    for fn, ts in zip(fns, times):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      ts.append(time.perf_counter() - t0)
  return [float(np.median(ts)) for ts in times]


def _max_err(a, b):
  return max(float(jnp.max(jnp.abs(u.astype(jnp.float32) - v.astype(jnp.float32))))
             for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _cases(dtype):
  keys = jax.random.split(jax.random.key(0), 4)
  rows, cols = 4096, 1024
  x = jax.random.normal(keys[0], (rows, cols), dtype)
  scale = jnp.linspace(0.5, 1.5, cols)
  B, T, N, H = 4, 512, 8, 64
  q, k, v = (jax.random.normal(kk, (B, T, N, H), dtype) for kk in keys[1:])
  return [
      ("layer_norm", lambda x, s: jaxcraft.layer_norm(x, s, s),
       lambda x, s: norm_ops.layer_norm_reference(x, s, s), (x, scale)),
      # Both outputs (the normalized rows and the summed residual stream) on
      # both sides: with only the first, XLA would skip writing the second.
      ("rms_norm + residual", lambda x, s: jaxcraft.rms_norm(x, s, residual=x),
       lambda x, s: norm_ops.rms_norm_reference(x, s, residual=x), (x, scale)),
      ("dot_product_attention (causal)",
       lambda q, k, v: jaxcraft.dot_product_attention(q, k, v, is_causal=True),
       lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True), (q, k, v)),
  ]


def main():
  device = jax.devices()[0]
  built = ", ".join(sorted(_ffi.kernel_platforms())) or "none"
  print(f"jaxcraft {jaxcraft.__version__} | jax {jax.__version__} | backend {device.platform} "
        f"({device.device_kind}) | kernels built for: {built}")
  if _ffi.extension_error():
    print(f"WARNING: the compiled extension did not load: {_ffi.extension_error()}")
  dtype = jnp.bfloat16 if device.platform == "gpu" else jnp.float32
  print(f"\n{'op':32s} {'dtype':9s} {'max |err|':>10s} {'jaxcraft':>11s} {'pure JAX':>11s}")
  for name, ours, ref, args in _cases(dtype):
    up = [a.astype(jnp.float32) for a in args]
    with jax.default_matmul_precision("highest"):
      expected = jax.jit(ref)(*up)
    err = _max_err(jax.jit(ours)(*args), expected)
    t_ours, t_ref = _time_pair((ours, ref), args)
    print(f"{name:32s} {jnp.dtype(dtype).name:9s} {err:10.2e} {t_ours * 1e3:8.3f} ms "
          f"{t_ref * 1e3:8.3f} ms")
  print("\nErrors are against the pure-JAX reference on float32 inputs; "
        "times are medians of 20 jitted calls, the two taken in turn.")


if __name__ == "__main__":
  main()
