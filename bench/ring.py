"""Ring attention over 2 GPUs vs the single-GPU kernel (bf16, fwd and fwd+bwd).

Rows per spec (bench/specs.py RING_SPECS: S = 32k and 128k, N = K = 16, D 128,
causal; timing.time_step chains steps on the carry (q, k, v) -> (out, q, k)):
- ring-zigzag: `jaxcraft.ring_attention` in shard_map, data already in zig-zag
  order (no reorder); ring-contiguous: contiguous shards, reordered inside;
  jit-seq-sharded: `dot_product_attention` in a jit with sequence-sharded inputs
  (partitions itself into the ring, reorders like ring-contiguous).
- single-S/2: the single-GPU kernel on one GPU's share of the sequence, S/2
  (the brief's baseline), and single-S: the whole sequence on one GPU.
- compute-only: ring-zigzag with every step attending the device's own K/V
  (the same kernel calls, no transfers); comm-only: the same transfers
  (K/V bf16 forward; K/V and the fp32 dK/dV partial sums backward) with
  no attention.

Summary per spec and mode: per-GPU throughput of the ring (FLOPs(S) / devices
per second) relative to single-S/2's (target >= 85%), speedup over single-S,
and the communication left exposed, ring - compute-only, vs comm-only (hidden
fraction = 1 - exposed / comm-only).

JAXCRAFT_BENCH_RING_SMOKE=1 runs tiny shapes on 2 CPU devices (start with
XLA_FLAGS=--xla_force_host_platform_device_count=2): the code path only.
"""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxcraft
from jaxcraft.ops import _ring
from specs import RING_SMOKE_SPECS, RING_SPECS
from timing import time_step

DTYPE = jnp.bfloat16
AXIS = "ring"
SPEC = P(None, AXIS)
TIMING = dict(custom_call=True, short=1, long=4, reps=3)


def _fwd(fn):
  """A chainable step on the carry (q, k, v) -> (out, q, k): each chained step
  gets new K/V. With K/V constant, XLA would send them around the ring once
  for all chained steps (the same collective on the same operands)."""
  return lambda qkv: (fn(*qkv), *qkv[:2])


def _fwd_bwd(fn):
  def step(qkv):
    out, vjp = jax.vjp(fn, *qkv)
    dq, dk, dv = vjp(out)
    # All three gradients are used (else XLA could drop dK/dV work); tanh keeps
    # the chain's values bounded.
    return jnp.tanh(dq + dk + dv), *qkv[:2]
  return step


def _ring_fn(mesh, causal, layout):
  return jax.shard_map(
      lambda q, k, v: jaxcraft.ring_attention(q, k, v, axis_name=AXIS, is_causal=causal,
                                              layout=layout),
      mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC)


def _comm_fn(mesh, size, mode):
  """The ring's transfers without its attention; elementwise adds keep each
  transfer live and chain the backward's partial sums as the ring does."""
  ring = _ring.Ring(AXIS, size, "zigzag")

  def fn(q, k, v):
    kv = (k, v)
    for _ in range(size - 1):
      kv = _ring.shift(kv, ring)
    if mode == "fwd":
      return q + kv[0] + kv[1]
    dkv = tuple(x.astype(jnp.float32) for x in kv)
    for _ in range(size - 1):
      kv = _ring.shift(kv, ring)
      dkv = tuple(d + x for d, x in zip(_ring.shift(dkv, ring), kv))
    dk, dv = _ring.shift(tuple(d.astype(q.dtype) for d in dkv), ring)
    return jnp.tanh(q + dk + dv)

  return jax.shard_map(fn, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC)


def _inputs(shape, sharding=None):
  keys = jax.random.split(jax.random.key(0), 3)
  arrays = [jax.random.normal(k, shape, DTYPE) for k in keys]
  return [jax.device_put(a, sharding) for a in arrays] if sharding else arrays


