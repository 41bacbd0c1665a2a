"""A Llama/Gemma-style decoder-only model in flax.nnx with a KV cache, three ways.

Grouped-query attention with rotary embeddings, pre-norm RMSNorm blocks whose residual add is
fused into the norm, a SwiGLU MLP, an optional sliding window on alternating layers and an
optional soft cap on the attention logits (Gemma 2), a final norm, and a tied or separate
output head. The backend picks the kernels and nothing else, so one parameter tree serves all
three:

  jaxcraft  jaxcraft.dot_product_attention (training, prefill), jaxcraft.decode_attention
            (one token against the cache), jaxcraft.rms_norm(residual=...), jaxcraft.swiglu
  xla       what a user writes in plain JAX: jax.nn.dot_product_attention(implementation="xla")
            for whole sequences; decode steps and soft-capped layers as the same grouped
            einsums written out with a position mask; norms in jnp; jax.nn.silu(a) * b
  cudnn     "xla" with cuDNN's fused attention (jax.nn, implementation="cudnn") wherever jax.nn
            can express the call; GPU only

Training (`forward`, `loss`, `train_step`) and generation (`prefill`, `decode_step`, greedy
`generate_python` and `generate_while`) are pure functions of the module; the `jit_*` helpers
compile them with the large state donated. Jitted functions take the parameters as the pure
dict of `split`: a Python loop dispatches one small decode step at a time, and a jitted call
with 73 parameters took 24 us with a nested dict of arrays against 77 us with an nnx.State
(whose leaves flatten in Python).

`python -m jaxcraft.examples.decoder` generates from a random prompt with each backend the
machine runs and checks that they agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import jaxcraft
from jaxcraft._flax_attention import apply_rope

BACKENDS = ("jaxcraft", "xla", "cudnn")
F32 = jnp.float32
# Masked logits: the most negative float32; finite, so a fully masked row (none here) would give
# a uniform softmax rather than NaN.
_MASKED = float(jnp.finfo(F32).min)


@dataclasses.dataclass(frozen=True)
class Config:
  """The model's shape and numerics.

  Attributes:
    vocab: vocabulary size.
    d_model: width of the residual stream.
    layers: number of decoder blocks.
    heads: query heads N.
    kv_heads: key/value heads K (N % K == 0; K < N is grouped-query attention).
    head_dim: H, even (rotary embeddings rotate pairs).
    mlp_hidden: SwiGLU hidden width F (the input projection has 2F outputs).
    rope_base: rotary embedding base.
    local_window_size: if set, even-numbered layers (0, 2, ...) attend to the W previous
      tokens and their own (jax.nn's local_window_size=(W, 0)); odd layers stay global.
    logit_soft_cap: if set, attention logits become cap * tanh(logits / cap) in every layer.
    tied_embedding: the output head is the transposed token embedding.
    epsilon: RMSNorm epsilon.
    dtype: activations, logits and KV cache.
    param_dtype: parameters as initialized (float32 for training; `cast` for serving).
  """
  vocab: int = 32000
  d_model: int = 2048
  layers: int = 8
  heads: int = 16
  kv_heads: int = 4
  head_dim: int = 128
  mlp_hidden: int = 5632
  rope_base: float = 10000.0
  local_window_size: int | None = None
  logit_soft_cap: float | None = None
  tied_embedding: bool = True
  epsilon: float = 1e-6
  dtype: str = "bfloat16"
  param_dtype: str = "float32"

  def __post_init__(self):
    if self.heads % self.kv_heads:
      raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even (rotary embeddings); got {self.head_dim}")

  def window(self, layer: int) -> int | None:
    """The sliding window of `layer` (None: global attention)."""
    return self.local_window_size if layer % 2 == 0 else None


class Cache(NamedTuple):
  """The KV cache of a batch of sequences.

  Attributes:
    keys: per layer, [B, S_max, K, H] in config.dtype; row j holds the key of position j.
    values: per layer, [B, S_max, K, H], as keys.
    lengths: int32 [B], the positions filled per sequence (the next token's position).
  """
  keys: tuple
  values: tuple
  lengths: jax.Array


def init_cache(config: Config, batch: int, capacity: int) -> Cache:
  """An empty cache (zeros, lengths 0) for `batch` sequences of up to `capacity` tokens."""
  shape = (batch, capacity, config.kv_heads, config.head_dim)
  zeros = lambda: tuple(jnp.zeros(shape, config.dtype) for _ in range(config.layers))
  return Cache(zeros(), zeros(), jnp.zeros((batch,), jnp.int32))


# --------------------------------------------------------------------------- kernels
def _rms_norm(backend, x, scale, epsilon, residual=None):
  """RMSNorm over the last axis, float32 statistics. With `residual`: (norm(x + r), x + r)."""
  if backend == "jaxcraft":
    return jaxcraft.rms_norm(x, scale, epsilon=epsilon, residual=residual)
  h = x if residual is None else x + residual
  hf = h.astype(F32)
  y = (hf * jax.lax.rsqrt(jnp.mean(jnp.square(hf), -1, keepdims=True) + epsilon)
       * scale).astype(x.dtype)
  return y if residual is None else (y, h)


def _swiglu(backend, x):
  if backend == "jaxcraft":
    return jaxcraft.swiglu(x)
  a, b = jnp.split(x, 2, axis=-1)
  return jax.nn.silu(a) * b


def _masked_attention(q, k, v, q_positions, window, soft_cap):
  """Attention as plain JAX writes it: grouped einsums, a position mask, float32 softmax.

  jax.nn.dot_product_attention(implementation="xla") with key_value_seq_lengths lowers a
  decode step to the same two grouped dot_generals over the cache, a select and a float32
  softmax (their HLO matches op for op), but it has no soft cap, and it puts a lone query row
  at position 0, where a window cannot be placed; this one function serves every layer. Keys
  past a query's position are masked, which also hides the cache's unfilled rows. Windowed
  layers read and mask the whole cache, as Gemma's reference JAX implementation does.

  Args:
    q: [B, T, N, H] queries.
    k: [B, S, K, H] keys (N % K == 0); key j sits at position j.
    v: [B, S, K, H] values.
    q_positions: int [B, T] (or broadcastable) position of each query.
    window: int | None, keys older than position - window are masked.
    soft_cap: float | None, logits -> cap * tanh(logits / cap).

  Returns:
    [B, T, N, H] in v's dtype.
  """
  B, T, N, H = q.shape
  S, K = k.shape[1], k.shape[2]
  logits = jnp.einsum("btkgh,bskh->bkgts", q.reshape(B, T, K, N // K, H), k,
                      preferred_element_type=F32) * (1.0 / math.sqrt(H))
  if soft_cap is not None:
    logits = soft_cap * jnp.tanh(logits / soft_cap)
  key_positions = jnp.arange(S)
  q_positions = q_positions[..., None]
  visible = key_positions <= q_positions
  if window is not None:
    visible &= key_positions >= q_positions - window
  logits = jnp.where(visible[:, None, None], logits, _MASKED)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  return jnp.einsum("bkgts,bskh->btkgh", probs, v).reshape(B, T, N, H)


def cudnn_runs(config: Config, layer: int, decode: bool) -> bool:
  """Whether the "cudnn" backend runs cuDNN's attention for `layer` (else the "xla" path).

  jax.nn's cuDNN attention has no soft cap; in a decode step its single query row sits at
  position 0 (top-left causal alignment), so a sliding window cannot be placed either.
  """
  return config.logit_soft_cap is None and not (decode and config.window(layer) is not None)


def _attention(backend, config, layer, q, k, v):
  """Causal self-attention of whole sequences: q [B, T, N, H], k / v [B, T, K, H]."""
  window, soft_cap = config.window(layer), config.logit_soft_cap
  window_size = None if window is None else (window, 0)
  if backend == "jaxcraft":
    return jaxcraft.dot_product_attention(q, k, v, is_causal=True, local_window_size=window_size,
                                          logit_soft_cap=soft_cap)
  if soft_cap is not None:  # beyond jax.nn (see cudnn_runs)
    return _masked_attention(q, k, v, jnp.arange(q.shape[1])[None], window, soft_cap)
  implementation = "cudnn" if backend == "cudnn" else "xla"
  return jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=window_size,
                                      implementation=implementation)


def _cached_attention(backend, config, layer, q, k_cache, v_cache, positions):
  """One new token per sequence against caches that already hold its key and value.

  q [B, 1, N, H]; caches [B, S_max, K, H]; positions int32 [B], the token's position.
  """
  window, soft_cap = config.window(layer), config.logit_soft_cap
  lengths = positions + 1
  if backend == "jaxcraft":
    return jaxcraft.decode_attention(q, k_cache, v_cache, lengths, logit_soft_cap=soft_cap,
                                     local_window_size=window)
  if backend == "cudnn" and cudnn_runs(config, layer, decode=True):
    return jax.nn.dot_product_attention(q, k_cache, v_cache, key_value_seq_lengths=lengths,
                                        implementation="cudnn")
  return _masked_attention(q, k_cache, v_cache, positions[:, None], window, soft_cap)


# --------------------------------------------------------------------------- model
# Flax 0.12 requires nnx.List for a list of submodules; earlier versions take a plain list.
_ModuleList = getattr(nnx, "List", list)


def _normal(rngs, shape, fan_in, dtype):
  return nnx.Param(jax.random.normal(rngs.params(), shape, dtype) / math.sqrt(fan_in))


class Block(nnx.Module):
  """Pre-norm decoder block: h += attention(norm(h)); h += mlp(norm(h)).

  The block takes the previous sublayer's output x and the residual stream before it, and
  returns its MLP output and the stream before that: the add of each residual happens inside
  the next norm (`rms_norm(x, residual=h)` returns norm(x + h) and x + h).
  """

  def __init__(self, config: Config, layer: int, *, rngs: nnx.Rngs):
    d, N, K, H, F = (config.d_model, config.heads, config.kv_heads, config.head_dim,
                     config.mlp_hidden)
    p = jnp.dtype(config.param_dtype)
    self.config, self.layer = config, layer
    self.attention_norm = nnx.Param(jnp.ones((d,), p))
    self.query = _normal(rngs, (d, N, H), d, p)
    self.key = _normal(rngs, (d, K, H), d, p)
    self.value = _normal(rngs, (d, K, H), d, p)
    self.out = _normal(rngs, (N, H, d), N * H, p)
    self.mlp_norm = nnx.Param(jnp.ones((d,), p))
    self.mlp_in = _normal(rngs, (d, 2 * F), d, p)  # [gate | up], the halves swiglu splits
    self.mlp_out = _normal(rngs, (F, d), F, p)

  def __call__(self, x, residual, positions, attend, *, backend):
    """One block.

    Args:
      x: [B, T, d] the previous sublayer's output (the embeddings in the first block).
      residual: [B, T, d] the residual stream before x, or None in the first block.
      positions: int32 [B, T] token positions (rotary embeddings).
      attend: (layer, q [B,T,N,H], k [B,T,K,H], v) -> (out [B,T,N,H], aux).
      backend: one of BACKENDS.

    Returns:
      (mlp output [B, T, d], residual stream before it [B, T, d], aux from `attend`).
    """
    c, dtype = self.config, x.dtype
    w = lambda param: param[...].astype(dtype)
    norm = functools.partial(_rms_norm, backend, epsilon=c.epsilon)
    if residual is None:
      y, h = norm(x, self.attention_norm[...]), x
    else:
      y, h = norm(x, self.attention_norm[...], residual=residual)
    q = apply_rope(jnp.einsum("btd,dnh->btnh", y, w(self.query)), positions, c.rope_base)
    k = apply_rope(jnp.einsum("btd,dkh->btkh", y, w(self.key)), positions, c.rope_base)
    v = jnp.einsum("btd,dkh->btkh", y, w(self.value))
    o, aux = attend(self.layer, q, k, v)
    y, h = norm(jnp.einsum("btnh,nhd->btd", o, w(self.out)), self.mlp_norm[...], residual=h)
    return _swiglu(backend, y @ w(self.mlp_in)) @ w(self.mlp_out), h, aux


class Decoder(nnx.Module):
  """Token embedding, `config.layers` blocks, final RMSNorm, output head (module docstring)."""

  def __init__(self, config: Config, *, rngs: nnx.Rngs):
    p = jnp.dtype(config.param_dtype)
    self.config = config
    # Unit-variance rows / sqrt(d): the tied head's logits start near unit scale.
    self.embed = _normal(rngs, (config.vocab, config.d_model), config.d_model, p)
    self.blocks = _ModuleList([Block(config, i, rngs=rngs) for i in range(config.layers)])
    self.final_norm = nnx.Param(jnp.ones((config.d_model,), p))
    if not config.tied_embedding:
      self.unembed = _normal(rngs, (config.d_model, config.vocab), config.d_model, p)

  def trunk(self, tokens, positions, attend, *, backend):
    """Embeddings through every block and the final norm.

    Args:
      tokens: int32 [B, T].
      positions: int32 [B, T].
      attend: see Block.__call__.
      backend: one of BACKENDS.

    Returns:
      ([B, T, d] final-norm output in config.dtype, tuple of each layer's aux).
    """
    c = self.config
    x = jnp.take(self.embed[...], tokens, axis=0).astype(c.dtype)
    residual, auxes = None, []
    for block in self.blocks:
      x, residual, aux = block(x, residual, positions, attend, backend=backend)
      auxes.append(aux)
    y, _ = _rms_norm(backend, x, self.final_norm[...], c.epsilon, residual=residual)
    return y, tuple(auxes)

  def logits(self, y):
    """[..., d] -> [..., vocab] logits in y's dtype."""
    if self.config.tied_embedding:
      return y @ self.embed[...].astype(y.dtype).T
    return y @ self.unembed[...].astype(y.dtype)


def init(config: Config, rngs: nnx.Rngs) -> Decoder:
  """A freshly initialized model (parameters in config.param_dtype)."""
  return Decoder(config, rngs=rngs)


def split(model: Decoder):
  """(graphdef, params): params is a nested dict of arrays (nnx.to_pure_dict), the form the
  jitted helpers take."""
  graphdef, state = nnx.split(model)
  return graphdef, nnx.to_pure_dict(state)


def merge(graphdef, params) -> Decoder:
  """The model from `split`'s two halves (inside or outside jit)."""
  return nnx.merge(graphdef, params)


def cast(params, dtype):
  """params (a pytree) with every floating-point array in `dtype` (bf16 weights for serving)."""
  convert = lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
  return jax.tree.map(convert, params)


def _check_backend(backend):
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")


# --------------------------------------------------------------------------- training
def forward(model: Decoder, tokens, *, backend: str = "jaxcraft"):
  """Causal logits of whole sequences (training and scoring).

  Args:
    model: the Decoder.
    tokens: int32 [B, T].
    backend: one of BACKENDS.

  Returns:
    [B, T, vocab] logits in config.dtype; position t scores token t + 1.
  """
  _check_backend(backend)
  B, T = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  attend = lambda layer, q, k, v: (_attention(backend, model.config, layer, q, k, v), None)
  y, _ = model.trunk(tokens, positions, attend, backend=backend)
  return model.logits(y)


def loss(model: Decoder, tokens, *, backend: str = "jaxcraft"):
  """Mean next-token cross-entropy (float32 logits).

  Args:
    model: the Decoder.
    tokens: int32 [B, T + 1]; the model reads the first T and predicts the last T.
    backend: one of BACKENDS.

  Returns:
    float32 scalar.
  """
  logits = forward(model, tokens[:, :-1], backend=backend)
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(F32), tokens[:, 1:]).mean()


def train_step(graphdef, params, opt_state, tokens, *, optimizer, backend: str = "jaxcraft"):
  """One optimizer update, gradients through every kernel of the backend.

  Args:
    graphdef: from `split`.
    params: from `split`.
    opt_state: optimizer.init(params).
    tokens: int32 [B, T + 1] (see `loss`).
    optimizer: an optax.GradientTransformation (e.g. optax.adamw).
    backend: one of BACKENDS.

  Returns:
    (new params, new opt_state, float32 loss before the update).
  """
  objective = lambda p: loss(merge(graphdef, p), tokens, backend=backend)
  value, grads = jax.value_and_grad(objective)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, value


def jit_train_step(graphdef, optimizer, backend: str = "jaxcraft"):
  """`train_step` jitted as (params, opt_state, tokens) -> (params, opt_state, loss), with
  params and opt_state donated (updated in place)."""
  step = functools.partial(train_step, graphdef, optimizer=optimizer, backend=backend)
  return jax.jit(step, donate_argnums=(0, 1))


# --------------------------------------------------------------------------- generation
def prefill(model: Decoder, tokens, cache: Cache, *, backend: str = "jaxcraft"):
  """Runs prompts of equal length through the model and fills an empty cache with them.

  Args:
    model: the Decoder.
    tokens: int32 [B, T] prompts; they take positions 0..T-1 (any earlier cache content is
      overwritten and ignored).
    cache: a Cache with batch B and capacity >= T.
    backend: one of BACKENDS.

  Returns:
    (logits [B, vocab] of the last position in config.dtype, the cache with lengths T).
  """
  _check_backend(backend)
  B, T = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  attend = lambda layer, q, k, v: (_attention(backend, model.config, layer, q, k, v), (k, v))
  y, kvs = model.trunk(tokens, positions, attend, backend=backend)
  write = lambda c, x: jax.lax.dynamic_update_slice(c, x.astype(c.dtype), (0, 0, 0, 0))
  keys = tuple(write(c, k) for c, (k, _) in zip(cache.keys, kvs))
  values = tuple(write(c, v) for c, (_, v) in zip(cache.values, kvs))
  return model.logits(y[:, -1]), Cache(keys, values, jnp.full((B,), T, jnp.int32))


def decode_step(model: Decoder, tokens, cache: Cache, *, backend: str = "jaxcraft"):
  """One new token per sequence: writes its key and value at position lengths[b], attends to
  the cache, and advances the lengths.

  Args:
    model: the Decoder.
    tokens: int32 [B], the tokens at positions cache.lengths.
    cache: a Cache with batch B and capacity > max(lengths) (rows past the capacity are
      dropped).
    backend: one of BACKENDS.

  Returns:
    (logits [B, vocab] in config.dtype predicting the following token, the updated cache).
  """
  _check_backend(backend)
  positions = cache.lengths
  rows = jnp.arange(tokens.shape[0])
  write = lambda c, x: c.at[rows, positions].set(x[:, 0].astype(c.dtype))

  def attend(layer, q, k, v):
    k_cache, v_cache = write(cache.keys[layer], k), write(cache.values[layer], v)
    out = _cached_attention(backend, model.config, layer, q, k_cache, v_cache, positions)
    return out, (k_cache, v_cache)

  y, kvs = model.trunk(tokens[:, None], positions[:, None], attend, backend=backend)
  cache = Cache(tuple(k for k, _ in kvs), tuple(v for _, v in kvs), positions + 1)
  return model.logits(y[:, 0]), cache


def jit_prefill(graphdef, backend: str = "jaxcraft"):
  """`prefill` jitted as (params, tokens, cache) -> (logits, cache), the cache donated."""
  def run(params, tokens, cache):
    return prefill(merge(graphdef, params), tokens, cache, backend=backend)
  return jax.jit(run, donate_argnums=(2,))


def _greedy(logits):
  return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def jit_sample_step(graphdef, backend: str = "jaxcraft"):
  """A jitted greedy step (params, tokens [B], cache) -> (next tokens int32 [B], cache): one
  `decode_step` and an argmax, the cache donated (updated in place)."""
  def step(params, tokens, cache):
    logits, cache = decode_step(merge(graphdef, params), tokens, cache, backend=backend)
    return _greedy(logits), cache
  return jax.jit(step, donate_argnums=(2,))


def generate_python(step, params, tokens, cache: Cache, steps: int):
  """Greedy generation by a Python loop over a jitted step (dispatched asynchronously: the
  sampled token stays on the device and feeds the next call).

  Args:
    step: from `jit_sample_step`.
    params: from `split`.
    tokens: int32 [B], the last tokens, not yet in the cache (e.g. the argmax of prefill's
      logits).
    cache: a Cache with room for `steps` more tokens; donated.
    steps: number of tokens to generate.

  Returns:
    (int32 [B, steps] generated tokens, the cache).
  """
  out = []
  for _ in range(steps):
    tokens, cache = step(params, tokens, cache)
    out.append(tokens)
  return jnp.stack(out, axis=1), cache


def generate_while(model: Decoder, tokens, cache: Cache, steps: int, *,
                   backend: str = "jaxcraft"):
  """Greedy generation as one lax.while_loop (call under jit; see `jit_generate_while`).

  Args:
    model: the Decoder.
    tokens: int32 [B], as in `generate_python`.
    cache: a Cache with room for `steps` more tokens.
    steps: number of tokens to generate (static).
    backend: one of BACKENDS.

  Returns:
    (int32 [B, steps] generated tokens, the cache); the same tokens as `generate_python`.
  """
  def body(carry):
    i, tokens, cache, out = carry
    logits, cache = decode_step(model, tokens, cache, backend=backend)
    tokens = _greedy(logits)
    return i + 1, tokens, cache, jax.lax.dynamic_update_slice(out, tokens[:, None], (0, i))

  out = jnp.zeros((tokens.shape[0], steps), jnp.int32)
  carry = (jnp.int32(0), tokens, cache, out)
  _, _, cache, out = jax.lax.while_loop(lambda c: c[0] < steps, body, carry)
  return out, cache


def jit_generate_while(graphdef, steps: int, backend: str = "jaxcraft"):
  """`generate_while` jitted as (params, tokens, cache) -> (tokens [B, steps], cache), the
  cache donated."""
  def run(params, tokens, cache):
    return generate_while(merge(graphdef, params), tokens, cache, steps, backend=backend)
  return jax.jit(run, donate_argnums=(2,))


# --------------------------------------------------------------------------- command line
def main(argv=None) -> dict:
  """Greedy generation from one random prompt with each backend; returns backend -> tokens."""
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--prompt", type=int, default=16, help="prompt length")
  parser.add_argument("--steps", type=int, default=16, help="tokens to generate")
  parser.add_argument("--gemma", action="store_true",
                      help="sliding window (8) on alternating layers and soft cap 50")
  args = parser.parse_args(argv)
  extra = dict(local_window_size=8, logit_soft_cap=50.0) if args.gemma else {}
  config = Config(vocab=256, d_model=128, layers=4, heads=4, kv_heads=2, head_dim=32,
                  mlp_hidden=256, dtype="float32", **extra)
  graphdef, params = split(init(config, nnx.Rngs(0)))
  prompt = jax.random.randint(jax.random.key(1), (2, args.prompt), 0, config.vocab)
  backends = [b for b in BACKENDS if b != "cudnn" or jax.default_backend() == "gpu"]
  generated = {}
  for backend in backends:
    cache = init_cache(config, prompt.shape[0], args.prompt + args.steps)
    logits, cache = jit_prefill(graphdef, backend)(params, prompt, cache)
    out, _ = generate_python(jit_sample_step(graphdef, backend), params, _greedy(logits),
                             cache, args.steps)
    generated[backend] = out
    print(f"{backend:9s} {out.tolist()}")
  same = all((out == generated["xla"]).all() for out in generated.values())
  print("backends agree" if same else "backends differ")
  return generated


if __name__ == "__main__":
  main()
