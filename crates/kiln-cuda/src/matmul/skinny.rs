//! The batched-decode products of kernels/skinny.cu: the tiled GEMM for
//! 2..=64 token rows (split along k when the matrix alone would leave SMs
//! idle) and the greedy head over several hidden rows at once.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use kiln_model::{ModelError, Result};

use super::{as_i32, grid, Matmul, TypeKernels, BLOCK, FINISH_BLOCK};
use crate::gpu::Gpu;
use crate::ops::launch;
use crate::weight::CudaWeight;

/// How a tiled GEMM kernel is launched (skinny.cu's `gemm`, mma.cu's
/// `mma_gemm`: the same arguments, the same split along k).
pub(super) struct TiledGemm<'a> {
    pub f: &'a CudaFunction,
    /// Weight rows and tokens of one CTA.
    pub tile: (usize, usize),
    pub threads: u32,
    pub smem_bytes: u32,
    /// CTAs per SM the split along k aims for.
    pub ctas_per_sm: usize,
    /// 8-value units of the kernel's k step (splits are multiples).
    pub step_units: usize,
}

/// Token tiles of `gemm_*_t*` and `argmax_tiles_*_t*` (`KILN_SKINNY` in
/// skinny.cu); a step takes the smallest that holds its rows.
pub(super) const GEMM_TOKENS: [usize; 4] = [8, 16, 32, 64];
/// Most token rows of the tiled GEMM; more go through SGEMM.
pub(super) const GEMM_MAX_TOKENS: usize = 64;
/// Weight rows and 8-value units of a tile, and threads of a CTA
/// (`TILE_ROWS`, `TILE_UNITS`, `TILE_THREADS`).
const TILE_ROWS: usize = 64;
const TILE_UNITS: usize = 8;
const TILE_THREADS: u32 = 256;
/// A GEMM whose tiles make fewer CTAs than this many per SM is split
/// along k, each split covering at least `MIN_SPLIT_UNITS` units.
const CTAS_PER_SM: usize = 2;
const MIN_SPLIT_UNITS: usize = 32;
/// f32 partial sums of the split workspace. Splits are made only while
/// the tiles number under `CTAS_PER_SM` per SM, so `splits * n_tok *
/// n_rows` stays near `CTAS_PER_SM * SMs * 64 * 64` (about 2.2M on an
/// H200); a larger product takes fewer splits.
pub(super) const SPLIT_FLOATS: usize = 4 << 20;
/// CTAs of `argmax_tiles` per SM (each strides over row tiles).
const ARGMAX_CTAS_PER_SM: usize = 8;

/// Index into [`GEMM_TOKENS`] of the tile for `n_tok` rows (the last one
/// for more: the grid then spans several token tiles).
fn token_tile(n_tok: usize) -> usize {
    GEMM_TOKENS
        .iter()
        .position(|&t| t >= n_tok)
        .unwrap_or(GEMM_TOKENS.len() - 1)
}

impl Matmul {
    /// `(splits, units per split)` of a GEMM of `tiles` CTAs over `n_units`
    /// 8-value units with `outputs` results: one split when the tiles make
    /// `ctas_per_sm` CTAs per SM, else enough splits to, each at least
    /// `MIN_SPLIT_UNITS` long (a multiple of `step` units), their partial
    /// sums within the `SPLIT_FLOATS` workspace.
    pub(super) fn split_k(
        &self,
        tiles: usize,
        n_units: usize,
        outputs: usize,
        (ctas_per_sm, step): (usize, usize),
    ) -> (usize, usize) {
        let target = ctas_per_sm * self.sms;
        let splits = if tiles >= target {
            1
        } else {
            target
                .div_ceil(tiles)
                .min(n_units / MIN_SPLIT_UNITS)
                .min(SPLIT_FLOATS / outputs)
                .max(1)
        };
        let per_split = n_units.div_ceil(splits).next_multiple_of(step);
        (n_units.div_ceil(per_split), per_split)
    }

    /// Adds the `splits` partial sums of `n` outputs in the split
    /// workspace into `out` (in split order).
    pub(super) fn split_sum(
        &self,
        gpu: &Gpu,
        k: &TypeKernels,
        splits: usize,
        n: usize,
        out: &mut CudaSlice<f32>,
        what: &str,
    ) -> Result<()> {
        let cfg = grid((n.div_ceil(BLOCK as usize).min(4096), 1), BLOCK);
        // Reads splits * n <= SPLIT_FLOATS partial sums (written by the
        // GEMM before), writes n of out (checked by the caller).
        launch!(gpu, &k.split_sum, cfg, what;
            gpu.ptr(&self.split, 0), splits as i32, n as i32, gpu.ptr(out, 0))
    }

