"""Device timing for JAX functions without host overhead in the numbers.

A step is chained `n` times inside one jitted function (each output fed back
as the next input, so nothing can be hoisted or skipped); the time per step is
the difference between two chain lengths divided by their difference, which
cancels launch and dispatch costs. Median of several repetitions.

Custom calls (jaxcraft, cuDNN) are chained unrolled: in a `lax.fori_loop`
XLA copies a custom call's result into the loop-carried buffer each
iteration, a full extra read + write (seen in the HLO). XLA's own fusions are
chained in a `lax.fori_loop`: unrolled, XLA fuses consecutive steps into one
kernel (seen: chained negations cancelled, chained norms fused), which no
real model gets.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np


# The span two chains should differ by (time_step's default min_span): host
# jitter of tens of microseconds then moves a step's time by under 1%.
# Shorter spans gave attention cells above the matmul ceiling (a 3-step
# difference of a 50-us step), decode cells at 128% of the copy bandwidth and
# +-20 points on the 11-us norm rows. Steps under ~150 us reach max_long
# first (a 64-step unrolled chain) and keep a shorter span.
MIN_SPAN_S = 0.01

# The shortest chain of custom calls that XLA runs as one CUDA graph in both
# chains of a pair: XLA forms a command buffer only from 5 commands on
# (`--xla_gpu_graph_min_graph_size`), and cuDNN's calls go into one, so a
# 2-step chain of cuDNN calls runs without a graph (on an H200 its device span
# holds 150 us of launch gaps beside 249 us of kernels, decode 1 x 128k) while
# the long chain runs in one: the difference would credit cuDNN with the
# short chain's launch cost (0.5-1% per step on the decode rows).
# jaxcraft's handlers are marked command-buffer compatible, and under JAX
# 0.11.2 its chains run as one graph too (bench/host_events.py: one
# cuGraphLaunch per chain for both implementations).
GRAPH_STEPS = 8


def _chain(step, n, unroll):
  @jax.jit
  def run(carry, *consts):
    if not unroll:
      return jax.lax.fori_loop(0, n, lambda i, c: step(c, *consts), carry)
    for _ in range(n):
      carry = step(carry, *consts)
    return carry
  return run


def _wall(fn, carry, consts, reps):
  jax.block_until_ready(fn(carry, *consts))  # compile + warm up
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(carry, *consts))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


class ChainTimer:
  """Seconds per application of `step(carry, *consts) -> carry`, from the
  difference of two chain lengths (see time_step, whose arguments these are).
  Built once (compiled, warmed up, the long chain lengthened as needed and
  timed once: `first`); `sample()` times the pair again."""

  def __init__(self, step, carry, *consts, custom_call=True, short=2, long=12, reps=5,
               min_span=MIN_SPAN_S, max_long=64):
    self._args, self._reps = (carry, consts), reps
    self.short, self.long = short, long
    self._short_fn, self._long_fn = _chain(step, short, custom_call), _chain(step, long, custom_call)
    self.first = self.sample()
    if (long - short) * self.first < min_span and long < max_long:
      self.long = min(max_long, short + int(np.ceil(min_span / self.first)))
      self._long_fn = _chain(step, self.long, custom_call)
      self.first = self.sample()

  def sample(self) -> float:
    carry, consts = self._args
    t_short = _wall(self._short_fn, carry, consts, self._reps)
    t_long = _wall(self._long_fn, carry, consts, self._reps)
    return max(t_long - t_short, 1e-9) / (self.long - self.short)


def _repeats(repeats, default=3):
  return repeats or int(os.environ.get("JAXCRAFT_BENCH_REPEATS", str(default)))


def time_step(step, carry, *consts, repeats=None, **chain) -> float:
  """Seconds per application of `step(carry, *consts) -> carry`.

  `consts` are passed as arguments (never closed over: XLA would fold them).
  `custom_call`: the step is a custom call (unrolled chain), else XLA ops (loop).
  `min_span`: when the two chains differ by less than this many seconds, the
  long chain is lengthened (up to `max_long` steps) and timed again, so that
  host jitter of a few tens of microseconds cannot move the result of a fast
  step by more than a few percent.
  `repeats` (default: the JAXCRAFT_BENCH_REPEATS variable, else 3): the
  chain pair is timed this many times and the median step returned. With one
  timing, single attention cells move by 5-20% between back-to-back sweeps;
  with the median of three the whole 36-row attention sweep against cuDNN
  takes about 129 s on an H200.
  """
  return time_interleaved({None: ChainTimer(step, carry, *consts, **chain)}, repeats)[None]


def time_interleaved(timers: dict, repeats=None, default=3) -> dict:
  """The median seconds per step of each ChainTimer in `timers` (name ->
  timer), their repeats taken in turn, in alternating order (a b, b a, a b,
  ...), so that the GPU's clocks, which move with its power draw over a
  row's seconds, move every implementation of a row alike. `repeats`
  defaults to the JAXCRAFT_BENCH_REPEATS variable, else `default`."""
  samples = {name: [timer.first] for name, timer in timers.items()}
  names = list(timers)
  for r in range(_repeats(repeats, default) - 1):
    for name in (names if r % 2 else names[::-1]):
      samples[name].append(timers[name].sample())
  return {name: float(np.median(s)) for name, s in samples.items()}


def kernel_seconds(step, carry, *consts, match: str, n: int = 8) -> float:
  """GPU seconds per step in the kernels whose names contain `match`, from a
  profiler trace of an unrolled chain of `n` steps: the op's own kernel
  without the glue a chain may need to feed an output back as an input
  (time_step counts that glue, a small XLA fusion and its launch)."""
  import tempfile

  from kernel_trace import trace_kernels
  chain = _chain(step, n, True)
  run_once = lambda: jax.block_until_ready(chain(carry, *consts))
  run_once()  # compile + warm up outside the trace
  with tempfile.TemporaryDirectory() as trace_dir:
    rows, _, _ = trace_kernels(run_once, trace_dir)
  us = sum(us for name, us, _ in rows if match in name)
  if not us:
    raise RuntimeError(f"no kernel named *{match}* in the trace: {[r[0][:60] for r in rows]}")
  return us / n * 1e-6


def kernel_fields(step, carry, *consts, match: str, nbytes: int, bandwidth: float):
  """kernel_seconds as a result row's fields (kernel_us, kernel_pct_copy)
  and a note to print; a failed trace gives no fields and says why."""
  try:
    sec = kernel_seconds(step, carry, *consts, match=match)
  except Exception as e:  # noqa: BLE001 - the trace is extra; the row stands without it
    return {}, f"  (kernel trace failed: {type(e).__name__}: {str(e)[:160]})"
  pct = 100 * nbytes / sec / bandwidth
  return dict(kernel_us=sec * 1e6, kernel_pct_copy=pct), f"  (kernel {sec * 1e6:.1f} us, {pct:.1f}%)"


def copy_bandwidth(nbytes=1 << 30) -> float:
  """The device's read+write bandwidth in bytes/s: an elementwise bitwise
  NOT over a large uint32 array (one read and one write per element). On
  the H200 XLA's bf16 negate reached only 3.33 TB/s where float32 and
  uint32 loops reach 4.21-4.24 TB/s, the device copy's 4.27 TB/s."""
  x = jnp.zeros((nbytes // 4,), jnp.uint32)
  seconds = time_step(lambda c: ~c, x, custom_call=False)
  return 2 * x.size * x.dtype.itemsize / seconds
