"""PNG plots of bench results (bars: GB/s per shape and implementation)."""

from __future__ import annotations

import collections
import pathlib
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _norm_plot(rows, meta, path):
  ops = sorted({r["op"] for r in rows})
  modes = [m for m in ("fwd", "bwd", "fwd+bwd") if any(r["mode"] == m for r in rows)]
  fig, axes = plt.subplots(len(ops), len(modes), figsize=(6 * len(modes), 3 * len(ops)), squeeze=False)
  for i, op in enumerate(ops):
    for j, mode in enumerate(modes):
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
      # Long shape names ("128k x 4096 16k ids skew90/100") wrap instead of overlapping.
      ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))],
                    [textwrap.fill(s, 16) for s in shapes], fontsize=7)
      ax.set_title(f"{op} {mode}")
      ax.set_ylabel("GB/s")
      ax.legend(fontsize=7)
  # Ops or shapes that name their dtype ("softmax float32") mix dtypes; the rest are bf16.
  named = any(" " in op for op in ops) or any("float32" in r["shape"] for r in rows)
  dtypes = "" if named else " - bf16"
  fig.suptitle(f"{meta['device']}{dtypes} - {meta['date']}")
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def _attention_plot(rows, meta, path):
  dims = sorted({r["head_dim"] for r in rows})
  fig, axes = plt.subplots(len(dims), 2, figsize=(12, 3.2 * len(dims)), squeeze=False)
  for i, d in enumerate(dims):
    for j, mode in enumerate(("fwd", "fwd+bwd")):
      ax = axes[i][j]
      for impl in dict.fromkeys(r["impl"] for r in rows):
        for causal, style in ((False, "-o"), (True, "--s")):
          sel = sorted((r for r in rows if r["head_dim"] == d and r["mode"] == mode
                        and r["impl"] == impl and r["causal"] == causal), key=lambda r: r["seqlen"])
          if sel:
            ax.plot([r["seqlen"] for r in sel], [r["tflops"] for r in sel], style,
                    label=f"{impl}{' causal' if causal else ''}")
      ax.set_xscale("log", base=2)
      ax.set_title(f"attention D={d} {mode}")
      ax.set_xlabel("sequence length")
      ax.set_ylabel("TFLOP/s")
      ax.legend(fontsize=7)
  dtypes = "/".join(sorted({r.get("dtype", "bfloat16") for r in rows}))  # older result files have no dtype
  fig.suptitle(f"{meta['device']} - {dtypes} - 16k tokens/batch, hidden 2048 - {meta['date']}")
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def _decode_plot(rows, meta, path):
  fig, ax = plt.subplots(figsize=(8, 3.5))
  shapes = list(dict.fromkeys(r["shape"] for r in rows))
  impls = list(dict.fromkeys(r["impl"] for r in rows))
  width = 0.8 / max(len(impls), 1)
  for k, impl in enumerate(impls):
    by_shape = {r["shape"]: r["gbps"] for r in rows if r["impl"] == impl}
    ax.bar([x + k * width for x in range(len(shapes))], [by_shape.get(s, 0) for s in shapes],
           width, label=impl)
  ax.axhline(meta["copy_gbps"], color="k", ls="--", lw=1, label="copy")
  ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))], shapes)
  ax.set_xlabel("B x S")
  ax.set_ylabel("GB/s of K + V")
  ax.legend(fontsize=7)
  ax.set_title(f"decode, 32/8 heads, D128, Tq 1 - {meta['device']} - bf16 - {meta['date']}")
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def _model_plot(rows, meta, path):
  """bench/model.py: jaxcraft's tokens/s over the best stock variant's (XLA or cuDNN) per
  row, one panel per part (generation: per mode)."""
  def panel(r):
    return r["part"] if r["part"] != "generate" else f"generate ({r['mode']})"

  def label(r):
    if r["part"] != "generate":
      return f"D{r['head_dim']} {r['batch']}x{r['seqlen']}"
    cache = f"{r['cache'] // 1024}k" if r["cache"] >= 1024 else str(r["cache"])
    return f"D{r['head_dim']} B{r['batch']} {cache}"

  order = lambda r: (r["head_dim"], r["batch"], r.get("seqlen") or r.get("cache") or 0)
  panels = list(dict.fromkeys(panel(r) for r in rows))
  fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.8 * len(panels)), squeeze=False)
  for ax, name in zip(axes[:, 0], panels):
    sel = sorted((r for r in rows if panel(r) == name), key=order)
    labels = list(dict.fromkeys(label(r) for r in sel))
    ours = {label(r): r["tokens_per_s"] for r in sel if r["variant"] == "jaxcraft"}
    stock = {}
    for r in sel:
      if r["variant"] != "jaxcraft":
        stock[label(r)] = max(stock.get(label(r), 0), r["tokens_per_s"])
    labels = [s for s in labels if s in ours and s in stock]
    ratios = [ours[s] / stock[s] for s in labels]
    ax.bar(range(len(labels)), ratios, color=["C0" if x >= 1 else "C3" for x in ratios])
    ax.axhline(1.0, color="k", ls="--", lw=1)
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=30, ha="right")
    ax.set_title(f"decoder {name}")
    ax.set_ylabel("jaxcraft / best stock")
  sizes = ", ".join(sorted({f"{r['layers']} layers, d_model {r['d_model']}" for r in rows}))
  fig.suptitle(f"{meta['device']} - bf16 - {sizes} - {meta['date']}")
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def write_all(results, out: pathlib.Path):
  if "norm" in results:
    _norm_plot(results["norm"], results["meta"], out / "norm.png")
  if "attention" in results:
    _attention_plot(results["attention"], results["meta"], out / "attention.png")
  if results.get("activations"):  # GB/s bars per op and shape, as the norms'
    _norm_plot(results["activations"], results["meta"], out / "activations.png")
  if results.get("decode"):
    _decode_plot(results["decode"], results["meta"], out / "decode.png")
  if results.get("embedding"):  # GB/s bars per shape and implementation, as the norms'
    _norm_plot(results["embedding"], results["meta"], out / "embedding.png")
  if results.get("softmax"):  # GB/s bars per shape (one row per dtype), as the norms'
    _norm_plot(results["softmax"], results["meta"], out / "softmax.png")
  if results.get("model"):
    _model_plot(results["model"], results["meta"], out / "model.png")
