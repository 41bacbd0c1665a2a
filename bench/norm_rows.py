"""The norm kernels against XLA's jnp norms between matmuls, from one row (a
decode step) to training-sized row counts: the measurements behind the norms'
`implementation=None` policy (jaxcraft/ops/norm.py, DEFAULT_IMPLEMENTATION).

One step is a pre-norm block's skeleton, bf16: h = x @ W, then
(y, h') = norm(h, residual=x), then x' = y + h'. XLA fuses its jnp norm with
the residual add and the final add; the kernel is a custom call between them.
Modes: the forward (inference, every row count) and forward + backward
(row counts of a training step). Small row counts fit in L2, as they do in a
decode step. `python bench/run.py --ops norm_rows`.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

import jaxcraft
from timing import ChainTimer, time_interleaved

DTYPE = jnp.bfloat16
ROWS = (1, 8, 64, 256, 1024, 4096, 16384)
COLS = (2048,)  # the d_model of bench/model.py's decoder
BACKWARD_MIN_ROWS = 1024  # fewer rows than a training step has


def _norm(kind, implementation):
  if kind == "rms_norm+residual":
    return lambda h, s, r: jaxcraft.rms_norm(h, s, residual=r, implementation=implementation)
  norm = jaxcraft.rms_norm if kind == "rms_norm" else jaxcraft.layer_norm
  return lambda h, s, r: (norm(h, s, implementation=implementation), r)


def _step(norm, backward):
  def block(x, w, s):
    y, h = norm(x @ w, s, x)
    return y + h

  if not backward:
    return block
  return lambda x, w, s: jax.grad(lambda x: block(x, w, s).astype(jnp.float32).sum())(x).astype(x.dtype)


def run(bandwidth: float):
  del bandwidth  # the matmuls dominate the bytes: reported as time
  smoke = bool(os.environ.get("JAXCRAFT_BENCH_SMOKE"))
  rows_list, cols_list = ((1, 64), (256,)) if smoke else (ROWS, COLS)
  impls = {"jaxcraft": None if smoke else "cuda", "xla": "xla"}
  out = []
  for cols in cols_list:
    k = jax.random.split(jax.random.key(0), 3)
    w = (jax.random.normal(k[1], (cols, cols), jnp.float32) / cols**0.5).astype(DTYPE)
    s = 1.0 + 0.1 * jax.random.normal(k[2], (cols,), jnp.float32)
    for rows in rows_list:
      x = jax.random.normal(k[0], (rows, cols), DTYPE)
      for kind in ("rms_norm+residual", "rms_norm", "layer_norm"):
        modes = ("fwd", "fwd+bwd") if rows >= BACKWARD_MIN_ROWS or smoke else ("fwd",)
        for mode in modes:
          # Both unrolled: the matmul between two steps keeps XLA from fusing
          # one step's norm into the next, as in a model.
          times = time_interleaved({
              name: ChainTimer(_step(_norm(kind, implementation), mode == "fwd+bwd"), x, w, s)
              for name, implementation in impls.items()})
          ratio = times["xla"] / times["jaxcraft"]
          out.append(dict(op=kind, rows=rows, cols=cols, mode=mode,
                          jaxcraft_us=times["jaxcraft"] * 1e6, xla_us=times["xla"] * 1e6,
                          speedup=ratio))
          print(f"  {kind:18s} {rows:6d} x {cols:5d} {mode:8s} jaxcraft {times['jaxcraft'] * 1e6:9.1f} us"
                f"  xla {times['xla'] * 1e6:9.1f} us  xla/jaxcraft {ratio:5.2f}", flush=True)
  return out
