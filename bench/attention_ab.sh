#!/usr/bin/env bash
# Old-vs-new timings of the Hopper attention kernels alone
# (bench/attention_ab.cu), for a kernel change's A/B in one device call:
#   here:    bash bench/attention_ab.sh prepare REV
#            (REV's cpp/ tree into .ab_old/, git-ignored: pass
#            carry=[".ab_old"] to the device run)
#   device:  bash bench/attention_ab.sh run [HEAD_DIMS]   (default "64 128 256")
#            (AB_GQA=4: four query heads per KV head;
#            AB_FWD_ONLY=1: the forward alone; the backward columns read 0;
#            AB_FEATURES=1: the forward's feature instances too;
#            AB_SIDES="old new v1": more variants, side X's tree in .ab_X/cpp,
#            carried too)
# Builds every side per head dim in parallel, runs them in order and then
# in reverse (old, new, new, old: so that drift shows), writes
# $OUT/attention_ab.txt and prints, per row and side, the best old time,
# side / old, and whether the outputs' hashes agree with old's.
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
    sides=(${AB_SIDES:-old new})
    out=${OUT:-bench/out}
    bin=/tmp/attention_ab
    mkdir -p "$bin" "$out"
    pids=()
    for d in $dims; do
      for side in "${sides[@]}"; do
        tree=.ab_$side/cpp
        [[ $side == new ]] && tree=cpp
        nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
          -DHEAD_DIM="$d" -I"$tree" bench/attention_ab.cu -o "$bin/$side$d" > "$bin/$side$d.log" 2>&1 &
        pids+=($!)
      done
    done
    for p in "${pids[@]}"; do wait "$p" || { cat "$bin"/*.log; exit 1; }; done
    for d in $dims; do
      for ((i = 0; i < 2 * ${#sides[@]}; ++i)); do
        j=$((i < ${#sides[@]} ? i : 2 * ${#sides[@]} - 1 - i))
        "$bin/${sides[j]}$d" "${sides[j]}"
      done
    done > "$out/attention_ab.txt"
    python3 - "$out/attention_ab.txt" <<'PY'
import collections, sys
best = collections.defaultdict(lambda: [1e30, 1e30])
hashes = {}
for line in open(sys.argv[1]):
  f = line.split()
  side, row = f[0], " ".join(f[1:4])
  for i, at in enumerate((5, 11)):  # fwd us, bwd us
    best[row, side][i] = min(best[row, side][i], float(f[at]))
  hashes.setdefault((row, side), (f[9], f[15]))
sides = list(dict.fromkeys(s for _, s in best))
print(f"{'row':24s} {'side':>6s} {'fwd old us':>10s} {'/old':>7s} {'bwd old us':>10s} {'/old':>7s}  outputs")
for row in dict.fromkeys(r for r, _ in best):
  old = best[row, "old"]
  for side in (s for s in sides if s != "old"):
    new = best[row, side]
    same = "same" if hashes[row, side] == hashes[row, "old"] else "DIFFER"
    ratio = lambda i: new[i] / old[i] if old[i] > 0 else float("nan")
    print(f"{row:24s} {side:>6s} {old[0]:10.1f} {ratio(0):7.3f} {old[1]:10.1f} {ratio(1):7.3f}  {same}")
PY
    ;;
  *)
    echo "usage: $0 prepare REV | run [HEAD_DIMS]"
    exit 2
    ;;
esac
