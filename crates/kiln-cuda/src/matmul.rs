//! Products with packed weights (kernels/matmul.cu): the decode GEMV, the
//! skinny multi-token GEMM, prefill through dequantized chunks and cuBLAS
//! SGEMM, the embedding gather and the greedy LM head (argmax without
//! logits); the tiled kernels of batched decode (kernels/skinny.cu) in
//! `skinny.rs`, the one-token kernels that stream weights through shared
//! memory (kernels/stream.cu) in `stream.rs`; the tensor-core GEMM of
//! prefill and large batches (kernels/mma.cu) in `mma.rs`.
//!
//! `matmul.cu` is compiled once per weight type met (NVRTC, on first use:
//! a model needs two or three of the thirteen), each time with
//! `KILN_WEIGHT` naming the decoder of `quant.cuh`. Every launch here only
//! enqueues device work on the one stream, so all of it may be captured
//! into a CUDA graph; the three buffers (argmax partials, split sums,
//! dequant workspace) are allocated before any capture and never
//! reallocated, so a captured graph never points at freed memory.

mod mma;
mod skinny;
mod stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_DYNAMIC_SMEM;
use cudarc::driver::{CudaFunction, CudaSlice, CudaView, DevicePtr, LaunchConfig};
use kiln_model::{ModelError, Result};
use kiln_quant::GgmlType;

use crate::gpu::{cuda_err, Gpu, Source};
use crate::ops::launch;
use crate::weight::CudaWeight;
use mma::{
    codes_fit_bf16, cta_smem_bytes, mma2_cta_smem_bytes, mma_head_enabled, mma_mode, mma_wanted,
    MMA_SHAPES,
};
use skinny::{GEMM_MAX_TOKENS, GEMM_TOKENS, SPLIT_FLOATS};
use stream::{stream_enabled, HEAD_CELLS, STREAM_HEAD_TOKENS, STREAM_R};

/// One [`Source`] per weight type: `matmul.cu` after `quant.cuh`, with
/// `KILN_WEIGHT` set to the type's decoder (also the kernels' name suffix).
macro_rules! sources {
    ($($ty:ident => $name:literal),* $(,)?) => {
        [$((
            GgmlType::$ty,
            $name,
            Source {
                name: concat!("matmul_", $name),
                text: concat!(
                    "#define KILN_WEIGHT ", $name, "\n",
                    include_str!("../kernels/common.cuh"),
                    include_str!("../kernels/quant.cuh"),
                    include_str!("../kernels/matmul.cu"),
                    include_str!("../kernels/skinny.cu"),
                    include_str!("../kernels/stream.cu"),
                    include_str!("../kernels/qdot.cu"),
                    include_str!("../kernels/mma.cu"),
                    include_str!("../kernels/mma2.cu"),
                ),
            },
        )),*]
    };
}

static SOURCES: [(GgmlType, &str, Source); 13] = sources!(
    F32 => "f32",
    F16 => "f16",
    BF16 => "bf16",
    Q4_0 => "q4_0",
    Q4_1 => "q4_1",
    Q5_0 => "q5_0",
    Q5_1 => "q5_1",
    Q8_0 => "q8_0",
    Q2K => "q2_k",
    Q3K => "q3_k",
    Q4K => "q4_k",
    Q5K => "q5_k",
    Q6K => "q6_k",
);

/// The kernel sources, one per weight type (for compile tests).
pub(crate) fn sources() -> impl Iterator<Item = &'static Source> {
    SOURCES.iter().map(|(_, _, src)| src)
}

/// Threads of every kernel but `argmax_finish` (`WARPS * 32` in matmul.cu).
const BLOCK: u32 = 128;
const WARPS: usize = 4;
/// Threads of `argmax_finish` (`ARGMAX_FINISH_THREADS`).
const FINISH_BLOCK: u32 = 256;

