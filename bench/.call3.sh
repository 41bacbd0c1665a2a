#!/usr/bin/env bash
set -u
L=/tmp/c3; rm -rf $L; mkdir -p $L $OUT; trap "tar czf $OUT/c3.tgz -C $L ." EXIT
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
NV="nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icpp"
t0=$SECONDS
$NV -lineinfo cpp/kernels/softmax/standalone_test.cu cpp/kernels/softmax/launch_softmax.cu -o /tmp/sm.bin > $L/build.log 2>&1 &
python3 -m pip install --no-build-isolation --no-deps -e . > $L/pip.log 2>&1 &
wait
echo "builds done $((SECONDS-t0))s"; grep -i " error" $L/build.log $L/pip.log | head
/tmp/sm.bin > $L/standalone.log 2>&1; echo "standalone rc=$?"; grep -E "FAIL|ALL| us " $L/standalone.log
for c in 32768 131072; do
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 1 /tmp/sm.bin --cols=$c > $L/race_$c.log 2>&1; echo "racecheck $c rc=$?"; tail -1 $L/race_$c.log
done
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 1 /tmp/sm.bin --cols=2048 > $L/mem_2048.log 2>&1; echo "memcheck 2048 rc=$?"; tail -1 $L/mem_2048.log
timeout 100 compute-sanitizer --tool synccheck --error-exitcode 1 /tmp/sm.bin --cols=131072 > $L/sync.log 2>&1; echo "synccheck rc=$?"; tail -1 $L/sync.log
echo "t=$((SECONDS-t0))"
timeout 150 python3 -m pytest -q -x tests/test_softmax.py 2>&1 | tail -2
echo "t=$((SECONDS-t0))"
for k in softmax_fwd_warp_kernelIfLi32E softmax_fwd_rows_kernelIfLi1024ELi4ELb0ELi8E softmax_fwd_rows_kernelI13__nv_bfloat16Li512ELi4ELb0ELi8E; do
  timeout 90 ncu --kernel-name-base mangled --kernel-name "regex:$k" --launch-skip 2 --launch-count 1 --set full -f -o /tmp/p_$k /tmp/sm.bin --timing-only > $L/ncu_run_$k.log 2>&1
  ncu --import /tmp/p_$k.ncu-rep --page details > $L/ncu_$k.txt 2>&1
  echo "== $k"; grep -E "^ +(Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Issue Slots Busy|Warp Cycles Per Issued Instruction|Eligible Warps Per Scheduler|No Eligible) " $L/ncu_$k.txt
done
echo "t=$((SECONDS-t0))"
JAXCRAFT_BENCH_SOFTMAX_MODES=fwd,bwd timeout 200 python3 bench/run.py --ops softmax --out $L/bench > $L/bench.log 2>&1; grep -E "jaxcraft|default|copy" $L/bench.log
echo "t=$((SECONDS-t0))"
