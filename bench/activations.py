"""gelu / bias_gelu / swiglu / geglu: jaxcraft's kernel vs XLA, bf16.

Implementations (each op):
  jaxcraft  the kernel, forced (implementation="cuda"/"cpu"), whatever the
            implementation=None policy says;
  xla       jaxcraft's reference (implementation="xla": float32 math, what
            implementation=None falls back to), jitted: XLA fuses it;
  jax.nn    the plain jax.nn expression in the input dtype, jitted (for
            bias_gelu the bias is cast to x's dtype first);
  xla+kbwd  xla's forward with the kernel's backward (a per-pass policy's
            other mix).
Modes (GB/s from ActivationSpec's byte formulas, % of the copy ceiling):
"fwd"; "bwd", the backward alone (dx, and bias_gelu's dbias, from the
forward's saved x and an independent dy); "fwd+bwd" (dy = y, y itself
unused: XLA recomputes the forward in its backward fusion and never writes
y, which no model that consumes y gets); and "mlp fwd": the op between two
matmuls (x @ w_in -> act -> @ w_out, d_model 1024) where XLA may fuse the
activation into a matmul's epilogue or prologue and a custom call cannot;
microseconds of the whole block, no GB/s; and "mlp fwd+bwd": that block's
training step (the gradients of x, both weights and the bias for an
independent output cotangent), where XLA may fuse the activation's backward
into the backward matmuls. These rows fill DEFAULT_IMPLEMENTATION in
jaxcraft/ops/activations.py.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

import jaxcraft
from specs import ACTIVATION_SMOKE_SPECS, ACTIVATION_SPECS, ActivationSpec
from timing import kernel_fields, time_step

DTYPE = jnp.bfloat16
D_MODEL = 1024  # the "mlp fwd" mode's model width
F32 = jnp.float32


def _kernel_platform() -> str:
  return "cuda" if jax.devices()[0].platform == "gpu" else "cpu"


def _impls(op: str):
  """name -> (fn(x, b), whether its forward / its backward is a custom call).

  Each pass is timed as the chain its kind needs (timing.py): a custom call
  unrolled, XLA's own code in a loop, so that XLA cannot fuse consecutive
  steps of a pure-XLA pass (xla+kbwd's forward, unrolled as if a custom
  call, fuses across steps: 82 against xla's 102 us)."""
  k = _kernel_platform()
  base = op.removesuffix("_erf")  # the "_erf" ops: the GELU's erf form
  approximate = base == op
  ours = {
      "gelu": lambda impl: lambda x, b: jaxcraft.gelu(x, approximate, implementation=impl),
      "bias_gelu": lambda impl: lambda x, b: jaxcraft.bias_gelu(x, b, approximate, implementation=impl),
      "swiglu": lambda impl: lambda x, b: jaxcraft.swiglu(x, implementation=impl),
      "geglu": lambda impl: lambda x, b: jaxcraft.geglu(x, approximate, implementation=impl),
  }[base]
  halves = lambda x: jnp.split(x, 2, axis=-1)
  gelu = lambda h: jax.nn.gelu(h, approximate=approximate)
  nn = {
      "gelu": lambda x, b: gelu(x),
      "bias_gelu": lambda x, b: gelu(x + b.astype(x.dtype)),
      "swiglu": lambda x, b: (lambda a, g: jax.nn.silu(a) * g)(*halves(x)),
      "geglu": lambda x, b: (lambda a, g: gelu(a) * g)(*halves(x)),
  }[base]
  return {"jaxcraft": (ours(k), True, True), "xla": (ours("xla"), False, False),
          "jax.nn": (nn, False, False),
          "xla+kbwd": (_xla_forward_kernel_backward(ours("xla"), ours(k)), False, True)}


def _xla_forward_kernel_backward(xla_fn, kernel_fn):
  """The op with XLA's forward and the kernel's backward: the mix a per-pass
  policy can choose (the kernel's vjp forward is dead code under jit)."""
  @jax.custom_vjp
  def fn(x, b):
    return xla_fn(x, b)

  def fwd(x, b):
    return xla_fn(x, b), (x, b)

  def bwd(res, dy):
    return jax.vjp(kernel_fn, *res)[1](dy)

  fn.defvjp(fwd, bwd)
  return fn


def _fwd_step(fn, spec: ActivationSpec):
  if spec.gated:
    # y ([rows, cols]) cannot be the next x ([rows, 2 cols]), and building one
    # from it would add a pass. The next x is x with one element taken from
    # y (an in-place update); the barrier makes all of y materialize first
    # (XLA could otherwise compute just that element).
    def step(x, b):
      y = jax.lax.optimization_barrier(fn(x, b))
      return x.at[0, 0].set(y[0, 0])
    return step
  return lambda x, b: fn(x, b)


def _fwd_bwd_step(fn, spec: ActivationSpec):
  """x -> dx with dy = y (shapes match x); bias_gelu carries (x, bias) and
  feeds dbias / rows back, so that the bias gradient is computed (not dead
  code) and stays O(1)."""
  if spec.has_bias:
    def step(carry):
      x, b = carry
      y, vjp = jax.vjp(fn, x, b)
      dx, db = vjp(y)
      return dx, (db / spec.rows).astype(b.dtype)
    return step

  def step(x, b):
    y, vjp = jax.vjp(lambda x: fn(x, b), x)
    return vjp(y)[0]
  return step


def _bwd_step(dy, vjp):
  """dy -> the next dy through the forward's saved residuals (a vjp closure
  is a pytree: it travels into the jitted chain as an argument). dx may not
  be dy's shape (gated ops) and bias_gelu also returns dbias: one element of
  each gradient goes into the next dy, after a barrier that makes them
  materialize whole (as in _fwd_step)."""
  grads = jax.lax.optimization_barrier(vjp(dy))
  probe = sum(g.reshape(-1)[0].astype(F32) for g in grads)
  return dy.at[0, 0].set(probe.astype(dy.dtype))


def _vjp(fn, spec: ActivationSpec, x, b):
  """The backward closure of fn at (x, b): over x and the bias for
  bias_gelu, over x alone otherwise."""
  if spec.has_bias:
    return jax.vjp(fn, x, b)[1]
  return jax.vjp(lambda x: fn(x, b), x)[1]


def _mlp_block(fn):
  return lambda x, b, w_in, w_out: (fn(x @ w_in, b) @ w_out).astype(x.dtype)


def _mlp_step(fn, w_in, w_out):
  return lambda x, b: _mlp_block(fn)(x, b, w_in, w_out)


def _mlp_train_step(fn):
  """x -> dx of the MLP block for an independent output cotangent dz, with
  the weight (and bias) gradients folded into one element of dx so that they
  are computed, not dead code."""
  def step(x, b, w_in, w_out, dz):
    _, vjp = jax.vjp(_mlp_block(fn), x, b, w_in, w_out)
    dx, db, dw_in, dw_out = vjp(dz)
    probe = db.reshape(-1)[0] + dw_in[0, 0].astype(F32) + dw_out[0, 0].astype(F32)
    return dx.at[0, 0].add(probe.astype(dx.dtype))
  return step


def run(bandwidth: float, specs=None):
  smoke = os.environ.get("JAXCRAFT_BENCH_ACTIVATIONS_SMOKE") == "1"
  if specs is None:
    specs = ACTIVATION_SMOKE_SPECS if smoke else ACTIVATION_SPECS
  # JAXCRAFT_BENCH_ACTIVATION_OPS=gelu,bias_gelu / JAXCRAFT_BENCH_MODES=fwd,bwd:
  # a part of the table (the whole one takes over two minutes on the H200).
  if wanted := os.environ.get("JAXCRAFT_BENCH_ACTIVATION_OPS"):
    specs = [s for s in specs if s.op in wanted.split(",")]
  modes = os.environ.get("JAXCRAFT_BENCH_MODES")
  modes = modes.split(",") if modes else None
  rows = []

  def record(spec, name, mode, sec, nbytes, kernel=({}, "")):
    row = dict(op=spec.op, shape=spec.name, impl=name, mode=mode, us=sec * 1e6,
               gbps=nbytes / sec / 1e9 if nbytes else None,
               pct_copy=100 * nbytes / sec / bandwidth if nbytes else None, **kernel[0])
    rows.append(row)
    rate = f"{row['gbps']:7.0f} GB/s {row['pct_copy']:5.1f}%" if nbytes else ""
    print(f"  {spec.op:10s} {spec.name:12s} {name:9s} {mode:8s} {row['us']:9.1f} us {rate}{kernel[1]}",
          flush=True)

  for spec in specs:
    k = jax.random.split(jax.random.key(0), 6)
    x = jax.random.normal(k[0], (spec.rows, spec.in_cols), DTYPE)
    b = 0.1 * jax.random.normal(k[1], (spec.cols,), F32)
    w_in = (jax.random.normal(k[2], (D_MODEL, spec.in_cols), DTYPE) / D_MODEL ** 0.5).astype(DTYPE)
    w_out = (jax.random.normal(k[3], (spec.cols, D_MODEL), DTYPE) / spec.cols ** 0.5).astype(DTYPE)
    dy = jax.random.normal(k[4], (spec.rows, spec.cols), DTYPE)
    dz_mlp = jax.random.normal(k[5], (spec.rows, D_MODEL), DTYPE)
    x_mlp = x[:, :D_MODEL] if spec.in_cols >= D_MODEL else jnp.tile(x, (1, D_MODEL // spec.in_cols + 1))[:, :D_MODEL]
    for name, (fn, fwd_call, bwd_call) in _impls(spec.op).items():
      step_call = fwd_call or bwd_call  # a step with both passes
      cases = [("fwd", lambda: time_step(_fwd_step(fn, spec), x, b, custom_call=fwd_call),
                spec.fwd_bytes(2)),
               ("bwd", lambda: time_step(_bwd_step, dy, _vjp(fn, spec, x, b), custom_call=bwd_call),
                spec.bwd_bytes(2)),
               ("fwd+bwd", lambda: time_step(_fwd_bwd_step(fn, spec), (x, b) if spec.has_bias else x,
                                             *(() if spec.has_bias else (b,)),
                                             custom_call=step_call),
                spec.fwd_bwd_bytes(2)),
               ("mlp fwd", lambda: time_step(_mlp_step(fn, w_in, w_out), x_mlp, b, custom_call=fwd_call),
                0),
               ("mlp fwd+bwd", lambda: time_step(_mlp_train_step(fn), x_mlp, b, w_in, w_out, dz_mlp,
                                                 custom_call=step_call),
                0)]
      for mode, timed, nbytes in cases:
        if modes and mode not in modes:
          continue
        try:
          sec = timed()
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
          print(f"  {spec.op} {name} {mode} {spec.name}: failed: {type(e).__name__}: {str(e)[:160]}")
          continue
        # The forced kernel's own time (profiler trace): the chains' glue (the
        # one-element updates above) and, with a bias, XLA's sum of the
        # partial bias gradients are not in it.
        kernel = ({}, "")
        if name == "jaxcraft" and mode in ("fwd", "bwd") and not smoke:
          step, carry, consts = ((_fwd_step(fn, spec), x, (b,)) if mode == "fwd"
                                 else (_bwd_step, dy, (_vjp(fn, spec, x, b),)))
          kernel = kernel_fields(step, carry, *consts, match=f"activation_{mode}_kernel", nbytes=nbytes,
                                 bandwidth=bandwidth)
        record(spec, name, mode, sec, nbytes, kernel)
  return rows
