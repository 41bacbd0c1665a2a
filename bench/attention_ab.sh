#!/usr/bin/env bash
# Old-vs-new timings of the Hopper attention kernels alone
# (bench/attention_ab.cu), for a kernel change's A/B in one device call:
#   here:    bash bench/attention_ab.sh prepare REV
#            (REV's cpp/ tree into .ab_old/, git-ignored: pass
#            carry=[".ab_old"] to the device run)
#   device:  bash bench/attention_ab.sh run [HEAD_DIMS]   (default "64 128 256")
#            (AB_FWD_ONLY=1: the forward alone; the backward columns read 0)
# Builds both sides per head dim in parallel, runs old, new, new, old (so
# that drift shows), writes $OUT/attention_ab.txt and prints, per row, the
# best old time, new / old, and whether the outputs' hashes agree.
set -euo pipefail
case "${1:-}" in
  prepare)
    rm -rf .ab_old
    mkdir -p .ab_old
    git archive "${2:?usage: prepare REV}" cpp | tar -x -C .ab_old
    echo "old side: $(git rev-parse --short "$2")"
    ;;
  run)
    [[ -d .ab_old/cpp ]] || { echo "no .ab_old/cpp: run 'prepare REV' here and carry .ab_old"; exit 1; }
    dims=${2:-"64 128 256"}
    out=${OUT:-bench/out}
    bin=/tmp/attention_ab
    mkdir -p "$bin" "$out"
    pids=()
    for d in $dims; do
      for side in old new; do
        tree=cpp
        [[ $side == old ]] && tree=.ab_old/cpp
        nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
          -DHEAD_DIM="$d" -I"$tree" bench/attention_ab.cu -o "$bin/$side$d" > "$bin/$side$d.log" 2>&1 &
        pids+=($!)
      done
    done
    for p in "${pids[@]}"; do wait "$p" || { cat "$bin"/*.log; exit 1; }; done
    for d in $dims; do
      for side in old new new old; do "$bin/$side$d" "$side"; done
    done > "$out/attention_ab.txt"
    python3 - "$out/attention_ab.txt" <<'PY'
import collections, sys
best = collections.defaultdict(lambda: [1e30, 1e30])
hashes = collections.defaultdict(set)
for line in open(sys.argv[1]):
  f = line.split()
  side, row = f[0], " ".join(f[1:4])
  for i, at in enumerate((5, 11)):  # fwd us, bwd us
    best[row, side][i] = min(best[row, side][i], float(f[at]))
  hashes[row, "fwd"].add(f[9])
  hashes[row, "bwd"].add(f[15])
print(f"{'row':24s} {'fwd old us':>10s} {'new/old':>7s} {'bwd old us':>10s} {'new/old':>7s}  outputs")
for row in dict.fromkeys(r for r, _ in best):
  old, new = best[row, "old"], best[row, "new"]
  same = "same" if len(hashes[row, "fwd"]) == len(hashes[row, "bwd"]) == 1 else "DIFFER"
  ratio = lambda i: new[i] / old[i] if old[i] > 0 else float("nan")
  print(f"{row:24s} {old[0]:10.1f} {ratio(0):7.3f} {old[1]:10.1f} {ratio(1):7.3f}  {same}")
PY
    ;;
  *)
    echo "usage: $0 prepare REV | run [HEAD_DIMS]"
    exit 2
    ;;
esac