/// The `(tokens, rows per warp)` instantiations of `matvec` (`KILN_MATVEC`
/// in matmul.cu). Several rows per warp reuse each x load from registers;
/// one row per warp gives short matrices more warps to spread over.
const MATVEC_SHAPES: [(usize, usize); 5] = [(1, 1), (1, 2), (2, 2), (4, 4), (8, 4)];
/// Most token rows of the `matvec` path; more go through SGEMM.
pub(crate) const MATVEC_MAX_TOKENS: usize = 8;
/// From this many rows a 1-token GEMV takes 2 rows per warp: 2048 warps
/// still fill an H200 (132 SMs x 16 resident warps of 128-thread CTAs).
const TWO_ROWS_FROM: usize = 4096;

/// Rows per warp and step of `argmax_rows` (`ARGMAX_ROWS` in matmul.cu).
const ARGMAX_ROWS: usize = 4;
/// Most CTAs of `argmax_rows`: enough to fill every SM; larger
/// vocabularies are covered by striding.
const ARGMAX_CTAS: usize = 2048;
/// Partial results of the argmax heads: `ARGMAX_CTAS` for one row,
/// `rows x CTAs` for several (`argmax_tiles` takes fewer CTAs when many
/// rows would not fit).
const ARGMAX_PARTIALS: usize = 64 * ARGMAX_CTAS;
/// f32 values of the dequant workspace (32 MiB): prefill dequantizes the
/// weight in chunks of rows that fit, so the 262,144-row LM head needs 32
/// MiB rather than its full 671 MB.
const WORKSPACE_FLOATS: usize = 8 << 20;

/// The kernels of one weight type.
struct TypeKernels {
    /// In [`MATVEC_SHAPES`] order.
    matvec: Vec<CudaFunction>,
    dequant_rows: CudaFunction,
    embed: CudaFunction,
    argmax_rows: CudaFunction,
    argmax_finish: CudaFunction,
    /// In [`GEMM_TOKENS`] order.
    gemm: Vec<CudaFunction>,
    argmax_tiles: Vec<CudaFunction>,
    split_sum: CudaFunction,
    /// In [`STREAM_R`] order.
    stream_matvec: Vec<CudaFunction>,
    stream_argmax: Vec<CudaFunction>,
    /// In [`STREAM_HEAD_TOKENS`] order.
    stream_head: Vec<CudaFunction>,
    /// In [`MMA_SHAPES`] order: the tensor-core GEMM and greedy head.
    mma: Vec<CudaFunction>,
    mma_argmax: Vec<CudaFunction>,
    /// By default (not `KILN_CUDA_MMA=1`): x split once per product, then
    /// the GEMM; `[bfloat16 planes, half planes]` (mma2.cu's policies,
    /// chosen per shape by mma.rs's `half_planes`).
    mma2_split_x: [CudaFunction; 2],
    mma2: [Vec<CudaFunction>; 2],
    mma2_argmax: [Vec<CudaFunction>; 2],
    /// The large one-token products (stream.rs's `qdot_for`): x split into
    /// int8 planes, then the GEMV and head of one row on integer dot
    /// products.
    qx_split: CudaFunction,
    qdot_matvec: Vec<CudaFunction>,
    qdot_argmax: Vec<CudaFunction>,
}

/// The packed-weight ops of [`crate::CudaBackend`].
pub(crate) struct Matmul {
    kernels: Mutex<HashMap<GgmlType, Arc<TypeKernels>>>,
    /// One orderable (dot, row) key per argmax CTA and hidden row.
    partials: CudaSlice<u64>,
    /// Partial sums of a GEMM split along k.
    split: CudaSlice<f32>,
    /// The one-kernel heads' running best keys and finished-CTA count
    /// (zero between launches).
    head_cells: CudaSlice<u64>,
    /// Streaming multiprocessors of the GPU (split and grid sizes).
    sms: usize,
    /// Shared memory of one SM in bytes (how many streaming CTAs fit).
    smem_per_sm: usize,
    /// Most shared memory one CTA may opt in to: the largest tensor-core
    /// CTAs (156 KiB) fit an H100 / H200 (227 KiB), not GPUs of compute
    /// capability 8.6 / 8.9 (99 KiB), where smaller shapes take their
    /// products ([`Matmul::mma_shape`]).
    smem_per_cta: usize,
    /// The GPU has TF32 tensor cores (compute capability 8.0 or newer).
    tensor_cores: bool,
    /// Dequantized weight rows for SGEMM; allocated on the first prefill
    /// (never during a graph capture), then kept.
    workspace: Mutex<Option<CudaSlice<f32>>>,
    /// `mma2_gemm`'s split x (mma.rs), allocated on first use.
    mma2_x: Mutex<Option<CudaSlice<f32>>>,
    /// The qdot kernels' split x (stream.rs), allocated on first use.
    qx: Mutex<Option<CudaSlice<f32>>>,
}

