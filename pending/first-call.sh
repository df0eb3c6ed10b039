#!/bin/bash
# A GPU session's first call (written 2026-12-05, eighth session; not yet
# run): time and test pending/gpu-qdot-loads.patch's batch-1 GEMV (each
# qdot kernel direct-only; per-type group loads) against 5a69584's kernels
# (old-src) and the f32 / all-qdot forms, profile a 4B step, and run every
# GPU test on the patch's defaults, with every type through qdot and
# through the half-plane GEMM (KILN_CUDA_MMA=3). second-call.sh then times
# the batched forms and the 64-stream serve.
#
# Here (build machine, NVRTC on LD_LIBRARY_PATH for the pack's compile
# test), on a branch of main with the patch applied:
#   git apply pending/gpu-qdot-loads.patch && cargo build --release &&
#   bench/gpu-check --pack gpu-x/p && cp -r gpu-x/old-src gpu-x/p/ &&
#   tar cJf gpu-x/p.tar.xz -C gpu-x p && rm -rf gpu-x/p
#   cp pending/first-call.sh pending/second-call.sh gpu-x/
# old-src: 5a69584's matmul units, one per type: `#define KILN_WEIGHT T`
# then common.cuh quant.cuh matmul.cu skinny.cu stream.cu qdot.cu mma.cu
# mma2.cu as `git show 5a69584:crates/kiln-cuda/kernels/F` (matmul.rs's
# order), named matmul_T.cu for the 13 types of matmul.rs's SOURCES.
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
# Compiles the modules once (both sources, side by side).
timeout 150 p/bin/decode_bench $S/gemma3-270m-q4_k_m.gguf -p 16 -n 8 -r 1 >/dev/null 2>&1 &
KILN_CUDA_SOURCE_DIR=$D/p/old-src timeout 150 p/bin/decode_bench $S/gemma3-270m-q4_k_m.gguf -p 16 -n 8 -r 1 >/dev/null 2>&1 &
wait; echo "warm $(( $(date +%s) - T0 )) s"
# 1. Benchmarks first (a quiet GPU), tg128 and pp512.
b() { local line="$*:"; for z in 270m 1b 4b; do
    r=$(env "$@" timeout 60 p/bin/decode_bench $S/gemma3-$z-q4_k_m.gguf -p 512 -n 128 -r 3 2>&1 | grep -o '"[pt][pg]_tok_s":[0-9.]*' | cut -d: -f2 | tr '\n' '/')
    line="$line $z=$r"; done; echo "$line" | tee -a $O/bench.txt; }
b X=defaults
b KILN_CUDA_SOURCE_DIR=$D/p/old-src
b KILN_CUDA_GEMV=f32
b KILN_CUDA_GEMV=qdot
b X=defaults
echo "bench $(( $(date +%s) - T0 )) s"
# Where a 4B step goes now (per launch, serialized; stderr table).
KILN_CUDA_PROFILE=1 timeout 60 p/bin/decode_bench $S/gemma3-4b-q4_k_m.gguf -p 16 -n 64 -r 1 > $O/profile-4b.txt 2>&1
head -30 $O/profile-4b.txt
# 2. Every GPU test binary on the defaults, side by side (the synthetic
#    files are written once above, so the test processes do not race).
for t in matmul synth kv_batch graphs fused fixtures ops sample nan_fallback device fallback; do
    [ -x p/bin/$t ] || continue
    (timeout 240 p/bin/$t --test-threads=2 > $O/$t.log 2>&1; echo "$t rc=$? $(grep 'test result' $O/$t.log | tail -1)") &
done
# Every type through the qdot kernels (and a whole model), and through
# the half-plane GEMM.
for t in matmul synth; do
    (KILN_CUDA_GEMV=qdot timeout 240 p/bin/$t --test-threads=2 > $O/${t}_qdot.log 2>&1; echo "$t qdot rc=$? $(grep 'test result' $O/${t}_qdot.log | tail -1)") &
done
(KILN_CUDA_MMA=3 timeout 240 p/bin/matmul --test-threads=2 > $O/matmul_half.log 2>&1; echo "matmul MMA=3 rc=$? $(grep 'test result' $O/matmul_half.log | tail -1)") &
wait; echo "tests $(( $(date +%s) - T0 )) s"
grep -h -A3 "panicked" $O/*.log | head -12
echo "done $(( $(date +%s) - T0 )) s"
