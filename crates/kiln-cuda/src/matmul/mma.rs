//! The tensor-core GEMM of kernels/mma.cu: integer codes times three
//! bfloat16 planes of x, with each 16-column chunk's scale and min applied
//! in f32 (within f32 accumulation of the exact product; see mma.cu), on
//! GPUs of compute capability 8.0 or newer, for quantized and BF16 weights
//! (F32 and F16 are not exact in bfloat16 and keep the f32 kernels). It
//! takes every product of 8 or more token rows (batched decode and
//! prefill), where it measured faster than the f32 kernels on the H200
//! ([`MMA_MIN_TOKENS`]); `KILN_CUDA_MMA=0` sends none (A/B timing, and
//! the f32 kernels' tests).

use cudarc::driver::{CudaSlice, LaunchConfig};
use kiln_model::{ModelError, Result};
use kiln_quant::GgmlType;

use super::skinny::TiledGemm;
use super::{as_i32, grid, Matmul, TypeKernels, FINISH_BLOCK};
use crate::gpu::{cuda_err, Gpu};
use crate::ops::launch;
use crate::weight::CudaWeight;

/// `(name, weight rows, tokens, threads)` of the CTA shapes of
/// `mma_gemm_*` (`KILN_MMA` in mma.cu), smallest first.
pub(super) const MMA_SHAPES: [(&str, usize, usize, u32); 4] = [
    ("m64n16", 64, 16, 128),
    ("m64n32", 64, 32, 128),
    ("m64n64", 64, 64, 128),
    ("m128n64", 128, 64, 256),
];
/// 8-value units of one k step (`MMA_K_UNITS`): splits are multiples.
const MMA_K_UNITS: usize = 8;
/// Shared memory of a CTA (`MmaShape` in mma.cu), in 4-byte words: per
/// weight row `MMA_STRIDE` (36) words of codes and a (d, m) pair for each
/// of the 4 chunks; per token 3 planes of 36 words and 4 chunk sums.
pub(super) fn mma_smem_bytes(rows: usize, tokens: usize) -> usize {
    4 * (rows * (36 + 4 * 2) + tokens * (3 * 36 + 4))
}

/// Whether `ty`'s codes are exact in bfloat16 (`CodesFitBf16`): the
/// quantized types and BF16.
pub(super) fn codes_fit_bf16(ty: GgmlType) -> bool {
    ty.block_elems() >= 32 || ty == GgmlType::BF16
}
/// Threads per SM the split along k aims for: each warp waits on its
/// weight loads and barriers, so the GEMM wants many in flight (with 256
/// per CTA, 6 CTAs per SM). More than fit: the 64-token shapes use ~200
/// registers a thread, so an SM holds 2 of their CTAs (pending/README.md).
const MMA_THREADS_PER_SM: usize = 1536;

/// How many CTAs per SM the split along k aims for
/// (`KILN_CUDA_MMA_CTAS_PER_SM`, for timing the split on a GPU): unset,
/// [`MMA_THREADS_PER_SM`]'s share; a number, that many; `occupancy`, as
/// many as the driver says fit at once (registers and shared memory).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SplitTarget {
    Threads,
    Ctas(usize),
    Occupancy,
}

fn split_target() -> SplitTarget {
    static TARGET: std::sync::OnceLock<SplitTarget> = std::sync::OnceLock::new();
    *TARGET.get_or_init(|| {
        let v = std::env::var("KILN_CUDA_MMA_CTAS_PER_SM").unwrap_or_default();
        parse_split_target(&v)
    })
}

fn parse_split_target(v: &str) -> SplitTarget {
    match v.trim() {
        "occupancy" => SplitTarget::Occupancy,
        n => match n.parse::<usize>() {
            Ok(n) if n > 0 => SplitTarget::Ctas(n),
            _ => SplitTarget::Threads,
        },
    }
}

