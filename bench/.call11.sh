#!/usr/bin/env bash
# call 11: issue 9 on whatever GPU comes (H200 hoped): standalone timings, then JAX fwd/bwd
L=/tmp/c11logs; mkdir -p $L/g
trap "tar czf $OUT/c11.tgz -C $L ." EXIT
nvidia-smi --query-gpu=name --format=csv,noheader
NV="nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icpp"
for op in softmax activations embedding; do $NV cpp/kernels/$op/standalone_test.cu cpp/kernels/$op/launch_$op.cu -o /tmp/$op.bin > $L/b_$op.log 2>&1 & done
python3 -m pip install --no-build-isolation --no-deps -e . > $L/pip.log 2>&1 &
wait
/tmp/softmax.bin --timing-only > $L/sa_softmax.log 2>&1; grep -E "copy|fwd|bwd" $L/sa_softmax.log | head -20
/tmp/embedding.bin --timing-only > $L/sa_embedding.log 2>&1; grep -E "copy|timing" $L/sa_embedding.log
timeout 150 /tmp/activations.bin > $L/sa_activations.log 2>&1; grep -iE "copy|GB/s" $L/sa_activations.log | tail -14
JAXCRAFT_BENCH_SOFTMAX_MODES=fwd,bwd JAXCRAFT_BENCH_MODES=fwd,bwd timeout 420 python3 bench/run.py --ops softmax,activations,embedding --out $L/g > $L/bench.log 2>&1
tail -60 $L/bench.log
