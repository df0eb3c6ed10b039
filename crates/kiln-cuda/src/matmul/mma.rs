//! The tensor-core GEMM of kernels/mma.cu: integer codes times three
//! bfloat16 planes of x, with each 16-column chunk's scale and min applied
//! in f32 (within f32 accumulation of the exact product; see mma.cu), on
//! GPUs of compute capability 8.0 or newer, for quantized and BF16 weights
//! (F32 and F16 are not exact in bfloat16 and keep the f32 kernels). It
//! takes every product of 8 or more token rows (batched decode and
//! prefill), where it measured faster than the f32 kernels on the H200
//! ([`MMA_MIN_TOKENS`]); products of up to 1,024 rows go to `mma2_gemm`
//! (mma2.cu: x split once per product, ~30% fewer instructions per k step
//! by the SASS; with the head below, batched decode 18-30% faster on an
//! H100, and prefill 12-31%). `KILN_CUDA_MMA=1` keeps every product on
//! `mma_gemm` and `KILN_CUDA_MMA=0` sends none (A/B timing, and the f32
//! kernels' tests).

use cudarc::driver::{CudaFunction, CudaSlice, CudaView, DevicePtr, LaunchConfig};
use kiln_model::Result;
use kiln_quant::GgmlType;

use super::skinny::TiledGemm;
use super::{as_i32, grid, Matmul, TypeKernels, BLOCK};
use crate::gpu::{cuda_err, env_number, Gpu};
use crate::ops::launch;
use crate::weight::CudaWeight;

/// `(name, weight rows, tokens, threads)` of the CTA shapes of
/// `mma_gemm_*` (`KILN_MMA` in mma.cu), smallest first.
pub(super) const MMA_SHAPES: [(&str, usize, usize, u32); 5] = [
    ("m64n16", 64, 16, 128),
    ("m64n32", 64, 32, 128),
    ("m64n64", 64, 64, 128),
    ("m128n64", 128, 64, 256),
    ("m128n128", 128, 128, 256),
];
/// 8-value units of one k step (`MMA_K_UNITS`): splits are multiples.
const MMA_K_UNITS: usize = 8;
/// Shared memory of a CTA (`MmaShape` in mma.cu), in 4-byte words: per
/// weight row `MMA_STRIDE` (36) words of codes and a (d, m) pair for each
/// of the 4 chunks; per token 3 planes of 36 words and 4 chunk sums.
fn mma_smem_bytes(rows: usize, tokens: usize) -> usize {
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
    /// `1`: every product of [`MMA_MIN_TOKENS`] or more rows on
    /// `mma_gemm`. Prefill too: at 512 rows it is 0.8-1.25x the f32 SGEMM
    /// per matrix, and a whole 512-token prefill 1.10x (4B) to 1.18x (1B)
    /// faster.
    On,
    /// Unset (or `2`): as `On`, with products of up to [`MMA2_MAX_TOKENS`]
    /// rows on `mma2_gemm` (x split once per product; mma2.cu). H100,
    /// 2026-12-05 (bench/RESULTS.md), batched decode without the
    /// tensor-core head: 1B 16 / 64 rows 4,804 / 11,202 tok/s against
    /// 4,596 / 10,277 on `mma_gemm`, 4B 1,975 / 3,639 against 1,810 /
    /// 3,389.
    ///
    /// The planes of x by tile (`half_planes`): 64-token tiles take two
    /// IEEE half planes scaled by a power of two per token (the `mma2h_`
    /// kernels, mma2.cu's HalfPlanes: two MMAs per fragment instead of
    /// three, two thirds of the x tile's bytes), smaller ones three
    /// bfloat16 planes. H100, 2026-12-05 (bench/RESULTS.md), `batch_bench`
    /// tok/s at 16 / 64 rows: 4B 2,567 / 4,785 (bfloat16 everywhere 2,567
    /// / 3,918, half everywhere 2,200 / 4,785), 1B 6,237 / 13,738
    /// (6,237 / 13,310; 5,239 / 13,738).
    Split,
    /// `2`: `Split` with bfloat16 planes at every tile size.
    SplitBf16,
    /// `3`: `Split` with half planes at every tile size.
    SplitHalf,
    /// `0`: none (the f32 kernels, for A/B timing).
    Off,
}

