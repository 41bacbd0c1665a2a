"""Layer norm / RMS norm: jaxcraft vs XLA's fused jnp version vs Pallas, bf16."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxcraft
from jaxcraft.ops import norm as norm_ops
from specs import NORM_SPECS
from timing import time_step

DTYPE = jnp.bfloat16


def _pallas_layer_norm():
  try:
    from jax.experimental.pallas.ops.gpu import layer_norm as pallas_ln
  except Exception:  # noqa: BLE001 - Pallas GPU ops need Triton; absent on CPU
    return None
  # Pallas' kernel reads rows of a [batch, seq, features] array (a 2-D x fails
  # inside it with an IndexError): give it one batch.
  return lambda x, s, b, residual=None: pallas_ln.layer_norm(x[None], s, b)[0]


def _impls(kind):
  if kind == "layer":
    impls = {"jaxcraft": lambda x, s, b, residual=None: jaxcraft.layer_norm(x, s, b, residual=residual),
             "xla": lambda x, s, b, residual=None: norm_ops.layer_norm_reference(x, s, b, residual=residual)}
    pallas = _pallas_layer_norm()
    if pallas is not None:
      impls["pallas"] = pallas
  else:
    impls = {"jaxcraft": lambda x, s, b, residual=None: jaxcraft.rms_norm(x, s, residual=residual),
             "xla": lambda x, s, b, residual=None: norm_ops.rms_norm_reference(x, s, residual=residual)}
  return impls


def _fwd_step(fn, residual):
  if residual:
    return lambda x, s, b, r: fn(x, s, b, residual=r)[0]
  return lambda x, s, b, r: fn(x, s, b)


def _fwd_bwd_step(fn, residual):
  def step(x, s, b, r):
    if residual:
      (y, h), vjp = jax.vjp(lambda x, r: fn(x, s, b, residual=r), x, r)
      return vjp((y, h))[0]
    y, vjp = jax.vjp(lambda x: fn(x, s, b), x)
    return vjp(y)[0]
  return step


def run(bandwidth: float, specs=NORM_SPECS):
  rows = []
  for spec in specs:
    k = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(k[0], (spec.rows, spec.cols), DTYPE)
    r = jax.random.normal(k[1], (spec.rows, spec.cols), DTYPE)
    s = 1.0 + 0.1 * jax.random.normal(k[2], (spec.cols,), jnp.float32)
    b = 0.1 * jax.random.normal(k[3], (spec.cols,), jnp.float32)
    for kind in ("layer", "rms"):
      for residual in (False, True):
        for name, fn in _impls(kind).items():
          if residual and name == "pallas":
            continue
          for mode, make, nbytes in (("fwd", _fwd_step, spec.fwd_bytes(2, residual)),
                                     ("fwd+bwd", _fwd_bwd_step, spec.fwd_bwd_bytes(2, residual))):
            try:
              step = make(fn, residual)
              sec = time_step(step, x, s, b, r,
                              custom_call=name == "jaxcraft")
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
              print(f"  {kind} {name} {mode} {spec.name}: failed: {type(e).__name__}: {str(e)[:120]}")
              continue
            rows.append(dict(op=f"{kind}_norm" + ("+residual" if residual else ""), shape=spec.name,
                             impl=name, mode=mode, us=sec * 1e6, gbps=nbytes / sec / 1e9,
                             pct_copy=100 * nbytes / sec / bandwidth))
            print(f"  {rows[-1]['op']:22s} {spec.name:10s} {name:9s} {mode:8s} "
                  f"{rows[-1]['us']:8.1f} us {rows[-1]['gbps']:7.0f} GB/s {rows[-1]['pct_copy']:5.1f}%",
                  flush=True)
  return rows
