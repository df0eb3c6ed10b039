//! CUDA backend: packed weights and the KV cache live on one NVIDIA GPU;
//! kernels are CUDA C sources compiled by NVRTC for the GPU at hand on
//! first use; a step whose shape repeats is captured once as a CUDA graph
//! and replayed. The CUDA libraries are loaded at run time, so this crate
//! builds and its tests run (skipping) on machines without CUDA.

// Until `impl Backend` (next commit) uses the device plumbing.
#![allow(dead_code)]

mod gpu;
mod matmul;
mod weight;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaView};
use kiln_model::{ModelError, Result, StepInput};

use crate::gpu::Gpu;
pub use crate::weight::CudaWeight;

/// GPUs present: 0 without a driver (never panics).
pub fn device_count() -> usize {
    gpu::count_devices().unwrap_or(0)
}

/// Why there is no usable GPU (no driver, none present, ...); `None` when
/// device 0 exists. For "skipped" lines and `--device auto` messages.
pub fn unavailable_reason() -> Option<String> {
    match gpu::count_devices() {
        Ok(0) => Some("no CUDA device (the driver reports 0)".into()),
        Ok(_) => None,
        Err(e) => Some(backend_message(e)),
    }
}

/// The text of a backend error, without the "backend: " prefix.
fn backend_message(e: ModelError) -> String {
    match e {
        ModelError::Backend(m) => m,
        e => e.to_string(),
    }
}

/// The CUDA backend on one GPU.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.gpu.name())
            .field("ordinal", &self.gpu.ctx.ordinal())
            .finish()
    }
}

impl CudaBackend {
    /// Opens GPU `ordinal`. Errors (never panics) when there is no driver,
    /// no such device, or NVRTC/cuBLAS are missing.
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        let n = gpu::count_devices()?;
        if ordinal >= n {
            return Err(ModelError::Backend(format!(
                "CUDA device {ordinal} not found ({n} present)"
            )));
        }
        Ok(CudaBackend {
            gpu: Arc::new(Gpu::new(ordinal)?),
        })
    }

    /// The GPU's name, e.g. "NVIDIA H200".
    pub fn device_name(&self) -> String {
        self.gpu.name().to_string()
    }

    /// `(free, total)` device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.gpu
            .ctx
            .mem_get_info()
            .map_err(|e| gpu::cuda_err("reading device memory", e))
    }
}

/// A device buffer of f32 activations (`data.len()` values).
pub struct CudaBuf {
    pub(crate) data: CudaSlice<f32>,
}

/// A step's inputs on the device, written by one host→device copy per
/// step ([`kiln_model::Backend::load_step`]), and the ids argmax writes.
///
/// `inputs` holds `[tokens; max_rows] [positions; max_rows] [seq p0;
/// max_rows]`: kernels read them through [`CudaStep::tokens`] etc., so a
/// captured graph replays with new values.
pub struct CudaStep {
    pub(crate) inputs: CudaSlice<u32>,
    pub(crate) ids: CudaSlice<u32>,
    pub(crate) host: StepInput,
    pub(crate) max_rows: usize,
    /// Host staging of `inputs` (reused).
    pub(crate) staging: Vec<u32>,
}

impl CudaStep {
    /// Token id of every row.
    pub(crate) fn tokens(&self) -> CudaView<'_, u32> {
        self.inputs.slice(0..self.max_rows)
    }

    /// Position of every row.
    pub(crate) fn positions(&self) -> CudaView<'_, u32> {
        self.inputs.slice(self.max_rows..2 * self.max_rows)
    }

    /// Cached positions (`p0`) of every sequence.
    pub(crate) fn seq_p0(&self) -> CudaView<'_, u32> {
        self.inputs.slice(2 * self.max_rows..3 * self.max_rows)
    }
}
