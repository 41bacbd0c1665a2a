"""GPU time per kernel name, from the JAX profiler's Perfetto trace of a few calls."""

from __future__ import annotations

import collections
import ctypes
import glob
import gzip
import json
import os
import re

import jax


def profile_once(run_once):
  """One call of `run_once` between cuProfilerStart and cuProfilerStop, for Nsight Compute
  under `ncu --profile-from-start off` (warm it up first, so that compilation and
  autotuning stay outside the profile)."""
  cuda = ctypes.CDLL("libcuda.so.1")  # the driver API: present wherever the GPU is
  cuda.cuProfilerStart()
  run_once()
  cuda.cuProfilerStop()


def trace_events(run_once, trace_dir: str, steps: int = 1):
  """The Perfetto trace events of `steps` calls of `run_once` (which blocks until its step
  is done; warm it up first), traced into `trace_dir`."""
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(steps):
      run_once()
  path = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                          recursive=True))[-1]
  return json.load(gzip.open(path))["traceEvents"]


def trace_kernels(run_once, trace_dir: str, steps: int = 3):
  """Traces `steps` calls of `run_once` (see trace_events); kernel_times of the trace."""
  return kernel_times(trace_events(run_once, trace_dir, steps), steps)


def kernel_times(events, steps: int):
  """Per step of a trace of `steps` calls: GPU time per kernel name [(name, us, calls)],
  largest first; the device span (first kernel's start to last kernel's end) in us; idle gaps
  {(kernel before, kernel after): us}."""
  names = {(e["pid"], e.get("tid"), e["name"]): str(e.get("args", {}).get("name", ""))
           for e in events if e.get("ph") == "M"}
  gpu = {pid for (pid, _, kind), name in names.items() if kind == "process_name" and "GPU" in name}
  # The device's stream lines hold the kernels ("XLA Ops"/"XLA Modules" lines repeat them).
  streams = {(pid, tid) for (pid, tid, kind), name in names.items()
             if pid in gpu and kind == "thread_name" and name.startswith("Stream")}
  if not streams:
    raise RuntimeError(f"no GPU stream in the trace; its lines: {sorted(set(names.values()))}")
  kernels = sorted((e["ts"], e.get("dur", 0), e["name"]) for e in events
                   if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in streams)
  total, calls = collections.Counter(), collections.Counter()
  # Idle device time between a kernel's end and the next start, by the pair around it.
  gaps, end, before = collections.Counter(), None, None
  for ts, dur, name in kernels:
    total[name] += dur / steps
    calls[name] += 1 / steps
    if end is not None and ts > end:
      gaps[(before[:60], name[:60])] += (ts - end) / steps
    if end is None or ts + dur > end:
      end, before = ts + dur, name
  rows = [(name, us, calls[name]) for name, us in total.most_common()]
  return rows, (end - kernels[0][0]) / steps, gaps


def host_times(events):
  """name -> [count, total us] of every host-thread event of a trace but Python's frames
  ("$file:line name"); one name per op and call kind (instance numbers and CUDA graph ids
  dropped)."""
  procs = {e["pid"]: str(e.get("args", {}).get("name", "")) for e in events
           if e.get("ph") == "M" and e["name"] == "process_name"}
  out = collections.defaultdict(lambda: [0, 0.0])
  for e in events:
    proc = procs.get(e.get("pid"), "")
    if (e.get("ph") == "X" and "GPU" not in proc and "/device" not in proc
        and not e["name"].startswith("$")):
      name = re.sub(r"\.\d+$|\s*\(CudaGraph:\d+\)", "", e["name"])[:70]
      out[name][0] += 1
      out[name][1] += e.get("dur", 0)
  return out


def print_kernel_times(label: str, rows, span, gaps, top: int = 40):
  print(f"{label}: device span {span / 1e3:.3f} ms per step, idle "
        f"{sum(gaps.values()) / 1e3:.3f} ms; largest idle gaps (us per step):")
  for (before, after), us in gaps.most_common(8):
    print(f"  {us:8.1f}  {before}  ->  {after}")
  print(f"{label}: GPU kernel time {sum(r[1] for r in rows) / 1e3:.3f} ms per step")
  for name, us, n in rows[:top]:
    print(f"{us:10.1f} us {n:6.1f} calls  {name[:150]}")
