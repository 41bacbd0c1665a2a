"""Layer norm / RMS norm over 256 MB of bf16 (JAXCRAFT_BENCH_NORM_MB sets
another size) at row widths 512 to 65536: the kernels (forced,
`implementation="cuda"`) against XLA's fusion of the jnp version and
Pallas' layer norm. Forward and backward are timed apart; the backward is a
chain of the forward's VJP function, so it measures the backward alone."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp

import jaxcraft
from jaxcraft.ops import norm as norm_ops
from specs import NORM_SPECS
from timing import kernel_fields, time_step

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
    impls = {"jaxcraft": lambda x, s, b, residual=None: jaxcraft.layer_norm(
                 x, s, b, residual=residual, implementation="cuda"),
             "xla": lambda x, s, b, residual=None: norm_ops.layer_norm_reference(x, s, b, residual=residual)}
    pallas = _pallas_layer_norm()
    if pallas is not None:
      impls["pallas"] = pallas
  else:
    impls = {"jaxcraft": lambda x, s, b, residual=None: jaxcraft.rms_norm(
                 x, s, residual=residual, implementation="cuda"),
             "xla": lambda x, s, b, residual=None: norm_ops.rms_norm_reference(x, s, residual=residual)}
  if wanted := os.environ.get("JAXCRAFT_BENCH_IMPLS"):
    impls = {name: fn for name, fn in impls.items() if name in wanted.split(",")}
  return impls


def _fwd_case(fn, residual, x, s, b, r):
  """(step, carry, consts): y = norm(x) fed back as the next x."""
  if residual:
    return (lambda x, s, b, r: fn(x, s, b, residual=r)[0]), x, (s, b, r)
  return (lambda x, s, b: fn(x, s, b)), x, (s, b)


def _bwd_case(fn, residual, x, s, b, r):
  """(step, carry, consts): dx = vjp(dy) fed back as the next dy. The VJP
  function is a pytree (its saved h and row statistics are leaves), passed
  as an argument so that XLA does not fold them into the program."""
  if residual:
    (y, h), vjp = jax.vjp(lambda x, r: fn(x, s, b, residual=r), x, r)
    return (lambda dy, vjp, dh: vjp((dy, dh))[0]), y, (vjp, h)
  y, vjp = jax.vjp(lambda x: fn(x, s, b), x)
  return (lambda dy, vjp: vjp(dy)[0]), y, (vjp,)


def _selected(variable, values):
  wanted = os.environ.get(variable)
  return [v for v in values if not wanted or str(v) in wanted.split(",")]


def run(bandwidth: float, specs=NORM_SPECS):
  if mb := os.environ.get("JAXCRAFT_BENCH_NORM_MB"):
    specs = [dataclasses.replace(s, mb=int(mb)) for s in specs]
  rows = []
  for spec in [s for s in specs if s.cols in map(int, _selected("JAXCRAFT_BENCH_NORM_COLS",
                                                                  [s.cols for s in specs]))]:
    k = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(k[0], (spec.rows, spec.cols), DTYPE)
    r = jax.random.normal(k[1], (spec.rows, spec.cols), DTYPE)
    s = 1.0 + 0.1 * jax.random.normal(k[2], (spec.cols,), jnp.float32)
    b = 0.1 * jax.random.normal(k[3], (spec.cols,), jnp.float32)
    for kind in _selected("JAXCRAFT_BENCH_NORM_OPS", ("layer", "rms")):
      for residual in (False, True):
        for name, fn in _impls(kind).items():
          if residual and name == "pallas":
            continue
          for mode in _selected("JAXCRAFT_BENCH_MODES", ("fwd", "bwd")):
            make, nbytes = ((_fwd_case, spec.fwd_bytes(2, residual)) if mode == "fwd"
                            else (_bwd_case, spec.bwd_bytes(2, residual)))
            custom_call = name == "jaxcraft"
            try:
              step, carry, consts = make(fn, residual, x, s, b, r)
              sec = time_step(step, carry, *consts, custom_call=custom_call)
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
              print(f"  {kind} {name} {mode} {spec.name}: failed: {type(e).__name__}: {str(e)[:120]}")
              continue
            row = dict(op=f"{kind}_norm" + ("+residual" if residual else ""), shape=spec.name,
                       impl=name, mode=mode, us=sec * 1e6, gbps=nbytes / sec / 1e9,
                       pct_copy=100 * nbytes / sec / bandwidth)
            note = ""
            if custom_call:  # the kernel alone, without the partial-sum reduction
              fields, note = kernel_fields(step, carry, *consts, match=f"norm_{mode}",
                                           nbytes=nbytes, bandwidth=bandwidth)
              row.update(fields)
            rows.append(row)
            print(f"  {row['op']:20s} {spec.name:11s} {name:9s} {mode:4s} {row['us']:8.1f} us "
                  f"{row['gbps']:7.0f} GB/s {row['pct_copy']:5.1f}%{note}", flush=True)
  return rows