/// Fewest token rows sent to the tensor-core GEMM. Measured on the H200
/// (bench/RESULTS.md, 2026-12-05, matmul_bench Q4_K / Q6_K at the 270M, 1B
/// and 4B FFN shapes): from 16 rows it beats the f32 tiled GEMM 1.1-2.7x
/// up to 128 rows, and one 16-token tile (half of it masked) takes less
/// time than the tiled GEMM's 8 rows; below 8 rows the two are even (both
/// bound by the weight read) and the f32 kernels need no staging.
const MMA_MIN_TOKENS: usize = 8;

/// Which products take the tensor-core GEMM (`KILN_CUDA_MMA`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum MmaMode {
    /// Unset (or `all`): every product of [`MMA_MIN_TOKENS`] or more rows.
    /// Prefill too: at 512 rows it is 0.8-1.25x the f32 SGEMM per matrix,
    /// and a whole 512-token prefill 1.10x (4B) to 1.18x (1B) faster.
    On,
    /// `0`: none (the f32 kernels, for A/B timing).
    Off,
}

pub(super) fn mma_mode() -> MmaMode {
    static MODE: std::sync::OnceLock<MmaMode> = std::sync::OnceLock::new();
    *MODE.get_or_init(
        || match std::env::var("KILN_CUDA_MMA").as_deref().map(str::trim) {
            Ok("0") => MmaMode::Off,
            _ => MmaMode::On,
        },
    )
}

/// `KILN_CUDA_MMA_HEAD=1`: the greedy head of 8 or more rows on the
/// tensor cores ([`Matmul::mma_argmax`]) rather than the f32 tiled head.
/// Off until it is timed on a GPU (written while none was lent): on the
/// H200 the tiled head took ~3 ms of a 4B 64-row step (bench/RESULTS.md,
/// 2026-12-04), f32 FMAs over 262,144 rows.
pub(super) fn mma_head_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_CUDA_MMA_HEAD").is_ok_and(|v| v.trim() == "1"))
}

/// Whether `n_tok` token rows take the tensor-core GEMM in `mode`.
pub(super) fn mma_wanted(mode: MmaMode, n_tok: usize) -> bool {
    mode == MmaMode::On && n_tok >= MMA_MIN_TOKENS
}

/// Index into [`MMA_SHAPES`] for `n_tok` rows of an `n_rows` matrix: the
/// smallest token tile that holds them, and for more than 64 rows the
/// 128-row CTA when its tiles alone fill the GPU (`sms` SMs).
fn mma_shape(n_tok: usize, n_rows: usize, sms: usize) -> usize {
    match n_tok {
        0..=16 => 0,
        17..=32 => 1,
        33..=64 => 2,
        _ if n_rows.div_ceil(128) * n_tok.div_ceil(64) >= 2 * sms => 3,
        _ => 2,
    }
}

impl Matmul {
    /// `out[t, r] = Σ_c x[t, c] · W[row0 + r, c]` on the tensor cores
    /// (shapes checked by the caller).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mma_gemm(
        &self,
        gpu: &Gpu,
        k: &TypeKernels,
        w: &CudaWeight,
        row0: usize,
        n_rows: usize,
        x: &CudaSlice<f32>,
        n_tok: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let shape = mma_shape(n_tok, n_rows, self.sms);
        let (name, rows, tokens, threads) = MMA_SHAPES[shape];
        let smem_bytes = mma_smem_bytes(rows, tokens);
        let f = &k.mma[shape];
        let ctas_per_sm = match split_target() {
            SplitTarget::Threads => MMA_THREADS_PER_SM / threads as usize,
            SplitTarget::Ctas(n) => n,
            SplitTarget::Occupancy => f
                .occupancy_max_active_blocks_per_multiprocessor(threads, smem_bytes, None)
                .map_err(|e| cuda_err(&format!("occupancy of mma_gemm {name}"), e))?
                .max(1) as usize,
        };
        let plan = TiledGemm {
            f,
            tile: (rows, tokens),
            threads,
            smem_bytes: smem_bytes as u32,
            ctas_per_sm,
            step_units: MMA_K_UNITS,
        };
        self.launch_tiled(gpu, k, w, (row0, n_rows), x, n_tok, out, plan)
    }
}

