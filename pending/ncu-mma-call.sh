#!/bin/bash
# ncu stall reasons of the split-x GEMM at 64 rows (the 4B's FFN gate+up,
# mma2h m64n64) and of a 512-token prefill chunk (m128n128): the 2026-12-06
# run showed a third fewer instructions per k step changed nothing at 64
# rows, so the kernel waits on something; WarpStateStats says on what
# (long scoreboard = global loads, barrier, short scoreboard = shared
# memory, math pipe throttle = tensor cores).
# Pack: bench/gpu-check --pack gpu-x/p && tar cJf gpu-x/p.tar.xz -C gpu-x p && rm -rf gpu-x/p
#   cp pending/ncu-mma-call.sh gpu-x/
# Device: run(command="bash gpu-x/ncu-mma-call.sh", carry=["gpu-x/p.tar.xz", "gpu-x/ncu-mma-call.sh"])
set -u
cd "$(dirname "$0")"; D=$PWD
rm -rf p; tar xJf p.tar.xz || exit 1
export KILN_SHARED_DIR=$D/p/shared KILN_CACHE_DIR=/tmp/kiln-cache
S=$KILN_CACHE_DIR/synth; O=${OUT:-/tmp}/o; mkdir -p $S $O; T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
p/bin/kiln synth --arch gemma3 --size 4b --quant q4_k_m -o $S/gemma3-4b-q4_k_m.gguf >/dev/null 2>&1
timeout 200 p/bin/batch_bench $S/gemma3-4b-q4_k_m.gguf -b 64 -p 64 -n 8 -r 1 2>&1 | tail -1
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats --section InstructionStats --section SchedulerStats"
N="ncu --clock-control none $SEC"
KILN_CUDA_PROFILE=1 timeout 200 $N -k regex:mma2h_gemm --launch-skip 8 --launch-count 6 p/bin/batch_bench $S/gemma3-4b-q4_k_m.gguf -b 64 -p 4 -n 4 -r 1 > $O/mma64.txt 2>&1
echo "64 rows $(( $(date +%s) - T0 )) s"
KILN_CUDA_PROFILE=1 timeout 150 $N -k regex:mma2h_gemm --launch-skip 8 --launch-count 4 p/bin/decode_bench $S/gemma3-4b-q4_k_m.gguf -p 512 -n 1 -r 1 > $O/mma512.txt 2>&1
echo "512 rows $(( $(date +%s) - T0 )) s"
for f in $O/mma*.txt; do echo "== $f"; grep -E "mma2h_gemm|Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Ipc|Stall|stall" $f | head -80; done
