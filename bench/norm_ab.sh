#!/usr/bin/env bash
# Old-vs-new timings of the norm kernels alone (tests/cuda/norm.cu
# --timing-only: bf16, 64 MB of x, 512 to 65536 columns), for a kernel
# change's A/B in one device call:
#   here:    bash bench/attention_ab.sh prepare REV
#            (REV's cpp/ tree into .ab_old/: pass carry=[".ab_old"])
#   device:  bash bench/norm_ab.sh
#            (AB_SIDES="old new v1": more variants, side X's tree in
#            .ab_X/cpp, carried too)
# Runs every side in order and then in reverse (old, new, new, old: so that
# drift shows), writes $OUT/norm_ab.txt and prints, per row, old's best
# forward and backward times and each side's over old's.
set -euo pipefail
[[ -d .ab_old/cpp ]] || {
  echo "no .ab_old/cpp: run 'bash bench/attention_ab.sh prepare REV' here and carry .ab_old"
  exit 1
}
sides=(${AB_SIDES:-old new})
out=${OUT:-bench/out}
bin=/tmp/norm_ab
mkdir -p "$bin" "$out"
pids=()
for side in "${sides[@]}"; do
  tree=.ab_$side/cpp
  [[ $side == new ]] && tree=cpp
  nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I"$tree" \
    tests/cuda/norm.cu "$tree/kernels/norm/launch_norm.cu" -o "$bin/$side" > "$bin/$side.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$bin"/*.log; exit 1; }; done
for ((i = 0; i < 2 * ${#sides[@]}; ++i)); do
  j=$((i < ${#sides[@]} ? i : 2 * ${#sides[@]} - 1 - i))
  "$bin/${sides[j]}" --timing-only | sed "s/^/${sides[j]} /"
done > "$out/norm_ab.txt"
python3 - "$out/norm_ab.txt" "${sides[@]}" <<'PY'
import collections, re, sys
best = collections.defaultdict(lambda: [1e30, 1e30])
pattern = re.compile(r"(\S+) timing bf16 (\S+)\s*(\+res)?\s*\[\s*\d+,\s*(\d+)\]: fwd\s+([\d.]+) us.*"
                     r"bwd\s+([\d.]+) us")
for line in open(sys.argv[1]):
  if m := pattern.match(line):
    side, op, res, cols, fwd, bwd = m.groups()
    row = f"{op}{res or ''} {cols}"
    best[row, side] = [min(best[row, side][0], float(fwd)), min(best[row, side][1], float(bwd))]
sides = sys.argv[2:]
print(f"{'row':18s} {'fwd old us':>10s} " + " ".join(f"{s + '/old':>8s}" for s in sides[1:]) +
      f" {'bwd old us':>10s} " + " ".join(f"{s + '/old':>8s}" for s in sides[1:]))
for row in dict.fromkeys(r for r, _ in best):
  old = best[row, "old"]
  print(f"{row:18s} {old[0]:10.1f} " + " ".join(f"{best[row, s][0] / old[0]:8.3f}" for s in sides[1:]) +
        f" {old[1]:10.1f} " + " ".join(f"{best[row, s][1] / old[1]:8.3f}" for s in sides[1:]))
PY
