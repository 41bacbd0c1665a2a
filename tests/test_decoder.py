"""The decoder example (jaxcraft/examples/decoder.py): its backends compute the same model from
one parameter tree, and generation with the KV cache reproduces the full-sequence forward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")

import optax  # noqa: E402
from flax import nnx  # noqa: E402

from jaxcraft.examples import decoder  # noqa: E402

SEQ = 16
TINY = dict(vocab=64, d_model=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp_hidden=96,
            dtype="float32")
# The window (4) is shorter than the sequence, and the cap (2.0) is below the logits' spread,
# so both change the result (test_variants_change_the_model). The tied configs share one
# parameter tree (same shapes, same seed).
CONFIGS = {
    "global": decoder.Config(**TINY),
    "window": decoder.Config(**TINY, local_window_size=4),
    "softcap": decoder.Config(**TINY, logit_soft_cap=2.0),
    "gemma": decoder.Config(**TINY, local_window_size=4, logit_soft_cap=2.0,
                            tied_embedding=False),
}
# Float32 throughout: the backends differ only in summation order and in exp/tanh/rsqrt
# implementations, a few float32 ulps per op; through two layers that stays far below 1e-4 of
# the logits' range, while a wrong mask, position or scale moves logits by O(1).
RTOL = 1e-4


@pytest.fixture(autouse=True)
def _float32_matmuls():
  """Full float32 matmuls: on a GPU JAX's default precision rounds float32
  operands to TF32 (about 1e-3), which the backends would meet differently."""
  with jax.default_matmul_precision("highest"):
    yield


@functools.lru_cache(maxsize=None)
def _model(name):
  """(graphdef, params) of CONFIGS[name], seed 0 (configs of one shape share parameters)."""
  return decoder.split(decoder.init(CONFIGS[name], nnx.Rngs(0)))


def _tokens(batch=2, length=SEQ, seed=1):
  return jax.random.randint(jax.random.key(seed), (batch, length), 0, TINY["vocab"])


@functools.lru_cache(maxsize=None)
def _forward(name, backend):
  graphdef, _ = _model(name)
  return jax.jit(lambda p, t: decoder.forward(decoder.merge(graphdef, p), t, backend=backend))


def _close(actual, expected):
  expected = np.asarray(expected)
  scale = np.abs(expected).max()
  np.testing.assert_allclose(np.asarray(actual), expected, rtol=0, atol=RTOL * scale)


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_backends_agree(name):
  _, params = _model(name)
  tokens = _tokens()
  _close(_forward(name, "jaxcraft")(params, tokens), _forward(name, "xla")(params, tokens))


def test_variants_change_the_model():
  """One parameter tree, three masks: the cap moves every logit; the window (on layer 0) moves
  only positions past it."""
  _, params = _model("global")
  tokens = _tokens()
  run = lambda name: np.asarray(_forward(name, "xla")(params, tokens))
  base, capped, windowed = run("global"), run("softcap"), run("window")
  assert np.abs(capped - base).max() > 1e-2
  seen = CONFIGS["window"].local_window_size + 1  # positions 0..window see every key
  _close(windowed[:, :seen], base[:, :seen])
  assert np.abs(windowed[:, seen:] - base[:, seen:]).max() > 1e-2


@pytest.mark.parametrize("backend", ["jaxcraft", "xla"])
@pytest.mark.parametrize("name", ["global", "gemma"])
def test_decode_reproduces_forward(name, backend):
  """Prefill, then one token per step at per-sequence positions (sequence 1 rewinds 3
  positions, so its cache holds stale rows past its length): each step's logits are the
  full-sequence forward's at that position."""
  graphdef, params = _model(name)
  tokens = _tokens()
  expected = np.asarray(_forward(name, "xla")(params, tokens))
  prompt = 8
  cache = decoder.init_cache(CONFIGS[name], tokens.shape[0], SEQ)
  logits, cache = decoder.jit_prefill(graphdef, backend)(params, tokens[:, :prompt], cache)
  _close(logits, expected[:, prompt - 1])
  lengths = np.array([prompt, prompt - 3], np.int32)
  cache = cache._replace(lengths=jnp.asarray(lengths))
  step = jax.jit(lambda p, t, c: decoder.decode_step(decoder.merge(graphdef, p), t, c,
                                                     backend=backend), donate_argnums=(2,))
  rows = np.arange(tokens.shape[0])
  while lengths.max() < SEQ:
    logits, cache = step(params, tokens[rows, lengths], cache)
    _close(logits, expected[rows, lengths])
    lengths = lengths + 1
    np.testing.assert_array_equal(np.asarray(cache.lengths), lengths)