def _time(name, spec, mode, fn, args):
  try:
    return time_step(fn, tuple(args), **TIMING)
  except Exception as e:  # noqa: BLE001 - a variant that fails is reported, not fatal
    print(f"  {spec.name} {name} {mode}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return None


def _summary(spec, mode, t, flops):
  def ms(name):
    return f"{t[name] * 1e3:.2f} ms" if t.get(name) else "-"
  line = []
  if t.get("ring-zigzag") and t.get("single-S/2"):
    per_gpu = flops(spec.seqlen) / spec.devices / t["ring-zigzag"]
    single = flops(spec.seqlen // spec.devices) / t["single-S/2"]
    line.append(f"per-GPU throughput {per_gpu / single:.0%} of single-S/2")
  if t.get("ring-zigzag") and t.get("single-S"):
    line.append(f"speedup over single-S {t['single-S'] / t['ring-zigzag']:.2f}x")
  if all(t.get(n) for n in ("ring-zigzag", "compute-only", "comm-only")):
    exposed = max(t["ring-zigzag"] - t["compute-only"], 0.0)
    line.append(f"comm {ms('comm-only')}, exposed {exposed * 1e3:.2f} ms "
                f"({1 - min(exposed / t['comm-only'], 1.0):.0%} hidden)")
  print(f"  {spec.name} {mode}: " + ", ".join(line), flush=True)


def run(bandwidth: float, specs=None):
  del bandwidth
  smoke = bool(os.environ.get("JAXCRAFT_BENCH_RING_SMOKE"))
  specs = specs or (RING_SMOKE_SPECS if smoke else RING_SPECS)
  devices = jax.devices()
  size = specs[0].devices
  if len(devices) < size or (devices[0].platform != "gpu" and not smoke):
    print(f"  ring: needs {size} GPUs, found {len(devices)} {devices[0].platform} device(s); "
          "skipped", flush=True)
    return []
  mesh = jax.make_mesh((size,), (AXIS,), axis_types=(AxisType.Explicit,), devices=devices[:size])
  rows = []
  for spec in specs:
    shape = (spec.batch, spec.seqlen, spec.heads, spec.head_dim)
    sharded = _inputs(shape, NamedSharding(mesh, SPEC))
    local = _inputs((spec.batch, spec.seqlen // size, spec.heads, spec.head_dim))
    single = lambda q, k, v, causal=spec.causal: jaxcraft.dot_product_attention(
        q, k, v, is_causal=causal)
    for mode, make, flops in (("fwd", _fwd, spec.fwd_flops), ("fwd+bwd", _fwd_bwd, spec.fwd_bwd_flops)):
      variants = {  # name -> (step, inputs, tokens the step covers)
          "ring-zigzag": (make(_ring_fn(mesh, spec.causal, "zigzag")), sharded, spec.seqlen),
          "ring-contiguous": (make(_ring_fn(mesh, spec.causal, "contiguous")), sharded, spec.seqlen),
          "jit-seq-sharded": (make(single), sharded, spec.seqlen),
          "single-S/2": (make(single), local, spec.seqlen // size),
          "single-S": (make(single), _inputs(shape), spec.seqlen),
          "compute-only": (make(_ring_fn(mesh, spec.causal, "zigzag")), sharded, spec.seqlen),
          "comm-only": (_fwd(_comm_fn(mesh, size, mode)), sharded, spec.seqlen),
      }
      times = {}
      for name, (step, args, tokens) in variants.items():
        with _ring.compute_only() if name == "compute-only" else contextlib.nullcontext():
          sec = _time(name, spec, mode, step, args)
        if sec is None:
          continue
        times[name] = sec
        gpus = 1 if name.startswith("single") else size
        per_gpu = flops(tokens) / gpus / sec / 1e12 if name != "comm-only" else None
        rows.append(dict(op="ring", shape=spec.name, seqlen=spec.seqlen, devices=size,
                         causal=spec.causal, impl=name, mode=mode, us=sec * 1e6,
                         tflops_per_gpu=per_gpu))
        rate = f"{per_gpu:6.0f} TFLOP/s per GPU" if per_gpu is not None else ""
        print(f"  {spec.name:28s} {name:16s} {mode:8s} {sec * 1e3:9.3f} ms {rate}", flush=True)
      _summary(spec, mode, times, flops)
  return rows


if __name__ == "__main__":
  run(0.0)
