"""The norm and activation kernels against XLA's jnp versions between
matmuls, from one row (a decode step) to training-sized row counts: the
measurements behind the `implementation=None` policies of the norms
(jaxcraft/ops/norm.py) and the activations (jaxcraft/ops/activations.py).

One step is a block's skeleton in bf16 at the d_model and MLP width of
bench/model.py's decoder:
  norms:       h = x @ W, (y, h') = norm(h, residual=x), x' = y + h'
               (XLA fuses its jnp norm with the residual add and the final add);
  activations: x' = act(x @ W_in) @ W_out
               (XLA may fuse its jnp activation into a matmul's prologue or epilogue).
The kernel is a custom call between them. Modes: the forward (inference,
every row count) and forward + backward (row counts of a training step).
Small row counts fit in L2, as they do in a decode step.
`python bench/run.py --ops row_counts`.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

import jaxcraft
from timing import ChainTimer, time_interleaved

DTYPE = jnp.bfloat16
ROWS = (1, 8, 64, 256, 1024, 4096, 16384)
D_MODEL = 2048
MLP_WIDTH = 5632
BACKWARD_MIN_ROWS = 1024  # fewer rows than a training step has
NORMS = ("rms_norm+residual", "rms_norm", "layer_norm")
ACTIVATIONS = ("swiglu", "geglu", "gelu")


def _norm_block(kind, implementation):
  if kind == "rms_norm+residual":
    norm = lambda h, s, r: jaxcraft.rms_norm(h, s, residual=r, implementation=implementation)
  else:
    op = jaxcraft.rms_norm if kind == "rms_norm" else jaxcraft.layer_norm
    norm = lambda h, s, r: (op(h, s, implementation=implementation), r)

  def block(x, params):
    w, s = params
    y, h = norm(x @ w, s, x)
    return y + h
  return block


def _activation_block(kind, implementation):
  act = {"swiglu": lambda h: jaxcraft.swiglu(h, implementation=implementation),
         "geglu": lambda h: jaxcraft.geglu(h, implementation=implementation),
         "gelu": lambda h: jaxcraft.gelu(h, implementation=implementation)}[kind]

  def block(x, params):
    w_in, w_out = params
    return act(x @ w_in) @ w_out
  return block


def _params(kind, key, cols, width):
  k = jax.random.split(key, 2)
  normal = lambda k, shape: (jax.random.normal(k, shape, jnp.float32) / shape[0]**0.5).astype(DTYPE)
  if kind in NORMS:
    return normal(k[0], (cols, cols)), 1.0 + 0.1 * jax.random.normal(k[1], (cols,), jnp.float32)
  in_width = width if kind == "gelu" else 2 * width  # the gated ones split their input in halves
  return normal(k[0], (cols, in_width)), normal(k[1], (width, cols))


def _step(block, backward):
  if not backward:
    return block
  return lambda x, p: jax.grad(lambda x: block(x, p).astype(jnp.float32).sum())(x).astype(x.dtype)


def run(bandwidth: float):
  del bandwidth  # the matmuls dominate the bytes: reported as time
  smoke = bool(os.environ.get("JAXCRAFT_BENCH_SMOKE"))
  rows_list, cols, width = ((1, 64), 256, 512) if smoke else (ROWS, D_MODEL, MLP_WIDTH)
  impls = {"jaxcraft": None if smoke else "cuda", "xla": "xla"}
  kinds = os.environ.get("JAXCRAFT_BENCH_ROW_KINDS")
  kinds = kinds.split(",") if kinds else NORMS + ACTIVATIONS
  out = []
  key = jax.random.key(0)
  for kind in kinds:
    make_block = _norm_block if kind in NORMS else _activation_block
    params = _params(kind, key, cols, width)
    for rows in rows_list:
      x = jax.random.normal(key, (rows, cols), DTYPE)
      modes = ("fwd", "fwd+bwd") if rows >= BACKWARD_MIN_ROWS or smoke else ("fwd",)
      for mode in modes:
        # Both unrolled: the matmul between two steps keeps XLA from fusing
        # one step's op into the next, as in a model.
        times = time_interleaved({
            name: ChainTimer(_step(make_block(kind, implementation), mode == "fwd+bwd"), x, params)
            for name, implementation in impls.items()})
        ratio = times["xla"] / times["jaxcraft"]
        out.append(dict(op=kind, rows=rows, cols=cols, mode=mode, jaxcraft_us=times["jaxcraft"] * 1e6,
                        xla_us=times["xla"] * 1e6, speedup=ratio))
        print(f"  {kind:18s} {rows:6d} x {cols:5d} {mode:8s} jaxcraft {times['jaxcraft'] * 1e6:9.1f} us"
              f"  xla {times['xla'] * 1e6:9.1f} us  xla/jaxcraft {ratio:5.2f}", flush=True)
  return out
