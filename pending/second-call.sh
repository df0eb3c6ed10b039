#!/bin/bash
# The second call after first-call.sh (same pack; carry gpu-x/p.tar.xz and
# this file): batched decode at 64 rows for the GEMM forms (the patch's
# default, 5a69584's kernels, the 128-row CTA at 64 rows, the half-plane
# GEMM), the half-plane GEMM's whole-model tests, and issue 13's 4B serve
# at 64 streams with the best form (FORM=VAR=VALUE, default none).
set -u
cd "$(dirname "$0")"; D=$PWD
tar xJf p.tar.xz || exit 1
export KILN_SHARED_DIR=$D/p/shared KILN_CACHE_DIR=/tmp/kiln-cache
S=$KILN_CACHE_DIR/synth; O=${OUT:-/tmp}/o; mkdir -p $S $O; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for z in 1b 4b; do p/bin/kiln synth --arch gemma3 --size $z --quant q4_k_m -o $S/gemma3-$z-q4_k_m.gguf >/dev/null 2>&1 & done
wait
for v in "X=1" "KILN_CUDA_SOURCE_DIR=$D/p/old-src" "KILN_CUDA_MMA=3"; do
    env $v timeout 150 p/bin/batch_bench $S/gemma3-1b-q4_k_m.gguf -b 8 -p 16 -n 4 -r 1 >/dev/null 2>&1 &
done; wait; echo "warm $(( $(date +%s) - T0 )) s"
for z in 1b 4b; do for v in "X=1" "KILN_CUDA_SOURCE_DIR=$D/p/old-src" "KILN_CUDA_MMA_WIDE=1" "KILN_CUDA_MMA=3" "KILN_CUDA_MMA=3 KILN_CUDA_MMA_WIDE=1"; do
    echo "batch $z $v: $(env $v timeout 60 p/bin/batch_bench $S/gemma3-$z-q4_k_m.gguf -b 16,64 -p 64 -n 64 -r 3 2>&1 | grep -iE 'tok/s' | tail -3 | tr '\n' ' ')"
done; done
echo "bench $(( $(date +%s) - T0 )) s"
for t in synth kv_batch graphs; do
    (KILN_CUDA_MMA=3 timeout 200 p/bin/$t --test-threads=2 > $O/${t}_half.log 2>&1; echo "$t MMA=3 rc=$? $(grep 'test result' $O/${t}_half.log | tail -1)") &
done
wait; echo "tests $(( $(date +%s) - T0 )) s"
grep -h -A3 "panicked" $O/*.log | head -12
[ $(( $(date +%s) - T0 )) -lt 420 ] && env ${FORM:-X=1} timeout 150 ../bench/gpu-serve p/bin/kiln 4b 1,64 64 2>&1 | tail -8
echo "done $(( $(date +%s) - T0 )) s"
