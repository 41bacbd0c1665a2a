"""`jax.checkpoint` policies that keep the results of jaxcraft's kernels.

Under `jax.checkpoint` (`flax.linen.remat`, `flax.nnx.remat`) a value the
policy does not save is recomputed in the backward pass, which for attention
means running the forward kernel a second time. jaxcraft names the values its
backward kernels read with `jax.ad_checkpoint.checkpoint_name`, so a policy can
keep exactly those:

    block = jax.checkpoint(block, policy=jaxcraft.remat.save_attention)

Attention's output and logsumexp cost B*T*N*(H*itemsize + 4) bytes per call and
spare the most expensive recomputation. A norm's output costs as much as its
input; its statistics at most B*T*8 bytes.
"""

import jax

ATTENTION_OUT = "jaxcraft_attention_out"
ATTENTION_LSE = "jaxcraft_attention_lse"  # float32 [B, N, T]
# The norm's output (and with `residual=`, the sum h): what the next layer's
# backward reads, and only the norm kernel computes.
NORM_OUT = "jaxcraft_norm_out"
NORM_STATS = "jaxcraft_norm_stats"  # float32 mean (layer norm) and 1/std per row

ATTENTION_NAMES = (ATTENTION_OUT, ATTENTION_LSE)
NORM_NAMES = (NORM_OUT, NORM_STATS)
NAMES = ATTENTION_NAMES + NORM_NAMES

_policies = jax.checkpoint_policies

save_attention = _policies.save_only_these_names(*ATTENTION_NAMES)
"""Keeps attention's output and logsumexp: the backward runs no attention forward."""

save_attention_and_norms = _policies.save_only_these_names(*NAMES)
"""Also keeps the norms' outputs and statistics: no jaxcraft forward kernel reruns."""


def save_kernel_residuals(base_policy=None, *, norms=True):
  """A `jax.checkpoint` policy that also keeps jaxcraft's kernel results.

  Args:
    base_policy: a policy whose saved values are kept too (e.g.
      `jax.checkpoint_policies.dots_saveable`); None saves nothing else.
    norms: also keep the norms' outputs and statistics.

  Returns:
    A policy saving what `base_policy` saves, attention's output and
    logsumexp, and with `norms` the norms' outputs and statistics.
  """
  ours = save_attention_and_norms if norms else save_attention
  return ours if base_policy is None else _policies.save_from_both_policies(base_policy, ours)
