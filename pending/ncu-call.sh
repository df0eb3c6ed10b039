#!/bin/bash
# ncu on the decode GEMVs (batch 1) and the 64-row GEMM: where they stall.
# Ran 2026-12-05 16:46 UTC on an H100 (Firecracker: ncu reads counters;
# bench/RESULTS.md holds its table). Here:
#   bench/gpu-check --pack gpu-x/p && tar cJf gpu-x/p.tar.xz -C gpu-x p && rm -rf gpu-x/p
#   cp pending/ncu-call.sh gpu-x/
# Device: run(command="bash gpu-x/ncu-call.sh", carry=["gpu-x/p.tar.xz", "gpu-x/ncu-call.sh"])
# (drop the KILN_CUDA_MMA* exports: they are the defaults since a41ec2d).
set -u
cd "$(dirname "$0")"; D=$PWD
tar xJf p.tar.xz || exit 1
export KILN_SHARED_DIR=$D/p/shared KILN_CACHE_DIR=/tmp/kiln-cache KILN_CUDA_MMA=2 KILN_CUDA_MMA_HEAD=1
S=/tmp/synth; O=$OUT/o; mkdir -p $S $O; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
which ncu; ncu --version | tail -1
for z in 270m 1b 4b; do p/bin/kiln synth --arch gemma3 --size $z --quant q4_k_m -o $S/g-$z.gguf >/dev/null 2>&1 & done
wait; echo "synth done $(( $(date +%s) - T0 )) s"
# warm the cubin cache and a baseline
for z in 4b 1b 270m; do echo "== $z"; timeout 150 p/bin/decode_bench $S/g-$z.gguf -p 512 -n 128 -r 2 2>&1 | tail -3; done
echo "bench done $(( $(date +%s) - T0 )) s"
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats"
N="ncu --clock-control none $SEC"
KILN_CUDA_PROFILE=1 timeout 120 $N -k regex:stream_matvec --launch-skip 24 --launch-count 8 p/bin/decode_bench $S/g-4b.gguf -p 16 -n 4 -r 1 > $O/4b-gemv.txt 2>&1
echo "4b gemv $(( $(date +%s) - T0 )) s"
KILN_CUDA_PROFILE=1 timeout 90 $N -k regex:"attn_decode|stream_argmax|add_rms|split_heads|gelu" --launch-skip 10 --launch-count 8 p/bin/decode_bench $S/g-4b.gguf -p 16 -n 4 -r 1 > $O/4b-other.txt 2>&1
KILN_CUDA_PROFILE=1 timeout 90 $N -k regex:stream_matvec --launch-skip 24 --launch-count 8 p/bin/decode_bench $S/g-1b.gguf -p 16 -n 4 -r 1 > $O/1b-gemv.txt 2>&1
KILN_CUDA_GEMV=qdot KILN_CUDA_PROFILE=1 timeout 90 $N -k regex:qdot_matvec --launch-skip 24 --launch-count 6 p/bin/decode_bench $S/g-4b.gguf -p 16 -n 4 -r 1 > $O/4b-qdot.txt 2>&1
echo "qdot $(( $(date +%s) - T0 )) s"
KILN_CUDA_PROFILE=1 timeout 120 $N -k regex:mma2_gemm --launch-skip 10 --launch-count 6 p/bin/batch_bench $S/g-4b.gguf -b 64 -p 4 -n 4 -r 1 > $O/4b-mma64.txt 2>&1
echo "all done $(( $(date +%s) - T0 )) s"
for f in $O/*.txt; do echo "== $f"; grep -E "^\s+[a-z_0-9]+.*\(\d*|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Ipc|Theoretical Occupancy" $f | head -60; done
