"""What the decode bench's chain cells hold: each implementation's two chains
(S and L steps, as `timing.ChainTimer` builds them: decode.CHAIN's S is
timing.GRAPH_STEPS) timed by host wall clock and, in separate runs of the same
executables under the profiler, by their device span (first kernel's start to
last kernel's end). Per step, each is (long - short) / (L - S); wall minus
span is host time the cell counts.
jaxcraft and cuDNN alternate, in one process.

  python bench/decode_chain_spans.py ["1 x 128k,256 x 1k"] [rounds] [short chain length]

(the bench's chains, decode.CHAIN, unless a short length is given: 2 gives
chains too short for XLA's CUDA graphs, see timing.GRAPH_STEPS)
"""

from __future__ import annotations

import sys
import tempfile

import jax
import numpy as np
from kernel_trace import trace_kernels
from timing import ChainTimer, _wall

import decode

IMPLS = ("jaxcraft", "cudnn")


def _span(fn, q, consts):
  """Device span of one run of `fn`, the long-chain kernels' mean times, idle gaps."""
  with tempfile.TemporaryDirectory() as trace_dir:
    return trace_kernels(lambda: jax.block_until_ready(fn(q, *consts)), trace_dir, steps=1)


def main():
  rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
  for spec in decode.specs_named(sys.argv[1] if len(sys.argv) > 1 else ""):
    q, caches = decode._inputs(spec)
    consts = caches["dense"]
    impls = decode._impls(spec)
    chain = dict(decode.CHAIN, short=int(sys.argv[3])) if len(sys.argv) > 3 else decode.CHAIN
    timers = {n: ChainTimer(impls[n][0], q, *consts, **chain) for n in IMPLS}
    walls = {n: {"short": [], "long": []} for n in IMPLS}
    spans = {n: {"short": [], "long": []} for n in IMPLS}
    kernels, idle = {}, {n: [] for n in IMPLS}
    for r in range(rounds):
      for n in (IMPLS if r % 2 else IMPLS[::-1]):
        t = timers[n]
        for length, fn in (("short", t._short_fn), ("long", t._long_fn)):
          walls[n][length].append(_wall(fn, q, consts, 5) * 1e6)
          rows, span, gaps = _span(fn, q, consts)
          spans[n][length].append(span)
          if length == "long":
            kernels[n] = rows
            idle[n].append(sum(gaps.values()))
    for n in IMPLS:
      t = timers[n]
      steps = t.long - t.short
      ws, wl = (float(np.median(walls[n][x])) for x in ("short", "long"))
      ss, sl = (float(np.median(spans[n][x])) for x in ("short", "long"))
      print(f"{spec.name:9s} {n:9s} chains {t.short}/{t.long}: per step wall {(wl - ws) / steps:6.1f} "
            f"span {(sl - ss) / steps:6.1f} us (long span / steps {sl / t.long:6.1f}); "
            f"wall - span: short {ws - ss:6.1f}, long {wl - sl:6.1f} us; "
            f"idle in the long chain {float(np.median(idle[n])):5.1f} us", flush=True)
      for name, us, calls in kernels[n][:4]:
        print(f"    {us / t.long:8.2f} us/step  {calls / t.long:5.2f} calls/step  {name[:90]}")


if __name__ == "__main__":
  main()