pub(super) fn mma_mode() -> MmaMode {
    static MODE: std::sync::OnceLock<MmaMode> = std::sync::OnceLock::new();
    *MODE.get_or_init(
        || match std::env::var("KILN_CUDA_MMA").as_deref().map(str::trim) {
            Ok("0") => MmaMode::Off,
            Ok("1") => MmaMode::On,
            Ok("2") => MmaMode::SplitBf16,
            Ok("3") => MmaMode::SplitHalf,
            _ => MmaMode::Split,
        },
    )
}

/// The greedy head of 8 or more rows on the tensor cores
/// ([`Matmul::mma_argmax`]) rather than the f32 tiled head, unless
/// `KILN_CUDA_MMA_HEAD=0`. H100, 2026-12-05 (bench/RESULTS.md), batched
/// decode with `mma2_gemm`: 1B 16 / 64 rows 5,980 / 12,968 tok/s against
/// 4,804 / 11,202 with the tiled head, 4B 2,350 / 4,000 against 1,975 /
/// 3,639.
pub(super) fn mma_head_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !std::env::var("KILN_CUDA_MMA_HEAD").is_ok_and(|v| v.trim() == "0"))
}

/// Whether `n_tok` token rows take the tensor-core GEMM in `mode`.
pub(super) fn mma_wanted(mode: MmaMode, n_tok: usize) -> bool {
    mode != MmaMode::Off && n_tok >= MMA_MIN_TOKENS
}

/// Most token rows `mma2_gemm` takes by default (batched decode, prefill
/// chunks, and a GPU server's steps of 64 decode rows plus 960 prompt
/// rows), and the longest rows (k) its workspace holds: 3 bfloat16 planes
/// and the group sums of 1,024 x 16,384 values (100 MiB, allocated on first
/// use, before any capture: a graph keeps its address). H100, 2026-12-05
/// (bench/RESULTS.md), pp512 against 128 rows (prefill on `mma_gemm`):
/// 270M 62.5k -> 70k tok/s, 1B 21.1k -> 23.4k, 4B 5.5k -> 7.2k; 2026-12-06,
/// 64-stream serving with 1,024-row steps: 270M +10%, 1B +7%, 4B +5%.
const MMA2_MAX_TOKENS: usize = 1024;
const MMA2_MAX_K: usize = 16_384;

/// Workspace words of the split x of `tokens` rows of [`MMA2_MAX_K`].
const fn mma2_words(tokens: usize) -> usize {
    tokens * MMA2_MAX_K * 3 / 2 + tokens * MMA2_MAX_K / 16
}

/// `KILN_CUDA_MMA2_ROWS=N` (128 to 1,024, default 1,024): products of up
/// to N rows take the split-x GEMM, the workspace sized for them (N x 100
/// KiB); `128` sends prefill chunks back to `mma_gemm`, `512` sends a
/// server's 1,024-row steps there (A/B timing, or a smaller workspace).
fn mma2_max_tokens() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let ok = |n| (128..=1024).contains(&n);
        env_number("KILN_CUDA_MMA2_ROWS", ok, MMA2_MAX_TOKENS).next_multiple_of(128)
    })
}

/// Whether the split-x kernels of a tile of `tokens` take half planes
/// (index 1 of `TypeKernels::mma2*`) rather than bfloat16 ones (0), in
/// `mode` ([`MmaMode::Split`]).
pub(super) fn half_planes(mode: MmaMode, tokens: usize) -> usize {
    match mode {
        MmaMode::SplitHalf => 1,
        MmaMode::Split if tokens >= 64 => 1,
        _ => 0,
    }
}

/// Shared memory of a `rows` x `tokens` CTA of the split-x kernels
/// (`split`: of the planes [`half_planes`] picks) or of `mma_gemm`, for
/// weights of `ty`.
pub(super) fn cta_smem_bytes(split: bool, rows: usize, tokens: usize, ty: GgmlType) -> usize {
    match split {
        true => mma2_cta_smem_bytes(half_planes(mma_mode(), tokens) == 1, rows, tokens, ty),
        false => mma_smem_bytes(rows, tokens),
    }
}

