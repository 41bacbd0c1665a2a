"""Decode attention: GB/s of K + V read, jaxcraft (contiguous and paged caches)
vs cuDNN vs XLA vs Pallas' GPU decode kernel, against the copy ceiling.

One new token (Tq = 1), 32 query / 8 KV heads, head dim 128, bf16, every
sequence at its full length; rows B x S in 1 x 128k, 8 x 32k, 64 x 4k,
256 x 1k. The paged caches have 64-row pages and 16-row pages
(vLLM's default), each in a shuffled block table. The
minimum traffic is K and V read once: 2 B S K D bytes (q and the output are
B N D each, < 0.01% here). JAXCRAFT_BENCH_SMOKE=1: tiny shapes (CPU plumbing
check; the numbers mean nothing).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
from timing import GRAPH_STEPS, ChainTimer, time_interleaved

import jaxcraft

DTYPE = jnp.bfloat16
# Chain lengths (timing.ChainTimer): both chains long enough for XLA to run
# cuDNN's calls as a CUDA graph; the long one grows to a >= 10 ms span
# (1 x 128k: about 85 steps).
CHAIN = dict(short=GRAPH_STEPS, long=2 * GRAPH_STEPS, reps=5, max_long=GRAPH_STEPS + 96)


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
  batch: int
  seqlen: int
  heads: int = 32
  kv_heads: int = 8
  head_dim: int = 128
  tokens: int = 1
  page_sizes: tuple = (64, 16)

  @property
  def name(self) -> str:
    s = f"{self.seqlen // 1024}k" if self.seqlen >= 1024 else str(self.seqlen)
    heads = "" if (self.heads, self.kv_heads, self.head_dim) == (32, 8, 128) else \
        f" {self.heads}/{self.kv_heads}x{self.head_dim}"
    return f"{self.batch} x {s}{heads}"

  def kv_bytes(self, itemsize: int) -> int:
    """K and V read once: 2 B S K D elements."""
    return 2 * self.batch * self.seqlen * self.kv_heads * self.head_dim * itemsize


DECODE_SPECS = [DecodeSpec(1, 131072), DecodeSpec(8, 32768), DecodeSpec(64, 4096),
                DecodeSpec(256, 1024)]
# Small versions of the same layout (tests/test_decode_attention.py runs the
# kernels on shapes like these).
DECODE_SMOKE_SPECS = [DecodeSpec(1, 2048, page_sizes=(16,)), DecodeSpec(4, 512)]


def specs_named(names: str):
  """The benchmark rows named in a comma-separated list ("1 x 128k,8 x 32k"); all when empty."""
  wanted = [n for n in names.split(",") if n]
  return [s for s in DECODE_SPECS if not wanted or s.name in wanted]


def specs_from_env():
  """Rows from JAXCRAFT_BENCH_DECODE_SHAPES, "B:S:N:K:D,..." (batch, cache
  length, query heads, KV heads, head dim), contiguous caches only: the
  short caches and small batches of token-by-token generation."""
  rows = [r for r in os.environ.get("JAXCRAFT_BENCH_DECODE_SHAPES", "").split(",") if r]
  return [DecodeSpec(*map(int, r.split(":")), page_sizes=()) for r in rows]


def _inputs(spec):
  """q, and the constants per cache: "dense" (k, v, lengths) and, per page
  size, "paged<size>" (k_pages, v_pages, lengths, tables)."""
  keys = jax.random.split(jax.random.key(0), 3 + 2 * len(spec.page_sizes))
  B, S, K, D = spec.batch, spec.seqlen, spec.kv_heads, spec.head_dim
  q = jax.random.normal(keys[0], (B, spec.tokens, spec.heads, D), DTYPE)
  k = jax.random.normal(keys[1], (B, S, K, D), DTYPE)
  v = jax.random.normal(keys[2], (B, S, K, D), DTYPE)
  lengths = jnp.full((B,), S, jnp.int32)
  caches = {"dense": (k, v, lengths)}
  for i, size in enumerate(spec.page_sizes):
    pages = B * S // size
    k_pages = jax.random.normal(keys[3 + 2 * i], (pages, size, K, D), DTYPE)
    v_pages = jax.random.normal(keys[4 + 2 * i], (pages, size, K, D), DTYPE)
    tables = jnp.asarray(np.random.default_rng(i).permutation(pages).reshape(B, -1), jnp.int32)
    caches[f"paged{size}"] = (k_pages, v_pages, lengths, tables)
  return q, caches


def _impls(spec):
  """name -> (step(q, *consts) -> q', which cache's consts, is a custom call)."""
  paged = lambda q, k, v, n, t: jaxcraft.decode_attention(q, k, v, n, block_tables=t)
  impls = {"jaxcraft": (lambda q, k, v, n: jaxcraft.decode_attention(q, k, v, n), "dense", True)}
  for size in spec.page_sizes:  # 64-row pages keep the plain name "jaxcraft-paged"
    impls["jaxcraft-paged" if size == 64 else f"jaxcraft-paged{size}"] = (paged, f"paged{size}", True)
  impls.update({
      "cudnn": (lambda q, k, v, n: jax.nn.dot_product_attention(
          q, k, v, key_value_seq_lengths=n, implementation="cudnn"), "dense", True),
      "xla": (lambda q, k, v, n: jax.nn.dot_product_attention(
          q, k, v, key_value_seq_lengths=n, implementation="xla"), "dense", False),
  })
  try:  # Pallas' split-K decode kernel (Triton): q [B, N, D], kv_seq_len [B]
    from jax.experimental.pallas.ops.gpu import decode_attention as pallas_decode
    # gqa returns float32 for bf16 inputs (its final division adds a float32
    # eps); fed back unconverted, the next call's Q K^T fails in the Triton
    # lowering ("a and b must have the same element type"). The cast is a
    # B x N x D convert, as for any layer that keeps the activations' dtype.
    impls["pallas"] = (lambda q, k, v, n: pallas_decode.gqa(
        q[:, 0], k, v, kv_seq_len=n)[:, None].astype(q.dtype), "dense", True)
  except ImportError:
    pass
  return impls


def run(bandwidth: float, specs=None):
  smoke = bool(os.environ.get("JAXCRAFT_BENCH_SMOKE"))
  specs = specs or specs_from_env() or (DECODE_SMOKE_SPECS if smoke else DECODE_SPECS)
  rows = []
  for spec in specs:
    q, caches = _inputs(spec)
    nbytes = spec.kv_bytes(jnp.dtype(DTYPE).itemsize)
    timers = {}
    for name, (fn, which, custom_call) in _impls(spec).items():
      if smoke and name in ("cudnn", "pallas"):
        continue
      consts = caches[which]
      try:
        timers[name] = ChainTimer(fn, q, *consts, custom_call=custom_call, **CHAIN)
      except Exception as e:  # noqa: BLE001 - an unsupported peer is reported, not fatal
        print(f"  {spec.name:10s} {name:15s} unsupported: {type(e).__name__}: {str(e)[:120]}",
              flush=True)
    for name, sec in time_interleaved(timers).items():
      rows.append({"op": "decode", "shape": spec.name, "batch": spec.batch, "seqlen": spec.seqlen,
                   "impl": name, "mode": "fwd", "us": sec * 1e6, "gbps": nbytes / sec / 1e9,
                   "pct_copy": 100 * nbytes / sec / bandwidth})
      print(f"  {spec.name:10s} {name:15s} {sec * 1e6:9.1f} us {rows[-1]['gbps']:7.0f} GB/s "
            f"({rows[-1]['pct_copy']:.0f}% of copy)", flush=True)
  return rows