impl Matmul {
    /// `ids[slot0 + i] = argmax_r dot(W[r], h[row0 + i])` for `i < n` with
    /// the tensor-core GEMM's dots: a CTA per resident slot takes every
    /// gridDim-th row tile whole (no split along k) and keeps its best key
    /// per token; `argmax_finish` reduces the CTAs' keys (shapes checked by
    /// the caller; ties and non-finite dots as [`Matmul::argmax`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mma_argmax(
        &self,
        gpu: &Gpu,
        k: &TypeKernels,
        w: &CudaWeight,
        h: &CudaSlice<f32>,
        row0: usize,
        n: usize,
        ids: &mut CudaSlice<u32>,
        slot0: usize,
    ) -> Result<()> {
        let shape = mma_shape(n, w.rows, self.sms);
        let (name, rows, tokens, threads) = MMA_SHAPES[shape];
        let smem_bytes = mma_smem_bytes(rows, tokens);
        let f = &k.mma_argmax[shape];
        let resident = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem_bytes, None)
            .map_err(|e| cuda_err(&format!("occupancy of mma_argmax {name}"), e))?
            .max(1) as usize;
        let ctas = (resident * self.sms)
            .min(w.rows.div_ceil(rows))
            .min(self.partials.len() / n);
        if ctas == 0 {
            return Err(ModelError::Backend(format!(
                "argmax over {}: {n} rows at once exceed the {} partials",
                w.name,
                self.partials.len()
            )));
        }
        let cfg = LaunchConfig {
            grid_dim: (
                ctas as u32,
                1,
                as_i32("token tiles", n.div_ceil(tokens))? as u32,
            ),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem_bytes as u32,
        };
        let what = format!("argmax on {}", w.name);
        let (n_rows, cols) = (as_i32("rows", w.rows)?, as_i32("cols", w.cols)?);
        let n_i = as_i32("argmax rows", n)?;
        // Reads every weight row and h rows row0..row0+n (checked); writes
        // n * ctas <= partials.len() partials.
        launch!(gpu, f, cfg, &what;
            gpu.ptr(&w.data, 0), w.row_bytes as u64, n_rows, cols, gpu.ptr(h, row0 * w.cols), n_i,
            gpu.ptr(&self.partials, 0))?;
        let cfg = grid((n, 1), FINISH_BLOCK);
        let slot0 = as_i32("slot", slot0)?;
        // Reads the n * ctas partials just written, writes ids[slot0..slot0+n]
        // (checked).
        launch!(gpu, &k.argmax_finish, cfg, &what;
            gpu.ptr(&self.partials, 0), ctas as i32, gpu.ptr(ids, 0), slot0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_and_prefill_products_take_the_tensor_cores() {
        assert!(mma_wanted(MmaMode::On, 8) && mma_wanted(MmaMode::On, 512));
        assert!(!mma_wanted(MmaMode::On, 7) && !mma_wanted(MmaMode::On, 1));
        assert!(!mma_wanted(MmaMode::Off, 32));
    }

    #[test]
    fn split_target_reads_a_count_or_occupancy() {
        assert_eq!(parse_split_target(""), SplitTarget::Threads);
        assert_eq!(parse_split_target("0"), SplitTarget::Threads);
        assert_eq!(parse_split_target("x"), SplitTarget::Threads);
        assert_eq!(parse_split_target(" 2 "), SplitTarget::Ctas(2));
        assert_eq!(parse_split_target("occupancy"), SplitTarget::Occupancy);
    }

    #[test]
    fn shapes_hold_the_rows_and_fill_the_gpu() {
        assert_eq!(mma_shape(16, 1152, 132), 0);
        assert_eq!(mma_shape(17, 1152, 132), 1);
        assert_eq!(mma_shape(64, 1152, 132), 2);
        // 512 prefill rows of a 6912-row FFN: 54 x 8 tiles of 128 rows.
        assert_eq!(mma_shape(512, 6912, 132), 3);
        // Of a 640-row one: 5 x 8 tiles are too few, 64-row CTAs.
        assert_eq!(mma_shape(512, 640, 132), 2);
    }
}
