//! Products with few x rows that stream weight rows through shared memory
//! (kernels/stream.cu): the decode GEMV and the greedy head of 1 to 4
//! hidden rows. A tile of rows per CTA and step, copied two stages deep
//! with 16-byte asynchronous copies, the first tile requested before the
//! kernel waits for the one that writes x. Large one-row products
//! ([`qdot_for`]) instead read their rows straight from global memory,
//! a CTA per tile, and take qdot.cu's integer dots on a split x.

use std::sync::MutexGuard;

use cudarc::driver::{CudaSlice, CudaView, DevicePtr, LaunchConfig};
use kiln_model::Result;

use super::{as_i32, Matmul, TypeKernels};
use crate::gpu::{env_number, Gpu};
use crate::ops::launch;
use crate::weight::CudaWeight;

/// Rows per warp group of the one-x-row instantiations (`KILN_STREAM` in
/// stream.cu), in the order of `TypeKernels::stream_matvec` and
/// `stream_argmax`.
pub(super) const STREAM_R: [usize; 3] = [1, 2, 4];
/// x rows of the several-row heads (`KILN_STREAM_HEAD`), in the order of
/// `TypeKernels::stream_head`; a launch takes the smallest that holds its
/// rows. More rows take the tiled head (skinny.rs): on an H200, 8 rows
/// over the 262,144 x 640 Q8_0 table took 541 us here (f32 FMAs bound it,
/// one head row per warp) against the tiled kernel's 363 us.
pub(super) const STREAM_HEAD_TOKENS: [usize; 2] = [2, 4];
/// Cells of the heads: a best key per x row, then the finished-CTA count
/// (`HEAD_MAX_TOKENS + 1`).
pub(super) const HEAD_CELLS: usize = 9;
/// Warps and threads of a CTA (`STREAM_WARPS`).
const WARPS: usize = 4;
const THREADS: u32 = 32 * WARPS as u32;
/// Most bytes of one stage (a CTA holds one stage, or two when it takes
/// several tiles).
const STAGE_MAX: usize = 24 << 10;
/// Shared memory the driver keeps per CTA, and the most CTAs per SM.
const CTA_RESERVED_SMEM: usize = 1 << 10;
const MAX_CTAS_PER_SM: usize = 8;
/// A GEMV is cut into about this many tiles per SM: short matrices give
/// every SM work, and a warp computes at most one group of rows. The
/// GEMVs wait on their loads' latency, so more, shorter tiles (more CTAs
/// in flight) pay: on an H100 (bench/RESULTS.md, 2026-12-06) 8 against 4
/// took tg128 270M 1,528-1,540 -> 1,567-1,575 tok/s and 1B 732-734 ->
/// 766-784 (2 and 12-16 lost); the 4B's large products take 16-row tiles
/// either way.
const GEMV_TILES_PER_SM: usize = 8;
/// Most warps of a CTA that split one group of rows along k
/// (`KILN_CUDA_GEMV_SPLIT=N`, 1, 2 or 4; default 4): a tile of fewer
/// groups than warps (few long rows: the 270M's down projection) would
/// otherwise leave warps idle. On an H100, tg128 270M 1,438-1,463 -> 1,520
/// tok/s, 1B and 4B unchanged (their tiles have groups enough).
fn gemv_max_parts() -> i32 {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| env_number("KILN_CUDA_GEMV_SPLIT", |n| [1, 2, 4].contains(&n), 4)) as i32
}

/// `KILN_CUDA_GEMV_TILES=N` overrides [`GEMV_TILES_PER_SM`] (for A/B
/// timing).
fn gemv_tiles_per_sm() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| env_number("KILN_CUDA_GEMV_TILES", |n| n > 0, GEMV_TILES_PER_SM))
}

/// Rows per tile the warps split evenly: up to one row each, else one
/// group of R = 2 or 4 rows each.
const TILE_ROWS: [usize; 6] = [16, 8, 4, 3, 2, 1];

