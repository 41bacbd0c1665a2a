set -u
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p $O
obj=/tmp/ao; mkdir -p $obj
t0=$SECONDS
ls cpp/kernels/attention/*.cu cpp/kernels/attention/sm90/*.cu | xargs -P 16 -I{} bash -c 'nvcc -std=c++17 -O3 --expt-relaxed-constexpr -Icpp -gencode=arch=compute_90a,code=sm_90a -c {} -o /tmp/ao/$(echo {} | tr / _).o' > $O/build.log 2>&1
nvcc -gencode=arch=compute_90a,code=sm_90a /tmp/ao/*.o -o /tmp/attn_test.bin >> $O/build.log 2>&1
echo "build rc=$? $((SECONDS-t0))s"
timeout 300 /tmp/attn_test.bin fwdvariants > $O/fwdvar.txt 2>&1; echo "run rc=$?"
sed 's/ overlap 1 persistent 1//; s/sm90 fwd //; s/(causal up to [0-9]*) //; s/Q buffers/QB/; s/O in stage/OS/; s/split K.V/SKV/' $O/fwdvar.txt | cut -c1-200
