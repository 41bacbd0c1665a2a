"""Complex inputs, which jax.nn and Flax take and no kernel does: the ops with
a jax.nn counterpart (attention, softmax, gelu) run jax.nn's computation, and
the Flax norm modules run Flax's own; jaxcraft's extensions and forced
kernels raise errors that name them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen, nnx

import jaxcraft
import jaxcraft.nn
import jaxcraft.nnx

# jax.nn's attention and gelu cast complex values to float32 on the way (its
# softmax takes the logits' real part) and warn that this will become an error.
pytestmark = pytest.mark.filterwarnings("ignore:Casting from complex:DeprecationWarning")


def _complex(seed, shape):
  return jax.lax.complex(*jax.random.normal(jax.random.key(seed), (2, *shape)))


def _equal(got, want):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert g.dtype == w.dtype
    np.testing.assert_array_equal(g, w)


def test_attention():
  q, kv = _complex(0, (2, 7, 4, 8)), _complex(1, (2, 7, 4, 8))
  mask = jnp.arange(7)[None, :] <= jnp.arange(7)[:, None]
  lengths = jnp.array([7, 4], jnp.int32)
  for kw in (dict(), dict(is_causal=True, return_residual=True), dict(mask=mask),
             dict(key_value_seq_lengths=lengths, local_window_size=2)):
    _equal(jaxcraft.dot_product_attention(q, kv, kv, **kw), jax.nn.dot_product_attention(q, kv, kv, **kw))
  with pytest.raises(TypeError, match="logit_soft_cap is not supported with complex inputs"):
    jaxcraft.dot_product_attention(q, kv, kv, logit_soft_cap=30.0)
  with pytest.raises(ValueError, match="implementation='cpu': query is complex"):
    jaxcraft.dot_product_attention(q, kv, kv, implementation="cpu")


def test_softmax_and_gelu():
  x = _complex(2, (4, 16))
  where = jnp.arange(16) % 3 != 0
  _equal(jaxcraft.softmax(x), jax.nn.softmax(x))
  _equal(jaxcraft.softmax(x, axis=0, where=where), jax.nn.softmax(x, axis=0, where=where))
  _equal(jaxcraft.gelu(x), jax.nn.gelu(x))
  for gelu in (jaxcraft.gelu, jax.nn.gelu):  # the erf form takes no complex values in jax.nn either
    with pytest.raises(TypeError, match="erfc does not accept dtype complex64"):
      gelu(x, approximate=False)
  with pytest.raises(ValueError, match="implementation='cpu': x is complex"):
    jaxcraft.softmax(x, implementation="cpu")
  with pytest.raises(ValueError, match="implementation='cpu': x is complex"):
    jaxcraft.gelu(x, implementation="cpu")


def test_flax_norm_modules():
  x = _complex(3, (3, 16))
  for ours, theirs in ((jaxcraft.nn.LayerNorm(), linen.LayerNorm()), (jaxcraft.nn.RMSNorm(), linen.RMSNorm())):
    params = theirs.init(jax.random.key(0), x)
    _equal(ours.apply(params, x), theirs.apply(params, x))
  for ours, theirs in ((jaxcraft.nnx.LayerNorm(16, rngs=nnx.Rngs(0)), nnx.LayerNorm(16, rngs=nnx.Rngs(0))),
                       (jaxcraft.nnx.RMSNorm(16, rngs=nnx.Rngs(0)), nnx.RMSNorm(16, rngs=nnx.Rngs(0)))):
    _equal(ours(x), theirs(x))
    with pytest.raises(ValueError, match="residual= needs the kernel's configuration: real x"):
      ours(x, residual=x)
