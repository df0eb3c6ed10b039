#!/bin/bash
# Prefill chunks on the split-x GEMM (KILN_CUDA_MMA2_ROWS=512: half planes
# at 65-512 rows) against the default (mma_gemm above 128 rows): pp512,
# the 4B serve at 64 streams, and the model tests with it.
set -u
cd "$(dirname "$0")"; D=$PWD
rm -rf p; tar xJf p.tar.xz || exit 1
export KILN_SHARED_DIR=$D/p/shared KILN_CACHE_DIR=/tmp/kiln-cache
S=$KILN_CACHE_DIR/synth; O=${OUT:-/tmp}/o; mkdir -p $S $O; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for z in 270m 1b 4b; do [ -f $S/gemma3-$z-q4_k_m.gguf ] || p/bin/kiln synth --arch gemma3 --size $z --quant q4_k_m -o $S/gemma3-$z-q4_k_m.gguf >/dev/null 2>&1 & done; wait
timeout 150 p/bin/decode_bench $S/gemma3-270m-q4_k_m.gguf -p 16 -n 8 -r 1 >/dev/null 2>&1
echo "warm $(( $(date +%s) - T0 )) s"
(KILN_CUDA_MMA2_ROWS=512 timeout 100 p/bin/synth --test-threads=2 > $O/synth.log 2>&1; echo "synth ROWS=512 rc=$? $(grep 'test result' $O/synth.log | tail -1)"; grep -hE "prefill 512|decode 256|greedy" $O/synth.log | head -4) &
(KILN_CUDA_MMA2_ROWS=512 timeout 100 p/bin/fixtures --test-threads=2 > $O/fixtures.log 2>&1; echo "fixtures ROWS=512 rc=$? $(grep 'test result' $O/fixtures.log | tail -1)") &
(KILN_CUDA_MMA2_ROWS=512 timeout 100 p/bin/kv_batch > $O/kv.log 2>&1; echo "kv_batch ROWS=512 rc=$? $(grep 'test result' $O/kv.log | tail -1)") &
wait; echo "tests $(( $(date +%s) - T0 )) s"
for v in "X=1" "KILN_CUDA_MMA2_ROWS=512" "X=1" "KILN_CUDA_MMA2_ROWS=512"; do
    line="$v:"; for z in 270m 1b 4b; do
        r=$(env $v timeout 60 p/bin/decode_bench $S/gemma3-$z-q4_k_m.gguf -p 512 -n 32 -r 3 2>&1 | grep -o '"pp_tok_s":[0-9.]*' | cut -d: -f2); line="$line $z=$r"; done; echo "$line"
done
for v in "X=1" "KILN_CUDA_MMA2_ROWS=512"; do
    [ $(( $(date +%s) - T0 )) -lt 330 ] && echo "$v" && env $v timeout 100 ../bench/gpu-serve p/bin/kiln 4b 64 64 2>&1 | grep "streams:"
done
echo "done $(( $(date +%s) - T0 )) s"
