"""Decode under Nsight Compute (`bench/gpu_check.sh decode profile_decode`):
one call each of jaxcraft's kernels and cuDNN's per benchmark shape, between
cuProfilerStart and cuProfilerStop, after a warm-up call, so that compilation
and autotuning stay outside the profile. Run under
`ncu --profile-from-start off`. PROFILE_DECODE_SHAPES="256 x 1k,1 x 128k"
picks shapes (DecodeSpec names; default: all of DECODE_SPECS).
"""

from __future__ import annotations

import os

import jax

import decode
from kernel_trace import profile_once

IMPLS = ("jaxcraft", "cudnn")


def main():
  for spec in decode.specs_named(os.environ.get("PROFILE_DECODE_SHAPES", "")):
    q, caches = decode._inputs(spec)
    dense = caches["dense"]
    impls = decode._impls(spec)
    for name in IMPLS:
      fn = jax.jit(impls[name][0])
      jax.block_until_ready(fn(q, *dense))
      profile_once(lambda: jax.block_until_ready(fn(q, *dense)))
      print(f"profiled {name} {spec.name}", flush=True)


if __name__ == "__main__":
  main()