/// Which one-token products take qdot.cu's integer dot products on x
/// split into three int8 planes (the CPU VNNI path's exact scheme) rather
/// than stream.cu's f32 dots: `KILN_CUDA_GEMV=qdot` (every quantized
/// weight), `qdot:N` (rows of N or more values), `f32` (none); by default
/// products of [`QDOT_MIN_WEIGHTS`] weights or more in rows of
/// [`QDOT_MIN_COLS`] or more values. The split is one more launch per
/// product, which only large products repay: on an H100 every qdot
/// product took tg128 4B 280 -> 311-345 tok/s but 1B 725-748 -> 614-684
/// and 270M 1,438-1,548 -> 1,232-1,306.
#[derive(Debug, Clone, Copy, PartialEq)]
enum QdotRule {
    Large,
    MinCols(usize),
    Never,
}

/// The default's reach (the 4B's FFN products and head, not the 1B's
/// 13,824 x 1,152 gate+up).
const QDOT_MIN_WEIGHTS: usize = 1 << 24;
const QDOT_MIN_COLS: usize = 2048;

fn parse_qdot_rule(v: Option<&str>) -> QdotRule {
    match v.map(str::trim) {
        Some("qdot") => QdotRule::MinCols(0),
        Some("f32") => QdotRule::Never,
        Some(v) => match v.split_once(':') {
            Some(("qdot", n)) => n.trim().parse().map_or(QdotRule::Large, QdotRule::MinCols),
            _ => QdotRule::Large,
        },
        None => QdotRule::Large,
    }
}

/// Whether a product of `rows` x `cols` weights takes the qdot kernels.
pub(super) fn qdot_for(rows: usize, cols: usize) -> bool {
    static RULE: std::sync::OnceLock<QdotRule> = std::sync::OnceLock::new();
    let rule =
        RULE.get_or_init(|| parse_qdot_rule(std::env::var("KILN_CUDA_GEMV").ok().as_deref()));
    match *rule {
        QdotRule::Large => rows * cols >= QDOT_MIN_WEIGHTS && cols >= QDOT_MIN_COLS,
        QdotRule::MinCols(n) => cols >= n,
        QdotRule::Never => false,
    }
}

/// Whether one-token products take the stream kernels at all
/// (`KILN_CUDA_STREAM=0` sends them to the register-only kernels of
/// matmul.cu, for A/B timing). The f32 kernels stage their rows through
/// shared memory, the qdot ones read them straight from global memory
/// (each kernel holds one form: stream.cu's `Dots::STAGED`): on an H100
/// the qdot products took the 4B's tg128 311 -> 339-345 tok/s read
/// directly, while the f32 kernels lost 10-25%.
pub(super) fn stream_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_CUDA_STREAM").as_deref().map(str::trim) != Ok("0"))
}

/// Longest rows the split x workspace holds, and its size in floats:
/// three int8 planes, a scale per 32 values and a sum per 16.
const QDOT_MAX_K: usize = 16_384;
pub(super) const QX_FLOATS: usize = QDOT_MAX_K * 3 / 4 + QDOT_MAX_K / 32 + QDOT_MAX_K / 16;

/// A workspace held while the launches that read it are enqueued.
type HeldWorkspace<'a> = MutexGuard<'a, Option<CudaSlice<f32>>>;

/// A launch of a stream kernel: rows per tile, the index into
/// [`STREAM_R`], bytes per stage (0: rows read from global memory), stages
/// per CTA, CTAs and tiles.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Plan {
    tile_rows: usize,
    r: usize,
    stage_bytes: usize,
    stages: usize,
    ctas: usize,
    tiles: usize,
}

