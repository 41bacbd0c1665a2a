#!/usr/bin/env bash
set -u
L=/tmp/c1; rm -rf $L; mkdir -p $L $OUT; trap "tar czf $OUT/c1.tgz -C $L ." EXIT
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
NV="nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a"
t0=$SECONDS
$NV -I.ab_head/cpp .ab_head/cpp/kernels/softmax/standalone_test.cu .ab_head/cpp/kernels/softmax/launch_softmax.cu -o /tmp/sm_old.bin > $L/build_old.log 2>&1 &
$NV -Icpp cpp/kernels/softmax/standalone_test.cu cpp/kernels/softmax/launch_softmax.cu -o /tmp/sm_new.bin > $L/build_new.log 2>&1 &
python3 -m pip install --no-build-isolation --no-deps -e . > $L/pip.log 2>&1 &
wait
echo "builds done $((SECONDS-t0))s"; tail -3 $L/build_old.log $L/build_new.log; grep -i "error" $L/pip.log | head
/tmp/sm_new.bin --no-timing > $L/checks.log 2>&1; echo "checks rc=$?"; grep -c PASS $L/checks.log; grep -E "FAIL|ALL|131072" $L/checks.log | head -30
for b in old new new old; do echo "--- $b"; /tmp/sm_$b.bin --timing-only | grep -E "us|copy"; done 2>&1 | tee $L/ab.log
echo "t=$((SECONDS-t0))"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 /tmp/sm_new.bin --cols=131072 > $L/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -4 $L/memcheck.log
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 1 /tmp/sm_new.bin --cols=131072 > $L/racecheck.log 2>&1; echo "racecheck rc=$?"; tail -4 $L/racecheck.log
echo "t=$((SECONDS-t0))"
timeout 120 python3 -m pytest -q -x tests/test_softmax.py 2>&1 | tail -3
echo "t=$((SECONDS-t0))"
JAXCRAFT_BENCH_SOFTMAX_MODES=bwd timeout 150 python3 bench/run.py --ops softmax --out $L/bench > $L/bench.log 2>&1; tail -30 $L/bench.log
echo "t=$((SECONDS-t0))"
