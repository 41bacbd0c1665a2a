"""jaxcraft.remat policies (which kernels a checkpointed backward reruns) and
jax.export of functions that use the kernels (round trips, also into a fresh
process; why EXPORT_DISABLED_CHECKS is needed; multi-platform artifacts)."""

import collections
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name

import jaxcraft
from jaxcraft import _ffi, remat
from jaxcraft.ops import norm as norm_ops
from numerics import random

F32 = jnp.float32
B, T, N, H = 2, 16, 4, 32
USER_NAME = "values"  # a name in the user's code, for combined policies
POLICIES = {
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "save_attention": remat.save_attention,
    "save_attention_and_norms": remat.save_attention_and_norms,
    "kernels_and_user": remat.save_kernel_residuals(
        jax.checkpoint_policies.save_only_these_names(USER_NAME)),
    "attention_and_user": remat.save_kernel_residuals(
        jax.checkpoint_policies.save_only_these_names(USER_NAME), norms=False),
}


def _inputs(seed=0):
  """x, residual (bfloat16: the dtype both platforms' kernels take), scale, bias."""
  k = jax.random.split(jax.random.key(seed), 4)
  return (random(k[0], (B, T, N * H), jnp.bfloat16), random(k[1], (B, T, N * H), jnp.bfloat16),
          random(k[2], (N * H,), F32, offset=1.0), random(k[3], (N * H,), F32))


def _forward(x, r, scale, bias, *, impl=None):
  """A pre-norm block: fused add + layer norm, then causal self-attention whose
  values come from an op in user code, named USER_NAME. Returns (out, h)."""
  y, h = jaxcraft.layer_norm(x, scale, bias, residual=r, implementation=impl)
  q = y.reshape(B, T, N, H)
  v = checkpoint_name(jnp.cos(h), USER_NAME).reshape(q.shape)
  # deterministic: the default backward sums dq with float atomics, so two
  # runs of the same program may differ in the last bit on a GPU.
  out = jaxcraft.dot_product_attention(q, q, v, is_causal=True, deterministic=True,
                                       implementation=impl)
  return out, h


def _loss(x, r, scale, bias, *, impl=None):
  return jnp.sum(jnp.square(_forward(x, r, scale, bias, impl=impl)[0].astype(F32)))


def _op_counts(hlo_text):
  """How often each jaxcraft FFI target, and the user's cosine, appear."""
  counts = collections.Counter(re.findall(r"stablehlo\.custom_call @(\w+)\(", hlo_text))
  counts["cosine"] = len(re.findall(r"stablehlo\.cosine\b", hlo_text))
  return counts


# ---------------------------------------------------------------------- remat
# (norm fwd, attention fwd, cosine) calls in a checkpointed training step: one
# in the forward pass, plus one where the backward recomputes what was not saved.
EXPECTED_CALLS = {
    "nothing_saveable": (2, 2, 2),
    "save_attention": (2, 1, 2),
    "save_attention_and_norms": (1, 1, 2),
    "kernels_and_user": (1, 1, 1),
    "attention_and_user": (2, 1, 1),
}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_policy_decides_which_kernels_rerun(platform, policy):
  loss = jax.checkpoint(lambda *a: _loss(*a, impl=platform), policy=POLICIES[policy])
  # value_and_grad, as a training step: under jax.grad alone the forward pass
  # is dead code (only the backward's recomputation would be counted).
  text = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3))).lower(*_inputs()).as_text()
  counts = _op_counts(text)
  assert (counts[_ffi.NORM_FWD], counts[_ffi.ATTENTION_FWD], counts["cosine"]) == \
      EXPECTED_CALLS[policy], counts
  assert counts[_ffi.NORM_BWD] == counts[_ffi.ATTENTION_BWD] == 1, counts


def test_policy_keeps_the_gradients(platform):
  args = _inputs()
  loss = lambda *a: _loss(*a, impl=platform)
  want = jax.jit(jax.grad(loss, (0, 1, 2, 3)))(*args)
  for name, policy in POLICIES.items():
    got = jax.jit(jax.grad(jax.checkpoint(loss, policy=policy), (0, 1, 2, 3)))(*args)
    for g, w in zip(got, want):
      np.testing.assert_allclose(np.asarray(g.astype(F32)), np.asarray(w.astype(F32)),
                                 rtol=1e-2, atol=1e-2, err_msg=name)


# --------------------------------------------------------------------- export
def _step(x, r, scale, bias):
  """A training step's loss and gradients with jaxcraft's default dispatch."""
  return jax.value_and_grad(_loss, (0, 1, 2, 3))(x, r, scale, bias)


FUNCTIONS = {"forward": _forward, "step": _step}
# Every target a training step uses: all but inference-only decode attention
# (tests/test_decode_attention.py exports that one).
STEP_TARGETS = tuple(t for t in _ffi.TARGETS if t != _ffi.DECODE_ATTENTION_FWD)
# The activation, embedding and softmax ops are not in this step (tests/test_activations.py,
# tests/test_embedding.py and tests/test_softmax.py export them).
_ELEMENTWISE_TARGETS = (_ffi.ACTIVATION_FWD, _ffi.ACTIVATION_BWD, _ffi.EMBEDDING_FWD,
                        _ffi.EMBEDDING_BWD, _ffi.SOFTMAX_FWD, _ffi.SOFTMAX_BWD)
