#!/usr/bin/env bash
set -u
L=/tmp/c6; rm -rf $L; mkdir -p $L $OUT; trap "tar czf $OUT/c6.tgz -C $L ." EXIT
NV="nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a"
t0=$SECONDS
$NV -I.ab_head/cpp cpp/kernels/softmax/standalone_test.cu .ab_head/cpp/kernels/softmax/launch_softmax.cu -o /tmp/sm_old.bin > $L/build_old.log 2>&1 &
$NV -Icpp cpp/kernels/softmax/standalone_test.cu cpp/kernels/softmax/launch_softmax.cu -o /tmp/sm_new.bin > $L/build_new.log 2>&1 &
python3 -m pip install --no-build-isolation --no-deps -e . > $L/pip.log 2>&1 &
wait
echo "builds done $((SECONDS-t0))s"; cat $L/build_*.log | grep -i error | head
/tmp/sm_new.bin --no-timing > $L/checks.log 2>&1; echo "checks rc=$?"; grep -E "FAIL|ALL" $L/checks.log | head
for b in old new new old; do echo "--- $b"; /tmp/sm_$b.bin --timing-only | grep -E " us |copy"; done 2>&1 | tee $L/ab.log
echo "t=$((SECONDS-t0))"
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 /tmp/sm_new.bin --cols=32768 > $L/race.log 2>&1; echo "racecheck rc=$?"; tail -1 $L/race.log
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 /tmp/sm_new.bin --cols=131072 > $L/mem.log 2>&1; echo "memcheck rc=$?"; tail -1 $L/mem.log
echo "t=$((SECONDS-t0))"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 200 python3 -m pytest -q -x tests/test_softmax.py 2>&1 | tail -3
echo "t=$((SECONDS-t0))"
