//! The tensor-core GEMM of kernels/mma.cu: integer codes times three
//! bfloat16 planes of x, with each 16-column chunk's scale and min applied
//! in f32 (within f32 accumulation of the exact product; see mma.cu), on
//! GPUs of compute capability 8.0 or newer, for quantized and BF16 weights
//! (F32 and F16 are not exact in bfloat16 and keep the f32 kernels). By
//! default it takes the products where it measured faster than the f32
//! kernels on the H200 ([`mma_auto`]). `KILN_CUDA_MMA=all` sends every
//! product of 16 or more rows to it (for tests and A/B timing),
//! `KILN_CUDA_MMA=0` none.

use cudarc::driver::CudaSlice;
use kiln_model::Result;
use kiln_quant::GgmlType;

use super::skinny::TiledGemm;
use super::{Matmul, TypeKernels};
use crate::gpu::Gpu;
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
/// per CTA, 6 CTAs per SM).
const MMA_THREADS_PER_SM: usize = 1536;
/// Fewest token rows of the tensor-core GEMM (its smallest token tile).
const MMA_MIN_TOKENS: usize = 16;

/// Which products take the tensor-core GEMM (`KILN_CUDA_MMA`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum MmaMode {
    /// Unset: where [`mma_auto`] says.
    Auto,
    /// `all`: every product of 16 or more token rows.
    All,
    /// `0`: none.
    Off,
}

pub(super) fn mma_mode() -> MmaMode {
    static MODE: std::sync::OnceLock<MmaMode> = std::sync::OnceLock::new();
    *MODE.get_or_init(
        || match std::env::var("KILN_CUDA_MMA").as_deref().map(str::trim) {
            Ok("0") => MmaMode::Off,
            Ok("all") => MmaMode::All,
            _ => MmaMode::Auto,
        },
    )
}

/// Whether `n_tok` token rows times a `rows x cols` weight take the
/// tensor-core GEMM in `mode`.
pub(super) fn mma_wanted(mode: MmaMode, n_tok: usize, rows: usize, cols: usize) -> bool {
    match mode {
        MmaMode::Off => false,
        MmaMode::All => n_tok >= MMA_MIN_TOKENS,
        MmaMode::Auto => mma_auto(n_tok, rows * cols),
    }
}

/// The measured default (matmul_bench, H200, Q4_K / Q6_K / Q8_0, vs the
/// f32 tiled GEMM): 16-32 rows gain 1.1-1.6x from 1B-sized matrices on
/// (~8M weights) but lose up to 1.2x on 270M ones (~1.3M); 33-64 rows
/// gain 1.1-1.5x on 4B-sized ones (26M), 0.9-1.2x on 1B ones. Past 64
/// rows it is at best even (128) and SGEMM faster (it runs at 0.63-0.85x
/// of SGEMM's speed at 512).
fn mma_auto(n_tok: usize, weights: usize) -> bool {
    match n_tok {
        16..=32 => weights >= 4 << 20,
        33..=64 => weights >= 16 << 20,
        _ => false,
    }
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
        let (_, rows, tokens, threads) = MMA_SHAPES[shape];
        let plan = TiledGemm {
            f: &k.mma[shape],
            tile: (rows, tokens),
            threads,
            smem_bytes: mma_smem_bytes(rows, tokens) as u32,
            ctas_per_sm: MMA_THREADS_PER_SM / threads as usize,
            step_units: MMA_K_UNITS,
        };
        self.launch_tiled(gpu, k, w, (row0, n_rows), x, n_tok, out, plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_large_batched_products_only() {
        let auto = |n, rows, cols| mma_wanted(MmaMode::Auto, n, rows, cols);
        // Gemma 3 1B / 4B FFN (1152 x 6912, 2560 x 10240), 270M (640 x 2048).
        assert!(auto(16, 1152, 6912) && auto(32, 1152, 6912) && !auto(64, 1152, 6912));
        assert!(auto(64, 2560, 10_240) && !auto(65, 2560, 10_240));
        assert!(!auto(32, 640, 2048) && !auto(8, 2560, 10_240) && !auto(512, 2560, 10_240));
        assert!(mma_wanted(MmaMode::All, 512, 640, 2048));
        assert!(!mma_wanted(MmaMode::All, 15, 640, 2048));
        assert!(!mma_wanted(MmaMode::Off, 32, 2560, 10_240));
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
