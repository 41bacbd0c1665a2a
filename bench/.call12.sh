#!/usr/bin/env bash
# Scratch: final decode checks: standalone A/B (old = HEAD~1), sanitizers, pytest, JAX bench, chain spans.
L=/tmp/logs; rm -rf $L; mkdir -p $L; trap "tar czf $OUT/c12.tgz -C $L ." EXIT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $L/gpu.txt
(OUT=$L/jb bash bench/gpu_check.sh decode build > $L/jax_build.out 2>&1) &
jb=$!
pids=()
for side in old new; do
  tree=.ab_old/cpp; [[ $side == new ]] && tree=cpp
  nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I$tree \
    $tree/kernels/decode/standalone_test.cu $tree/kernels/decode/launch_decode.cu -o /tmp/dec_$side > $L/build_$side.log 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
for side in old new new old; do echo "== $side"; /tmp/dec_$side bench; done > $L/ab.txt 2>&1
grep -c "all cases passed" $L/ab.txt
awk '/^== /{side=$2} /us .*GB\/s/ && !/ceiling/{key=$1"x"$3" "$4; v[key" "side]=v[key" "side]" "$5} END{for(k in v) print k, v[k]}' $L/ab.txt | sort -t' ' -k1,1n -k2,2 -k3,3
for tool in memcheck racecheck synccheck; do compute-sanitizer --tool $tool --error-exitcode 1 /tmp/dec_new > $L/$tool.txt 2>&1; echo "$tool rc=$? $(tail -1 $L/$tool.txt)"; done
wait $jb; tail -2 $L/jax_build.out
PYTEST_ARGS=tests/test_decode_attention.py OUT=$L/pt timeout 200 bash bench/gpu_check.sh decode test > $L/pytest.out 2>&1
tail -2 $L/pytest.out
(cd bench && JAXCRAFT_BENCH_REPEATS=5 timeout 300 python3 run.py --ops decode --out $L/bench > $L/bench.out 2>&1)
grep " x " $L/bench.out
[[ ${SPANS:-0} == 1 ]] && (cd bench && timeout 120 python3 decode_chain_spans.py "256 x 1k" 1 2>&1 | grep -v "^W\|^I0" | tail -8)
