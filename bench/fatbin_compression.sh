#!/usr/bin/env bash
# What fatbin compression costs when the driver loads a module: two of the
# largest translation units (the portable attention kernels of head dim 128,
# the norm launcher) compiled as the build compiles them (sm_80 + PTX,
# sm_90a) under nvcc's --compress-mode none, default and size, then each
# fatbin's size and median load time, eager and lazy (bench/fatbin_load.cu).
#   bash bench/fatbin_compression.sh [out_dir=/tmp/fatbins]
set -euo pipefail
out=${1:-/tmp/fatbins}
mkdir -p "$out"
units=(cpp/kernels/attention/instances_hdim128.cu cpp/kernels/norm/launch_norm.cu)
for unit in "${units[@]}"; do
  for mode in none default size; do
    echo "$unit $mode"
  done
done | xargs -P 8 -n 2 bash -c 'nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Icpp \
  -gencode=arch=compute_80,code=[sm_80,compute_80] -gencode=arch=compute_90a,code=sm_90a \
  --compress-mode="$1" -fatbin "$0" -o '"$out"'/$(basename "$0" .cu).$1.fatbin'
nvcc -O2 -o "$out/fatbin_load" bench/fatbin_load.cu -lcuda
for loading in EAGER LAZY; do
  echo "CUDA_MODULE_LOADING=$loading: file, bytes, median load ms"
  CUDA_MODULE_LOADING=$loading "$out/fatbin_load" "$out"/*.fatbin
done
