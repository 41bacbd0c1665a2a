"""End to end: jaxcraft/examples/decoder.py's decoder with each backend, from the same
parameters in one process, tokens/s of

  train     one jitted AdamW step (float32 parameters and optimizer state, donated; bf16
            activations) on B x T tokens, 16k tokens per step: 8 x 2k and 2 x 8k
  prefill   one jitted prefill (bf16 weights) of B x T prompt tokens into an empty cache, the
            same 16k-token shapes: the prompt phase of serving a batch
  generate  greedy token-by-token generation of STEPS tokens (bf16 weights) after a cache that
            already holds `cache` tokens per sequence (random K/V: no prefill is run), at batch
            1, 8, 64 x cache 1k, 8k, 32k; two modes:
              python  a jitted step (decode_step + argmax) called from a Python loop, the cache
                      donated: wall clock of STEPS calls, host dispatch included
              while   one jitted lax.while_loop of STEPS steps: wall clock of one call

The two models (MODELS): 8 layers, d_model 2048, SwiGLU 5632, vocab 32000, tied embedding;
head dim 128 with 16 query / 4 KV heads (Llama-style), or head dim 256 with 8 query / 4 KV
heads, a 512-token window on alternating layers and attention soft cap 50 (Gemma-style).

Variants (decoder.BACKENDS): "jaxcraft"; "xla" (stock JAX); "cudnn" (stock with jax.nn's cuDNN
attention where jax.nn can express the layer: never with a soft cap, not in windowed decode
layers; GPU only). A variant whose every attention call would run the xla path is skipped.
Each row times its variants' repetitions in alternating order (timing.time_interleaved),
after one untimed warm-up call that compiles; the median of JAXCRAFT_BENCH_REPEATS (default 5)
timings. Compiles per row: one per variant for train and prefill; two per variant for
generate (the python mode's step, reused for every call, and the while program).

Filters (comma-separated; default all): JAXCRAFT_BENCH_MODEL_PARTS (train,prefill,generate),
_HEAD_DIMS (128,256), _VARIANTS (jaxcraft,xla,cudnn), _MODES (python,while); sizes, any
value: _SEQS (train/prefill sequence lengths 2048,8192), _BATCHES (generate batch 1,8,64),
_CACHES (generate cache 1024,8192,32768); JAXCRAFT_BENCH_MODEL_STEPS (generated tokens per
timing, 32);
JAXCRAFT_BENCH_MODEL_SOFT_CAP (the head-dim-256 model's cap, 50; 0: none, which lets cuDNN run
its attention). JAXCRAFT_BENCH_SMOKE=1: tiny models and shapes (CPU plumbing check; the numbers
mean nothing).

`python bench/model.py --profile DIR --variant jaxcraft --batch 8 --cache 1024 --head-dim 256`
traces PROFILE_STEPS python-mode generation steps into DIR (jax.profiler, Perfetto) and prints
the host dispatch time per step, the wall time per step, and GPU time per kernel;
`--part train` or `--part prefill` (with `--seq`) traces one training step or prefill.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from timing import time_interleaved  # noqa: E402

from jaxcraft.examples import decoder  # noqa: E402

PARTS = ("train", "prefill", "generate")
MODES = ("python", "while")
TOKENS_PER_BATCH = 16384  # train and prefill: batch = TOKENS_PER_BATCH // sequence length
LEARNING_RATE = 1e-4
PROFILE_STEPS = 10

_BASE = decoder.Config(vocab=32000, d_model=2048, layers=8, mlp_hidden=5632)
MODELS = {
    128: dataclasses.replace(_BASE, heads=16, kv_heads=4, head_dim=128),
    256: dataclasses.replace(_BASE, heads=8, kv_heads=4, head_dim=256, local_window_size=512,
                             logit_soft_cap=50.0),
}


@dataclasses.dataclass(frozen=True)
class Grid:
  """The rows a run covers (before the JAXCRAFT_BENCH_MODEL_* filters)."""
  models: dict
  seqs: tuple = (2048, 8192)
  tokens_per_batch: int = TOKENS_PER_BATCH
  batches: tuple = (1, 8, 64)
  caches: tuple = (1024, 8192, 32768)
  steps: int = 32
  repeats: int = 5  # when JAXCRAFT_BENCH_REPEATS is unset


FULL = Grid(MODELS)
# The same layout, tiny: two layers, 2 query / 1 KV heads, window 16 (the CPU smoke check).
_SMOKE_BASE = decoder.Config(vocab=512, d_model=256, layers=2, heads=2, kv_heads=1,
                             mlp_hidden=512)
SMOKE = Grid({128: dataclasses.replace(_SMOKE_BASE, head_dim=128),
              256: dataclasses.replace(_SMOKE_BASE, head_dim=256, local_window_size=16,
                                       logit_soft_cap=50.0)},
             seqs=(64,), tokens_per_batch=128, batches=(2,), caches=(32,), steps=4, repeats=2)


def _wanted(name, default, any_value=False):
  """The values JAXCRAFT_BENCH_MODEL_<name> lists (default: `default`, a tuple); they must be
  among `default` unless `any_value` (sizes)."""
  value = os.environ.get(f"JAXCRAFT_BENCH_MODEL_{name}")
  if not value:
    return default
  kind = type(default[0])
  wanted = tuple(kind(v) for v in value.split(",") if v)
  unknown = [v for v in wanted if v not in default]
  if unknown and not any_value:
    raise ValueError(f"JAXCRAFT_BENCH_MODEL_{name}: {unknown} not among {default}")
  return wanted


def _grid() -> Grid:
  grid = SMOKE if os.environ.get("JAXCRAFT_BENCH_SMOKE") else FULL
  models = {d: grid.models[d] for d in _wanted("HEAD_DIMS", tuple(grid.models))}
  if cap := os.environ.get("JAXCRAFT_BENCH_MODEL_SOFT_CAP"):
    cap = float(cap) or None
    models = {d: dataclasses.replace(c, logit_soft_cap=cap) if c.logit_soft_cap else c
              for d, c in models.items()}
  steps = int(os.environ.get("JAXCRAFT_BENCH_MODEL_STEPS", grid.steps))
  return dataclasses.replace(grid, models=models, seqs=_wanted("SEQS", grid.seqs, True),
                             batches=_wanted("BATCHES", grid.batches, True),
                             caches=_wanted("CACHES", grid.caches, True), steps=steps)


def _variants(config: decoder.Config, decode: bool) -> list:
  """The variants to time for `config`: cuDNN only on a GPU and where it runs some layer."""
  variants = list(_wanted("VARIANTS", decoder.BACKENDS))
  if "cudnn" in variants:
    layers = sum(decoder.cudnn_runs(config, i, decode) for i in range(config.layers))
    if jax.default_backend() != "gpu" or not layers:
      variants.remove("cudnn")
      if jax.default_backend() == "gpu":
        print("  cudnn skipped: jax.nn's cuDNN attention runs in no layer of this model "
              "(soft cap)", flush=True)
  return variants


def _row(config: decoder.Config, part: str, variant: str, head_dim: int, *, decode: bool,
         **fields) -> dict:
  """A result row: the part, variant and model, then `fields` (shape, mode, times)."""
  note = ""
  if variant == "cudnn":
    layers = sum(decoder.cudnn_runs(config, i, decode) for i in range(config.layers))
    note = f"cuDNN attention in {layers}/{config.layers} layers, the xla path in the rest"
  return dict(op="model", part=part, variant=variant, head_dim=head_dim, layers=config.layers,
              d_model=config.d_model, heads=config.heads, kv_heads=config.kv_heads,
              window=config.local_window_size, soft_cap=config.logit_soft_cap, note=note,
              **fields)


class _Timer:
  """A blocked wall-clock call in time_interleaved's timer interface: `sample()` runs
  `prepare` (untimed), then times `call` (which blocks until its work is done); built after
  `warmup` untimed calls (the first one compiles)."""

  def __init__(self, call, prepare=lambda: None, warmup: int = 1):
    self._call, self._prepare = call, prepare
    for _ in range(warmup):
      prepare()
      call()
    self.first = self.sample()

  def sample(self) -> float:
    self._prepare()
    t0 = time.perf_counter()
    self._call()
    return time.perf_counter() - t0


def _timers(builders: dict, label: str, holder=None, make=None) -> dict:
  """name -> _Timer for each name -> (() -> _Timer) that builds; a variant that fails (cuDNN
  rejecting a shape, out of memory) is reported and left out. A failed call may have consumed
  the donated cache in holder["cache"]: then `make()` builds it again for the next variant."""
  timers = {}
  for name, build in builders.items():
    try:
      timers[name] = build()
    except Exception as e:  # noqa: BLE001 - one failing variant must not end the run
      print(f"  {label} {name} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
      if holder is not None and any(a.is_deleted() for a in jax.tree.leaves(holder["cache"])):
        _free(holder)
        holder["cache"] = make()
  return timers


def _report(rows: list, label: str) -> None:
  """Prints one row group (the variants of one shape and mode) with the ratios to stock."""
  speed = {r["variant"]: r["tokens_per_s"] for r in rows}
  for r in rows:
    print(f"  {label} {r['variant']:9s} {r['ms']:10.3f} ms {r['tokens_per_s']:12.0f} tokens/s",
          flush=True)
  ratios = [f"jaxcraft/{peer} {speed['jaxcraft'] / speed[peer]:.2f}x"
            for peer in ("xla", "cudnn") if "jaxcraft" in speed and peer in speed]
  if ratios:
    print(f"  {label} " + "  ".join(ratios), flush=True)


def _params(config: decoder.Config, dtype=None):
  """(graphdef, params) from one seed: every variant and part of a model starts from these."""
  graphdef, params = decoder.split(decoder.init(config, nnx.Rngs(0)))
  return graphdef, params if dtype is None else decoder.cast(params, dtype)


def _free(tree) -> None:
  """Releases the device buffers of `tree` now (the 32k-token caches reach 69 GB)."""
  for a in jax.tree.leaves(tree):
    if isinstance(a, jax.Array) and not a.is_deleted():
      a.delete()


# --------------------------------------------------------------------------- parts
def _train_rows(grid: Grid, head_dim: int, config: decoder.Config) -> list:
  graphdef, params = _params(config)
  optimizer = optax.adamw(LEARNING_RATE)
  rows = []
  for seq in grid.seqs:
    batch = grid.tokens_per_batch // seq
    tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, config.vocab)
    label = f"train    D{head_dim} {batch} x {seq}"
    states, first_loss = {}, {}

    def build(variant):
      step = decoder.jit_train_step(graphdef, optimizer, variant)
      # Each variant updates its own copy (the step donates it).
      states[variant] = [jax.tree.map(jnp.copy, params), optimizer.init(params)]

      def call():
        state = states[variant]
        state[0], state[1], loss = jax.block_until_ready(step(*state, tokens))
        first_loss.setdefault(variant, float(loss))
      return _Timer(call)

    variants = _variants(config, decode=False)
    timers = _timers({v: (lambda v=v: build(v)) for v in variants}, label)
    for failed in set(states) - set(timers):
      _free(states.pop(failed))
    group = []
    for variant, sec in time_interleaved(timers, default=grid.repeats).items():
      group.append(_row(config, "train", variant, head_dim, decode=False, batch=batch,
                        seqlen=seq, mode="step", ms=sec * 1e3, tokens_per_s=batch * seq / sec,
                        loss=first_loss[variant]))
    _report(group, label)
    # From the same parameters and tokens the first losses agree to bf16 accuracy.
    print(f"  {label} first-step loss " + " ".join(f"{r['variant']} {r['loss']:.4f}"
                                                   for r in group), flush=True)
    rows += group
    _free(states)
  _free(params)
  return rows


def _prefill_rows(grid: Grid, head_dim: int, config: decoder.Config) -> list:
  graphdef, params = _params(config, config.dtype)
  rows = []
  for seq in grid.seqs:
    batch = grid.tokens_per_batch // seq
    tokens = jax.random.randint(jax.random.key(1), (batch, seq), 0, config.vocab)
    label = f"prefill  D{head_dim} {batch} x {seq}"
    # One cache for every variant: each call donates it and returns the refilled one.
    make = lambda: decoder.init_cache(config, batch, seq)
    holder = {"cache": make()}

    def build(variant):
      run = decoder.jit_prefill(graphdef, variant)

      def call():
        logits, holder["cache"] = run(params, tokens, holder["cache"])
        jax.block_until_ready(logits)
      return _Timer(call)

    builders = {v: (lambda v=v: build(v)) for v in _variants(config, decode=False)}
    timers = _timers(builders, label, holder, make)
    group = []
    for variant, sec in time_interleaved(timers, default=grid.repeats).items():
      group.append(_row(config, "prefill", variant, head_dim, decode=False, batch=batch,
                        seqlen=seq, mode="step", ms=sec * 1e3, tokens_per_s=batch * seq / sec))
    _report(group, label)
    rows += group
    _free(holder)
  _free(params)
  return rows


def random_cache(config: decoder.Config, batch: int, filled: int, capacity: int):
  """A cache whose first `filled` positions per sequence hold random keys and values."""
  shape = (batch, capacity, config.kv_heads, config.head_dim)
  keys = jax.random.split(jax.random.key(2), 2 * config.layers)
  fill = lambda k: jax.random.normal(k, shape, config.dtype)
  return decoder.Cache(tuple(fill(k) for k in keys[:config.layers]),
                       tuple(fill(k) for k in keys[config.layers:]),
                       jnp.full((batch,), filled, jnp.int32))


def _generate_rows(grid: Grid, head_dim: int, config: decoder.Config) -> list:
  graphdef, params = _params(config, config.dtype)
  modes = _wanted("MODES", MODES)
  steps = grid.steps
  rows = []
  for batch in grid.batches:
    for filled in grid.caches:
      label = f"generate D{head_dim} B{batch} cache {filled}"
      tokens = jax.random.randint(jax.random.key(3), (batch,), 0, config.vocab)
      # One cache for every variant and mode (each call donates it); every timed call starts
      # from `filled` positions again, so the capacity only needs room for `steps` more.
      make = lambda: random_cache(config, batch, filled, filled + steps)
      holder = {"cache": make()}

      def rewind():
        lengths = jax.block_until_ready(jnp.full((batch,), filled, jnp.int32))
        holder["cache"] = holder["cache"]._replace(lengths=lengths)

      def build(variant, mode):
        if mode == "python":
          step = decoder.jit_sample_step(graphdef, variant)
          run = lambda c: decoder.generate_python(step, params, tokens, c, steps)
        else:
          loop = decoder.jit_generate_while(graphdef, steps, variant)
          run = lambda c: loop(params, tokens, c)

        def call():
          out, holder["cache"] = run(holder["cache"])
          jax.block_until_ready(out)
        return _Timer(call, prepare=rewind)

      builders = {(v, m): (lambda v=v, m=m: build(v, m))
                  for v in _variants(config, decode=True) for m in modes}
      times = time_interleaved(_timers(builders, label, holder, make), default=grid.repeats)
      for mode in modes:
        group = [_row(config, "generate", v, head_dim, decode=True, batch=batch, cache=filled,
                      mode=mode, steps=steps, ms=sec * 1e3 / steps,
                      tokens_per_s=batch * steps / sec)
                 for (v, m), sec in times.items() if m == mode]
        _report(group, f"{label} {mode:6s}")
        rows += group
      _free(holder)
  _free(params)
  return rows


def run(bandwidth: float):
  """bench/run.py's entry: every selected row; a list of dicts (ms: per step, or per
  generated token step for generate)."""
  del bandwidth
  grid = _grid()
  parts = _wanted("PARTS", PARTS)
  repeats = int(os.environ.get("JAXCRAFT_BENCH_REPEATS", grid.repeats))
  print(f"  parts {','.join(parts)}; head dims {list(grid.models)}; median of {repeats}",
        flush=True)
  rows = []
  for head_dim, config in grid.models.items():
    if "train" in parts:
      rows += _train_rows(grid, head_dim, config)
    if "prefill" in parts:
      rows += _prefill_rows(grid, head_dim, config)
    if "generate" in parts:
      rows += _generate_rows(grid, head_dim, config)
  return rows


# --------------------------------------------------------------------------- profile
def _print_trace(run_once, trace_dir: str, label: str, per: int, top_host: int = 20) -> None:
  """Traces one call of `run_once` into `trace_dir` and prints its GPU time per kernel and its
  longest host events, divided by `per` (the steps one call runs)."""
  from kernel_trace import host_times, kernel_times, print_kernel_times, trace_events
  events = trace_events(run_once, trace_dir)
  try:
    rows, span, gaps = kernel_times(events, per)
  except RuntimeError as e:  # no GPU stream (a CPU run): the trace is still written
    print(f"no kernel times: {e}"[:200])
  else:
    print_kernel_times(label, rows, span, gaps)
  print(f"{label}: longest host events (us per step, calls)")
  host = sorted(host_times(events).items(), key=lambda item: -item[1][1])
  for name, (count, us) in host[:top_host]:
    print(f"{us / per:10.1f} us {count / per:6.1f}  {name}")
  print(f"trace in {trace_dir}")


def _profile_generate(trace_dir: str, variant: str, config: decoder.Config, batch: int,
                      filled: int, steps: int) -> None:
  """Python-mode generation of `steps` tokens; prints the host time per dispatched step,
  the wall time per step, and GPU time per kernel per step."""
  graphdef, params = _params(config, config.dtype)
  step = decoder.jit_sample_step(graphdef, variant)
  tokens = jax.random.randint(jax.random.key(3), (batch,), 0, config.vocab)
  holder = {"cache": random_cache(config, batch, filled, filled + steps)}
  dispatch = []

  def run_once():
    cache = holder["cache"]._replace(lengths=jnp.full((batch,), filled, jnp.int32))
    jax.block_until_ready(cache.lengths)
    out, t = tokens, time.perf_counter()
    for _ in range(steps):
      out, cache = step(params, out, cache)
      now = time.perf_counter()
      dispatch.append(now - t)
      t = now
    jax.block_until_ready(out)
    holder["cache"] = cache

  run_once()  # compile
  dispatch.clear()
  t0 = time.perf_counter()
  run_once()
  wall = (time.perf_counter() - t0) / steps
  print(f"{variant} D{config.head_dim} B{batch} cache {filled}: host dispatch "
        f"{np.median(dispatch) * 1e6:.0f} us per step (median), wall {wall * 1e6:.0f} us "
        f"per step", flush=True)
  _print_trace(run_once, trace_dir, f"{variant} (per generated token)", steps)


def _profile_whole(trace_dir: str, part: str, variant: str, config: decoder.Config,
                   batch: int, seq: int) -> None:
  """One training step or one prefill of `batch` x `seq` tokens; prints its wall time and
  GPU time per kernel."""
  if part == "train":
    graphdef, params = _params(config)
    optimizer = optax.adamw(LEARNING_RATE)
    step = decoder.jit_train_step(graphdef, optimizer, variant)
    tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, config.vocab)
    state = [params, optimizer.init(params)]

    def run_once():
      state[0], state[1], loss = jax.block_until_ready(step(*state, tokens))
  else:
    graphdef, params = _params(config, config.dtype)
    run = decoder.jit_prefill(graphdef, variant)
    tokens = jax.random.randint(jax.random.key(1), (batch, seq), 0, config.vocab)
    holder = {"cache": decoder.init_cache(config, batch, seq)}

    def run_once():
      logits, holder["cache"] = run(params, tokens, holder["cache"])
      jax.block_until_ready(logits)

  run_once()  # compile
  walls = []
  for _ in range(3):
    t0 = time.perf_counter()
    run_once()
    walls.append(time.perf_counter() - t0)
  print(f"{variant} {part} D{config.head_dim} {batch} x {seq}: wall "
        f"{np.median(walls) * 1e3:.2f} ms (median of 3)", flush=True)
  _print_trace(run_once, trace_dir, f"{variant} {part}", 1)


def profile(trace_dir: str, part: str, variant: str, head_dim: int, *, batch: int = 8,
            cache: int = 1024, seq: int = 8192, steps: int = PROFILE_STEPS) -> None:
  grid = _grid()
  config = grid.models[head_dim]
  if part == "generate":
    _profile_generate(trace_dir, variant, config, batch, cache, steps)
  else:
    _profile_whole(trace_dir, part, variant, config, grid.tokens_per_batch // seq, seq)


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--profile", metavar="DIR", required=True,
                      help="trace the part into DIR")
  parser.add_argument("--part", choices=PARTS, default="generate")
  parser.add_argument("--variant", choices=decoder.BACKENDS, default="jaxcraft")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--cache", type=int, default=1024, help="filled cache positions")
  parser.add_argument("--head-dim", type=int, choices=tuple(MODELS), default=256)
  parser.add_argument("--seq", type=int, default=8192,
                      help=f"train/prefill sequence length ({TOKENS_PER_BATCH} tokens per step)")
  parser.add_argument("--steps", type=int, default=PROFILE_STEPS,
                      help="generated tokens traced")
  args = parser.parse_args()
  profile(args.profile, args.part, args.variant, args.head_dim, batch=args.batch,
          cache=args.cache, seq=args.seq, steps=args.steps)


if __name__ == "__main__":
  main()
