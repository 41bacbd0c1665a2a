"""Embedding lookup: jaxcraft (both backward paths) vs XLA (jnp.take and its
autodiff), bf16 tables and one float32 table, GB/s by the explicit byte
formulas of specs.EmbeddingSpec and % of the copy ceiling.

Forward step: the previous step's output feeds the next step's ids (ids +
(out[:, 0] == marker), the marker an argument XLA cannot fold), so every
step's output must be computed in full; the column read is 0.1-1% of the
step's bytes, but the glue is a kernel of its own (a few us between two
lookups of ~75 us); jaxcraft's forward rows also carry the lookup kernel's
own time from a profiler trace (kernel_us, kernel_pct_copy). Fwd+bwd step:
the table's gradient becomes the next table.
JAXCRAFT_BENCH_SMOKE=1: tiny shapes (CPU plumbing check).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

import jaxcraft
from jaxcraft.ops import embedding as emb
from specs import EMBEDDING_SMOKE_SPECS, EMBEDDING_SPECS
from timing import kernel_fields, time_step

def ids_for(spec, key):
  """Uniform ids, or with `skew`: that fraction drawn from `hot` rows."""
  k = jax.random.split(key, 3)
  uniform = jax.random.randint(k[0], (spec.ids,), 0, spec.vocab, jnp.int32)
  if not spec.skew:
    return uniform
  hot_rows = jax.random.randint(k[1], (spec.hot,), 0, spec.vocab, jnp.int32)
  hot = hot_rows[jax.random.randint(k[2], (spec.ids,), 0, spec.hot)]
  return jnp.where(jax.random.uniform(k[2], (spec.ids,)) < spec.skew, hot, uniform)


def _impls():
  return {"jaxcraft": lambda t, i: jaxcraft.embedding_lookup(t, i),
          "jaxcraft-det": lambda t, i: jaxcraft.embedding_lookup(t, i, deterministic=True),
          "xla": lambda t, i: emb.embedding_lookup_reference(t, i)}


def _fwd(fn):
  def step(prev, table, ids, marker):
    return fn(table, ids + (prev[:, 0] == marker).astype(ids.dtype))
  return step


def _fwd_bwd(fn):
  def step(table, ids, marker):
    del marker
    out, vjp = jax.vjp(lambda t: fn(t, ids), table)
    return vjp(out)[0]
  return step


def run(bandwidth: float, specs=None):
  smoke = bool(os.environ.get("JAXCRAFT_BENCH_SMOKE"))
  specs = specs or (EMBEDDING_SMOKE_SPECS if smoke else EMBEDDING_SPECS)
  rows = []
  for spec in specs:
    k = jax.random.split(jax.random.key(0), 2)
    dtype = jnp.dtype(spec.dtype)
    table = jax.random.normal(k[0], (spec.vocab, spec.dim), dtype)
    ids = ids_for(spec, k[1])
    marker = jnp.asarray(12345.0, dtype)  # never in the table: ids unchanged
    out0 = jnp.zeros((spec.ids, spec.dim), dtype)
    itemsize = dtype.itemsize
    for name, fn in _impls().items():
      for mode, nbytes, carry, consts, make in (
          ("fwd", spec.fwd_bytes(itemsize), out0, (table, ids, marker), _fwd),
          ("fwd+bwd", spec.fwd_bwd_bytes(itemsize), table, (ids, marker), _fwd_bwd)):
        if mode == "fwd" and name == "jaxcraft-det":
          continue  # the same forward as jaxcraft
        try:
          sec = time_step(make(fn), carry, *consts, custom_call=name != "xla")
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
          print(f"  {spec.name} {name} {mode}: failed: {type(e).__name__}: {str(e)[:120]}",
                flush=True)
          continue
        rows.append(dict(op="embedding", shape=spec.name, impl=name, mode=mode, us=sec * 1e6,
                         gbps=nbytes / sec / 1e9, pct_copy=100 * nbytes / sec / bandwidth))
        kernel = ""
        if name == "jaxcraft" and mode == "fwd" and not smoke:
          fields, kernel = kernel_fields(make(fn), carry, *consts, match="lookup_kernel", nbytes=nbytes,
                                         bandwidth=bandwidth)
          rows[-1].update(fields)
        print(f"  {spec.name:28s} {name:12s} {mode:8s} {rows[-1]['us']:9.1f} us "
              f"{rows[-1]['gbps']:7.0f} GB/s {rows[-1]['pct_copy']:5.1f}%{kernel}", flush=True)
  return rows