    /// `out[t, r] = Σ_c x[t, c] · W[row0 + r, c]` by the tiled kernel
    /// (shapes checked by the caller).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm(
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
        let tile = token_tile(n_tok);
        let plan = TiledGemm {
            f: &k.gemm[tile],
            tile: (TILE_ROWS, GEMM_TOKENS[tile]),
            threads: TILE_THREADS,
            smem_bytes: 0,
            ctas_per_sm: CTAS_PER_SM,
            step_units: TILE_UNITS,
        };
        self.launch_tiled(gpu, k, w, (row0, n_rows), x, n_tok, out, plan)
    }

    /// `out[t, r] = Σ_c x[t, c] · W[row0 + r, c]` for rows `rows = (row0,
    /// n_rows)` by a tiled kernel (`plan`): CTA (x, y, z) takes row tile x,
    /// k split y and token tile z; with several splits, their partial sums
    /// are added by `gemm_split_sum` (shapes checked by the caller).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_tiled(
        &self,
        gpu: &Gpu,
        k: &TypeKernels,
        w: &CudaWeight,
        (row0, n_rows): (usize, usize),
        x: &CudaSlice<f32>,
        n_tok: usize,
        out: &mut CudaSlice<f32>,
        plan: TiledGemm<'_>,
    ) -> Result<()> {
        let (tile_rows, tile_tokens) = plan.tile;
        let z = n_tok.div_ceil(tile_tokens);
        let tiles = n_rows.div_ceil(tile_rows) * z;
        let split_plan = (plan.ctas_per_sm, plan.step_units);
        let (splits, per_split) = self.split_k(tiles, w.cols / 8, n_tok * n_rows, split_plan);
        let cfg = LaunchConfig {
            grid_dim: (
                n_rows.div_ceil(tile_rows) as u32,
                splits as u32,
                as_i32("token tiles", z)? as u32,
            ),
            block_dim: (plan.threads, 1, 1),
            shared_mem_bytes: plan.smem_bytes,
        };
        let dst = if splits == 1 {
            gpu.ptr(out, 0)
        } else {
            gpu.ptr(&self.split, 0)
        };
        let what = format!("tiled GEMM on {}", w.name);
        let (row0, rows_i) = (as_i32("row0", row0)?, as_i32("rows", n_rows)?);
        let (cols, n_tok_i) = (as_i32("cols", w.cols)?, as_i32("tokens", n_tok)?);
        // Reads rows row0..row0+n_rows of the weight and n_tok * cols of x
        // (checked by the caller); writes n_tok * n_rows values of out, or
        // splits * n_tok * n_rows <= SPLIT_FLOATS of the workspace.
        launch!(gpu, plan.f, cfg, &what;
            gpu.ptr(&w.data, 0), w.row_bytes as u64, row0, rows_i, cols, gpu.ptr(x, 0), n_tok_i,
            per_split as i32, dst)?;
        if splits == 1 {
            return Ok(());
        }
        self.split_sum(gpu, k, splits, n_tok * n_rows, out, &what)
    }

    /// `ids[slot0 + i] = argmax_r dot(W[r], h[row0 + i])` for `i < n`, each
    /// head row read once for all `n` hidden rows; ties and non-finite
    /// dots as [`Matmul::argmax`] (shapes checked by the caller).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn argmax_tiles(
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
        let tile = token_tile(n);
        let z = n.div_ceil(GEMM_TOKENS[tile]);
        let want = w
            .rows
            .div_ceil(TILE_ROWS)
            .min(ARGMAX_CTAS_PER_SM * self.sms);
        let ctas = self.head_ctas(w, n, want)?;
        let cfg = LaunchConfig {
            grid_dim: (ctas as u32, z as u32, 1),
            block_dim: (TILE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let what = format!("argmax on {}", w.name);
        let (rows, cols) = (as_i32("rows", w.rows)?, as_i32("cols", w.cols)?);
        let n_i = as_i32("argmax rows", n)?;
        // Reads every weight row and h rows row0..row0+n (checked); writes
        // n * ctas <= partials.len() partials.
        launch!(gpu, &k.argmax_tiles[tile], cfg, &what;
            gpu.ptr(&w.data, 0), w.row_bytes as u64, rows, cols, gpu.ptr(h, row0 * w.cols), n_i,
            gpu.ptr(&self.partials, 0))?;
        self.argmax_finish(gpu, k, n, ctas, ids, slot0, &what)
    }

    /// CTAs of a batched head over `n` hidden rows: `want`, or fewer where
    /// their `n * ctas` keys would not fit the partials.
    pub(super) fn head_ctas(&self, w: &CudaWeight, n: usize, want: usize) -> Result<usize> {
        let ctas = want.min(self.partials.len() / n);
        if ctas == 0 {
            return Err(ModelError::Backend(format!(
                "argmax over {}: {n} rows at once exceed the {} partials",
                w.name,
                self.partials.len()
            )));
        }
        Ok(ctas)
    }

    /// `ids[slot0 + i]` from the `ctas` keys per hidden row `i < n` that a
    /// batched head left in the partials (`argmax_finish`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn argmax_finish(
        &self,
        gpu: &Gpu,
        k: &TypeKernels,
        n: usize,
        ctas: usize,
        ids: &mut CudaSlice<u32>,
        slot0: usize,
        what: &str,
    ) -> Result<()> {
        let cfg = grid((n, 1), FINISH_BLOCK);
        let slot0 = as_i32("slot", slot0)?;
        // Reads the n * ctas partials just written, writes ids[slot0..slot0+n]
        // (checked by the caller).
        launch!(gpu, &k.argmax_finish, cfg, what;
            gpu.ptr(&self.partials, 0), ctas as i32, gpu.ptr(ids, 0), slot0)
    }
}
