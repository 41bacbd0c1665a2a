"""Markdown tables from bench results.json files: `python bench/report.py FILE...`."""

from __future__ import annotations

import collections
import json
import sys


def norm_table(rows):
  by = collections.defaultdict(dict)
  for r in rows:
    by[(r["shape"], r["op"])][(r["impl"], r["mode"])] = r
  out = ["| rows x columns | op | jaxcraft fwd | XLA fwd | jaxcraft bwd | XLA bwd |",
         "|---|---|---|---|---|---|"]

  def cell(cells, impl, mode):
    r = cells.get((impl, mode))
    if r is None:
      return "-"
    kernel = f"; kernel {r['kernel_pct_copy']:.0f}%" if "kernel_pct_copy" in r else ""
    return f"{r['us']:.1f} ({r['pct_copy']:.0f}%{kernel})"

  for (shape, op), cells in by.items():
    out.append(f"| {shape} | {op.replace('+residual', ' + residual')} | "
               + " | ".join(cell(cells, impl, mode) for mode in ("fwd", "bwd") for impl in ("jaxcraft", "xla"))
               + " |")
  return "\n".join(out)


def attention_table(rows):
  by = collections.defaultdict(dict)
  for r in rows:
    by[r["shape"]][(r["impl"], r["mode"])] = r["tflops"]
  out = ["| D, S | jaxcraft fwd / fwd+bwd | cuDNN fwd / fwd+bwd | tokamax fwd / fwd+bwd "
         "| Pallas-Triton fwd / fwd+bwd | XLA fwd / fwd+bwd |", "|---|---|---|---|---|---|"]
  for shape, cells in by.items():
    cell = lambda impl: " / ".join(f"{cells[(impl, m)]:.0f}" if (impl, m) in cells else "-"
                                   for m in ("fwd", "fwd+bwd"))
    out.append(f"| {shape} | {cell('jaxcraft')} | {cell('cudnn')} | {cell('tokamax')} "
               f"| {cell('pallas')} | {cell('xla')} |")
  return "\n".join(out)


def ring_table(rows):
  out = ["| spec | variant | fwd ms | fwd TFLOP/s per GPU | fwd+bwd ms | fwd+bwd TFLOP/s per GPU |",
         "|---|---|---|---|---|---|"]
  by = collections.defaultdict(dict)
  for r in rows:
    by[(r["shape"], r["impl"])][r["mode"]] = r
  for (shape, impl), cells in by.items():
    def cell(mode):
      r = cells.get(mode)
      if r is None:
        return "- | -"
      rate = "-" if r["tflops_per_gpu"] is None else f"{r['tflops_per_gpu']:.0f}"
      return f"{r['us'] / 1e3:.2f} | {rate}"
    out.append(f"| {shape} | {impl} | {cell('fwd')} | {cell('fwd+bwd')} |")
  return "\n".join(out)


def train_table(rows):
  out = ["| model | variant | step ms | tokens/s | TFLOP/s | peak GiB | loss |",
         "|---|---|---|---|---|---|---|"]
  for r in rows:
    peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
    out.append(f"| {r['shape']} | {r['impl']} | {r['ms']:.1f} | {r['tokens_per_s']:.0f} | "
               f"{r['tflops']:.0f} | {peak} | {r['loss']:.3f} |")
  return "\n".join(out)


def main():
  for path in sys.argv[1:]:
    results = json.load(open(path))
    meta = results["meta"]
    copy = f", copy {meta['copy_gbps']:.0f} GB/s" if "copy_gbps" in meta else ""
    print(f"\n### {path}: {meta['device']}, jax {meta['jax']}, {meta['date']}{copy}\n")
    if "norm" in results:
      print(norm_table(results["norm"]) + "\n")
    if "attention" in results:
      print(attention_table(results["attention"]) + "\n")
    if results.get("ring"):
      print(ring_table(results["ring"]) + "\n")
    if "train" in results:
      print(train_table(results["train"]) + "\n")


if __name__ == "__main__":
  main()
