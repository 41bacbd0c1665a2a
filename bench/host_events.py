"""The host's launch calls for the decode bench's two chains, jaxcraft beside
cuDNN: driver launches (kernels, CUDA graphs) and XLA's command-buffer and
thunk events, with counts and host time, from the JAX profiler's Perfetto
trace of one call of each chain. Shows whether a chain runs as a CUDA graph
(command buffer) or launch by launch.

  python bench/host_events.py ["1 x 128k,8 x 32k"]
"""

from __future__ import annotations

import re
import sys
import tempfile

import jax
from kernel_trace import host_times, trace_events
from timing import ChainTimer

import decode

# Driver launches and XLA's command-buffer and thunk events.
LAUNCHES = re.compile(r"Launch|command_buffer|Thunk")


def host_events(fn, q, consts):
  """(name -> [count, total us]) of every host-thread event in one traced call."""
  run_once = lambda: jax.block_until_ready(fn(q, *consts))
  run_once()  # compile + warm up outside the trace
  with tempfile.TemporaryDirectory() as trace_dir:
    events = trace_events(run_once, trace_dir)
  return host_times(events)


def main():
  for spec in decode.specs_named(sys.argv[1] if len(sys.argv) > 1 else "1 x 128k,8 x 32k"):
    q, caches = decode._inputs(spec)
    consts = caches["dense"]
    impls = decode._impls(spec)
    for name in ("jaxcraft", "cudnn"):
      t = ChainTimer(impls[name][0], q, *consts, **decode.CHAIN)
      for length, fn, steps in (("short", t._short_fn, t.short), ("long", t._long_fn, t.long)):
        events = host_events(fn, q, consts)
        print(f"{spec.name} {name} {length} chain ({steps} steps): host calls (count, total us)",
              flush=True)
        for k, (n, us) in sorted(events.items(), key=lambda kv: -kv[1][1]):
          if LAUNCHES.search(k):
            print(f"   {n:5d} x {us:9.1f} us  {k}")


if __name__ == "__main__":
  main()