STEP_TARGETS = tuple(t for t in STEP_TARGETS if t not in _ELEMENTWISE_TARGETS)
TARGETS_USED = {"forward": (_ffi.NORM_FWD, _ffi.ATTENTION_FWD), "step": STEP_TARGETS}


def _default_runs(target, platform):
  """Whether implementation=None lowers to `target` on `platform` (the norms'
  policy runs XLA's norm on CUDA)."""
  norm = target in (_ffi.NORM_FWD, _ffi.NORM_BWD)
  return not norm or norm_ops.default_implementation(platform) == "kernel"


def _export(fn, platforms, disabled_checks=jaxcraft.EXPORT_DISABLED_CHECKS):
  return jax.export.export(jax.jit(fn), platforms=platforms,
                           disabled_checks=disabled_checks)(*_inputs())


def _assert_identical(got, want):
  got, want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_array_equal(np.asarray(g.astype(F32)), np.asarray(w.astype(F32)))


def test_disabled_checks_cover_the_extensions_targets():
  registered = _ffi._extension().registrations()
  for xla_platform in ("cpu", "CUDA"):
    assert set(registered[xla_platform]) in (set(), set(_ffi.TARGETS)), xla_platform
  assert jaxcraft.EXPORT_DISABLED_CHECKS == tuple(
      jax.export.DisabledSafetyCheck.custom_call(t) for t in _ffi.TARGETS)


@pytest.mark.parametrize("what", list(FUNCTIONS))
def test_export_round_trip(platform, what):
  fn = FUNCTIONS[what]
  exported = _export(fn, (platform,))
  module = exported.mlir_module()
  for target in TARGETS_USED[what]:  # the artifact runs the kernels, not the reference
    assert (f"@{target}(" in module) == _default_runs(target, platform), target
  restored = jax.export.deserialize(exported.serialize())
  _assert_identical(restored.call(*_inputs()), jax.jit(fn)(*_inputs()))


_FRESH_PROCESS = textwrap.dedent("""
    import sys
    import jax, numpy as np
    import jaxcraft  # registers the FFI targets: no jaxcraft op is traced here
    blob_path, inputs_path, out_path, platform = sys.argv[1:]
    exported = jax.export.deserialize(bytearray(open(blob_path, "rb").read()))
    inputs = np.load(inputs_path)
    device = jax.devices(platform)[0]
    args = [jax.device_put(inputs[f"a{i}"].astype(a.dtype), device)
            for i, a in enumerate(exported.in_avals)]
    outs = jax.tree.leaves(exported.call(*args))
    np.savez(out_path, *[np.asarray(o.astype(np.float32)) for o in outs])
""")


def test_export_runs_in_a_fresh_process(platform, tmp_path):
  exported = _export(_step, (platform,))
  (tmp_path / "step.bin").write_bytes(exported.serialize())
  # bfloat16 -> float32 -> bfloat16 is exact, so the files can hold float32.
  np.savez(tmp_path / "inputs.npz",
           **{f"a{i}": np.asarray(a.astype(F32)) for i, a in enumerate(_inputs())})
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")  # this process holds the GPU
  if platform == "cpu":
    env["JAX_PLATFORMS"] = "cpu"
  run = subprocess.run(
      [sys.executable, "-c", _FRESH_PROCESS, str(tmp_path / "step.bin"),
       str(tmp_path / "inputs.npz"), str(tmp_path / "outs.npz"), platform],
      # cwd: from the checkout's root, `import jaxcraft` would find the source
      # tree (no built extension) before the installed package.
      env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  got = np.load(tmp_path / "outs.npz")
  want = jax.tree.leaves(jax.jit(_step)(*_inputs()))
  assert len(got.files) == len(want)
  for i, w in enumerate(want):
    np.testing.assert_array_equal(got[f"arr_{i}"], np.asarray(w.astype(F32)))


def test_export_needs_each_disabled_check():
  with pytest.raises(ValueError, match="custom call") as error:
    _export(_step, ("cpu",), disabled_checks=())
  assert "@jaxcraft_" in str(error.value)
  for target in STEP_TARGETS:
    others = tuple(jax.export.DisabledSafetyCheck.custom_call(t)
                   for t in _ffi.TARGETS if t != target)
    with pytest.raises(ValueError, match=f"@{target}\\("):
      _export(_step, ("cpu",), disabled_checks=others)


def test_multi_platform_export(platform):
  """One artifact for CPU and CUDA: each kernel platform lowers its own
  branch, and the caller's platform picks one at run time."""
  exported = _export(_step, ("cpu", "cuda"))
  assert exported.platforms == ("cpu", "cuda")
  # The CUDA branch has the kernels when this build has them, else the reference.
  counts = _op_counts(exported.mlir_module())
  for target in STEP_TARGETS:
    cuda = _ffi.has_kernels("cuda") and _default_runs(target, "cuda")
    assert counts[target] == 1 + cuda, (target, counts)
  restored = jax.export.deserialize(exported.serialize())
  _assert_identical(restored.call(*_inputs()), jax.jit(_step)(*_inputs()))
