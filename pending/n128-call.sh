#!/bin/bash
# The 128 x 128 split-x CTA (default for prefill products whose tiles fill
# the GPU; KILN_CUDA_MMA_N128=0 keeps 128 x 64) and prefill on the split-x
# GEMM (default now; KILN_CUDA_MMA2_ROWS=128 sends it back to mma_gemm):
# model tests with them, pp512 of the 270M/1B/4B in the three forms, the
# 1B and 4B 64-stream serve; then (SOAK=1) issue 13's soak started in the
# background for soak-call.sh finish in the next call.
set -u
cd "$(dirname "$0")"; D=$PWD
rm -rf p; tar xJf p.tar.xz || exit 1
export KILN_SHARED_DIR=$D/p/shared KILN_CACHE_DIR=/tmp/kiln-cache
S=$KILN_CACHE_DIR/synth; O=${OUT:-/tmp}/o; mkdir -p $S $O; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for z in 270m 1b 4b; do [ -f $S/gemma3-$z-q4_k_m.gguf ] || p/bin/kiln synth --arch gemma3 --size $z --quant q4_k_m -o $S/gemma3-$z-q4_k_m.gguf >/dev/null 2>&1 & done; wait
timeout 150 p/bin/decode_bench $S/gemma3-270m-q4_k_m.gguf -p 16 -n 8 -r 1 >/dev/null 2>&1
echo "warm $(( $(date +%s) - T0 )) s"
(timeout 200 p/bin/matmul --test-threads=4 > $O/matmul.log 2>&1; echo "matmul rc=$? $(grep 'test result' $O/matmul.log | tail -1)"; grep -E "FAIL|panicked" $O/matmul.log | head -5) &
(KILN_CUDA_SYNTH_SIZES=270m,1b timeout 200 p/bin/synth --test-threads=2 > $O/synth.log 2>&1; echo "synth 270m,1b rc=$? $(grep 'test result' $O/synth.log | tail -1)"; grep -hE "max\|" $O/synth.log | head -6) &
(timeout 120 p/bin/fixtures --test-threads=2 > $O/fixtures.log 2>&1; echo "fixtures rc=$? $(grep 'test result' $O/fixtures.log | tail -1)") &
(timeout 120 p/bin/kv_batch > $O/kv.log 2>&1; echo "kv_batch rc=$? $(grep 'test result' $O/kv.log | tail -1)") &
(timeout 120 p/bin/graphs > $O/graphs.log 2>&1; echo "graphs rc=$? $(grep 'test result' $O/graphs.log | tail -1)") &
wait; echo "tests $(( $(date +%s) - T0 )) s"
for v in "X=1" "KILN_CUDA_MMA_N128=0" "KILN_CUDA_MMA2_ROWS=128"; do
    line="$v:"; for z in 270m 1b 4b; do
        r=$(env $v timeout 60 p/bin/decode_bench $S/gemma3-$z-q4_k_m.gguf -p 512 -n 32 -r 2 2>&1 | grep -oE '"(pp|tg)_tok_s":[0-9.]*' | cut -d: -f2 | tr '\n' '/'); line="$line $z=$r"; done; echo "$line"
done
echo "bench $(( $(date +%s) - T0 )) s"
for z in ${SERVE:-1b 4b}; do timeout 100 ../bench/gpu-serve p/bin/kiln $z 64 64 2>&1 | grep "streams:"; done
echo "serve $(( $(date +%s) - T0 )) s"
[ "${SOAK:-0}" = 1 ] || KILN_CUDA_PROFILE=1 timeout 60 p/bin/decode_bench $S/gemma3-4b-q4_k_m.gguf -p 512 -n 1 -r 1 2>&1 | grep -A12 'kiln-cuda profile'
if [ "${SOAK:-0}" = 1 ]; then
    W=/tmp/soak; mkdir -p $W; cp -r ../bench $W/bench; cp -r p $W/p
    nohup bash -c "$W/bench/gpu-soak $W/p/bin/kiln 1b 64 600 > $W/soak.log 2>&1; echo \"rc=\$?\" >> $W/soak.log" > /dev/null 2>&1 &
    echo "soak started $(( $(date +%s) - T0 )) s"
    sleep $(( 585 - ($(date +%s) - T0) )); tail -3 $W/soak.log
fi
echo "done $(( $(date +%s) - T0 )) s"
