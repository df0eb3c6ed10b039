#!/bin/bash
# Issue 13 at 64 streams: how many prompt tokens a server step should take
# on a GPU (`kiln serve --step-tokens`, default 256 on every device). A
# step of 64 decode rows plus S prompt rows runs one GEMM of 64 + S rows;
# up to KILN_CUDA_MMA2_ROWS (default 512) rows take the split-x GEMM
# (128 x 128 CTAs), more fall back to mma_gemm, so S = 448 / 960 are timed
# with ROWS=512 / 1024. 1B (needs 8,300 tok/s; 8,032 at 256) and 4B.
# Pack: `bench/gpu-check --pack gpu-x/p` of main, `tar cJf gpu-x/p.tar.xz
# -C gpu-x p`; carry it and this file.
set -u
cd "$(dirname "$0")"; D=$PWD
rm -rf p; tar xJf p.tar.xz || exit 1
export KILN_SHARED_DIR=$D/p/shared KILN_CACHE_DIR=/tmp/kiln-cache
S=$KILN_CACHE_DIR/synth; mkdir -p $S; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for z in 1b 4b; do [ -f $S/gemma3-$z-q4_k_m.gguf ] || p/bin/kiln synth --arch gemma3 --size $z --quant q4_k_m -o $S/gemma3-$z-q4_k_m.gguf >/dev/null 2>&1 & done; wait
timeout 150 p/bin/decode_bench $S/gemma3-1b-q4_k_m.gguf -p 16 -n 8 -r 1 >/dev/null 2>&1
echo "warm $(( $(date +%s) - T0 )) s"
for z in 1b 4b; do
    for v in "256 512" "448 512" "960 1024" "256 512"; do
        set -- $v
        echo "$z --step-tokens $1 ROWS=$2: $(KILN_CUDA_MMA2_ROWS=$2 SERVE_ARGS="--step-tokens $1" timeout 100 ../bench/gpu-serve p/bin/kiln $z 64 64 2>&1 | grep 'streams:')"
    done
done
echo "done $(( $(date +%s) - T0 )) s"
