#!/bin/bash
# The next GPU session's first call (written 2026-12-05 18:40 UTC, when
# the device budget was spent): time the batch-1 GEMV defaults landed in
# cfcc5d3 (qdot + direct reads for products of 2^24+ weights in rows of
# 2,048+ values; k-split 4; split_heads' early RoPE angles) against the
# older forms, run every GPU test on them, and the 64-stream serve.
#
# Here (build machine, NVRTC on LD_LIBRARY_PATH for the pack's compile test):
#   bench/gpu-check --pack gpu-x/p && tar cJf gpu-x/p.tar.xz -C gpu-x p && rm -rf gpu-x/p
#   cp pending/first-call.sh gpu-x/
# Device: run(command="bash gpu-x/first-call.sh", carry=["gpu-x/p.tar.xz",
#   "gpu-x/first-call.sh"], timeout_s=590). Carry only what a call needs
#   (64 MiB in all, the working tree included).
set -u
cd "$(dirname "$0")"; D=$PWD
tar xJf p.tar.xz || exit 1
export KILN_SHARED_DIR=$D/p/shared KILN_CACHE_DIR=/tmp/kiln-cache
S=$KILN_CACHE_DIR/synth; O=${OUT:-/tmp}/o; mkdir -p $S $O; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for z in 270m 1b 4b; do p/bin/kiln synth --arch gemma3 --size $z --quant q4_k_m -o $S/gemma3-$z-q4_k_m.gguf >/dev/null 2>&1 & done
wait
timeout 150 p/bin/decode_bench $S/gemma3-270m-q4_k_m.gguf -p 16 -n 8 -r 1 >/dev/null 2>&1  # compiles the modules once
echo "warm $(( $(date +%s) - T0 )) s"
# 1. Benchmarks first (a quiet GPU), tg128 and pp512.
b() { local line="$*:"; for z in 270m 1b 4b; do
    r=$(env "$@" timeout 60 p/bin/decode_bench $S/gemma3-$z-q4_k_m.gguf -p 512 -n 128 -r 3 2>&1 | grep -o '"[pt][pg]_tok_s":[0-9.]*' | cut -d: -f2 | tr '\n' '/')
    line="$line $z=$r"; done; echo "$line" | tee -a $O/bench.txt; }
b X=defaults
b KILN_CUDA_GEMV=f32 KILN_CUDA_STREAM=staged
b KILN_CUDA_GEMV=qdot KILN_CUDA_STREAM=direct KILN_CUDA_GEMV_TILES=8
b KILN_CUDA_GEMV_SPLIT=1
b X=defaults
echo "bench $(( $(date +%s) - T0 )) s"
# 2. Every GPU test binary on the defaults, side by side (the synthetic
#    file is written once above, so the test processes do not race).
for t in matmul synth kv_batch graphs fused fixtures ops sample nan_fallback device fallback; do
    [ -x p/bin/$t ] || continue
    (timeout 240 p/bin/$t --test-threads=2 > $O/$t.log 2>&1; echo "$t rc=$? $(grep 'test result' $O/$t.log | tail -1)") &
done
wait; echo "tests $(( $(date +%s) - T0 )) s"
grep -h -A3 "panicked" $O/*.log | head -12
# 3. Issue 13's 64 streams through kiln serve, if time is left.
[ $(( $(date +%s) - T0 )) -lt 420 ] && timeout 150 ../bench/gpu-serve p/bin/kiln 4b 1,64 64 2>&1 | tail -8
echo "done $(( $(date +%s) - T0 )) s"