/// `KILN_CUDA_SKINNY=0` sends 2..=8 token rows to the per-warp `matvec`
/// shapes and more to SGEMM, as before the tiled GEMM (for A/B timing).
fn skinny_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_CUDA_SKINNY").map_or(true, |v| v.trim() != "0"))
}

/// A [`ModelError::Backend`] about a buffer too short for an op.
fn check_len(what: &str, name: &str, need: usize, have: usize) -> Result<()> {
    if need > have {
        return Err(ModelError::Backend(format!(
            "{what} {name}: needs {need} elements, buffer has {have}"
        )));
    }
    Ok(())
}

/// `blocks.0 x blocks.1` CTAs of `threads` (callers keep the counts small:
/// grids are sized from i32-checked shapes).
fn grid(blocks: (usize, usize), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.0 as u32, blocks.1 as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `v` as a kernel's `int`, or an error naming it.
fn as_i32(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| ModelError::Backend(format!("{what} = {v} exceeds the kernels' 2^31 limit")))
}

impl Matmul {
    pub(crate) fn new(gpu: &Gpu) -> Result<Self> {
        use cudarc::driver::sys::CUdevice_attribute::{
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as SMEM_CTA,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR as SMEM,
            CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as SMS,
        };
        let attr = |a, what: &str| {
            let v = gpu
                .ctx
                .attribute(a)
                .map_err(|e| cuda_err(&format!("reading the {what}"), e))?;
            Ok::<usize, ModelError>(usize::try_from(v).unwrap_or(1).max(1))
        };
        let (sms, smem_per_sm) = (attr(SMS, "SM count")?, attr(SMEM, "shared memory per SM")?);
        let smem_per_cta = attr(SMEM_CTA, "shared memory per block")?;
        let tensor_cores = attr(MAJOR, "compute capability")? >= 8;
        Ok(Matmul {
            kernels: Mutex::default(),
            partials: gpu.alloc::<u64>(ARGMAX_PARTIALS, "argmax partials")?,
            split: gpu.alloc::<f32>(SPLIT_FLOATS, "split partial sums")?,
            head_cells: gpu.alloc::<u64>(HEAD_CELLS, "argmax head cells")?,
            sms,
            smem_per_sm,
            smem_per_cta,
            tensor_cores,
            workspace: Mutex::new(None),
            mma2_x: Mutex::new(None),
            qx: Mutex::new(None),
        })
    }