/// Shared memory of a split-x CTA of bfloat16 planes (`mma2_`, `half`
/// false) or half planes (`mma2h_`), for setting each kernel's limit.
pub(super) fn mma2_cta_smem_bytes(half: bool, rows: usize, tokens: usize, ty: GgmlType) -> usize {
    mma2_smem_bytes(rows, tokens, mma_group(ty), x_planes(half, ty))
}

/// Planes of x a split-x CTA holds (`Mma2Planes` in mma2.cu): two half
/// planes in the `mma2h_` kernels of quantized weights (BF16 is not exact
/// in half: its `mma2h_` kernels keep three bfloat16 planes), else three.
/// The shared memory of a 64 x 64 Q4_K CTA is then 56 KiB rather than 75,
/// so three fit an SM's 227 KiB instead of two.
fn x_planes(half: bool, ty: GgmlType) -> usize {
    if half && ty.block_elems() >= 32 {
        2
    } else {
        3
    }
}

/// Columns under one (d, m) as mma2.cu groups them (`MmaGroup`).
fn mma_group(ty: GgmlType) -> usize {
    use GgmlType::*;
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4K | Q5K => 32,
        _ => 16,
    }
}

/// Shared memory of an `mma2_gemm` CTA (`Mma2Shape` in mma2.cu): two
/// weight buffers (codes, and (d, m) per row and group) and two x buffers
/// (`planes` planes, and a sum per token and group), in 4-byte words.
fn mma2_smem_bytes(rows: usize, tokens: usize, group: usize, planes: usize) -> usize {
    let groups = 64 / group;
    4 * (2 * (rows * (36 + 2 * groups)) + 2 * (tokens * (planes * 36 + groups)))
}

impl Matmul {
    /// Index into [`MMA_SHAPES`] for `n_tok` rows of an `n_rows` matrix of
    /// `ty`: the smallest token tile that holds them, and for more than 64
    /// rows the 128-row CTA when its tiles alone fill the GPU; with `split`
    /// (the split-x kernels take the product) the 128 x 128 CTA where its
    /// tiles fill the GPU once. A shape whose shared memory is over the
    /// GPU's per-CTA limit gives way to the next smaller one (the 64 x 64
    /// CTAs, at most 80 KiB, fit every GPU of compute capability 8.0+).
    fn mma_shape(&self, n_tok: usize, n_rows: usize, ty: GgmlType, split: bool) -> usize {
        let wanted = shape_for(n_tok, n_rows, self.sms, wide_tiles(), split && n128_tiles());
        fitting_shape(wanted, |shape| {
            let (_, rows, tokens, _) = MMA_SHAPES[shape];
            cta_smem_bytes(split, rows, tokens, ty) <= self.smem_per_cta
        })
    }
}

/// `wanted`, or the largest smaller shape that `fits` (128 x 128 -> 128 x
/// 64 -> 64 x 64 -> ...; shape 0 when none does).
fn fitting_shape(wanted: usize, fits: impl Fn(usize) -> bool) -> usize {
    (0..=wanted).rev().find(|&s| fits(s)).unwrap_or(0)
}

/// Whether more than 64 rows of the split-x GEMM may take 128-token tiles
/// (`KILN_CUDA_MMA_N128=0` keeps them on 64: A/B timing). Each weight
/// unit decoded serves twice the tokens: by the SASS (Q4_K, sm_90), 7.6
/// instructions per MMA instead of 12.
fn n128_tiles() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !std::env::var("KILN_CUDA_MMA_N128").is_ok_and(|v| v.trim() == "0"))
}

/// `KILN_CUDA_MMA_WIDE=1`: products of 33-64 rows take the 128-row CTA
/// too, so each x tile is read by half as many CTAs (at 64 rows a k step
/// of mma2's split x, 6 bytes a value, is ten times the Q4_K bytes of a
/// 64-row weight tile). For A/B timing on a GPU; off by default.
fn wide_tiles() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_CUDA_MMA_WIDE").is_ok_and(|v| v.trim() == "1"))
}

fn shape_for(n_tok: usize, n_rows: usize, sms: usize, wide: bool, n128: bool) -> usize {
    match n_tok {
        0..=16 => 0,
        17..=32 => 1,
        33..=64 if wide => 3,
        33..=64 => 2,
        _ if n128 && n_rows.div_ceil(128) * n_tok.div_ceil(128) >= sms => 4,
        _ if n_rows.div_ceil(128) * n_tok.div_ceil(64) >= 2 * sms => 3,
        _ => 2,
    }
}

