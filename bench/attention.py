"""Attention fwd and fwd+bwd TFLOP/s: jaxcraft vs cuDNN (jax.nn) vs tokamax (Mosaic GPU) vs
Pallas-Triton vs XLA."""

from __future__ import annotations

import dataclasses
import logging
import math
import os

import jax
import jax.numpy as jnp

import jaxcraft
from specs import ATTENTION_SPECS, AttentionSpec
from timing import GRAPH_STEPS, ChainTimer, time_interleaved

# JAXCRAFT_BENCH_DTYPE=float16: the sweep in float16 (both 16-bit types are supported).
DTYPE = jnp.dtype(os.environ.get("JAXCRAFT_BENCH_DTYPE", "bfloat16"))
# Chain pairs timed per cell, in turn with the other implementations
# (JAXCRAFT_BENCH_REPEATS overrides). Under the H100's power cap single
# samples of one kernel spread by +-5% (clocks 1470-1980 MHz); with the
# median of three, cells of unchanged kernels moved by 5-10% between sweeps.
REPEATS = 9
# Chain lengths (timing.ChainTimer): the short chain long enough for XLA to
# run cuDNN's calls as a CUDA graph (timing.GRAPH_STEPS), the long one grown
# to a 10 ms span.
CHAIN = dict(short=GRAPH_STEPS, long=GRAPH_STEPS + 2, reps=3, max_long=GRAPH_STEPS + 64)
# XLA's attention materializes B x N x S x S logits: skip it past this length.
XLA_MAX_SEQLEN = 2048
# JAXCRAFT_BENCH_QUICK=1: the headline rows only (short device leases).
QUICK_SPECS = [AttentionSpec(128, 2048, False), AttentionSpec(128, 2048, True),
               AttentionSpec(64, 2048, False)]


def _impls(spec):
  impls = {
      "jaxcraft": lambda q, k, v: jaxcraft.dot_product_attention(q, k, v, is_causal=spec.causal),
      "cudnn": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=spec.causal,
                                                            implementation="cudnn"),
  }
  try:  # tokamax's Mosaic GPU kernels, where installed (bench/peer_wheels.sh)
    import tokamax
    # It warns of its empty autotuning cache at every lowering (and runs its
    # default configuration).
    logging.getLogger("absl").setLevel(logging.ERROR)
    # Jitted: each call of a jitted function in the unrolled chain lowers to
    # a call of one function, so Pallas compiles its kernels once per chain,
    # not once per step (a 72-step chain took about a minute per cell).
    impls["tokamax"] = jax.jit(lambda q, k, v: tokamax.dot_product_attention(
        q, k, v, is_causal=spec.causal, implementation="mosaic"))
  except ImportError:
    pass
  try:  # Pallas' Triton flash attention (forward and backward kernels)
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention
    impls["pallas"] = lambda q, k, v: pallas_attention.mha(
        q, k, v, None, sm_scale=1.0 / math.sqrt(spec.head_dim), causal=spec.causal)
  except ImportError:
    pass
  if spec.seqlen <= XLA_MAX_SEQLEN:
    impls["xla"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=spec.causal,
                                                                implementation="xla")
  # JAXCRAFT_BENCH_IMPLS=jaxcraft,cudnn: time only these implementations.
  if wanted := os.environ.get("JAXCRAFT_BENCH_IMPLS"):
    impls = {name: fn for name, fn in impls.items() if name in wanted.split(",")}
  return impls


def _fwd(fn):
  return lambda q, k, v: fn(q, k, v)  # output has q's shape: it becomes the next q


def _fwd_bwd(fn):
  def step(q, k, v):
    out, vjp = jax.vjp(fn, q, k, v)
    dq, dk, dv = vjp(out)
    # Use all three gradients (else XLA could drop dk/dv work), each KV head's
    # for its group of query heads; tanh keeps the chain's values bounded.
    return jnp.tanh(dq + jnp.repeat(dk + dv, q.shape[2] // k.shape[2], axis=2))
  return step


def inputs(spec):
  """The row's q [batch, seqlen, heads, head_dim] and k, v [..., kv_heads, head_dim]: normal
  samples."""
  keys = jax.random.split(jax.random.key(0), 3)
  shape = lambda heads: (spec.batch, spec.seqlen, heads, spec.head_dim)
  return (jax.random.normal(keys[0], shape(spec.heads), DTYPE),
          *(jax.random.normal(kk, shape(spec.kv_heads), DTYPE) for kk in keys[1:]))


def run(bandwidth: float, specs=None):
  del bandwidth
  specs = specs or (QUICK_SPECS if os.environ.get("JAXCRAFT_BENCH_QUICK") else ATTENTION_SPECS)
  # JAXCRAFT_BENCH_GQA=4: four query heads per KV head in every row.
  group = int(os.environ.get("JAXCRAFT_BENCH_GQA", "1"))
  specs = [dataclasses.replace(s, group=group) for s in specs]
  # JAXCRAFT_BENCH_HEAD_DIMS=64,128 / JAXCRAFT_BENCH_SEQLENS=1024,4096: a part of
  # the sweep (to fit one device call).
  for var, field in (("JAXCRAFT_BENCH_HEAD_DIMS", "head_dim"), ("JAXCRAFT_BENCH_SEQLENS", "seqlen")):
    if wanted := os.environ.get(var):
      specs = [s for s in specs if str(getattr(s, field)) in wanted.split(",")]
  rows = []
  for spec in specs:
    q, k, v = inputs(spec)
    impls = _impls(spec)
    for mode, make, flops in (("fwd", _fwd, spec.fwd_flops()),
                              ("fwd+bwd", _fwd_bwd, spec.fwd_bwd_flops())):
      timers = {}
      for name, fn in impls.items():
        try:
          timers[name] = ChainTimer(make(fn), q, k, v, custom_call=name != "xla", **CHAIN)
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
          print(f"  {spec.name} {name} {mode}: failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
      for name, sec in time_interleaved(timers, default=REPEATS).items():
        rows.append(dict(op="attention", shape=spec.name, head_dim=spec.head_dim,
                         seqlen=spec.seqlen, causal=spec.causal, kv_heads=spec.kv_heads,
                         dtype=DTYPE.name, impl=name,
                         mode=mode, us=sec * 1e6, tflops=flops / sec / 1e12))
        print(f"  {spec.name:18s} {name:9s} {mode:8s} {sec * 1e3:9.3f} ms "
              f"{rows[-1]['tflops']:6.0f} TFLOP/s", flush=True)
  return rows
