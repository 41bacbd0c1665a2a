"""PNG plots of bench results (bars: GB/s per shape and implementation)."""

from __future__ import annotations

import collections
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _norm_plot(rows, meta, path):
  ops = sorted({r["op"] for r in rows})
  fig, axes = plt.subplots(len(ops), 2, figsize=(12, 3 * len(ops)), squeeze=False)
  for i, op in enumerate(ops):
    for j, mode in enumerate(("fwd", "fwd+bwd")):
      ax = axes[i][j]
      sel = [r for r in rows if r["op"] == op and r["mode"] == mode]
      shapes = list(dict.fromkeys(r["shape"] for r in sel))
      impls = list(dict.fromkeys(r["impl"] for r in sel))
      width = 0.8 / max(len(impls), 1)
      by = collections.defaultdict(dict)
      for r in sel:
        by[r["impl"]][r["shape"]] = r["gbps"]
      for k, impl in enumerate(impls):
        ax.bar([x + k * width for x in range(len(shapes))],
               [by[impl].get(s, 0) for s in shapes], width, label=impl)
      ax.axhline(meta["copy_gbps"], color="k", ls="--", lw=1, label="copy")
      ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))], shapes)
      ax.set_title(f"{op} {mode}")
      ax.set_ylabel("GB/s")
      ax.legend(fontsize=7)
  fig.suptitle(f"{meta['device']} - bf16 - {meta['date']}")
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def write_all(results, out: pathlib.Path):
  if "norm" in results:
    _norm_plot(results["norm"], results["meta"], out / "norm.png")
