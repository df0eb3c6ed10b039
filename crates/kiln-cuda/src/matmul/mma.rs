//! The tensor-core GEMM of kernels/mma.cu: prefill and batched-decode
//! products of `KILN_CUDA_MMA` (default [`MMA_MIN_TOKENS`]) or more token
//! rows, on GPUs of compute capability 8.0 or newer, in split-operand
//! 3xTF32 (within f32 rounding of the f32 kernels; see mma.cu).
//! Fewer rows, older GPUs and `KILN_CUDA_MMA=0` take the f32 kernels.

use cudarc::driver::{CudaSlice, LaunchConfig};
use kiln_model::Result;

use super::{as_i32, Matmul, TypeKernels};
use crate::gpu::Gpu;
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
const MMA_K_UNITS: usize = 4;
/// Shared memory of a CTA: its weight rows and tokens, `MMA_STRIDE` (36)
/// split {hi, lo} pairs of 8 bytes each.
pub(super) fn mma_smem_bytes(rows: usize, tokens: usize) -> usize {
    (rows + tokens) * 36 * 8
}
/// Threads per SM the split along k aims for: each warp waits on its
/// weight loads and barriers, so the GEMM wants many in flight (with 256
/// per CTA, 6 CTAs per SM).
const MMA_THREADS_PER_SM: usize = 1536;
/// Fewest token rows that take the tensor-core GEMM by default: below it
/// the f32 tiled GEMM (skinny.rs) is as fast (matmul_bench on the H200).
pub(super) const MMA_MIN_TOKENS: usize = 16;

/// Fewest token rows of the tensor-core GEMM: `KILN_CUDA_MMA=N` sets it
/// (for A/B timing and thresholds), `KILN_CUDA_MMA=0` turns it off.
pub(super) fn mma_min_tokens() -> Option<usize> {
    static MIN: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| match std::env::var("KILN_CUDA_MMA") {
        Err(_) => Some(MMA_MIN_TOKENS),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(0) => None,
            Ok(n) => Some(n.max(2)),
            Err(_) => Some(MMA_MIN_TOKENS),
        },
    })
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
        let (_, tile_rows, tile_tokens, threads) = MMA_SHAPES[shape];
        let z = n_tok.div_ceil(tile_tokens);
        let tiles = n_rows.div_ceil(tile_rows) * z;
        let per_sm = MMA_THREADS_PER_SM / threads as usize;
        let (splits, per_split) =
            self.split_k(tiles, w.cols / 8, n_tok * n_rows, (per_sm, MMA_K_UNITS));
        let cfg = LaunchConfig {
            grid_dim: (
                n_rows.div_ceil(tile_rows) as u32,
                splits as u32,
                as_i32("token tiles", z)? as u32,
            ),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: mma_smem_bytes(tile_rows, tile_tokens) as u32,
        };
        let dst = if splits == 1 {
            gpu.ptr(out, 0)
        } else {
            gpu.ptr(&self.split, 0)
        };
        let what = format!("mma_gemm on {}", w.name);
        let (row0, rows_i) = (as_i32("row0", row0)?, as_i32("rows", n_rows)?);
        let (cols, n_tok_i) = (as_i32("cols", w.cols)?, as_i32("tokens", n_tok)?);
        // Reads rows row0..row0+n_rows of the weight and n_tok * cols of x
        // (checked by the caller); writes n_tok * n_rows values of out, or
        // splits * n_tok * n_rows <= SPLIT_FLOATS of the workspace.
        launch!(gpu, &k.mma[shape], cfg, &what;
            gpu.ptr(&w.data, 0), w.row_bytes as u64, row0, rows_i, cols, gpu.ptr(x, 0), n_tok_i,
            per_split as i32, dst)?;
        if splits == 1 {
            return Ok(());
        }
        self.split_sum(gpu, k, splits, n_tok * n_rows, out, &what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