/// CTAs of `f` (shape `name`) an SM holds at once, by the driver (at
/// least 1).
fn resident(f: &CudaFunction, name: &str, threads: u32, smem_bytes: usize) -> Result<usize> {
    f.occupancy_max_active_blocks_per_multiprocessor(threads, smem_bytes, None)
        .map_err(|e| cuda_err(&format!("occupancy of {name} CTAs"), e))
        .map(|n| n.max(1) as usize)
}

/// The launch plan of an MMA kernel of `shape`: its split along k aims
/// for `KILN_CUDA_MMA_CTAS_PER_SM` CTAs per SM where set, else
/// `default` (or, without one, as many as fit at once).
fn mma_plan<'a>(
    f: &'a CudaFunction,
    (name, rows, tokens, threads): (&str, usize, usize, u32),
    smem_bytes: usize,
    default: Option<usize>,
) -> Result<TiledGemm<'a>> {
    let ctas_per_sm = match (split_target(), default) {
        (SplitTarget::Ctas(n), _) => n,
        (SplitTarget::Threads, Some(n)) => n,
        _ => resident(f, name, threads, smem_bytes)?,
    };
    Ok(TiledGemm {
        f,
        tile: (rows, tokens),
        threads,
        smem_bytes: smem_bytes as u32,
        ctas_per_sm,
        step_units: MMA_K_UNITS,
    })
}

impl Matmul {
    /// The product by `mma2_gemm` where the mode asks for it (the default) and
    /// it applies (at most [`MMA2_MAX_TOKENS`] rows of at most
    /// [`MMA2_MAX_K`] values); `Ok(false)` leaves it to `mma_gemm`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mma2_gemm(
        &self,
        gpu: &Gpu,
        k: &TypeKernels,
        w: &CudaWeight,
        (row0, n_rows): (usize, usize),
        x: &CudaSlice<f32>,
        n_tok: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<bool> {
        if !self.mma2_fits(w, n_tok) {
            return Ok(false);
        }
        let shape = self.mma_shape(n_tok, n_rows, w.ty, true);
        let (_, tile_rows, tokens, _) = MMA_SHAPES[shape];
        let smem_bytes = cta_smem_bytes(true, tile_rows, tokens, w.ty);
        let planes = half_planes(mma_mode(), tokens);
        let f = &k.mma2[planes][shape];
        let mut guard = self.mma2_x.lock().unwrap_or_else(|e| e.into_inner());
        let ws = self.split_x(gpu, k, w, &x.slice(..), n_tok, tokens, &mut guard)?;
        // One wave of resident CTAs unless told otherwise (mma_gemm's
        // default over-splits: pending/README.md).
        let plan = mma_plan(f, MMA_SHAPES[shape], smem_bytes, None)?;
        // The split x in place of x: mma2_gemm takes the same arguments.
        self.launch_tiled(gpu, k, w, (row0, n_rows), ws, n_tok, out, plan)?;
        Ok(true)
    }

    /// Whether `n_tok` rows of `w` take the split-x kernels
    /// (the default mode, within the workspace).
    fn mma2_fits(&self, w: &CudaWeight, n_tok: usize) -> bool {
        matches!(
            mma_mode(),
            MmaMode::Split | MmaMode::SplitBf16 | MmaMode::SplitHalf
        ) && n_tok <= mma2_max_tokens()
            && w.cols <= MMA2_MAX_K
    }

