"""softmax: jaxcraft's kernel vs XLA's jax.nn.softmax, bf16 and f32.

Implementations:
  jaxcraft  the kernel, forced (implementation="cuda"/"cpu"), whatever the
            implementation=None policy says;
  default   jaxcraft.softmax with implementation=None: the policy's own
            choice per pass (kernel or XLA);
  jax.nn    jax.jit(jax.nn.softmax) in the input dtype (= implementation="xla").
Modes: "fwd"; "bwd", the backward alone (dx from the forward's saved y and
an independent dy: what the policy's backward choice decides); "fwd+bwd"
(the backward from dy = y, y itself unused: XLA fuses the forward into its
backward and never writes y, which no model that consumes y gets). GB/s from
SoftmaxSpec's byte formulas (fwd: read x + write y = 2 passes; bwd: read y
and dy, write dx = 3; fwd+bwd: 5) and % of the copy ceiling;
JAXCRAFT_BENCH_SOFTMAX_MODES (comma-separated) runs only some modes. The
"op" column carries the dtype so that the plot shows one row per dtype.
These rows fill DEFAULT_IMPLEMENTATION in jaxcraft/ops/softmax.py.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

import jaxcraft
from jaxcraft.ops import softmax as softmax_ops
from specs import SOFTMAX_SMOKE_SPECS, SOFTMAX_SPECS, SoftmaxSpec
from timing import time_step

DTYPES = (jnp.bfloat16, jnp.float32)


def _kernel_platform() -> str:
  return "cuda" if jax.devices()[0].platform == "gpu" else "cpu"


def _impls(x):
  """name -> (fn(x), forward is a custom call, backward is one). The policy's
  row is chained as a custom call where its pass runs the kernel (timing.py:
  XLA's own ops are timed in a loop, or consecutive steps would fuse)."""
  k = _kernel_platform()
  row_bytes = x.shape[-1] * x.dtype.itemsize
  policy = [softmax_ops.default_implementation(k, p, row_bytes, dtype=x.dtype) == "kernel"
            for p in ("fwd", "bwd")]
  return {"jaxcraft": (lambda x: jaxcraft.softmax(x, implementation=k), True, True),
          "default": (jaxcraft.softmax, *policy),
          "jax.nn": (jax.nn.softmax, False, False)}


def _fwd_bwd_step(fn):
  """x -> dx with dy = y (shapes match x)."""
  def step(x):
    y, vjp = jax.vjp(fn, x)
    return vjp(y)[0]
  return step


def _bwd_step(dy, vjp):
  """dy -> dx through the forward's saved residuals (a vjp closure is a
  pytree: it travels into the jitted chain as an argument)."""
  return vjp(dy)[0]


def run(bandwidth: float, specs=None):
  if specs is None:
    smoke = os.environ.get("JAXCRAFT_BENCH_SOFTMAX_SMOKE") == "1"
    specs = SOFTMAX_SMOKE_SPECS if smoke else SOFTMAX_SPECS
  modes = os.environ.get("JAXCRAFT_BENCH_SOFTMAX_MODES", "fwd,bwd,fwd+bwd").split(",")
  rows = []

  def record(spec: SoftmaxSpec, dtype, name, mode, sec, nbytes):
    row = dict(op=f"softmax {jnp.dtype(dtype).name}", shape=spec.name, impl=name, mode=mode,
               us=sec * 1e6, gbps=nbytes / sec / 1e9, pct_copy=100 * nbytes / sec / bandwidth)
    rows.append(row)
    print(f"  {row['op']:16s} {spec.name:12s} {name:9s} {mode:8s} {row['us']:9.1f} us "
          f"{row['gbps']:7.0f} GB/s {row['pct_copy']:5.1f}%", flush=True)

  # One untimed cell first: the process's first timed cell (bf16 [16k, 4k]
  # forward) runs 4-6% slower on the H200 than the same kernel timed later in
  # the same process.
  warm = jnp.zeros((specs[0].rows, specs[0].cols), DTYPES[0])
  time_step(lambda x: jaxcraft.softmax(x, implementation=_kernel_platform()), warm, repeats=1)
  del warm
  for spec in specs:
    for dtype in DTYPES:
      x = (3 * jax.random.normal(jax.random.key(0), (spec.rows, spec.cols), jnp.float32)).astype(dtype)
      itemsize = jnp.dtype(dtype).itemsize
      dy = jax.random.normal(jax.random.key(1), x.shape, dtype)
      for name, (fn, custom_call, bwd_custom_call) in _impls(x).items():
        cases = [("fwd", lambda: time_step(fn, x, custom_call=custom_call), spec.fwd_bytes(itemsize)),
                 ("bwd", lambda: time_step(_bwd_step, dy, jax.vjp(fn, x)[1], custom_call=bwd_custom_call),
                  spec.bwd_bytes(itemsize)),
                 ("fwd+bwd", lambda: time_step(_fwd_bwd_step(fn), x,
                                               custom_call=custom_call or bwd_custom_call),
                  spec.fwd_bwd_bytes(itemsize))]
        for mode, timed, nbytes in (c for c in cases if c[0] in modes):
          try:
            sec = timed()
          except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            print(f"  softmax {name} {mode} {spec.name}: failed: {type(e).__name__}: {str(e)[:160]}")
            continue
          record(spec, dtype, name, mode, sec, nbytes)
      del x, dy
  return rows