impl Plan {
    /// Tiles of about `want_rows` rows of `row_bytes` (the largest of
    /// [`TILE_ROWS`] at most that, or the first that fits a stage) over
    /// `n_rows` rows, on as many CTAs as the GPU holds at once
    /// (`sms`, `smem_per_sm`), each taking the same number of tiles where
    /// it can; `None` when one row does not fit a stage.
    fn new(
        row_bytes: usize,
        n_rows: usize,
        want_rows: usize,
        sms: usize,
        smem_per_sm: usize,
    ) -> Option<Plan> {
        // A tile starts up to 15 bytes past its stage's 16-byte boundary.
        let fits = |rows: usize| rows * row_bytes + 15 <= STAGE_MAX;
        let tile_rows = TILE_ROWS
            .into_iter()
            .find(|&r| r <= want_rows.max(1) && fits(r))?
            .min(n_rows);
        if tile_rows == 0 {
            return None;
        }
        let stage_bytes = (tile_rows * row_bytes + 15).next_multiple_of(16);
        let tiles = n_rows.div_ceil(tile_rows);
        // One stage per CTA when every CTA takes one tile, else two.
        let resident = |stages: usize| {
            sms * (smem_per_sm / (stages * stage_bytes + CTA_RESERVED_SMEM))
                .clamp(1, MAX_CTAS_PER_SM)
        };
        let (stages, rounds) = if tiles <= resident(1) {
            (1, 1)
        } else {
            (2, tiles.div_ceil(resident(2)))
        };
        let r = match tile_rows {
            16 => 2,
            8 => 1,
            _ => 0,
        };
        Some(Plan {
            tile_rows,
            r,
            stage_bytes,
            stages,
            ctas: tiles.div_ceil(rounds),
            tiles,
        })
    }

    /// The GEMV's plan: tiles short enough that every SM gets several.
    fn matvec(row_bytes: usize, n_rows: usize, sms: usize, smem_per_sm: usize) -> Option<Plan> {
        let want = n_rows.div_ceil(gemv_tiles_per_sm() * sms);
        // Rounded up to whole groups: 5 rows take a tile of 8.
        let want = TILE_ROWS
            .into_iter()
            .rev()
            .find(|&r| r >= want)
            .unwrap_or(TILE_ROWS[0]);
        Plan::new(row_bytes, n_rows, want, sms, smem_per_sm)
    }

    /// The head's plan: the largest tiles (a 262,144-row table has
    /// thousands, so the CTAs' shares still balance); for several x rows,
    /// one row per warp (the kernels hold every x row's unit in registers).
    fn argmax(
        row_bytes: usize,
        n_rows: usize,
        n_x: usize,
        sms: usize,
        smem_per_sm: usize,
    ) -> Option<Plan> {
        let rows = if n_x == 1 { TILE_ROWS[0] } else { WARPS };
        Plan::new(row_bytes, n_rows, rows, sms, smem_per_sm)
    }

    /// The same tiles read from global memory: no stages, a CTA a tile.
    fn direct(self) -> Plan {
        Plan {
            stage_bytes: 0,
            stages: 0,
            ctas: self.tiles,
            ..self
        }
    }

    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.ctas as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: (self.stages * self.stage_bytes) as u32,
        }
    }
}

/// The device address one past the weight's last byte.
fn end_ptr(gpu: &Gpu, w: &CudaWeight) -> u64 {
    gpu.ptr(&w.data, w.rows * w.row_bytes)
}

impl Matmul {
    /// `out[r] = Σ_c x[c] · W[row0 + r, c]` for `r < n_rows` (shapes checked
    /// by the caller). `Ok(false)` when the rows are too long for a stage
    /// (the caller takes another kernel).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stream_matvec(
        &self,
        gpu: &Gpu,
        k: &TypeKernels,
        w: &CudaWeight,
        row0: usize,
        n_rows: usize,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<bool> {
        let Some(mut plan) = Plan::matvec(w.row_bytes, n_rows, self.sms, self.smem_per_sm) else {
            return Ok(false);
        };
        let split = self.split_qx(gpu, k, w, n_rows, &x.slice(..))?;
        if split.is_some() {
            plan = plan.direct();
        }
        let (row0, rows) = (as_i32("row0", row0)?, as_i32("rows", n_rows)?);
        let (cols, tile_rows) = (as_i32("cols", w.cols)?, plan.tile_rows as i32);
        let (f, xp) = match &split {
            Some((xq, _)) => (&k.qdot_matvec[plan.r], *xq),
            None => (&k.stream_matvec[plan.r], gpu.ptr(x, 0)),
        };
        // Reads rows row0..row0+n_rows of the weight (never past its end),
        // cols values of x (or their split) and writes n_rows of out
        // (checked by the caller).
        launch!(gpu, f, plan.config(), &format!("stream_matvec on {}", w.name);
            gpu.ptr(&w.data, 0), w.row_bytes as u64, end_ptr(gpu, w), row0, rows, cols, tile_rows,
            plan.stage_bytes as u32, gemv_max_parts(), xp, gpu.ptr(out, 0))?;
        Ok(true)
    }

