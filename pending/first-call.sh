#!/bin/bash
# The next GPU session's first call, written 2026-12-05 when the device was
# not lent: everything main holds that has not run on a GPU, and the
# measurements the next changes need, in one call of ~9 minutes.
#
# Here (build machine, NVRTC on LD_LIBRARY_PATH for the pack's compile test):
#   bench/gpu-check --pack gpu-x/p && tar cJf gpu-x/p.tar.xz -C gpu-x p && rm -rf gpu-x/p
#   pending/variants/build gpu-x/v    # the kernel variants, as KILN_CUDA_SOURCE_DIR units
#   cp pending/first-call.sh gpu-x/
# Device: run(command="bash gpu-x/first-call.sh", carry=["gpu-x"], timeout_s=590)
# STEPS (default "tests profile gemv head split") picks steps; a step the
# time left cannot hold is cut, so a second call can run the rest, e.g.
# STEPS="head split" bash gpu-x/first-call.sh.
set -u
STEPS=" ${STEPS:-tests profile gemv head split} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
cd "$(dirname "$0")"; D=$PWD; R=$(cd .. && pwd)
tar xJf p.tar.xz || exit 1
export KILN_SHARED_DIR=$D/p/shared KILN_CACHE_DIR=/tmp/kiln-cache
S=$KILN_CACHE_DIR/synth; O=/tmp/out; mkdir -p $S $O; T0=$(date +%s)
left() { echo $((570 - $(date +%s) + T0)); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for z in 270m 1b 4b; do p/bin/kiln synth --arch gemma3 --size $z --quant q4_k_m -o $S/gemma3-$z-q4_k_m.gguf >/dev/null 2>&1 & done
wait
# 1. Tests: what changed since the last GPU run (the tensor-core head) and
#    the batched paths it feeds, side by side (NVRTC compiles each module
#    once per process on a fresh machine: ~1-2 minutes of CPU each).
if want tests; then
for t in matmul kv_batch synth graphs fused ops; do
    (timeout 200 p/bin/$t --test-threads=1 > $O/$t.log 2>&1; echo "$t rc=$? $(grep 'test result' $O/$t.log)") &
done
(KILN_CUDA_MMA_HEAD=1 timeout 200 p/bin/matmul argmax --test-threads=1 > $O/matmul-head.log 2>&1
 echo "matmul argmax KILN_CUDA_MMA_HEAD=1 rc=$? $(grep 'test result' $O/matmul-head.log)") &
(KILN_CUDA_MMA=2 timeout 200 p/bin/matmul --test-threads=1 > $O/matmul-mma2.log 2>&1
 echo "matmul KILN_CUDA_MMA=2 rc=$? $(grep 'test result' $O/matmul-mma2.log)") &
# The grouped decode GEMV (pending/variants/gemv-groups.patch): one-token
# products and whole models against the CPU.
for t in matmul synth; do
    (KILN_CUDA_SOURCE_DIR=$D/v/gemv-groups timeout 200 p/bin/$t --test-threads=1 > $O/$t-gemv.log 2>&1
     echo "$t gemv-groups rc=$? $(grep 'test result' $O/$t-gemv.log)") &
    (KILN_CUDA_GEMV=qdot timeout 200 p/bin/$t --test-threads=1 > $O/$t-qdot.log 2>&1
     echo "$t KILN_CUDA_GEMV=qdot rc=$? $(grep 'test result' $O/$t-qdot.log)") &
done
# The attention variant (pending/variants/attn-tile-rows.patch).
for t in ops fixtures synth kv_batch; do
    (KILN_CUDA_SOURCE_DIR=$D/v/attn-tile-rows timeout 200 p/bin/$t --test-threads=1 > $O/$t-attn.log 2>&1
     echo "$t attn-tile-rows rc=$? $(grep 'test result' $O/$t-attn.log)") &
done
wait; echo "tests done at $(( $(date +%s) - T0 )) s"
grep -hE "panicked|^---- " $O/*.log | head -8
fi
# 2. Where a batch-1 step and a 64-row step go (1B, 4B): not yet profiled.
want profile && for z in 1b 4b; do m=$S/gemma3-$z-q4_k_m.gguf
    KILN_CUDA_PROFILE=1 timeout 40 p/bin/decode_bench $m -p 16 -n 64 -r 1 > $O/prof1-$z.log 2>&1
    KILN_CUDA_PROFILE=1 timeout 40 p/bin/batch_bench $m -b 64 -p 128 -n 16 -r 1 > $O/prof64-$z.log 2>&1
    echo "== $z batch 1"; grep -v '^\s*$' $O/prof1-$z.log | tail -22; echo "== $z batch 64"; grep -v '^\s*$' $O/prof64-$z.log | tail -22
done
# 3. Switches side by side: the grouped and the integer-dot GEMV and the
#    attention variant (batch 1, pp512 / tg128), the tensor-core
#    head, the split-x GEMM, the split target.
want gemv && BATCHES=1 timeout $(( $(left) < 200 ? $(left) : 200 )) $R/bench/gpu-ab $D/p/bin 270m,1b,4b "" "KILN_CUDA_SOURCE_DIR=$D/v/gemv-groups" "KILN_CUDA_GEMV=qdot" "KILN_CUDA_SOURCE_DIR=$D/v/attn-tile-rows" 2>&1 | tee $O/ab-gemv.log
want head && [ $(left) -gt 60 ] && BATCHES=16,64 DECODE=0 timeout $(( $(left) - 30 )) $R/bench/gpu-ab $D/p/bin 1b,4b "" "KILN_CUDA_MMA_HEAD=1" "KILN_CUDA_MMA=2" "KILN_CUDA_MMA=2 KILN_CUDA_MMA_HEAD=1" 2>&1 | tee $O/ab-head.log
want split && [ $(left) -gt 100 ] && MATMUL=1 BATCHES=16,64 DECODE=0 timeout $(( $(left) - 10 )) $R/bench/gpu-ab $D/p/bin 1b,4b "" "KILN_CUDA_MMA=2" "KILN_CUDA_MMA_CTAS_PER_SM=occupancy" "KILN_CUDA_MMA_CTAS_PER_SM=2" 2>&1 | tee $O/ab-split.log
tar czf $OUT/first-call.tgz -C /tmp out
