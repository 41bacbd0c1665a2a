"""Pure-JAX reference for jaxcraft's attention op.

It is the ground truth that the CPU and CUDA flash-attention kernels are
tested against, and it follows the mask semantics of
``cpp/contract/attention.h``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax


def attention_reference(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    scale,
    is_causal,
    causal_offset,
    query_seq_lengths,
    key_value_seq_lengths,
    window,
    q_segment_ids=None,
    kv_segment_ids=None,
    logit_soft_cap=None,
    dropout_rate=0.0,
    dropout_keep=None,
    precision=None,
):
    """Attention with fp32 logits and softmax, materializing [B, N, T, S].

    Shapes: ``query`` [B, T, N, H]; ``key``/``value`` [B, S, K, H] with
    N % K == 0, query head n reading KV head n // (N // K) (GQA, done by
    reshaping the query to [B, T, K, N // K, H]; K/V are never repeated).

    Math, in this order (jax.nn.dot_product_attention's XLA path, plus the
    soft cap, which jax.nn does not have):

    1. ``logits = einsum(q, k)`` in fp32 (``preferred_element_type``; bf16
       inputs use the BF16_BF16_F32 precision preset, f16 inputs the default
       precision, which is the same f16 x f16 -> f32 product),
    2. ``logits *= scale``,
    3. ``logits = logit_soft_cap * tanh(logits / logit_soft_cap)`` if given,
    4. ``logits += bias`` (in fp32; bias broadcastable to [B, N, T, S]),
    5. masks, then softmax in fp32; the probabilities are cast to the value
       dtype before ``einsum(probs, v)``, exactly as jax.nn does;
    6. with ``dropout_keep`` (bool, broadcastable to [B, N, T, S]: the
       kernels' draw, attention_dropout.dropout_keep_mask), kept
       probabilities are multiplied by 1 / (1 - dropout_rate) in fp32 and
       the others zeroed before that cast. lse is that of step 5.

    ``precision`` (a ``jax.lax.Precision``, or None for JAX's default) sets
    both matmuls' precision for float32 and float64 inputs; 16-bit inputs
    take the products above, exact in any precision.

    Row i (of batch b) sees key j iff all of these hold (bounds inclusive,
    ``causal_offset`` = 0 is top-left alignment, S - T bottom-right):

    * ``mask[b, n, i, j]`` if ``mask`` (bool, broadcastable to [B, N, T, S]),
    * ``j <= i + causal_offset`` if ``is_causal``,
    * ``i + causal_offset - left <= j <= i + causal_offset + right`` for
      ``window = (left, right)``; a None or negative bound is unbounded and
      an int w means (w, w) as in jax.nn,
    * ``j < key_value_seq_lengths[b]`` and ``i < query_seq_lengths[b]``,
    * ``q_segment_ids[b, i] == kv_segment_ids[b, j]`` if segment ids are given.

    A row that sees no key (including rows i >= query_seq_lengths[b]) gives
    out = 0 and lse = -inf, and its gradients are zero, not NaN.

    With ``causal_offset=0``, no soft cap and no segment ids this equals::

        jax.nn.dot_product_attention(
            query, key, value, bias, mask, scale=scale, is_causal=is_causal,
            query_seq_lengths=query_seq_lengths,
            key_value_seq_lengths=key_value_seq_lengths,
            local_window_size=window, implementation="xla")

    (jax.nn's window is always top-left aligned and takes non-negative ints
    only), on every row that sees at least one key;
    segment ids are the bool mask ``q_seg[:, None, :, None] ==
    kv_seg[:, None, None, :]``. jax.nn returns garbage (a uniform average)
    for rows that see no key, and its residual lse is [B, T, N] in the input
    dtype.

    Returns:
      ``(out, lse)``: out [B, T, N, H] in the query dtype and lse [B, N, T]
      float32, the natural-log logsumexp of the masked logits.
    """
    B, T, N, H = query.shape
    _, S, K, _ = key.shape
    G = N // K

    logits = _grouped_logits(query.reshape(B, T, K, G, H), key, precision)  # [B, K, G, T, S]
    logits = logits * jnp.asarray(scale, logits.dtype)
    if logit_soft_cap is not None:
        cap = jnp.asarray(logit_soft_cap, logits.dtype)
        logits = cap * jnp.tanh(logits / cap)
    if bias is not None:
        logits = (logits + _to_grouped(jnp.asarray(bias), N, K)).astype(logits.dtype)

    visible = _visible(
        T, S, N, K, mask, is_causal, causal_offset, query_seq_lengths,
        key_value_seq_lengths, window, q_segment_ids, kv_segment_ids,
    )
    probs, lse = _masked_softmax(logits, visible)
    if dropout_keep is not None:
        probs = _apply_dropout(probs, dropout_keep, dropout_rate, N, K)

    out = jnp.einsum("bkgts,bskh->btkgh", probs.astype(value.dtype), value,
                     precision=_wide_precision(value.dtype, precision))
    out = out.reshape(B, T, N, H).astype(query.dtype)
    return out, lse.reshape(B, N, T)


def attention_backward_reference(
    query,
    key,
    value,
    out,
    lse,
    d_out,
    *,
    scale,
    is_causal,
    causal_offset,
    query_seq_lengths,
    key_value_seq_lengths,
    window,
    q_segment_ids=None,
    kv_segment_ids=None,
    bias=None,
    mask=None,
    logit_soft_cap=None,
    dropout_rate=0.0,
    dropout_keep=None,
):
    """Gradients (dq, dk, dv, dbias) given the forward's ``out`` and ``lse``,
    as the backward kernel computes them (masks, bias, soft cap and dropout
    as ``attention_reference``; dbias is None without a bias, else float32
    [B, N, T, S] before any reduction over broadcast axes).

    Rebuilding the probabilities from the given ``lse`` (not from this call's
    own logsumexp) is what lets a caller run it on one block of keys while
    ``out`` and ``lse`` cover all keys (ring attention): the block's share of
    the gradients comes out. With the full keys and the forward's own out
    and lse it equals ``jax.vjp`` of ``attention_reference``.

    Math (fp32, materializing one [B, N, T, S] block)::

        x = cap(scale * q k^T) + bias;  p = exp(x - lse)   # 0 where masked / lse = -inf
        pd = p * keep / (1 - rate);  dv = pd^T dO;  dp = (dO v^T) * keep / (1 - rate)
        delta = rowsum(dO * out);  dbias = p * (dp - delta)
        ds = dbias * cap'(.);  dq = scale * ds k;  dk = scale * ds^T q
    """
    B, T, N, H = query.shape
    _, S, K, _ = key.shape
    G = N // K
    f32 = lambda x: x.astype(jnp.float32)
    q = f32(query).reshape(B, T, K, G, H)
    do = f32(d_out).reshape(B, T, K, G, H)
    k, v = f32(key), f32(value)
    hi = lax.Precision.HIGHEST
    logits = jnp.einsum("btkgh,bskh->bkgts", q, k, precision=hi) * scale
    if logit_soft_cap is not None:
        logits = logit_soft_cap * jnp.tanh(logits / logit_soft_cap)
    capped = logits
    if bias is not None:
        logits = logits + _to_grouped(f32(jnp.asarray(bias)), N, K)
    visible = _visible(
        T, S, N, K, mask, is_causal, causal_offset, query_seq_lengths,
        key_value_seq_lengths, window, q_segment_ids, kv_segment_ids,
    )
    lse = lse.reshape(B, K, G, T)[..., None]
    has_keys = jnp.isfinite(lse)
    # Rows with lse = -inf saw no key: their probabilities are 0, not exp(+inf).
    probs = jnp.where(visible & has_keys, jnp.exp(logits - jnp.where(has_keys, lse, 0.0)), 0.0)
    delta = jnp.sum(do * f32(out).reshape(B, T, K, G, H), axis=-1)  # [B, T, K, G]
    dp = jnp.einsum("btkgh,bskh->bkgts", do, v, precision=hi)
    dropped = probs
    if dropout_keep is not None:
        dropped = _apply_dropout(probs, dropout_keep, dropout_rate, N, K)
        dp = _apply_dropout(dp, dropout_keep, dropout_rate, N, K)
    dv = jnp.einsum("bkgts,btkgh->bskh", dropped, do, precision=hi)
    dlogits = probs * (dp - jnp.transpose(delta, (0, 2, 3, 1))[..., None])
    ds = dlogits
    if logit_soft_cap is not None:
        ds = ds * (1.0 - jnp.square(capped / logit_soft_cap))
    ds = ds * scale
    dq = jnp.einsum("bkgts,bskh->btkgh", ds, k, precision=hi).reshape(B, T, N, H)
    dk = jnp.einsum("bkgts,btkgh->bskh", ds, q, precision=hi)
    dbias = None if bias is None else dlogits.reshape(B, N, T, S)
    return dq.astype(query.dtype), dk.astype(key.dtype), dv.astype(value.dtype), dbias


def _wide_precision(dtype, precision):
    """`precision` for float32 / float64 matmuls; None (JAX's default) for
    16-bit ones."""
    return precision if jnp.dtype(dtype).itemsize >= 4 else None


def _grouped_logits(query, key, precision=None):
    """fp32 [B, K, G, T, S] logits, with jax.nn's precision choice.

    f16 takes the default precision, not the F16_F16_F32 preset: the
    preset is rejected at compile time on CPU and TPU, and on GPU for a
    dot that degenerates to a vector product (T = S = 1), while f16 x f16
    -> f32 with the default precision is the same computation. float32 and
    float64 take `precision`.
    """
    if query.dtype == jnp.bfloat16:
        precision = lax.DotAlgorithmPreset.BF16_BF16_F32
    else:
        precision = _wide_precision(query.dtype, precision)
    logits_dtype = jnp.promote_types(query.dtype, jnp.float32)
    return jnp.einsum(
        "btkgh,bskh->bkgts", query, key,
        precision=precision, preferred_element_type=logits_dtype,
    )


def _apply_dropout(x, keep, rate, N, K):
    """x [B, K, G, T, S] with dropped entries zeroed, kept ones / (1 - rate)."""
    keep = _to_grouped(jnp.asarray(keep), N, K)
    keep_scale = np.float32(1) / (np.float32(1) - np.float32(rate))  # as the kernels round it
    return jnp.where(keep, x * keep_scale, 0.0)


def _to_grouped(x, N, K):
    """[b, n, t, s] with n in {1, N} (other dims broadcastable) -> [b, k, g, t, s]."""
    if x.ndim != 4:
        raise ValueError(f"bias and mask must be 4-D [B, N, T, S], got shape {x.shape}")
    b, n, t, s = x.shape
    if n == 1:
        return x[:, :, None]
    if n != N:
        raise ValueError(f"bias/mask head dimension must be 1 or {N}, got {n}")
    return x.reshape(b, K, N // K, t, s)


def _window_bound(bound):
    """None or a negative bound means unbounded."""
    if bound is None or bound < 0:
        return None
    return int(bound)


def _visible(T, S, N, K, mask, is_causal, causal_offset, q_lengths, kv_lengths,
             window, q_segment_ids, kv_segment_ids):
    """Bool array broadcastable to [B, K, G, T, S]: row i sees key j."""
    i = jnp.arange(T)[:, None]
    j = jnp.arange(S)[None, :]
    diagonal = i + causal_offset
    visible = jnp.ones((T, S), dtype=bool)
    if is_causal:
        visible &= j <= diagonal
    if isinstance(window, int):  # jax.nn's convention: a symmetric window
        window = (window, window)
    if window is not None:
        left, right = (_window_bound(w) for w in window)
        if left is not None:
            visible &= j >= diagonal - left
        if right is not None:
            visible &= j <= diagonal + right
    visible = visible[None, None, None]  # [1, 1, 1, T, S]

    if kv_lengths is not None:
        visible = visible & (j < jnp.asarray(kv_lengths)[:, None, None])[:, None, None]
    if q_lengths is not None:
        visible = visible & (i < jnp.asarray(q_lengths)[:, None, None])[:, None, None]
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids must be given together")
    if q_segment_ids is not None:
        q_seg = jnp.asarray(q_segment_ids)[:, :, None]
        kv_seg = jnp.asarray(kv_segment_ids)[:, None, :]
        visible = visible & (q_seg == kv_seg)[:, None, None]
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.dtype != np.dtype(bool):
            raise ValueError(f"mask must be bool, got {mask.dtype}; pass additive masks as bias")
        visible = visible & _to_grouped(mask, N, K)
    return visible


def _masked_softmax(logits, visible):
    """Softmax over the last axis restricted to `visible`, and its logsumexp.

    Rows with no visible key give probs = 0 and lse = -inf. Every op is
    chosen so that such rows have zero (not NaN) gradients: the row max is
    replaced by 0 before the subtraction, exp(-inf) = 0 has derivative 0,
    and the row sum is replaced by 1 before the division and log.
    """
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    visible = jnp.broadcast_to(visible, logits.shape)
    has_keys = jnp.any(visible, axis=-1, keepdims=True)
    masked = jnp.where(visible, logits, -jnp.inf)
    row_max = lax.stop_gradient(jnp.max(masked, axis=-1, keepdims=True))
    row_max = jnp.where(has_keys, row_max, 0.0)
    unnormalized = jnp.exp(masked - row_max)
    row_sum = jnp.where(has_keys, jnp.sum(unnormalized, axis=-1, keepdims=True), 1.0)
    probs = unnormalized / row_sum
    lse = jnp.where(has_keys, row_max + jnp.log(row_sum), -jnp.inf)
    return probs, lse[..., 0]


__all__ = ["attention_backward_reference", "attention_reference"]