    /// When a product of `rows` rows of `w` takes the qdot kernels
    /// ([`qdot_for`]; a quantized `w` and rows that fit): splits x (one
    /// row of `w.cols` values) into the workspace (allocated on first use,
    /// before any capture) by `qx_split` and returns its address with the
    /// workspace held until the caller's launch; else `None`, taking no
    /// lock.
    fn split_qx(
        &self,
        gpu: &Gpu,
        k: &TypeKernels,
        w: &CudaWeight,
        rows: usize,
        x: &CudaView<'_, f32>,
    ) -> Result<Option<(u64, HeldWorkspace<'_>)>> {
        if !qdot_for(rows, w.cols) || w.ty.block_elems() < 32 || w.cols > QDOT_MAX_K {
            return Ok(None);
        }
        let mut guard = self.qx.lock().unwrap_or_else(|e| e.into_inner());
        let ws = match &mut *guard {
            Some(ws) => ws,
            // The warm-up run of a step (run_step runs it plainly first)
            // allocates it.
            None => guard.insert(gpu.alloc::<f32>(QX_FLOATS, "split x workspace")?),
        };
        let blocks = w.cols / 32;
        let cfg = LaunchConfig {
            grid_dim: (blocks.div_ceil(WARPS) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // Reads cols values of x (checked by the caller: cols is a whole
        // number of blocks of 32) and writes 3 cols bytes + cols / 32 +
        // cols / 16 floats <= QX_FLOATS.
        let (xp, _guard) = x.device_ptr(&gpu.stream);
        launch!(gpu, &k.qx_split, cfg, &format!("split x for {}", w.name);
            xp, as_i32("cols", w.cols)?, gpu.ptr(ws, 0))?;
        let at = gpu.ptr(ws, 0);
        Ok(Some((at, guard)))
    }

    /// `ids[slot + i] = argmax_r dot(W[r], h[row + i])` for `i < n` (1 to 4)
    /// in one kernel (ties and non-finite dots as [`Matmul::argmax`];
    /// shapes checked by the caller). `Ok(false)` when the rows are too
    /// long for a stage or `n` is out of range.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stream_argmax(
        &self,
        gpu: &Gpu,
        k: &TypeKernels,
        w: &CudaWeight,
        h: &CudaSlice<f32>,
        row: usize,
        n: usize,
        ids: &mut CudaSlice<u32>,
        slot: usize,
    ) -> Result<bool> {
        let Some(mut plan) = Plan::argmax(w.row_bytes, w.rows, n, self.sms, self.smem_per_sm)
        else {
            return Ok(false);
        };
        let f = match n {
            1 => &k.stream_argmax[plan.r],
            _ => match STREAM_HEAD_TOKENS.iter().position(|&t| t >= n) {
                Some(i) if plan.r == 0 => &k.stream_head[i],
                _ => return Ok(false),
            },
        };
        let (rows, cols) = (as_i32("rows", w.rows)?, as_i32("cols", w.cols)?);
        let (tile_rows, slot) = (plan.tile_rows as i32, as_i32("slot", slot)?);
        let split = match n {
            1 => self.split_qx(
                gpu,
                k,
                w,
                w.rows,
                &h.slice(row * w.cols..(row + 1) * w.cols),
            )?,
            _ => None,
        };
        let (f, xp) = match &split {
            Some((xq, _)) => {
                plan = plan.direct();
                (&k.qdot_argmax[plan.r], *xq)
            }
            None => (f, gpu.ptr(h, row * w.cols)),
        };
        // Reads every weight row (never past its end) and x rows
        // row..row+n (or their split), updates the head cells (n <= 4
        // keys and the count) and writes ids[slot..slot+n] (checked by the
        // caller).
        launch!(gpu, f, plan.config(), &format!("argmax on {}", w.name);
            gpu.ptr(&w.data, 0), w.row_bytes as u64, end_ptr(gpu, w), rows, cols, tile_rows,
            plan.stage_bytes as u32, gemv_max_parts(), xp, n as i32, gpu.ptr(&self.head_cells, 0),
            gpu.ptr(ids, 0), slot)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H200: 132 SMs of 228 KiB.
    const H200: (usize, usize) = (132, 228 << 10);

    fn matvec(row_bytes: usize, n_rows: usize) -> Plan {
        Plan::matvec(row_bytes, n_rows, H200.0, H200.1).unwrap()
    }

    #[test]
    fn qdot_rule_reads_its_switch() {
        assert_eq!(parse_qdot_rule(None), QdotRule::Large);
        assert_eq!(parse_qdot_rule(Some(" qdot ")), QdotRule::MinCols(0));
        assert_eq!(parse_qdot_rule(Some("qdot:2048")), QdotRule::MinCols(2048));
        assert_eq!(parse_qdot_rule(Some("f32")), QdotRule::Never);
        assert_eq!(parse_qdot_rule(Some("qdot:x")), QdotRule::Large);
        // The default's reach: the 4B's FFN, not the 1B's.
        let large =
            |rows: usize, cols: usize| rows * cols >= QDOT_MIN_WEIGHTS && cols >= QDOT_MIN_COLS;
        assert!(large(20_480, 2_560) && large(2_560, 10_240));
        assert!(!large(13_824, 1_152) && !large(1_152, 6_912) && !large(2_560, 2_048));
    }

    #[test]
    fn split_x_workspace_holds_the_longest_rows() {
        // qdot.cu's layout: three planes of k bytes, k / 32 scales and
        // k / 16 sums (floats).
        let k = QDOT_MAX_K;
        assert_eq!(4 * QX_FLOATS, 3 * k + 4 * (k / 32 + k / 16));
    }

    #[test]
    fn plans_fill_the_gpu_and_fit_their_stages() {
        // 270M ffn_down (640 rows of 2048 Q4_K): a row a tile, one each.
        let p = matvec(1152, 640);
        assert_eq!((p.tile_rows, p.r, p.stages, p.ctas), (1, 0, 1, 640));
        // 1B gate/up (13,824 rows of 1152 Q5_0): 16-row tiles, R = 4.
        let p = matvec(792, 13_824);
        assert_eq!((p.tile_rows, p.r, p.stages, p.ctas), (16, 2, 1, 864));
        // 5 rows a tile wanted (5,200 over 8 x 132 tiles): a whole group of 8.
        let p = matvec(1152, 5200);
        assert_eq!((p.tile_rows, p.r), (8, 1));
        // The 262,144-row Q8_0 head: 16-row tiles, two stages, 8 CTAs per
        // SM, each taking the same number of tiles.
        let p = Plan::argmax(680, 262_144, 1, H200.0, H200.1).unwrap();
        assert_eq!((p.tile_rows, p.r, p.stages), (16, 2, 2));
        assert!(p.stage_bytes >= 15 + 16 * 680 && p.stage_bytes.is_multiple_of(16));
        assert!(
            p.ctas <= 8 * 132 && 16_384usize.is_multiple_of(p.ctas),
            "{p:?}"
        );
        // Long rows: fewer per tile, the CTAs limited by shared memory.
        let p = Plan::argmax(4080, 262_144, 1, H200.0, H200.1).unwrap();
        assert_eq!((p.tile_rows, p.r), (4, 0));
        assert!(p.ctas * (2 * p.stage_bytes + CTA_RESERVED_SMEM) <= 132 * (228 << 10));
        // Several x rows: one head row per warp.
        let p = Plan::argmax(680, 262_144, 8, H200.0, H200.1).unwrap();
        assert_eq!((p.tile_rows, p.r), (4, 0));
        // Rows longer than a stage: another kernel.
        assert_eq!(Plan::matvec(STAGE_MAX, 10, H200.0, H200.1), None);
        // Fewer rows than a tile.
        let p = Plan::argmax(680, 5, 1, H200.0, H200.1).unwrap();
        assert_eq!((p.tile_rows, p.ctas, p.stages), (5, 1, 1));
    }
}
