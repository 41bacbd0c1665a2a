"""Where an attention row's time goes: GPU time per kernel of one jitted fwd+bwd step
(bench/attention.py's step), jaxcraft beside cuDNN, from the JAX profiler's trace.

  python bench/attention_profile.py D64S4096c D128S2048 ... [--trace-dir DIR] [--mode fwd]
    [--chain N] (N steps unrolled as in the benchmark's cells: the idle gaps between calls)
    [--impls jaxcraft,cudnn,tokamax] (which of the benchmark's implementations; default
    jaxcraft,cudnn)
  ncu --profile-from-start off ... python bench/attention_profile.py D64S512c --ncu
    (one step of each between cuProfilerStart/Stop, for Nsight Compute, instead of the trace)

A row name is D<head dim>S<seqlen>, with a trailing c for causal (16k tokens, as in the
sweep)."""

from __future__ import annotations

import argparse
import re
import tempfile

import jax

import attention
import timing
from kernel_trace import print_kernel_times, profile_once, trace_kernels
from specs import AttentionSpec


def spec_of(name: str) -> AttentionSpec:
  m = re.fullmatch(r"D(\d+)S(\d+)(c?)", name)
  if not m:
    raise SystemExit(f"row {name!r}: expected D<head dim>S<seqlen>[c], e.g. D64S4096c")
  return AttentionSpec(int(m[1]), int(m[2]), bool(m[3]))


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("rows", nargs="+")
  parser.add_argument("--mode", choices=("fwd", "fwd+bwd"), default="fwd+bwd")
  parser.add_argument("--trace-dir", default=None)
  parser.add_argument("--ncu", action="store_true")
  parser.add_argument("--chain", type=int, default=1)
  parser.add_argument("--impls", default="jaxcraft,cudnn")
  args = parser.parse_args()
  trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="attn_trace_")
  for row in args.rows:
    spec = spec_of(row)
    q, k, v = attention.inputs(spec)
    for name, fn in attention._impls(spec).items():
      if name not in args.impls.split(","):
        continue
      step = (attention._fwd_bwd if args.mode == "fwd+bwd" else attention._fwd)(fn)
      step = timing._chain(step, args.chain, True) if args.chain > 1 else jax.jit(step)
      jax.block_until_ready(step(q, k, v))  # compile + warm up
      if args.ncu:
        profile_once(lambda: jax.block_until_ready(step(q, k, v)))
        continue
      rows, span, gaps = trace_kernels(lambda: jax.block_until_ready(step(q, k, v)),
                                       f"{trace_dir}/{row}_{name}")
      print_kernel_times(f"{spec.name} {name} {args.mode} x{args.chain}", rows, span, gaps, top=12)


if __name__ == "__main__":
  main()
