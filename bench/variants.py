"""Attention variants: packed documents with segment ids, and an
additive bias with its gradient, against cuDNN (jax.nn) on the same inputs.

Packed: 16k tokens as 8 causal documents of 2k (B=1, N=16, D=128, bf16).
jaxcraft takes segment ids; cuDNN needs the equivalent dense [1, 1, S, S]
mask. TFLOP/s count only the visible (unmasked) work, so the plain causal
kernel on the 8 documents as a batch of 8 (same visible work) is the bar:
the packed run's target is >= 80% of it.
Bias: B=1, N=16, S=4k, D=128, bias [1, N, S, S] bf16, fwd and fwd+bwd
(dbias included).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxcraft
from attention import CHAIN
from timing import time_step

DTYPE = jnp.bfloat16
HEADS, HEAD_DIM = 16, 128
DOCS, DOC_LEN = 8, 2048
BIAS_SEQLEN = 4096


def _normal(shape, seed):
  return jax.random.normal(jax.random.key(seed), shape, DTYPE)


def _qkv(B, S, seed=0):
  return [_normal((B, S, HEADS, HEAD_DIM), seed + i) for i in range(3)]


def _fwd(fn):
  return lambda q, *rest: fn(q, *rest)


def _fwd_bwd(fn):
  def step(q, k, v, *rest):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, *rest), q, k, v)
    dq, dk, dv = vjp(out)
    return jnp.tanh(dq + dk + dv)
  return step


def _time(rows, case, name, mode, step, args, flops):
  try:
    sec = time_step(step, *args, **CHAIN)
  except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
    print(f"  {case} {name} {mode}: failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
    return
  rows.append(dict(op="variants", case=case, impl=name, mode=mode, us=sec * 1e6,
                   tflops=flops / sec / 1e12))
  print(f"  {case:8s} {name:22s} {mode:8s} {sec * 1e3:8.3f} ms {rows[-1]['tflops']:6.0f} TFLOP/s",
        flush=True)


def _packed(rows):
  S = DOCS * DOC_LEN
  ids = jnp.repeat(jnp.arange(DOCS, dtype=jnp.int32), DOC_LEN)[None]
  pos = jnp.arange(S)
  dense = ((ids[0][:, None] == ids[0][None, :]) & (pos[None, :] <= pos[:, None]))[None, None]
  visible_fwd = 4.0 * DOCS * HEADS * DOC_LEN ** 2 * HEAD_DIM / 2
  cases = {
      "jaxcraft segment ids": (lambda q, k, v: jaxcraft.dot_product_attention(
          q, k, v, is_causal=True, q_segment_ids=ids, kv_segment_ids=ids), 1),
      "jaxcraft dense mask": (lambda q, k, v, m: jaxcraft.dot_product_attention(
          q, k, v, mask=m, is_causal=True), 1),
      "cudnn dense mask": (lambda q, k, v, m: jax.nn.dot_product_attention(
          q, k, v, mask=m, implementation="cudnn"), 1),
      "jaxcraft causal B=8": (lambda q, k, v: jaxcraft.dot_product_attention(q, k, v, is_causal=True),
                              DOCS),
      "cudnn causal B=8": (lambda q, k, v: jax.nn.dot_product_attention(
          q, k, v, is_causal=True, implementation="cudnn"), DOCS),
  }
  for name, (fn, batch) in cases.items():
    q, k, v = _qkv(batch, S // batch)
    extra = (dense,) if "dense" in name else ()
    for mode, make, flops in (("fwd", _fwd, visible_fwd), ("fwd+bwd", _fwd_bwd, 3.5 * visible_fwd)):
      _time(rows, "packed", name, mode, make(fn), (q, k, v, *extra), flops)


def _bias(rows):
  S = BIAS_SEQLEN
  q, k, v = _qkv(1, S, seed=10)
  bias = _normal((1, HEADS, S, S), 20)
  fwd_flops = 4.0 * HEADS * S * S * HEAD_DIM
  impls = {
      "jaxcraft": lambda q, k, v, b: jaxcraft.dot_product_attention(q, k, v, b),
      "cudnn": lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, b, implementation="cudnn"),
  }
  for name, fn in impls.items():
    _time(rows, "bias", name, "fwd", lambda q, k, v, b, fn=fn: fn(q, k, v, b), (q, k, v, bias),
          fwd_flops)

    def fwd_bwd(carry, k, v, fn=fn):
      q, b = carry
      out, vjp = jax.vjp(fn, q, k, v, b)
      dq, dk, dv, db = vjp(out)
      return jnp.tanh(dq + dk + dv), jnp.tanh(db).astype(b.dtype)
    _time(rows, "bias", name, "fwd+bwd", fwd_bwd, ((q, bias), k, v), 3.5 * fwd_flops)


def run(bandwidth: float):
  del bandwidth
  rows = []
  _packed(rows)
  _bias(rows)
  return rows
