#!/bin/bash
# A GPU session's first call (written 2026-12-05 evening, not yet run):
# time pending/gpu-qdot-loads.patch's batch-1 GEMV (each qdot kernel
# direct-only; per-type group loads) against 5a69584's kernels (old-src)
# and the f32 / all-qdot forms, its mma2 registers change at 64 rows
# (new2-src), run every GPU test on it, and the 64-stream serve.
#
# Here (build machine, NVRTC on LD_LIBRARY_PATH for the pack's compile
# test), on a branch with the patch applied (the pack's binaries carry
# its items 1-2; new2-src adds item 3 by KILN_CUDA_SOURCE_DIR):
#   cargo build --release && bench/gpu-check --pack gpu-x/p && cp -r gpu-x/old-src gpu-x/mid-src gpu-x/new2-src gpu-x/p/ &&
#   tar cJf gpu-x/p.tar.xz -C gpu-x p && rm -rf gpu-x/p
#   cp pending/first-call.sh gpu-x/
# (old-src: the matmul units of 5a69584, `#define KILN_WEIGHT T` + the
# eight files as matmul.rs joins them; mid-src: the new stream.cu with
# 5a69584's qdot.cu made direct-only, before the per-type group loads.)
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
for v in old mid new2; do KILN_CUDA_SOURCE_DIR=$D/p/$v-src timeout 150 p/bin/decode_bench $S/gemma3-270m-q4_k_m.gguf -p 16 -n 8 -r 1 >/dev/null 2>&1 & done; wait
echo "warm $(( $(date +%s) - T0 )) s"
# 1. Benchmarks first (a quiet GPU), tg128 and pp512.
b() { local line="$*:"; for z in 270m 1b 4b; do
    r=$(env "$@" timeout 60 p/bin/decode_bench $S/gemma3-$z-q4_k_m.gguf -p 512 -n 128 -r 3 2>&1 | grep -o '"[pt][pg]_tok_s":[0-9.]*' | cut -d: -f2 | tr '\n' '/')
    line="$line $z=$r"; done; echo "$line" | tee -a $O/bench.txt; }
b X=defaults
b KILN_CUDA_SOURCE_DIR=$D/p/old-src
b KILN_CUDA_SOURCE_DIR=$D/p/mid-src
b KILN_CUDA_GEMV=f32
b KILN_CUDA_GEMV=qdot
b X=defaults
echo "bench $(( $(date +%s) - T0 )) s"
# Where a 4B step goes now (per launch, serialized; stderr table).
KILN_CUDA_PROFILE=1 timeout 60 p/bin/decode_bench $S/gemma3-4b-q4_k_m.gguf -p 16 -n 64 -r 1 > $O/profile-4b.txt 2>&1
KILN_CUDA_PROFILE=1 KILN_CUDA_SOURCE_DIR=$D/p/old-src timeout 60 p/bin/decode_bench $S/gemma3-4b-q4_k_m.gguf -p 16 -n 64 -r 1 > $O/profile-4b-old.txt 2>&1
head -30 $O/profile-4b.txt
# 64-row batched decode: mma2 with bf16 codes held between steps (new2-src)
# against the pack's kernels, and the 128-row CTA at 64 rows
# (KILN_CUDA_MMA_WIDE=1, main since 2026-12-05 21:00; a pack older than
# that ignores it).
# (A pack rebuilt from main + the whole patch has item 3 built in: then
# old-src is the baseline.)
for z in 1b 4b; do for v in "X=1" "KILN_CUDA_SOURCE_DIR=$D/p/new2-src" "KILN_CUDA_SOURCE_DIR=$D/p/old-src" "KILN_CUDA_MMA_WIDE=1"; do
    echo "batch $z $v: $(env $v timeout 90 p/bin/batch_bench $S/gemma3-$z-q4_k_m.gguf -b 64 -p 64 -n 64 -r 3 2>&1 | grep -iE 'tok/s' | tail -2 | tr '\n' ' ')"
done; done
# 2. Every GPU test binary on the defaults, side by side (the synthetic
#    file is written once above, so the test processes do not race).
for t in matmul synth kv_batch graphs fused fixtures ops sample nan_fallback device fallback; do
    [ -x p/bin/$t ] || continue
    (timeout 240 p/bin/$t --test-threads=2 > $O/$t.log 2>&1; echo "$t rc=$? $(grep 'test result' $O/$t.log | tail -1)") &
done
(KILN_CUDA_SOURCE_DIR=$D/p/new2-src timeout 240 p/bin/matmul --test-threads=2 > $O/matmul_new2.log 2>&1; echo "matmul new2 rc=$? $(grep 'test result' $O/matmul_new2.log | tail -1)") &
# Every type through the qdot kernels, and a whole model on them.
for t in matmul synth; do
    (KILN_CUDA_GEMV=qdot timeout 240 p/bin/$t --test-threads=2 > $O/${t}_qdot.log 2>&1; echo "$t qdot rc=$? $(grep 'test result' $O/${t}_qdot.log | tail -1)") &
done
wait; echo "tests $(( $(date +%s) - T0 )) s"
grep -h -A3 "panicked" $O/*.log | head -12
# 3. Issue 13's 64 streams through kiln serve, if time is left.
[ $(( $(date +%s) - T0 )) -lt 420 ] && timeout 150 ../bench/gpu-serve p/bin/kiln 4b 1,64 64 2>&1 | tail -8
echo "done $(( $(date +%s) - T0 )) s"
