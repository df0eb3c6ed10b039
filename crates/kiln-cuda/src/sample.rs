//! The sampling head (`kernels/sample.cu`): the head rows' logits into a
//! device buffer, then one CTA per row samples it with the sampler state
//! the step's table names (`kiln_model::sample`), writing only ids (and
//! the state's output words) — no logits cross to the host.

use std::sync::Mutex;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use kiln_model::{Backend, ModelError, Result};

use crate::gpu::{Gpu, Source};
use crate::ops::{check, launch, to_u32};
use crate::{CudaBackend, CudaBuf, CudaStep, CudaWeight};

pub(crate) const SAMPLE: Source = Source {
    name: "sample",
    text: concat!(
        include_str!("../kernels/common.cuh"),
        include_str!("../kernels/sample.cu")
    ),
};

/// Threads of `sample_rows` (`SAMPLE_THREADS`).
const THREADS: u32 = 1024;

pub(crate) struct Sampling {
    rows: CudaFunction,
    /// The head rows of `h` when they do not start at row 0 (a step that
    /// also returns logits): the LM head reads its input from row 0.
    h_rows: Mutex<Option<CudaSlice<f32>>>,
}

impl Sampling {
    pub(crate) fn new(gpu: &Gpu) -> Result<Sampling> {
        Ok(Sampling {
            rows: gpu.function(&SAMPLE, "sample_rows")?,
            h_rows: Mutex::new(None),
        })
    }
}

/// [`kiln_model::Backend::sample_head`] on the GPU: the states are found
/// through the step's sampler table, so a captured graph replays with
/// whichever sequences the next step binds.
pub(crate) fn head(
    be: &CudaBackend,
    w: &CudaWeight,
    h: &CudaBuf,
    rows: std::ops::Range<usize>,
    softcap: Option<f32>,
    logits: &mut CudaBuf,
    step: &mut CudaStep,
) -> Result<()> {
    let gpu = &be.gpu;
    let n = rows.len();
    let (cols, v) = (w.cols, w.rows);
    check("sample_head ids", rows.end, step.max_rows)?;
    check("sample_head table", n, step.host.rows())?;
    check("sample_head input", rows.end * cols, h.data.len())?;
    check("sample_head logits", n * v, logits.data.len())?;
    if n == 0 {
        return Ok(());
    }
    if rows.start == 0 {
        be.lm_head(w, h, n, softcap, logits)?;
    } else {
        let mut guard = be.sampling.h_rows.lock().unwrap_or_else(|e| e.into_inner());
        if guard.as_ref().is_none_or(|b| b.len() < n * cols) {
            *guard = Some(gpu.alloc::<f32>(n * cols, "sample_head rows")?);
            gpu.workspace_reallocated();
        }
        let Some(staged) = guard.as_mut() else {
            return Err(ModelError::Backend("sample_head rows unallocated".into()));
        };
        let (off, len) = (rows.start * cols, n * cols);
        be.ops
            .copy_strided(gpu, &h.data, off, 0, staged, 0, 0, 1, len, 1.0, false)?;
        let (_, weight_rows) = be.weight_shape(w);
        be.matmul
            .matmul(gpu, w, 0, weight_rows, staged, n, &mut logits.data)?;
        if let Some(c) = softcap {
            be.ops.softcap(gpu, &mut logits.data, c, n * v)?;
        }
    }
    let cfg = LaunchConfig {
        grid_dim: (to_u32("sample_head rows", n)?, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // sample_rows reads and rewrites rows 0..n of `logits` (n * v values,
    // checked), n table entries of the loaded step (checked), the states
    // they name (the model binds live buffers of state_words) and writes
    // ids[rows] (checked against max_rows).
    launch!(gpu, &be.sampling.rows, cfg, "sample_rows";
        gpu.ptr(&logits.data, 0), to_u32("vocabulary", v)?, step.sampler_table_ptr(gpu),
        gpu.ptr(&step.ids, 0), to_u32("head row", rows.start)?)
}
