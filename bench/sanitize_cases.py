"""Small calls of every CUDA kernel path, for compute-sanitizer
(`bench/gpu_check.sh` runs it under memcheck, racecheck and synccheck)."""

import sys

import jax
import jax.numpy as jnp

import jaxcraft


def norm_cases():
  key = jax.random.key(0)
  # Register path (aligned rows), streaming path (wide rows), scalar path (C % 8 != 0).
  for shape, dtype in [((7, 1024), jnp.bfloat16), ((3, 65536), jnp.bfloat16),
                       ((5, 257), jnp.float32), ((33, 96), jnp.float16)]:
    x = jax.random.normal(key, shape, dtype)
    s = jnp.linspace(0.5, 1.5, shape[-1])
    for fn in (lambda x, r: jaxcraft.layer_norm(x, s, s, residual=r, implementation="cuda")[0],
               lambda x, r: jaxcraft.rms_norm(x, s, residual=r, implementation="cuda")[0]):
      out, vjp = jax.vjp(fn, x, x)
      jax.block_until_ready(vjp(out))


CASES = {"norm": norm_cases}

if __name__ == "__main__":
  for name in sys.argv[1].split(","):
    CASES[name]()
  print("sanitizer cases ran")
