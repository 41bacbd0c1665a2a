"""Small calls of every CUDA kernel path, for compute-sanitizer
(`bench/gpu_check.sh` runs it under memcheck, racecheck and synccheck)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxcraft


def norm_cases():
  key = jax.random.key(0)
  # Register path (aligned rows; from 4096 bf16 columns the backward's row
  # ring, wrapping around as a block walks its rows; clusters at 65536 bf16
  # and 16384 f32), scalar path (C % 8 != 0).
  for shape, dtype in [((7, 1024), jnp.bfloat16), ((9, 4096), jnp.bfloat16),
                       ((3, 65536), jnp.bfloat16), ((6, 16384), jnp.float32),
                       ((5, 257), jnp.float32), ((33, 96), jnp.float16)]:
    x = jax.random.normal(key, shape, dtype)
    s = jnp.linspace(0.5, 1.5, shape[-1])
    for fn in (lambda x, r: jaxcraft.layer_norm(x, s, s, residual=r, implementation="cuda")[0],
               lambda x, r: jaxcraft.rms_norm(x, s, residual=r, implementation="cuda")[0]):
      out, vjp = jax.vjp(fn, x, x)
      jax.block_until_ready(vjp(out))


def attention_cases():
  keys = jax.random.split(jax.random.key(1), 3)
  # Partial tiles (T, S not multiples of the tiles), GQA, a padded head dim,
  # lengths with an empty row, a window; both backward paths.
  for (B, T, S, N, K, H), kw in [
      ((2, 77, 130, 4, 2, 64), dict(is_causal=True)),
      ((1, 33, 65, 2, 1, 80), dict(local_window_size=(9, 3))),
      ((2, 40, 50, 2, 2, 128), dict(query_seq_lengths=jnp.array([40, 0], jnp.int32),
                                     key_value_seq_lengths=jnp.array([17, 50], jnp.int32))),
      ((1, 16, 16, 2, 2, 256), dict(is_causal=True, causal_alignment="bottom_right"))]:
    q = jax.random.normal(keys[0], (B, T, N, H), jnp.bfloat16)
    k = jax.random.normal(keys[1], (B, S, K, H), jnp.bfloat16)
    v = jax.random.normal(keys[2], (B, S, K, H), jnp.bfloat16)
    for deterministic in (False, True):
      fn = lambda q, k, v: jaxcraft.dot_product_attention(
          q, k, v, implementation="cuda", deterministic=deterministic, **kw)
      out, vjp = jax.vjp(fn, q, k, v)
      jax.block_until_ready(vjp(out))


def variant_cases():
  """Attention variants (portable and Hopper paths): soft cap + packed
  segment ids + causal (bf16, head dims 64 / 128), a broadcast f32 bias +
  bool mask + GQA, dropout; both backward paths."""
  rng = np.random.default_rng(3)
  normal = lambda shape, dtype=jnp.bfloat16: jnp.asarray(rng.standard_normal(shape), dtype)
  ids = lambda B, L: jnp.asarray(np.sort(rng.integers(0, 3, (B, L)), axis=1), jnp.int32)
  seg = ids(2, 150)
  for (B, T, S, N, K, H), kw in [
      ((2, 150, 150, 4, 2, 64), dict(is_causal=True, logit_soft_cap=5.0, q_segment_ids=seg,
                                     kv_segment_ids=seg)),
      ((1, 130, 200, 4, 4, 128), dict(q_segment_ids=ids(1, 130), kv_segment_ids=ids(1, 200))),
      ((2, 67, 90, 8, 2, 128), dict(bias=normal((1, 8, 67, 90), jnp.float32),
                                    mask=jnp.asarray(rng.random((2, 1, 67, 90)) < 0.8))),
      ((2, 45, 70, 4, 2, 64), dict(dropout_rate=0.3, dropout_rng=jax.random.key(4)))]:
    q, k, v = normal((B, T, N, H)), normal((B, S, K, H)), normal((B, S, K, H))
    bias = kw.pop("bias", None)
    for deterministic in (False, True):
      fn = lambda q, k, v, b: jaxcraft.dot_product_attention(
          q, k, v, b, implementation="cuda", deterministic=deterministic, **kw)
      out, vjp = jax.vjp(fn, q, k, v, bias)
      jax.block_until_ready(vjp(out))


def decode_cases():
  rng = np.random.default_rng(2)
  # Every kernel: tensor cores (bf16 / f16, head-dim buckets 64 / 128 / 256,
  # a padded head dim), CUDA cores (float32); one split and several (with the
  # combine); contiguous and paged caches (page sizes 8, 24, 64), a bad page
  # entry, empty and clamped lengths, a window, a multi-chunk query group.
  normal = lambda shape, dtype: jnp.asarray(rng.standard_normal(shape).astype(dtype))
  for (B, Tq, S, N, K, H), dtype, page_size, kw in [
      ((3, 1, 70, 8, 2, 128), jnp.bfloat16, 0, {}),
      ((2, 3, 2000, 8, 1, 64), jnp.float16, 8, {"local_window_size": 300}),
      ((2, 4, 1536, 16, 2, 256), jnp.bfloat16, 64, {"logit_soft_cap": 5.0}),
      ((2, 2, 600, 4, 4, 80), jnp.bfloat16, 24, {}),
      ((2, 2, 900, 8, 2, 128), jnp.float32, 0, {}),
      ((2, 1, 264, 4, 1, 64), jnp.float32, 8, {})]:
    q = normal((B, Tq, N, H), dtype)
    lengths = jnp.array([S + 5, 0][:B - 1] + [S // 3], jnp.int32)
    if page_size:
      pages = B * S // page_size + 2
      k, v = normal((pages, page_size, K, H), dtype), normal((pages, page_size, K, H), dtype)
      tables = rng.permutation(pages)[:B * (S // page_size)].reshape(B, -1).astype(np.int32)
      tables[0, 1] = pages + 7  # out of range: masked, never read
      kw = {**kw, "block_tables": jnp.asarray(tables)}
    else:
      k, v = normal((B, S, K, H), dtype), normal((B, S, K, H), dtype)
    jax.block_until_ready(
        jaxcraft.decode_attention(q, k, v, lengths, implementation="cuda", **kw))


def activations_cases():
  """Every activation kernel: vector paths (rows of whole 16-byte vectors; one
  vector per row, 256 rows per block), the scalar path (odd widths), bias
  sums folded over thread rows and spread over several partials, fwd + bwd."""
  rng = np.random.default_rng(5)
  for shape, dtype in [((70, 4096), jnp.bfloat16), ((300, 24), jnp.float32),
                       ((33, 257), jnp.bfloat16), ((17, 96), jnp.float16)]:
    x = jnp.asarray(rng.standard_normal(shape), dtype)
    b = jnp.asarray(rng.standard_normal(shape[-1]), jnp.float32)
    fns = [lambda x, b: jaxcraft.gelu(x, implementation="cuda"),
           lambda x, b: jaxcraft.gelu(x, False, implementation="cuda"),
           lambda x, b: jaxcraft.bias_gelu(x, b, implementation="cuda"),
           lambda x, b: jaxcraft.bias_gelu(x, b, False, implementation="cuda")]
    if shape[-1] % 2 == 0:
      fns += [lambda x, b: jaxcraft.swiglu(x, implementation="cuda"),
              lambda x, b: jaxcraft.geglu(x, implementation="cuda"),
              lambda x, b: jaxcraft.geglu(x, False, implementation="cuda")]
    for fn in fns:
      out, vjp = jax.vjp(fn, x, b)
      jax.block_until_ready(vjp(out))


def embedding_cases():
  # Every kernel: the forward with 16-byte and scalar packs (D % 8 != 0) and
  # fill rows; the fast backward (float32 atomics into dtable; bf16 / f16
  # through the claimed scratch rows), the deterministic one (sorted runs),
  # each mode; a hot row (long runs, contended atomics).
  rng = np.random.default_rng(4)
  for (V, D, N), dtype, mode in [((37, 64, 300), jnp.bfloat16, None), ((37, 13, 300), jnp.float32, "clip"),
                                 ((50, 1000, 120), jnp.float16, "wrap"), ((1000, 96, 500), jnp.float32, None)]:
    table = jnp.asarray(rng.standard_normal((V, D)), dtype)
    ids = rng.integers(-V - 5, V + 5, N)
    ids[: N // 2] = 7  # a hot row
    ids = jnp.asarray(ids, jnp.int32)
    for deterministic in (False, True):
      fn = lambda t: jaxcraft.embedding_lookup(t, ids, mode=mode, deterministic=deterministic,
                                               implementation="cuda")
      out, vjp = jax.vjp(fn, table)
      jax.block_until_ready(vjp(jnp.nan_to_num(out)))



def softmax_cases():
  """Every softmax kernel path: rows kernels with a warp and a block per row
  (fwd: per-row mask, shared mask; a fully masked row), the stream kernel
  with vector body (an odd width; past the register limit) and without (a
  misaligned slice), fwd + bwd."""
  rng = np.random.default_rng(6)
  for shape, dtype in [((70, 96), jnp.bfloat16), ((5, 4096), jnp.float32), ((3, 257), jnp.bfloat16),
                       ((2, 40000), jnp.float16), ((2, 131072), jnp.bfloat16)]:
    x = jnp.asarray(3 * rng.standard_normal(shape), dtype)
    where = jnp.asarray(rng.random(shape) < 0.7).at[0].set(False)
    for w in (None, where, where[1]):
      fn = lambda x: jaxcraft.softmax(x, where=w, implementation="cuda")
      out, vjp = jax.vjp(fn, x)
      jax.block_until_ready(vjp(out))
  x = jnp.asarray(rng.standard_normal((9, 65)), jnp.bfloat16)
  fn = jax.jit(lambda x: jaxcraft.softmax(x[:, 1:], implementation="cuda"))  # unaligned rows
  jax.block_until_ready(jax.grad(lambda x: jnp.sum(fn(x).astype(jnp.float32) ** 2))(x))

CASES = {"norm": norm_cases, "attention": attention_cases, "variants": variant_cases,
         "decode": decode_cases}
CASES.update(activations=activations_cases, embedding=embedding_cases, softmax=softmax_cases)

if __name__ == "__main__":
  for name in sys.argv[1].split(","):
    CASES[name]()
  print("sanitizer cases ran")
