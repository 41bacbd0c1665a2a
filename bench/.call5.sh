#!/usr/bin/env bash
set -u
L=/tmp/c5; rm -rf $L; mkdir -p $L $OUT; trap "tar czf $OUT/c5.tgz -C $L ." EXIT
NV="nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a"
t0=$SECONDS
$NV -I.ab_head/cpp cpp/kernels/softmax/standalone_test.cu .ab_head/cpp/kernels/softmax/launch_softmax.cu -o /tmp/sm_old.bin > $L/build_old.log 2>&1 &
$NV -Icpp cpp/kernels/softmax/standalone_test.cu cpp/kernels/softmax/launch_softmax.cu -o /tmp/sm_new.bin > $L/build_new.log 2>&1 &
$NV -Icpp -DJAXCRAFT_FWD_WARP_BLOCK32=256 cpp/kernels/softmax/standalone_test.cu cpp/kernels/softmax/launch_softmax.cu -o /tmp/sm_n256.bin > $L/build_n256.log 2>&1 &
wait
echo "builds done $((SECONDS-t0))s"; cat $L/build_*.log | grep -i error | head
/tmp/sm_new.bin --no-timing > $L/checks.log 2>&1; echo "checks rc=$?"; grep -E "FAIL|ALL|x 6000 |x 8192 " $L/checks.log | head -20
for b in old new n256 n256 new old; do echo "--- $b"; /tmp/sm_$b.bin --timing-only | grep -E "fwd|copy"; done 2>&1 | tee $L/ab.log
echo "t=$((SECONDS-t0))"
for c in 6000 8192; do timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 /tmp/sm_new.bin --cols=$c > $L/mem_$c.log 2>&1; echo "memcheck $c rc=$?"; tail -1 $L/mem_$c.log; done
echo "t=$((SECONDS-t0))"
