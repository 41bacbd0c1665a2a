L=$OUT/l; mkdir -p $L; trap "tar czf $OUT/c9.tgz -C $L ." EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > $L/gpu.txt
OUT=$L/g bash bench/gpu_check.sh decode build > $L/g.log 2>&1
timeout 200 python3 bench/run.py --ops decode --out $L/dec > $L/dec.log 2>&1
JAXCRAFT_BENCH_SOFTMAX_MODES=fwd,bwd JAXCRAFT_BENCH_MODES=fwd,bwd JAXCRAFT_BENCH_ACTIVATION_OPS=gelu,bias_gelu,bias_gelu_erf timeout 220 python3 bench/run.py --ops softmax,activations,embedding --out $L/i9 > $L/i9.log 2>&1