def test_generate_python_and_while_agree():
  name = "gemma"
  graphdef, params = _model(name)
  prompt, steps = _tokens(length=6), 8
  generated = {}
  for backend in ("jaxcraft", "xla"):
    cache = decoder.init_cache(CONFIGS[name], prompt.shape[0], prompt.shape[1] + steps)
    logits, cache = decoder.jit_prefill(graphdef, backend)(params, prompt, cache)
    first = jnp.argmax(logits, -1).astype(jnp.int32)
    by_python, cache = decoder.generate_python(decoder.jit_sample_step(graphdef, backend),
                                               params, first, cache, steps)
    np.testing.assert_array_equal(np.asarray(cache.lengths), prompt.shape[1] + steps)
    cache = cache._replace(lengths=jnp.full((prompt.shape[0],), prompt.shape[1], jnp.int32))
    by_while, cache = decoder.jit_generate_while(graphdef, steps, backend)(params, first, cache)
    assert by_python.shape == (prompt.shape[0], steps)
    np.testing.assert_array_equal(np.asarray(by_python), np.asarray(by_while))
    generated[backend] = np.asarray(by_python)
  np.testing.assert_array_equal(generated["jaxcraft"], generated["xla"])


@pytest.mark.parametrize("name", ["global", "gemma"])
def test_train_step(name):
  """One jitted train step per backend, from the same parameters. Plain SGD with rate 1 makes
  the update the gradient itself: params - new params."""
  graphdef, params = _model(name)
  tokens = _tokens(length=SEQ + 1)
  optimizer = optax.sgd(1.0)
  grads, losses = {}, {}
  for backend in ("jaxcraft", "xla"):
    step = decoder.jit_train_step(graphdef, optimizer, backend)
    new, _, losses[backend] = step(jax.tree.map(jnp.copy, params), optimizer.init(params),
                                   tokens)
    grads[backend] = jax.tree.map(jnp.subtract, params, new)
  assert np.isfinite(losses["jaxcraft"])
  np.testing.assert_allclose(losses["jaxcraft"], losses["xla"], rtol=RTOL)
  for g in jax.tree.leaves(grads["jaxcraft"]):
    assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).max() > 0
  jax.tree.map(_close, grads["jaxcraft"], grads["xla"])


def test_bad_backend():
  graphdef, params = _model("global")
  with pytest.raises(ValueError, match="backend must be one of"):
    decoder.forward(decoder.merge(graphdef, params), _tokens(), backend="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs a GPU")
@pytest.mark.parametrize("name", ["global", "window"])
def test_cudnn_backend(name):
  """cuDNN's attention (bf16, its dtypes) against the xla backend, forward and decode."""
  config = decoder.Config(**{**TINY, "dtype": "bfloat16", "head_dim": 64},
                          local_window_size=CONFIGS[name].local_window_size,
                          tied_embedding=CONFIGS[name].tied_embedding)
  graphdef, params = decoder.split(decoder.init(config, nnx.Rngs(0)))
  params = decoder.cast(params, jnp.bfloat16)
  tokens = _tokens(length=64)
  run = lambda backend: jax.jit(lambda p, t: decoder.forward(
      decoder.merge(graphdef, p), t, backend=backend))(params, tokens).astype(jnp.float32)
  expected = run("xla")
  np.testing.assert_allclose(run("cudnn"), expected, atol=0.05 * np.abs(expected).max())
  cache = decoder.init_cache(config, tokens.shape[0], 80)
  _, cache = decoder.jit_prefill(graphdef, "cudnn")(params, tokens[:, :32], cache)
  logits, _ = decoder.decode_step(decoder.merge(graphdef, params), tokens[:, 32], cache,
                                  backend="cudnn")
  np.testing.assert_allclose(logits.astype(jnp.float32), expected[:, 32],
                             atol=0.05 * np.abs(expected).max())