    /// `out[t, r] = Σ_c x[t, c] · W[row0 + r, c]` for `t < n_tok`,
    /// `r < n_rows` (out row stride `n_rows`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul(
        &self,
        gpu: &Gpu,
        w: &CudaWeight,
        row0: usize,
        n_rows: usize,
        x: &CudaSlice<f32>,
        n_tok: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let k = self.kernels_for(gpu, w)?;
        if row0.checked_add(n_rows).is_none_or(|end| end > w.rows) {
            return Err(ModelError::Backend(format!(
                "{}: rows {row0}..{} out of {}",
                w.name,
                row0.saturating_add(n_rows),
                w.rows
            )));
        }
        check_len("matmul input of", &w.name, n_tok * w.cols, x.len())?;
        check_len("matmul output of", &w.name, n_tok * n_rows, out.len())?;
        if n_tok == 0 || n_rows == 0 {
            return Ok(());
        }
        if self.tensor_cores && codes_fit_bf16(w.ty) && mma_wanted(mma_mode(), n_tok) {
            return self.mma_gemm(gpu, &k, w, row0, n_rows, x, n_tok, out);
        }
        if n_tok > 1 && n_tok <= GEMM_MAX_TOKENS && skinny_enabled() {
            return self.gemm(gpu, &k, w, row0, n_rows, x, n_tok, out);
        }
        if n_tok > MATVEC_MAX_TOKENS {
            return self.matmul_sgemm(gpu, &k, w, row0, n_rows, x, n_tok, out);
        }
        if n_tok == 1 && stream_enabled() && self.stream_matvec(gpu, &k, w, row0, n_rows, x, out)? {
            return Ok(());
        }
        let shape = match n_tok {
            1 if n_rows < TWO_ROWS_FROM => 0,
            1 => 1,
            2 => 2,
            3 | 4 => 3,
            _ => 4,
        };
        let rows_per_cta = WARPS * MATVEC_SHAPES[shape].1;
        let cfg = grid((n_rows.div_ceil(rows_per_cta), 1), BLOCK);
        let (row0, n_rows) = (as_i32("row0", row0)?, as_i32("rows", n_rows)?);
        let (cols, n_tok) = (as_i32("cols", w.cols)?, n_tok as i32);
        // matvec_* reads rows row0..row0+n_rows of `w.data` (checked against
        // w.rows, whose bytes `upload` checked), n_tok * cols values of x
        // and writes n_tok * n_rows of out (both checked above).
        launch!(gpu, &k.matvec[shape], cfg, &format!("matvec on {}", w.name);
            gpu.ptr(&w.data, 0), w.row_bytes as u64, row0, n_rows, cols, gpu.ptr(x, 0), n_tok, gpu.ptr(out, 0))
    }

    /// Prefill: dequantize chunks of rows into the workspace, then
    /// `out[:, chunk] = x · chunkᵀ` by cuBLAS SGEMM (pure f32: `Gpu::new`
    /// sets the pedantic math mode, so no TF32).
    #[allow(clippy::too_many_arguments)]
    fn matmul_sgemm(
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
        let mut guard = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        let ws = match guard.as_mut() {
            Some(ws) => ws,
            // `alloc` refuses inside a capture: the warm-up run of a step
            // (run_step runs it plainly first) allocates it.
            None => guard.insert(gpu.alloc::<f32>(WORKSPACE_FLOATS, "dequant workspace")?),
        };
        let chunk = (WORKSPACE_FLOATS / w.cols).min(n_rows);
        if chunk == 0 {
            return Err(ModelError::Backend(format!(
                "{}: rows of {} values exceed the dequant workspace ({WORKSPACE_FLOATS})",
                w.name, w.cols
            )));
        }
        let (row_bytes, cols) = (w.row_bytes as u64, as_i32("cols", w.cols)?);
        let (n_tok_i, ldc) = (as_i32("tokens", n_tok)?, as_i32("rows", n_rows)?);
        for r in (0..n_rows).step_by(chunk) {
            let m = chunk.min(n_rows - r);
            let (first, m_i) = (as_i32("row", row0 + r)?, m as i32);
            let cfg = grid(((m * w.cols / 8).div_ceil(BLOCK as usize), 1), BLOCK);
            // Reads rows row0+r .. row0+r+m of the weight (checked by the
            // caller) and writes m * cols <= WORKSPACE_FLOATS values.
            launch!(gpu, &k.dequant_rows, cfg, &format!("dequant_rows on {}", w.name);
                gpu.ptr(&w.data, 0), row_bytes, first, m_i, cols, gpu.ptr(ws, 0))?;
            // Column-major view: C (n_rows x n_tok, ldc n_rows) = Aᵀ B with
            // A the chunk (cols x m, lda cols) and B = x (cols x n_tok).
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_T,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: m_i,
                n: n_tok_i,
                k: cols,
                alpha: 1.0f32,
                lda: cols,
                ldb: cols,
                beta: 0.0f32,
                ldc,
            };
            let a = ws.slice(0..m * w.cols);
            let mut c = out.slice_mut(r..);
            let what = format!("SGEMM on {}", w.name);
            gpu.timed(&what, || {
                // SAFETY: A holds m * cols values, B n_tok * cols (checked
                // by the caller), C is written at r + i + t * n_rows <
                // n_tok * n_rows for i < m, t < n_tok.
                unsafe { gpu.blas.gemm(cfg, &a, x, &mut c) }.map_err(|e| cuda_err(&what, e))
            })?;
        }
        Ok(())
    }

    /// `out[t] = dequant(W[tokens[t]]) * scale` for `t < n_tok`; ids are
    /// read on the device (an id past the table gives NaN rows: `load_step`
    /// rejects those ids on the host).
    pub(crate) fn embed(
        &self,
        gpu: &Gpu,
        table: &CudaWeight,
        tokens: &CudaView<'_, u32>,
        n_tok: usize,
        scale: f32,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let k = self.kernels_for(gpu, table)?;
        check_len("embed ids of", &table.name, n_tok, tokens.len())?;
        check_len(
            "embed output of",
            &table.name,
            n_tok * table.cols,
            out.len(),
        )?;
        if n_tok == 0 {
            return Ok(());
        }
        let units = table.cols / 8;
        let cfg = grid((units.div_ceil(BLOCK as usize), n_tok.min(65_535)), BLOCK);
        let (row_bytes, rows) = (table.row_bytes as u64, as_i32("rows", table.rows)?);
        let (cols, n_tok) = (as_i32("cols", table.cols)?, as_i32("tokens", n_tok)?);
        // Event tracking is off (`Gpu::new`): the guard does nothing.
        let (ids, _guard) = tokens.device_ptr(&gpu.stream);
        // Reads n_tok ids (checked), only rows below `rows`, and writes
        // n_tok * cols values of out (checked).
        launch!(gpu, &k.embed, cfg, &format!("embed on {}", table.name);
            gpu.ptr(&table.data, 0), row_bytes, rows, cols, ids, n_tok, scale, gpu.ptr(out, 0))
    }

    /// `ids[slot0 + i] = argmax_r dot(W[r], h[row0 + i])` for `i < n`: ties
    /// go to the lowest r, and any non-finite dot gives `u32::MAX` (the
    /// host reports it). Nothing is copied to the host and nothing
    /// allocated. Up to 4 rows take the streaming kernels (stream.rs), more
    /// the tiled one (from 8 rows the tensor cores, unless
    /// `KILN_CUDA_MMA_HEAD=0`: mma.rs); each reads every head row once for
    /// all rows (once per 64 rows on the tensor cores).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn argmax(
        &self,
        gpu: &Gpu,
        w: &CudaWeight,
        h: &CudaSlice<f32>,
        row0: usize,
        n: usize,
        ids: &mut CudaSlice<u32>,
        slot0: usize,
    ) -> Result<()> {
        let k = self.kernels_for(gpu, w)?;
        check_len("argmax input of", &w.name, (row0 + n) * w.cols, h.len())?;
        check_len("argmax ids of", &w.name, slot0 + n, ids.len())?;
        if w.rows == 0 || w.rows >= u32::MAX as usize {
            return Err(ModelError::Backend(format!(
                "argmax over {}: {} rows (1 to 2^32 - 2)",
                w.name, w.rows
            )));
        }
        if n == 0 || (stream_enabled() && self.stream_argmax(gpu, &k, w, h, row0, n, ids, slot0)?) {
            return Ok(());
        }
        if self.tensor_cores
            && codes_fit_bf16(w.ty)
            && mma_head_enabled()
            && mma_wanted(mma_mode(), n)
        {
            return self.mma_argmax(gpu, &k, w, h, row0, n, ids, slot0);
        }
        if n > 1 {
            return self.argmax_tiles(gpu, &k, w, h, row0, n, ids, slot0);
        }
        let (row, slot) = (row0, slot0);
        let ctas = w.rows.div_ceil(WARPS * ARGMAX_ROWS).min(ARGMAX_CTAS);
        let cfg = grid((ctas, 1), BLOCK);
        let (row_bytes, rows, cols) = (
            w.row_bytes as u64,
            as_i32("rows", w.rows)?,
            as_i32("cols", w.cols)?,
        );
        let what = format!("argmax on {}", w.name);
        // Reads every row of the weight and x row `row` (checked); writes
        // `ctas` <= ARGMAX_PARTIALS partials.
        launch!(gpu, &k.argmax_rows, cfg, &what;
            gpu.ptr(&w.data, 0), row_bytes, rows, cols, gpu.ptr(h, row * w.cols), gpu.ptr(&self.partials, 0))?;
        let cfg = grid((1, 1), FINISH_BLOCK);
        let (n, slot) = (ctas as i32, as_i32("slot", slot)?);
        // Reads the n partials just written, writes ids[slot] (checked).
        launch!(gpu, &k.argmax_finish, cfg, &what; gpu.ptr(&self.partials, 0), n, gpu.ptr(ids, 0), slot)
    }

    /// Starts compiling the kernels of weights of type `ty` in the
    /// background (a no-op for types without any, or once started).
    pub(crate) fn prepare(gpu: &Gpu, ty: GgmlType) {
        if let Some((_, _, src)) = SOURCES.iter().find(|(t, ..)| *t == ty) {
            gpu.prepare(src);
        }
    }

    /// The kernels for `w`'s type (compiled on first use), after checking
    /// that `w` is laid out as they assume.
    fn kernels_for(&self, gpu: &Gpu, w: &CudaWeight) -> Result<Arc<TypeKernels>> {
        check_layout(gpu, w)?;
        let mut map = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = map.get(&w.ty) {
            return Ok(k.clone());
        }
        let (_, suffix, src) = SOURCES.iter().find(|(ty, ..)| *ty == w.ty).ok_or_else(|| {
            ModelError::Backend(format!("{}: no CUDA kernels for type {}", w.name, w.ty))
        })?;
        let get = |op: &str| gpu.function(src, &format!("{op}_{suffix}"));
        let matvec = MATVEC_SHAPES
            .iter()
            .map(|(nt, r)| gpu.function(src, &format!("matvec_{suffix}_t{nt}r{r}")))
            .collect::<Result<Vec<_>>>();
        let tiled = |op: &str| {
            GEMM_TOKENS
                .iter()
                .map(|nt| gpu.function(src, &format!("{op}_{suffix}_t{nt}")))
                .collect::<Result<Vec<_>>>()
        };
        let streamed = |op: &str| {
            STREAM_R
                .iter()
                .map(|r| gpu.function(src, &format!("{op}_{suffix}_r{r}")))
                .collect::<Result<Vec<_>>>()
        };
        // The 128 x 64 CTAs take 50 KiB of shared memory: over the default
        // 48 (only asked where they run: some older GPUs have 48).
        let mma_kernels = |op: &str| {
            MMA_SHAPES
                .iter()
                .map(|&(shape, rows, tokens, _)| {
                    let name = format!("{op}_{suffix}_{shape}");
                    let f = gpu.function(src, &name)?;
                    let bytes = match op.strip_prefix("mma2") {
                        Some(rest) => {
                            mma2_cta_smem_bytes(rest.starts_with('h'), rows, tokens, w.ty)
                        }
                        None => cta_smem_bytes(false, rows, tokens, w.ty),
                    };
                    // A shape over the GPU's limit is never launched.
                    if self.tensor_cores && bytes <= self.smem_per_cta {
                        f.set_attribute(MAX_DYNAMIC_SMEM, bytes as i32)
                            .map_err(|e| cuda_err(&format!("shared memory of {name}"), e))?;
                    }
                    Ok(f)
                })
                .collect::<Result<Vec<_>>>()
        };
        let k = Arc::new(TypeKernels {
            matvec: matvec?,
            dequant_rows: get("dequant_rows")?,
            embed: get("embed")?,
            argmax_rows: get("argmax_rows")?,
            argmax_finish: get("argmax_finish")?,
            gemm: tiled("gemm")?,
            argmax_tiles: tiled("argmax_tiles")?,
            split_sum: get("gemm_split_sum")?,
            stream_matvec: streamed("stream_matvec")?,
            stream_argmax: streamed("stream_argmax")?,
            stream_head: STREAM_HEAD_TOKENS
                .iter()
                .map(|t| gpu.function(src, &format!("stream_argmax_{suffix}_t{t}")))
                .collect::<Result<Vec<_>>>()?,
            mma: mma_kernels("mma_gemm")?,
            mma_argmax: mma_kernels("mma_argmax")?,
            mma2_split_x: [get("mma2_split_x")?, get("mma2h_split_x")?],
            mma2: [mma_kernels("mma2_gemm")?, mma_kernels("mma2h_gemm")?],
            mma2_argmax: [mma_kernels("mma2_argmax")?, mma_kernels("mma2h_argmax")?],
            qx_split: get("qx_split")?,
            qdot_matvec: streamed("qdot_matvec")?,
            qdot_argmax: streamed("qdot_argmax")?,
        });
        map.insert(w.ty, k.clone());
        Ok(k)
    }
}

