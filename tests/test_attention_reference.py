"""The pure-JAX attention reference against jax.nn.dot_product_attention (XLA)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcraft.ops.attention_reference import attention_backward_reference, attention_reference

B, T, S, N, H = 2, 16, 16, 4, 32


def _inputs(dtype, t=T, s=S, n=N, k=N, h=H, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(keys[0], (B, t, n, h), jnp.float32).astype(dtype)
    kk = jax.random.normal(keys[1], (B, s, k, h), jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (B, s, k, h), jnp.float32).astype(dtype)
    return q, kk, v


def _reference(q, k, v, bias=None, mask=None, *, is_causal=False, causal_offset=0,
               query_seq_lengths=None, key_value_seq_lengths=None, window=None, **extra):
    return attention_reference(
        q, k, v, bias, mask, scale=q.shape[-1] ** -0.5, is_causal=is_causal,
        causal_offset=causal_offset, query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths, window=window, **extra)


def _jax_nn(q, k, v, bias=None, mask=None, *, is_causal=False, query_seq_lengths=None,
            key_value_seq_lengths=None, window=None, return_residual=False):
    return jax.nn.dot_product_attention(
        q, k, v, bias, mask, scale=q.shape[-1] ** -0.5, is_causal=is_causal,
        query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
        local_window_size=window, implementation="xla", return_residual=return_residual)


def _random_mask(t, s, seed=1):
    """Bool [B, N, T, S] mask where every row keeps at least key 0."""
    mask = jax.random.bernoulli(jax.random.PRNGKey(seed), 0.6, (B, N, t, s))
    return mask.at[..., 0].set(True)


# name -> (shape overrides, keyword arguments shared by both implementations)
CASES = {
    "plain": ({}, {}),
    "gqa_8_2": (dict(n=8, k=2), {}),
    "gqa_8_1": (dict(n=8, k=1), {}),
    "causal": ({}, dict(is_causal=True)),
    "causal_t_lt_s": (dict(t=12, s=20), dict(is_causal=True)),
    "causal_t_gt_s": (dict(t=20, s=12), dict(is_causal=True)),
    "window_int": ({}, dict(window=3)),
    "window_tuple": (dict(t=12, s=20), dict(window=(4, 1))),
    "causal_window_gqa": (dict(n=8, k=2), dict(is_causal=True, window=(5, 0))),
    "lengths": ({}, dict(query_seq_lengths=jnp.array([T, 5], jnp.int32),
                         key_value_seq_lengths=jnp.array([S, 7], jnp.int32))),
    "bias": ({}, dict(bias="full")),
    "bias_broadcast": ({}, dict(bias="broadcast")),
    "mask": ({}, dict(mask=True)),
    "everything": (dict(n=8, k=2, t=12, s=20),
                   dict(is_causal=True, window=(6, 2), bias="full", mask=True,
                        query_seq_lengths=jnp.array([12, 9], jnp.int32),
                        key_value_seq_lengths=jnp.array([20, 15], jnp.int32))),
}


def _case(name, dtype):
    shape, kwargs = CASES[name]
    q, k, v = _inputs(dtype, **shape)
    t, s, n = q.shape[1], k.shape[1], q.shape[2]
    kwargs = dict(kwargs)
    if kwargs.get("bias") == "full":
        kwargs["bias"] = jax.random.normal(jax.random.PRNGKey(7), (B, n, t, s), jnp.float32)
    elif kwargs.get("bias") == "broadcast":
        kwargs["bias"] = jax.random.normal(jax.random.PRNGKey(7), (1, 1, t, s), jnp.float32)
    if kwargs.get("mask"):
        kwargs["mask"] = jnp.broadcast_to(_random_mask(t, s)[:, :1], (B, n, t, s))
    return q, k, v, kwargs


def _valid_rows(q, kwargs):
    """[B, T] bool: rows that jax.nn computes meaningfully (below q length)."""
    lengths = kwargs.get("query_seq_lengths")
    if lengths is None:
        return np.ones(q.shape[:2], bool)
    return np.arange(q.shape[1])[None, :] < np.asarray(lengths)[:, None]


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax_nn_f32(name):
    q, k, v, kwargs = _case(name, jnp.float32)
    # Both sides at full f32: a GPU's autotuner may otherwise give either one TF32 kernels.
    with jax.default_matmul_precision("highest"):
        out, lse = _reference(q, k, v, **kwargs)
        expected, expected_lse = _jax_nn(q, k, v, **kwargs, return_residual=True)
    rows = _valid_rows(q, kwargs)
    assert out.dtype == jnp.float32 and out.shape == q.shape
    assert lse.dtype == jnp.float32 and lse.shape == (B, q.shape[2], q.shape[1])
    np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(expected)[rows],
                               rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(np.asarray(lse).transpose(0, 2, 1)[rows],
                               np.asarray(expected_lse)[rows], rtol=2e-6, atol=2e-6)
    # jax.nn zeroes rows past the query length too.
    np.testing.assert_array_equal(np.asarray(out)[~rows], 0)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax_nn_half(name, dtype):
    q, k, v, kwargs = _case(name, dtype)
    out, _ = _reference(q, k, v, **kwargs)
    expected = _jax_nn(q, k, v, **kwargs)
    assert out.dtype == dtype
    rows = _valid_rows(q, kwargs)
    out = np.asarray(out.astype(jnp.float32))[rows]
    expected = np.asarray(expected.astype(jnp.float32))[rows]
    eps = float(jnp.finfo(dtype).eps)
    # Both round the probabilities and the output to `dtype`; summation
    # orders may differ, so allow a couple of units in the last place.
    np.testing.assert_allclose(out, expected, rtol=2 * eps, atol=2 * eps)


@pytest.mark.parametrize("name", list(CASES))
def test_grads_match_jax_nn_f32(name):
    q, k, v, kwargs = _case(name, jnp.float32)
    bias = kwargs.pop("bias", None)
    rows = jnp.asarray(_valid_rows(q, kwargs))[:, :, None, None]
    cotangent = jax.random.normal(jax.random.PRNGKey(3), q.shape, jnp.float32)

    def loss(fn, q, k, v, bias):
        out = fn(q, k, v, bias, **kwargs)
        return jnp.sum(jnp.where(rows, out * cotangent, 0.0))

    args = (q, k, v, bias)
    argnums = (0, 1, 2, 3) if bias is not None else (0, 1, 2)
    with jax.default_matmul_precision("highest"):  # as in test_matches_jax_nn_f32
        ours = jax.grad(lambda *a: loss(lambda *x, **kw: _reference(*x, **kw)[0], *a),
                        argnums=argnums)(*args)
        theirs = jax.grad(lambda *a: loss(_jax_nn, *a), argnums=argnums)(*args)
    for mine, ref in zip(ours, theirs):
        assert np.all(np.isfinite(mine))
        np.testing.assert_allclose(mine, ref, rtol=1e-5, atol=1e-5)


def test_bottom_right_causal_window_matches_explicit_mask():
    t, s = 12, 20
    q, k, v = _inputs(jnp.float32, t=t, s=s)
    offset = s - t
    i = jnp.arange(t)[:, None]
    j = jnp.arange(s)[None, :]
    mask = (j <= i + offset) & (j >= i + offset - 3)
    out, lse = _reference(q, k, v, is_causal=True, causal_offset=offset, window=(3, None))
    expected, expected_lse = _jax_nn(q, k, v, mask=mask[None, None], return_residual=True)
    np.testing.assert_allclose(out, expected, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(lse.transpose(0, 2, 1), expected_lse, rtol=2e-6, atol=2e-6)


def test_window_with_offset_and_negative_bounds():
    t, s = 8, 24
    q, k, v = _inputs(jnp.float32, t=t, s=s)
    offset = s - t
    i = jnp.arange(t)[:, None]
    j = jnp.arange(s)[None, :]
    mask = (j >= i + offset - 2) & (j <= i + offset + 5)
    out, _ = _reference(q, k, v, causal_offset=offset, window=(2, 5))
    expected = _jax_nn(q, k, v, mask=jnp.broadcast_to(mask, (B, N, t, s)))
    np.testing.assert_allclose(out, expected, rtol=2e-6, atol=2e-6)
    unbounded, _ = _reference(q, k, v, causal_offset=offset, window=(-1, None))
    np.testing.assert_allclose(unbounded, _jax_nn(q, k, v), rtol=2e-6, atol=2e-6)


def test_segment_ids_match_bool_mask():
    q, k, v = _inputs(jnp.float32)
    q_seg = jnp.array([[0] * 6 + [1] * 10, [0] * 16], jnp.int32)
    kv_seg = jnp.array([[0] * 9 + [1] * 7, [0] * 3 + [1] * 13], jnp.int32)
    mask = (q_seg[:, None, :, None] == kv_seg[:, None, None, :])
    out, _ = _reference(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg)
    expected = _jax_nn(q, k, v, mask=mask)
    np.testing.assert_allclose(out, expected, rtol=2e-6, atol=2e-6)


def test_gqa_equals_repeated_kv():
    q, k, v = _inputs(jnp.float32, n=8, k=2)
    out, lse = _reference(q, k, v, is_causal=True)
    repeat = lambda x: jnp.repeat(x, 4, axis=2)  # noqa: E731
    expected, expected_lse = _reference(q, repeat(k), repeat(v), is_causal=True)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-6, atol=1e-6)


def test_soft_cap_against_numpy():
    cap = 2.0
    q, k, v = _inputs(jnp.float32)
    bias = jax.random.normal(jax.random.PRNGKey(5), (B, N, T, S), jnp.float32)
    # Against float64 NumPy: keep GPUs from using TF32 for the f32 matmuls.
    with jax.default_matmul_precision("highest"):
        out, lse = _reference(q, k, v, bias, is_causal=True, logit_soft_cap=cap)

    q64, k64, v64, b64 = (np.asarray(x, np.float64) for x in (q, k, v, bias))
    logits = np.einsum("btnh,bsnh->bnts", q64, k64) * H ** -0.5
    logits = cap * np.tanh(logits / cap) + b64  # scale, soft cap, then bias
    logits = np.where(np.tril(np.ones((T, S), bool)), logits, -np.inf)
    expected_lse = np.log(np.sum(np.exp(logits), axis=-1))
    probs = np.exp(logits - expected_lse[..., None])
    expected = np.einsum("bnts,bsnh->btnh", probs, v64)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5, atol=1e-5)


def _fully_masked_case():
    """Batch 1 has kv length 0; batch 0 has q length 10 and a bottom-right
    causal mask with T > S, so its first rows see no key."""
    t, s = 16, 12
    q, k, v = _inputs(jnp.float32, t=t, s=s)
    kwargs = dict(is_causal=True, causal_offset=s - t,
                  query_seq_lengths=jnp.array([10, t], jnp.int32),
                  key_value_seq_lengths=jnp.array([s, 0], jnp.int32))
    i = np.arange(t)
    dead = np.zeros((B, t), bool)
    dead[0] = (i + s - t < 0) | (i >= 10)
    dead[1] = True
    return q, k, v, kwargs, dead


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fully_masked_rows_give_zeros_and_neg_inf(dtype):
    q, k, v, kwargs, dead = _fully_masked_case()
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    out, lse = _reference(q, k, v, **kwargs)
    out = np.asarray(out.astype(jnp.float32))
    lse = np.asarray(lse).transpose(0, 2, 1)  # [B, T, N]
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[dead], 0)
    assert np.all(lse[dead] == -np.inf)
    assert np.all(np.isfinite(lse[~dead]))
    assert np.all(np.abs(out[~dead]).sum(-1) > 0)


def test_fully_masked_rows_have_finite_zero_grads():
    q, k, v, kwargs, dead = _fully_masked_case()
    bias = jax.random.normal(jax.random.PRNGKey(9), (B, N, q.shape[1], k.shape[1]))

    def loss(q, k, v, bias):
        out, lse = _reference(q, k, v, bias, **kwargs)
        finite_lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
        return jnp.sum(out ** 2) + jnp.sum(finite_lse)

    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, bias)
    for g in grads:
        assert np.all(np.isfinite(g))
    dq, dk, dv, dbias = (np.asarray(g) for g in grads)
    np.testing.assert_array_equal(dq[dead], 0)
    np.testing.assert_array_equal(dk[1], 0)  # batch 1 sees no key at all
    np.testing.assert_array_equal(dv[1], 0)
    np.testing.assert_array_equal(dbias.transpose(0, 2, 1, 3)[dead], 0)
    assert np.any(dq[~dead] != 0)


def test_backward_from_out_and_lse_matches_vjp():
    """The backward given the forward's out and lse (what the backward kernel
    and a ring block compute) equals autodiff of the reference, masks included;
    rows that see no key (lse = -inf) get zero gradients."""
    kwargs = _fully_masked_case()[3]
    q, k, v = _inputs(jnp.float32, t=16, s=12, n=4, k=2, seed=3)
    seg = jnp.array([[0] * 5 + [1] * 11, [1] * 16], jnp.int32)
    kwargs = dict(kwargs, window=(6, 2), q_segment_ids=seg, kv_segment_ids=seg[:, :12])
    with jax.default_matmul_precision("highest"):
        (out, lse), vjp = jax.vjp(lambda q, k, v: _reference(q, k, v, **kwargs), q, k, v)
        d_out = jax.random.normal(jax.random.PRNGKey(4), out.shape)
        expected = vjp((d_out, jnp.zeros_like(lse)))
        got = attention_backward_reference(q, k, v, out, lse, d_out, scale=H ** -0.5, **kwargs)[:3]
    assert np.any(np.isneginf(np.asarray(lse)))
    for g, e in zip(got, expected):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_jit_and_f16_dtypes():
    q, k, v = _inputs(jnp.float16)
    fn = jax.jit(lambda q, k, v: _reference(q, k, v, is_causal=True, window=(4, 0)))
    out, lse = fn(q, k, v)
    assert out.dtype == jnp.float16 and lse.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(out, np.float32)))


def test_backward_reference_with_bias_cap_mask_dropout_matches_vjp():
    from jaxcraft.ops.attention_dropout import dropout_keep_mask
    q, k, v = _inputs(jnp.float32, t=16, s=12, n=4, k=2, seed=5)
    B, T, N, _ = q.shape
    S = k.shape[1]
    bias = jax.random.normal(jax.random.PRNGKey(6), (1, N, T, S))
    mask = jax.random.bernoulli(jax.random.PRNGKey(7), 0.8, (B, 1, T, S))
    keep = dropout_keep_mask(jnp.array([3, 4], jnp.uint32), 0.3, (B, N, T, S))
    kw = dict(scale=H ** -0.5, is_causal=True, causal_offset=0, query_seq_lengths=None,
              key_value_seq_lengths=None, window=None, mask=mask, logit_soft_cap=2.0,
              dropout_rate=0.3, dropout_keep=keep)
    with jax.default_matmul_precision("highest"):
        (out, lse), vjp = jax.vjp(lambda q, k, v, b: attention_reference(q, k, v, b, **kw),
                                  q, k, v, bias)
        d_out = jax.random.normal(jax.random.PRNGKey(8), out.shape)
        expected = vjp((d_out, jnp.zeros_like(lse)))
        dq, dk, dv, dbias = attention_backward_reference(q, k, v, out, lse, d_out, bias=bias, **kw)
    got = (dq, dk, dv, dbias.sum(0, keepdims=True))
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
