"""Power, SM clock and energy per step of attention rows run without pause, jaxcraft
beside cuDNN: for rows whose chain cells trail a profiler trace's kernel times (the
clock falls under a sustained load).

  python bench/attention_power.py D256S16384 D128S16384 [--mode fwd] [--seconds 6]
    [--rounds 2] [--out power.json]

Each implementation's 64-step chain (bench/timing.py's, unrolled) runs back to back
for --seconds, in turn with the other's (rounds of jaxcraft, cuDNN), while
`nvidia-smi` samples power, SM clock, temperature and the active clock-event
reasons every 50 ms. Per window: time per step (wall time over the steps run),
mean power and clock over its second half (the clock has settled by then),
and energy per step = mean power x time per step. Row names as in
bench/attention_profile.py."""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import tempfile
import time

import jax
import numpy as np

import attention
import timing
from attention_profile import spec_of

FIELDS = "timestamp,power.draw,clocks.sm,temperature.gpu"
CHAIN = 64


def _query(fields):
  return subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                        capture_output=True, text=True)


def _sampler():
  # Older drivers name the reasons "throttle".
  reasons = next((f for f in ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
                  if _query(f).returncode == 0), None)
  fields = f"{FIELDS},{reasons}" if reasons else FIELDS
  # Into a file, not a pipe: unread, a pipe's buffer fills in under a
  # minute of samples and nvidia-smi stops sampling.
  log = tempfile.TemporaryFile("w+")
  proc = subprocess.Popen(
      ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "50"],
      stdout=log, text=True)
  return proc, log


def _samples(text):
  rows = []
  for line in text.splitlines():
    f = [x.strip() for x in line.split(",")]
    try:
      t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
      rows.append((t, float(f[1]), float(f[2]), float(f[3]), int(f[4], 16) if len(f) > 4 else 0))
    except (ValueError, IndexError):
      continue  # a header or a field the driver reports as N/A
  return rows


def _window(step, q, k, v, seconds):
  """Runs the chain back to back for `seconds`: (start, end, seconds per step)."""
  calls, t0, last = 0, time.time(), None
  while time.time() - t0 < seconds:
    q = step(q, k, v)
    calls += 1
    # At most two chains queued: the window ends on time, and the device
    # never waits for the host.
    if last is not None:
      jax.block_until_ready(last)
    last = q
  jax.block_until_ready(q)
  t1 = time.time()
  return t0, t1, (t1 - t0) / (calls * CHAIN)


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("rows", nargs="+")
  parser.add_argument("--mode", choices=("fwd", "fwd+bwd"), default="fwd")
  parser.add_argument("--seconds", type=float, default=6.0)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  print("power limit, max SM clock:",
        _query("power.limit,clocks.max.sm").stdout.strip())
  windows = []
  sampler, log = _sampler()
  for row in args.rows:
    spec = spec_of(row)
    q, k, v = attention.inputs(spec)
    steps = {}
    for name, fn in attention._impls(spec).items():
      if name in ("jaxcraft", "cudnn"):
        step = (attention._fwd_bwd if args.mode == "fwd+bwd" else attention._fwd)(fn)
        steps[name] = timing._chain(step, CHAIN, True)
        jax.block_until_ready(steps[name](q, k, v))  # compile + warm up
    for r in range(args.rounds):
      for name, step in steps.items():
        t0, t1, per_step = _window(step, q, k, v, args.seconds)
        windows.append(dict(row=row, impl=name, round=r, t0=t0, t1=t1, us=per_step * 1e6))
  sampler.terminate()
  sampler.wait()
  log.seek(0)
  samples = _samples(log.read())
  print(f"{'row':12s} {'impl':9s} {'us/step':>8s} {'W':>6s} {'MHz':>6s} {'C':>4s} "
        f"{'mJ/step':>8s}  reasons")
  for w in windows:
    mid = (w["t0"] + w["t1"]) / 2
    s = [x for x in samples if mid <= x[0] <= w["t1"]]
    if not s:
      print(f"{w['row']:12s} {w['impl']:9s} {w['us']:8.1f}  (no samples)")
      continue
    w["watts"], w["mhz"], w["celsius"] = (float(np.mean([x[i] for x in s])) for i in (1, 2, 3))
    w["reasons"] = sorted({hex(x[4]) for x in s})
    w["mj"] = w["watts"] * w["us"] * 1e-3
    print(f"{w['row']:12s} {w['impl']:9s} {w['us']:8.1f} {w['watts']:6.0f} {w['mhz']:6.0f} "
          f"{w['celsius']:4.0f} {w['mj']:8.2f}  {' '.join(w['reasons'])}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(mode=args.mode, windows=windows, samples=samples), f)


if __name__ == "__main__":
  main()
