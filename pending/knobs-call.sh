#!/bin/bash
# Next session's first call (written 2026-12-06, eleventh session): existing
# knobs on the 4B, no rebuild needed, then ncu on the 64-row split-x GEMM at
# three CTAs an SM. Pack: `cargo build --release; bench/gpu-check --pack
# gpu-x/p; tar cJf gpu-x/p.tar.xz -C gpu-x p; rm -rf gpu-x/p; cp
# pending/knobs-call.sh gpu-x/`. Device: run(command="bash
# gpu-x/knobs-call.sh", carry=["gpu-x/p.tar.xz", "gpu-x/knobs-call.sh"]).
set -u
cd "$(dirname "$0")"; D=$PWD
rm -rf p; tar xJf p.tar.xz || exit 1
export KILN_SHARED_DIR=$D/p/shared KILN_CACHE_DIR=/tmp/kiln-cache
S=$KILN_CACHE_DIR/synth; O=${OUT:-/tmp}/o; mkdir -p $S $O; T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M=$S/gemma3-4b-q4_k_m.gguf
p/bin/kiln synth --arch gemma3 --size 4b --quant q4_k_m -o $M >/dev/null 2>&1
timeout 150 p/bin/decode_bench $M -p 16 -n 4 -r 1 >/dev/null 2>&1; echo "warm $(el) s"
# The GPU tests of the 8-tile GEMV default (a347f67), beside nothing else.
(timeout 240 p/bin/matmul --test-threads=4 > $O/matmul.log 2>&1; echo "matmul rc=$? $(grep 'test result' $O/matmul.log | tail -1)") &
(KILN_CUDA_SYNTH_SIZES=270m,1b timeout 240 p/bin/synth --test-threads=2 > $O/synth.log 2>&1; echo "synth rc=$? $(grep 'test result' $O/synth.log | tail -1)") &
(timeout 100 p/bin/graphs > $O/graphs.log 2>&1; echo "graphs rc=$? $(grep 'test result' $O/graphs.log | tail -1)") &
wait; echo "tests $(el) s"
tg() { timeout 40 p/bin/decode_bench $M -p 16 -n 128 -r 2 2>&1 | grep -oE '"tg_tok_s":[0-9.]*' | cut -d: -f2; }
# Batch-1 GEMV geometry (latency-bound: more tiles / warps in flight?).
echo "tg default $(tg)"
for v in "KILN_CUDA_GEMV_TILES=4" "KILN_CUDA_GEMV_TILES=6" "KILN_CUDA_GEMV_TILES=12" "KILN_CUDA_GEMV_SPLIT=1" "KILN_CUDA_GEMV=f32" "KILN_CUDA_ATTN_SPLIT=2"; do
  echo "tg $v $(export $v; tg)"
done
echo "tg default $(tg) [$(el) s]"
# The 64-row split-x GEMM's split along k at three CTAs an SM.
bb() { timeout 60 p/bin/batch_bench $M -b 64 -p 64 -n 64 -r 2 2>&1 | grep -oE '"tok_s":[0-9.]*' | cut -d: -f2 | tr '\n' ' '; }
echo "64 rows default $(bb)"
for n in 2 3 4 6 occupancy; do echo "64 rows KILN_CUDA_MMA_CTAS_PER_SM=$n $(KILN_CUDA_MMA_CTAS_PER_SM=$n bb)"; done
echo "[$(el) s]"
# The 4B server's prompt tokens a step (TTFT median must stay <= 0.25 s).
for t in 256 448; do echo "serve 4b --step-tokens $t: $(SERVE_ARGS="--step-tokens $t" timeout 60 ../bench/gpu-serve p/bin/kiln 4b 64 64 2>&1 | grep 'streams:')"; done
echo "[$(el) s]"
SEC="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats"
KILN_CUDA_PROFILE=1 timeout 120 ncu --clock-control none $SEC -k regex:mma2h_gemm --launch-skip 8 --launch-count 2 p/bin/batch_bench $M -b 64 -p 4 -n 4 -r 1 > $O/mma64.txt 2>&1
grep -E "mma2h_gemm|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Eligible|stall" $O/mma64.txt | head -30
echo "done $(el) s"
