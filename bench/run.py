"""One command for every benchmark: `python bench/run.py [--ops norm,...] [--out DIR]`.

Prints a table, writes results.json and PNG plots into --out (default bench/out)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

import timing  # noqa: E402

MODULES = {"train": "train_step"}  # op -> bench module, where the names differ


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--ops", default="norm", help="comma-separated: norm, attention, variants, decode, train, ring"
                      ", activations, embedding, softmax, model, row_counts")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out"))
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  if "train" in args.ops.split(","):
    # The train benchmark runs in child processes; they need the device memory this process
    # would otherwise reserve (read when the backend starts, at jax.devices() below).
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

  device = jax.devices()[0]
  bandwidth = timing.copy_bandwidth()
  meta = dict(device=device.device_kind, platform=device.platform, jax=jax.__version__,
              date=datetime.date.today().isoformat(), copy_gbps=bandwidth / 1e9)
  print(f"device {meta['device']} ({meta['platform']}), jax {meta['jax']}, "
        f"copy bandwidth {meta['copy_gbps']:.0f} GB/s", flush=True)
  results = dict(meta=meta)
  for op in args.ops.split(","):
    module = __import__(MODULES.get(op, op))
    print(f"== {op}", flush=True)
    results[op] = module.run(bandwidth)
    # After each op: a run stopped by a time limit keeps the ops it finished.
    (out / "results.json").write_text(json.dumps(results, indent=1))
  import plots  # noqa: E402 - matplotlib only when writing plots
  plots.write_all(results, out)
  print(f"wrote {out}/results.json and plots")


if __name__ == "__main__":
  main()
