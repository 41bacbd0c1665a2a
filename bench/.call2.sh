#!/usr/bin/env bash
set -u
L=/tmp/c2; rm -rf $L; mkdir -p $L $OUT; trap "tar czf $OUT/c2.tgz -C $L ." EXIT
NV="nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icpp"
t0=$SECONDS
for v in 0 1 2; do
  $NV -DJAXCRAFT_SOFTMAX_REFILL=$v cpp/kernels/softmax/standalone_test.cu cpp/kernels/softmax/launch_softmax.cu -o /tmp/sm_v$v.bin > $L/build_v$v.log 2>&1 &
done
$NV -lineinfo cpp/kernels/softmax/standalone_test.cu cpp/kernels/softmax/launch_softmax.cu -o /tmp/sm_prof.bin > $L/build_prof.log 2>&1 &
wait
echo "builds done $((SECONDS-t0))s"; cat $L/build_v*.log | grep -i error | head
/tmp/sm_v0.bin --no-timing > $L/checks_v0.log 2>&1; echo "checks v0 rc=$?"; grep -E "FAIL|ALL|131080" $L/checks_v0.log | head -20
/tmp/sm_v2.bin --no-timing > $L/checks_v2.log 2>&1; echo "checks v2 rc=$?"; grep -E "FAIL|ALL" $L/checks_v2.log | head -5
echo "t=$((SECONDS-t0))"
for v in 0 1 2 2 1 0; do echo "--- v$v"; /tmp/sm_v$v.bin --timing-only | grep -E " us |copy"; done 2>&1 | tee $L/ab.log
echo "t=$((SECONDS-t0))"
timeout 120 ncu --kernel-name-base demangled --kernel-name "regex:fwd_rows_kernel<float, 1024, 4, false, 8>" \
  --launch-skip 1 --launch-count 1 --set full -f -o /tmp/fwd128k /tmp/sm_prof.bin --timing-only > $L/ncu_run.log 2>&1
echo "ncu rc=$?"; tail -3 $L/ncu_run.log
ncu --import /tmp/fwd128k.ncu-rep --page details > $L/ncu_fwd128k.txt 2>&1
grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Registers Per|Stall" $L/ncu_fwd128k.txt | head -30
echo "t=$((SECONDS-t0))"
