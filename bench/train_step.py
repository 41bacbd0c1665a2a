"""One GPT training step (forward + backward + Adam, jitted, parameters and optimizer state
donated) of jaxcraft/examples/gpt.py's model, three ways:

  jaxcraft  jaxcraft.nn.TransformerBlock (fused residual + RMSNorm kernel, flash attention,
            SwiGLU through jaxcraft.swiglu)
  flax      the stock flax.linen block with XLA's attention (materializes B x N x S x S logits)
  cudnn     the stock flax.linen block with cuDNN's fused attention as its attention_fn

Each variant runs in a fresh process, because the peak-memory counter is process-wide and
cannot be reset. `python bench/train_step.py --model jaxcraft [--spec quick]` measures one
variant and prints its row as JSON; `run` (bench/run.py --ops train) runs all three.
`--profile DIR` prints the variant's GPU time per kernel and its idle gaps instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import jax
import numpy as np
import optax

from jaxcraft.examples import gpt
from kernel_trace import print_kernel_times, trace_kernels
from specs import TRAIN_SPECS

VARIANTS = ("jaxcraft", "flax", "cudnn")
# Steps are long (~0.1 s and up): wall time around a blocked step is accurate enough, and the
# median of a few after two warm-up steps (the first compiles) is stable.
WARMUP, STEPS = 2, 10


def cudnn_attention(query, key, value, mask=None):
  """`attention_fn` for flax.linen.MultiHeadDotProductAttention running cuDNN's fused
  attention. The stock block's only mask is its causal mask: is_causal=True stands in for it,
  so cuDNN skips the masked tiles instead of reading a [B, 1, S, S] float mask. (Flax passes
  only the arguments this signature names.)"""
  del mask
  return jax.nn.dot_product_attention(query, key, value, is_causal=True, implementation="cudnn")


def _setup(variant: str, spec):
  """The variant's jitted step, fresh parameters and optimizer state, and a token batch."""
  config = gpt.Config(vocab=spec.vocab, seq_len=spec.seqlen, batch=spec.batch,
                      layers=spec.layers, d_model=spec.d_model, heads=spec.heads,
                      mlp_hidden=spec.mlp_hidden, dtype="bfloat16")
  model = gpt.make_model("jaxcraft" if variant == "jaxcraft" else "flax", config,
                         attention_fn=cudnn_attention if variant == "cudnn" else None)
  optimizer = optax.adam(config.lr)
  params = gpt.init_params(config)
  opt_state = jax.jit(optimizer.init)(params)
  step = gpt.make_train_step(model, optimizer)
  tokens = jax.random.randint(jax.random.key(1), (spec.batch, spec.seqlen + 1), 0, spec.vocab)
  return step, params, opt_state, tokens


def measure(variant: str, spec_name: str) -> dict:
  """Two step times: `ms`, the median of steps each waited for (dispatch latency included),
  and `pipelined_ms`, steps dispatched back to back and waited for once, as a training loop
  runs them (the host prepares step i + 1 while the GPU runs step i)."""
  spec = TRAIN_SPECS[spec_name]
  step, params, opt_state, tokens = _setup(variant, spec)
  times = []
  for i in range(WARMUP + STEPS):
    t0 = time.perf_counter()
    params, opt_state, loss = jax.block_until_ready(step(params, opt_state, tokens))
    if i >= WARMUP:
      times.append(time.perf_counter() - t0)
  sec = float(np.median(times))
  t0 = time.perf_counter()
  for _ in range(STEPS):
    params, opt_state, loss = step(params, opt_state, tokens)
  jax.block_until_ready(loss)
  pipelined = (time.perf_counter() - t0) / STEPS
  peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")  # None on CPU
  # The loss is a cross-check between rows: from the same init and batch, variants that train
  # the same model agree to bf16 accuracy after the same steps.
  return dict(op="train", shape=spec.name, impl=variant, ms=sec * 1e3,
              pipelined_ms=pipelined * 1e3, tokens_per_s=spec.tokens / sec,
              tflops=spec.flops() / sec / 1e12,
              peak_gib=None if peak is None else peak / 2 ** 30, loss=float(loss))


def kernel_times(variant: str, spec_name: str, trace_dir: str, steps: int = 3) -> list:
  """Per step, over `steps` traced steps (after the warm-up), from the JAX profiler's Perfetto
  trace: GPU time per kernel name [(name, us, calls)], largest first; the device span (first
  kernel's start to last kernel's end) in us; idle gaps {(kernel before, kernel after): us}.
  Where the gap to a peer comes from, kernel by kernel."""
  step, params, opt_state, tokens = _setup(variant, TRAIN_SPECS[spec_name])
  for _ in range(WARMUP):
    params, opt_state, _ = jax.block_until_ready(step(params, opt_state, tokens))
  state = [params, opt_state]

  def one_step():  # parameters and optimizer state are donated: carry the new ones
    state[0], state[1], _ = jax.block_until_ready(step(*state, tokens))

  return trace_kernels(one_step, trace_dir, steps)


def _spec_name() -> str:
  if jax.default_backend() == "cpu":
    return "smoke"  # a full-size step takes minutes on a CPU
  return "quick" if os.environ.get("JAXCRAFT_BENCH_QUICK") else "full"


def run(bandwidth: float):
  del bandwidth
  spec_name = _spec_name()
  print(f"  {TRAIN_SPECS[spec_name].name} ({spec_name}), median of {STEPS} steps", flush=True)
  rows = []
  for variant in VARIANTS:
    proc = subprocess.run([sys.executable, __file__, "--model", variant, "--spec", spec_name],
                          capture_output=True, text=True)
    if proc.returncode:  # a peer that fails is reported, not fatal
      errors = [line for line in proc.stderr.splitlines()
                if re.match(r"[\w.]+(Error|Exception): ", line)]
      reason = errors[-1] if errors else f"exit code {proc.returncode}"
      print(f"  {variant:9s} failed: {reason[:160]}", flush=True)
      continue
    rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    r = rows[-1]
    peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
    print(f"  {variant:9s} {r['ms']:9.2f} ms (pipelined {r['pipelined_ms']:.2f}) "
          f"{r['tokens_per_s']:10.0f} tokens/s "
          f"{r['tflops']:6.1f} TFLOP/s  peak {peak} GiB  loss {r['loss']:.4f}", flush=True)
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", choices=VARIANTS, required=True)
  parser.add_argument("--spec", choices=tuple(TRAIN_SPECS), default="full")
  parser.add_argument("--profile", metavar="DIR",
                      help="trace 3 steps into DIR and print GPU time per kernel instead")
  args = parser.parse_args()
  if args.profile:
    print_kernel_times(args.model, *kernel_times(args.model, args.spec, args.profile))
    return
  print(json.dumps(measure(args.model, args.spec)))


if __name__ == "__main__":
  main()
