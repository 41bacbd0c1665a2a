#!/usr/bin/env bash
# The one GPU script (run through the device tool): build, GPU tests,
# compute-sanitizer on small cases, benchmarks. Logs and JSON go to $OUT.
#   bash bench/gpu_check.sh [ops=norm] [stages=build,test,sanitize,bench]
#   (more stages: standalone (attention), profile (ncu, attention backward),
#   sanitize_standalone, standalone_activations, standalone_embedding, standalone_softmax,
#   standalone_decode, profile_decode (ncu: jaxcraft's and cuDNN's decode kernels),
#   profile_softmax (ncu: the bf16 [16k, 4096] softmax forward, per-instruction stalls),
#   profile_attention (ncu: jaxcraft's and cuDNN's attention kernels on the rows
#   PROFILE_ATTENTION_ROWS, mode PROFILE_ATTENTION_MODE))
# PYTEST_ARGS selects test files (default: all), PYTEST_K a -k expression;
# STANDALONE_PORTABLE=0 skips the portable kernels' timings in `standalone`;
# STAGE_TIMEOUT bounds each stage so
# one slow stage cannot eat the whole device call. More than 8 output files
# are packed into $OUT/all_outputs.tgz (results.json stays beside it).
set -uo pipefail
OPS=${1:-norm}
STAGES=${2:-build,test,sanitize,bench}
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false CMAKE_BUILD_PARALLEL_LEVEL=16
status=0
stage() { [[ ",$STAGES," == *",$1,"* ]]; }
step() {  # step NAME CMD...: run, log to $OUT/NAME.log, remember failure
  echo "=== $1"
  local t0=$SECONDS
  timeout "${STAGE_TIMEOUT:-480}" "${@:2}" > "$OUT/$1.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/$1.log"
  echo "=== $1: rc=$rc in $((SECONDS - t0))s"
  [[ $rc == 0 ]] || status=1
  return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if compgen -G ".whl/*.whl" > /dev/null; then  # peers' wheels (bench/peer_wheels.sh), carried
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/peer_site .whl/*.whl && export PYTHONPATH=/tmp/peer_site:$PWD/.whl/stub${PYTHONPATH:+:$PYTHONPATH}
fi
if stage build; then
  step build python3 -m pip install --no-build-isolation --no-deps -v -e . || exit 1
  grep -E "CUDA kernels|cmake version" "$OUT/build.log" | head -3
fi
build_attn_standalone() {  # /tmp/attn_test.bin: the attention standalone test
  [[ -n ${ATTN_BUILT:-} ]] && return 0  # once per script run (a warm machine keeps old ones)
  ATTN_BUILT=1
  att=cpp/kernels/attention obj=/tmp/attn_obj
  mkdir -p $obj
  nvcc_attn() { nvcc -std=c++17 -O3 --expt-relaxed-constexpr -lineinfo -Icpp \
    -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a "$@"; }
  export -f nvcc_attn
  step standalone_build bash -c "ls $att/*.cu $att/sm90/*.cu tests/cuda/attention.cu | xargs -P 16 -I{} bash -c \
    'nvcc_attn -c {} -o $obj/\$(echo {} | tr / _).o' && nvcc_attn $obj/*.o -o /tmp/attn_test.bin"
}
if stage standalone; then
  # The attention kernels outside JAX, against a float64 CPU reference, then
  # their timings; a second run times the portable kernels on the same GPU.
  build_attn_standalone
  step standalone_run /tmp/attn_test.bin ${STANDALONE_ARGS:-}
  [[ ${STANDALONE_PORTABLE:-1} == 1 ]] &&
    JAXCRAFT_ATTENTION_KERNEL=portable step standalone_portable /tmp/attn_test.bin bench
fi
if stage profile; then
  # Nsight Compute on the Hopper backward (D64 causal and full, D128 full):
  # the details page and per-instruction stall samples.
  build_attn_standalone
  step profile ncu --kernel-name regex:attn_bwd_sm90 --launch-count 3 --set full \
    --import-source yes -f -o /tmp/bwd_profile /tmp/attn_test.bin profile
  ncu --import /tmp/bwd_profile.ncu-rep --page details > "$OUT/profile_details.txt" 2>&1
  ncu --import /tmp/bwd_profile.ncu-rep --page source --csv --print-source sass \
    > "$OUT/profile_sass.csv" 2>&1
  gzip -f "$OUT/profile_sass.csv"
fi
for op in activations embedding softmax norm; do
  # The elementwise/row kernels outside JAX against a float64 CPU reference
  # (embedding: the deterministic backward bit for bit), then their GB/s at
  # the benchmark shapes.
  if stage "standalone_$op"; then
    step "${op}_standalone_build" nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Icpp \
      -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a \
      "tests/cuda/$op.cu" "cpp/kernels/$op/launch_$op.cu" -o "/tmp/${op}_test.bin"
    step "${op}_standalone_run" "/tmp/${op}_test.bin"
    if [[ $op == softmax || $op == norm ]]; then  # shared-memory rings; the warp kernels' barriers
      for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
        step "${op}_sanitize_$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 \
          "/tmp/${op}_test.bin" --no-timing
      done
    fi
  fi
done
if stage standalone_decode; then
  # Decode attention outside JAX against the float64 reference, its GB/s at
  # the benchmark shapes beside the read-only ceiling, compute-sanitizer.
  step decode_standalone_build nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Icpp \
    -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a \
    tests/cuda/decode.cu cpp/kernels/decode/launch_decode.cu -o /tmp/decode_test.bin
  step decode_standalone_run /tmp/decode_test.bin bench
  for tool in memcheck racecheck synccheck; do
    step "decode_sanitize_$tool" compute-sanitizer --tool "$tool" --error-exitcode 1 /tmp/decode_test.bin
  done
fi
if stage profile_decode; then
  # Nsight Compute on one decode call of jaxcraft and one of cuDNN per shape
  # (PROFILE_DECODE_SHAPES), side by side: where cuDNN's 4-8% comes from.
  step profile_decode ncu --profile-from-start off --set full -f -o /tmp/decode_profile \
    python3 bench/profile_decode.py
  ncu --import /tmp/decode_profile.ncu-rep --page details > "$OUT/decode_profile_details.txt" 2>&1
fi
if stage profile_attention; then
  # Nsight Compute on one jitted attention step of jaxcraft and of cuDNN per row:
  # launch shapes, occupancy, throughputs, stalls side by side.
  step profile_attention ncu --profile-from-start off --set full -f -o /tmp/attention_profile \
    python3 bench/attention_profile.py ${PROFILE_ATTENTION_ROWS:-D64S512c} \
    --mode "${PROFILE_ATTENTION_MODE:-fwd}" --ncu
  ncu --import /tmp/attention_profile.ncu-rep --page details > "$OUT/attention_profile_details.txt" 2>&1
fi
if stage profile_softmax; then
  # Nsight Compute on the bf16 [16k, 4096] softmax forward of the standalone
  # test (its first timed shape): the details page and per-instruction stall
  # samples (SASS with source lines).
  step softmax_profile_build nvcc -std=c++17 -O3 --expt-relaxed-constexpr -lineinfo -Icpp \
    -gencode=arch=compute_90a,code=sm_90a tests/cuda/softmax.cu \
    cpp/kernels/softmax/launch_softmax.cu -o /tmp/softmax_profile.bin
  step profile_softmax ncu --kernel-name-base mangled --kernel-name regex:softmax_fwd_rows_kernel \
    --launch-skip 2 --launch-count 1 --set full --import-source yes -f -o /tmp/softmax_profile \
    /tmp/softmax_profile.bin --timing-only
  ncu --import /tmp/softmax_profile.ncu-rep --page details > "$OUT/softmax_profile_details.txt" 2>&1
  ncu --import /tmp/softmax_profile.ncu-rep --page source --csv --print-source sass \
    > "$OUT/softmax_profile_sass.csv" 2>&1
  gzip -f "$OUT/softmax_profile_sass.csv"
fi
if stage test; then
  # CI runs the CPU kernels' tests; here the CUDA ones (and the platform-free tests).
  # Autotuning the references' matmuls would dominate the suite's compile time.
  # With pytest-xdist (on the device) the tests spread over PYTEST_WORKERS
  # processes on the one GPU: the whole suite took 205 s with 8 on an H100,
  # where one process ran about 60 attention tests in 236 s.
  workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${PYTEST_WORKERS:-8}")
  XLA_FLAGS=--xla_gpu_autotune_level=0 JAXCRAFT_TEST_PLATFORMS=cuda \
    step tests python3 -m pytest -v -rf --maxfail=25 -p no:cacheprovider $workers ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-tests}
fi
if stage sanitize; then
  for tool in memcheck racecheck synccheck; do
    step "sanitize_$tool" compute-sanitizer --tool "$tool" --kernel-name kns=jaxcraft \
      --error-exitcode 1 python3 bench/sanitize_cases.py "$OPS"
  done
fi
if stage sanitize_standalone; then
  # The attention kernels outside JAX, small cases (SANITIZE_CASES=features:
  # the feature cases only), on both routes (SANITIZE_ROUTES), with each tool of
  # SANITIZE_TOOLS (default: memcheck racecheck synccheck), with the
  # Hopper forward's persistent grid capped at 3 CTAs so that every CTA
  # walks several work items.
  build_attn_standalone
  for route in ${SANITIZE_ROUTES:-hopper portable}; do
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
      JAXCRAFT_ATTENTION_PERSISTENT_CTAS=3 \
        step "sanitize_standalone_${tool}_$route" compute-sanitizer --tool "$tool" \
        --error-exitcode 1 /tmp/attn_test.bin ${SANITIZE_CASES:-check} small $route
    done
  done
fi
if stage bench; then
  step bench python3 bench/run.py --ops "$OPS" --out "$OUT"
fi
# The device tool brings back at most 8 files from $OUT, and which ones is
# not ours to choose (a results.json can be left behind). Past 8, everything
# goes into one archive, and results.json stays beside it.
files=$(find "$OUT" -type f | wc -l)
if (( files > 8 )); then
  if tar -czf /tmp/gpu_check_outputs.tgz -C "$OUT" .; then
    find "$OUT" -type f -not -name results.json -delete
    find "$OUT" -mindepth 1 -type d -empty -delete
    mv /tmp/gpu_check_outputs.tgz "$OUT/all_outputs.tgz"
  fi
  echo "=== $files files packed into \$OUT/all_outputs.tgz"
fi
exit $status
