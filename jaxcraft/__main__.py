"""`python -P -m jaxcraft`: a self-check to run first.

Prints the backend, which kernels this installation has and, for each op, its
largest error against the pure-JAX reference (computed in float32) and its
speed against the pure-JAX version, with the spread of that ratio.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxcraft
from jaxcraft import _ffi
from jaxcraft.ops import norm as norm_ops


# Speed ratios above this relative spread (interquartile range over median)
# are flagged: the machine's speed moved while the pair was timed.
NOISY_SPREAD = 0.2


def _speedup(fns, args, rounds=41, warmup=3):
  """Median ms per call of (ours, reference), and the median and quartiles
  of the per-round ratio reference/ours.

  Each round times one call of each, in alternating order: on a shared or
  few-core machine the speed drifts within a second (3-4x between runs on a
  2-core machine), and a ratio taken within one round cancels the drift that
  separate medians would not.
  """
  fns = [jax.jit(fn) for fn in fns]
  for fn in fns:
    for _ in range(warmup):
      jax.block_until_ready(fn(*args))
  times = np.zeros((rounds, 2))
  for r in range(rounds):
    for i in ((0, 1) if r % 2 == 0 else (1, 0)):
      t0 = time.perf_counter()
      jax.block_until_ready(fns[i](*args))
      times[r, i] = time.perf_counter() - t0
  ratios = times[:, 1] / times[:, 0]
  q1, median, q3 = np.percentile(ratios, [25, 50, 75])
  ours_ms, ref_ms = np.median(times, axis=0) * 1e3
  return ours_ms, ref_ms, median, q1, q3


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
  if device.platform == "gpu" and not _ffi.has_kernels("cuda"):
    print(f"WARNING: {_ffi.cuda_kernels_missing()}")
  elif _ffi.extension_error():
    print(f"WARNING: the compiled extension did not load: {_ffi.extension_error()}")
  dtype = jnp.bfloat16 if device.platform == "gpu" else jnp.float32
  print(f"\n{'op':32s} {'dtype':9s} {'max |err|':>10s} {'jaxcraft':>11s} {'pure JAX':>11s}"
        f" {'speedup (quartiles)':>22s}")
  noisy = False
  for name, ours, ref, args in _cases(dtype):
    up = [a.astype(jnp.float32) for a in args]
    with jax.default_matmul_precision("highest"):
      expected = jax.jit(ref)(*up)
    err = _max_err(jax.jit(ours)(*args), expected)
    ours_ms, ref_ms, ratio, q1, q3 = _speedup((ours, ref), args)
    flag = "  noisy" if (q3 - q1) / ratio > NOISY_SPREAD else ""
    noisy |= bool(flag)
    print(f"{name:32s} {jnp.dtype(dtype).name:9s} {err:10.2e} {ours_ms:8.3f} ms "
          f"{ref_ms:8.3f} ms {ratio:7.2f}x ({q1:.2f}-{q3:.2f}){flag}")
  print("\nErrors are against the pure-JAX reference on float32 inputs. Times are medians "
        "of 41 jitted calls of each, taken in turn; the speedup is the median of the "
        "per-round ratios.")
  if noisy:
    print(f"'noisy': the ratio's quartiles spread by more than {NOISY_SPREAD:.0%} of it; the "
          "machine's speed changed while it was timed (other load, few cores). Rerun on an "
          "idle machine to compare speeds.")


if __name__ == "__main__":
  main()