/// What the kernels assume of a weight: rows of whole 8-value units, the
/// GGUF row size, every byte present, and a 16-byte aligned base (the
/// per-type loads in quant.cuh rely on it).
fn check_layout(gpu: &Gpu, w: &CudaWeight) -> Result<()> {
    let bad = |reason: String| ModelError::BadTensor {
        name: w.name.clone(),
        reason,
    };
    if !w.cols.is_multiple_of(8) || !w.cols.is_multiple_of(w.ty.block_elems()) {
        return Err(bad(format!(
            "row length {} is not a multiple of 8 (the CUDA kernels' unit) and of the {} block",
            w.cols, w.ty
        )));
    }
    if w.row_bytes != w.cols / w.ty.block_elems() * w.ty.block_bytes() {
        return Err(bad(format!(
            "row size {} bytes does not match {} {} values",
            w.row_bytes, w.cols, w.ty
        )));
    }
    if w.rows
        .checked_mul(w.row_bytes)
        .is_none_or(|n| n > w.data.len())
    {
        return Err(bad(format!(
            "{} bytes on the device for {} rows of {} bytes",
            w.data.len(),
            w.rows,
            w.row_bytes
        )));
    }
    let (ptr, _sync) = w.data.device_ptr(&gpu.stream);
    if ptr % 16 != 0 {
        return Err(bad(format!(
            "device address {ptr:#x} is not 16-byte aligned"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every type's instantiations compile for compute_90 (PTX: no GPU
    /// needed), so a kernel compile error shows up on any machine with
    /// NVRTC (`LD_LIBRARY_PATH=/opt/nvrtc/nvidia/cu13/lib` here).
    #[test]
    fn every_type_compiles_for_compute_90() {
        if !crate::gpu::nvrtc_present() {
            println!("skipped: no NVRTC (libnvrtc.so not found)");
            return;
        }
        for (ty, suffix, src) in &SOURCES {
            let ptx =
                crate::gpu::compile(src, "compute_90").unwrap_or_else(|e| panic!("{ty}: {e}"));
            let ptx = String::from_utf8_lossy(&ptx);
            for (nt, r) in MATVEC_SHAPES {
                let name = format!("matvec_{suffix}_t{nt}r{r}");
                assert!(ptx.contains(&format!(".entry {name}(")), "{ty}: no {name}");
            }
            let streamed = STREAM_R.iter().flat_map(|r| {
                ["stream_matvec", "stream_argmax"].map(|op| format!("{op}_{suffix}_r{r}"))
            });
            let heads = STREAM_HEAD_TOKENS
                .iter()
                .map(|t| format!("stream_argmax_{suffix}_t{t}"));
            let mma = MMA_SHAPES
                .iter()
                .map(|(shape, ..)| format!("mma_gemm_{suffix}_{shape}"));
            for name in streamed.chain(heads).chain(mma) {
                assert!(ptx.contains(&format!(".entry {name}(")), "{ty}: no {name}");
            }
            for nt in GEMM_TOKENS {
                for op in ["gemm", "argmax_tiles"] {
                    let name = format!("{op}_{suffix}_t{nt}");
                    assert!(ptx.contains(&format!(".entry {name}(")), "{ty}: no {name}");
                }
            }
            for op in [
                "dequant_rows",
                "embed",
                "argmax_rows",
                "argmax_finish",
                "gemm_split_sum",
            ] {
                assert!(
                    ptx.contains(&format!(".entry {op}_{suffix}(")),
                    "{ty}: no {op}"
                );
            }
        }
    }

    #[test]
    fn sources_cover_the_uploadable_types() {
        for ty in crate::weight::SUPPORTED {
            assert!(SOURCES.iter().any(|(t, ..)| *t == ty), "{ty}");
        }
    }
}