    /// Splits `x` (`n_tok` rows of `w.cols` values) into the workspace in
    /// `guard` (allocated on first use) for tiles of `tokens`
    /// (`mma2_split_x` or `mma2h_split_x`, as [`half_planes`] picks for
    /// that tile, as its GEMM), and returns the workspace.
    #[allow(clippy::too_many_arguments)]
    fn split_x<'g>(
        &self,
        gpu: &Gpu,
        k: &TypeKernels,
        w: &CudaWeight,
        x: &CudaView<'_, f32>,
        n_tok: usize,
        tokens: usize,
        guard: &'g mut Option<CudaSlice<f32>>,
    ) -> Result<&'g CudaSlice<f32>> {
        let ws = match guard {
            Some(ws) => ws,
            // Before any capture: the warm-up run of a step (run_step
            // runs it plainly first) allocates it.
            None => {
                guard.insert(gpu.alloc::<f32>(mma2_words(mma2_max_tokens()), "split x workspace")?)
            }
        };
        let (rows, kp, group) = (
            n_tok.next_multiple_of(tokens),
            w.cols.next_multiple_of(64),
            mma_group(w.ty),
        );
        let (cols, n_tok_i) = (as_i32("cols", w.cols)?, as_i32("tokens", n_tok)?);
        let (rows_i, kp_i, group_i) = (as_i32("rows", rows)?, as_i32("cols", kp)?, group as i32);
        let cfg = grid(
            ((rows * kp / 8).div_ceil(BLOCK as usize).min(4096), 1),
            BLOCK,
        );
        // Reads n_tok * cols of x (checked by the caller); writes 3 * rows *
        // kp / 2 + rows * kp / group <= mma2_words(mma2_max_tokens()) words
        // (rows: n_tok <= mma2_max_tokens(), a multiple of 128, rounded up
        // to a token tile of at most 128, which divides it; kp
        // <= MMA2_MAX_K, a multiple of 64). The kernels find the sums
        // after the planes.
        let (xp, _guard) = x.device_ptr(&gpu.stream);
        let f = &k.mma2_split_x[half_planes(mma_mode(), tokens)];
        launch!(gpu, f, cfg, &format!("split x for {}", w.name);
            xp, n_tok_i, cols, rows_i, kp_i, group_i, gpu.ptr(ws, 0), gpu.ptr(ws, 3 * rows * kp / 2))?;
        Ok(ws)
    }

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
        if self.mma2_gemm(gpu, k, w, (row0, n_rows), x, n_tok, out)? {
            return Ok(());
        }
        let shape = self.mma_shape(n_tok, n_rows, w.ty, false);
        let (_, rows, tokens, threads) = MMA_SHAPES[shape];
        let smem_bytes = cta_smem_bytes(false, rows, tokens, w.ty);
        let f = &k.mma[shape];
        let plan = mma_plan(
            f,
            MMA_SHAPES[shape],
            smem_bytes,
            Some(MMA_THREADS_PER_SM / threads as usize),
        )?;
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
        let split = self.mma2_fits(w, n);
        let shape = self.mma_shape(n, w.rows, w.ty, split);
        let (name, rows, tokens, threads) = MMA_SHAPES[shape];
        let f = match split {
            true => &k.mma2_argmax[half_planes(mma_mode(), tokens)][shape],
            false => &k.mma_argmax[shape],
        };
        let smem_bytes = cta_smem_bytes(split, rows, tokens, w.ty);
        let want = resident(f, name, threads, smem_bytes)? * self.sms;
        let ctas = self.head_ctas(w, n, want.min(w.rows.div_ceil(rows)))?;
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
        let mut guard = split.then(|| self.mma2_x.lock().unwrap_or_else(|e| e.into_inner()));
        let hp = match &mut guard {
            // The split x in place of h: mma2_argmax takes the same arguments.
            Some(guard) => {
                let rows_h = h.slice(row0 * w.cols..(row0 + n) * w.cols);
                gpu.ptr(self.split_x(gpu, k, w, &rows_h, n, tokens, guard)?, 0)
            }
            None => gpu.ptr(h, row0 * w.cols),
        };
        // Reads every weight row and h rows row0..row0+n (checked), or
        // their split; writes n * ctas <= partials.len() partials.
        launch!(gpu, f, cfg, &what;
            gpu.ptr(&w.data, 0), w.row_bytes as u64, n_rows, cols, hp, n_i, gpu.ptr(&self.partials, 0))?;
        drop(guard);
        self.argmax_finish(gpu, k, n, ctas, ids, slot0, &what)
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
        assert!(mma_wanted(MmaMode::Split, 8) && !mma_wanted(MmaMode::Split, 7));
    }

    #[test]
    fn split_x_layout_fits_its_workspace_and_shared_memory() {
        // Q4_K, 64 x 64: two weight buffers of 64 x (36 + 2 x 2) words,
        // two x buffers of 64 x (3 x 36 + 2).
        assert_eq!(
            mma2_smem_bytes(64, 64, 32, 3),
            4 * (2 * 64 * 40 + 2 * 64 * 110)
        );
        // The largest CTA fits an H200 SM's 227 KiB (with 16-column groups).
        assert!(mma2_smem_bytes(128, 128, 16, 3) <= 227 << 10);
        // Half planes: two planes of x; three 64 x 64 Q4_K CTAs fit an SM.
        assert_eq!(
            mma2_cta_smem_bytes(true, 64, 64, GgmlType::Q4K),
            4 * (2 * 64 * 40 + 2 * 64 * 74)
        );
        assert!(3 * (mma2_cta_smem_bytes(true, 64, 64, GgmlType::Q4K) + 1024) <= 228 << 10);
        assert_eq!(
            mma2_cta_smem_bytes(true, 64, 64, GgmlType::BF16),
            mma2_smem_bytes(64, 64, 16, 3)
        );
        // 1,024 rows of 16,384 values: planes and 16-column sums.
        assert_eq!(
            mma2_words(MMA2_MAX_TOKENS),
            3 * 1024 * 16_384 / 2 + 1024 * 16_384 / 16
        );
        assert_eq!(mma_group(GgmlType::Q4K), 32);
        assert_eq!(mma_group(GgmlType::Q6K), 16);
    }

    #[test]
    fn shapes_over_the_shared_memory_limit_give_way() {
        // A 99 KiB GPU (compute capability 8.6 / 8.9): Q6_K's split-x
        // 128 x 128 CTA (half planes, 120 KiB) does not fit, its 128 x 64
        // one (82 KiB) does; with bfloat16 planes 128 x 64 (100 KiB) does
        // not either, 64 x 64 (78 KiB) does.
        let fits = |s: usize| {
            let (_, rows, tokens, _) = MMA_SHAPES[s];
            cta_smem_bytes(true, rows, tokens, GgmlType::Q6K) <= 99 << 10
        };
        assert_eq!(fitting_shape(4, fits), 3);
        assert_eq!(fitting_shape(3, fits), 3);
        let fits_bf16 = |s: usize| {
            let (_, rows, tokens, _) = MMA_SHAPES[s];
            mma2_cta_smem_bytes(false, rows, tokens, GgmlType::Q6K) <= 99 << 10
        };
        assert_eq!(fitting_shape(4, fits_bf16), 2);
        assert_eq!(fitting_shape(3, fits_bf16), 2);
        assert_eq!(fitting_shape(1, fits), 1);
        assert_eq!(fitting_shape(4, |_| true), 4);
        assert_eq!(fitting_shape(4, |_| false), 0);
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
    fn half_planes_take_the_64_token_tiles_by_default() {
        assert_eq!(half_planes(MmaMode::Split, 16), 0);
        assert_eq!(half_planes(MmaMode::Split, 32), 0);
        assert_eq!(half_planes(MmaMode::Split, 64), 1);
        assert_eq!(half_planes(MmaMode::SplitBf16, 64), 0);
        assert_eq!(half_planes(MmaMode::SplitHalf, 16), 1);
    }

    #[test]
    fn shapes_hold_the_rows_and_fill_the_gpu() {
        assert_eq!(shape_for(16, 1152, 132, false, true), 0);
        assert_eq!(shape_for(17, 1152, 132, false, true), 1);
        assert_eq!(shape_for(64, 1152, 132, false, true), 2);
        // KILN_CUDA_MMA_WIDE=1: 33-64 rows on the 128-row CTA.
        assert_eq!(shape_for(64, 20_480, 132, true, true), 3);
        assert_eq!(shape_for(32, 20_480, 132, true, true), 1);
        // 512 prefill rows of a 6912-row FFN: 54 x 4 tiles of 128 x 128
        // on the split-x kernels, 54 x 8 of 128 x 64 on mma_gemm.
        assert_eq!(shape_for(512, 6912, 132, false, true), 4);
        assert_eq!(shape_for(512, 6912, 132, false, false), 3);
        // 128 rows of a 640-row one: 5 x 1 tiles are too few, 64-row CTAs.
        assert_eq!(shape_for(128, 640, 132, false, true), 2);
        assert_eq!(shape_for(512, 640, 132, false, false), 2);
    }
}
