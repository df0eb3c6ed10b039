//! A step's inputs on the device: token ids, positions and each sequence's
//! cached length, written by one small host→device copy per step, and the
//! ids the greedy head writes, read back as 4 bytes a row.

use cudarc::driver::{CudaSlice, CudaView};
use kiln_model::{ModelError, Result, StepInput};

use crate::gpu::Gpu;

/// See the module doc. `inputs` holds `[tokens; rows] [positions; rows]
/// [p0; seqs]` of the loaded step: for a fixed row count (one graph key)
/// every region sits at the same address, so a captured graph replays
/// with the next step's values.
pub struct CudaStep {
    pub(crate) inputs: CudaSlice<u32>,
    pub(crate) ids: CudaSlice<u32>,
    /// The loaded step, host side (shapes, and checks on the host).
    pub(crate) host: StepInput,
    pub(crate) max_rows: usize,
    /// Host staging of `inputs` (reused).
    staging: Vec<u32>,
}

impl CudaStep {
    pub(crate) fn new(gpu: &Gpu, max_rows: usize) -> Result<CudaStep> {
        Ok(CudaStep {
            inputs: gpu.alloc(3 * max_rows.max(1), "step inputs")?,
            ids: gpu.alloc(max_rows.max(1), "step ids")?,
            host: StepInput::default(),
            max_rows,
            staging: Vec::with_capacity(3 * max_rows),
        })
    }

    /// Copies `input` to the device (checks that it fits).
    pub(crate) fn load(&mut self, gpu: &Gpu, input: &StepInput) -> Result<()> {
        let rows = input.rows();
        if rows > self.max_rows || input.seqs.len() > self.max_rows {
            return Err(ModelError::Backend(format!(
                "step of {rows} rows and {} sequences exceeds the step buffer's {} rows",
                input.seqs.len(),
                self.max_rows
            )));
        }
        if input.positions.len() != rows {
            return Err(ModelError::Backend(format!(
                "step of {rows} tokens has {} positions",
                input.positions.len()
            )));
        }
        self.staging.clear();
        self.staging.extend_from_slice(&input.tokens);
        self.staging.extend_from_slice(&input.positions);
        for s in &input.seqs {
            let p0 = u32::try_from(s.p0).map_err(|_| {
                ModelError::Backend(format!("position {} exceeds the device's u32", s.p0))
            })?;
            self.staging.push(p0);
        }
        gpu.upload(&self.staging, &mut self.inputs, "step inputs")?;
        self.host.clone_from(input);
        Ok(())
    }

    /// Copies the ids of rows `0..out.len()` to the host.
    pub(crate) fn read_ids(&self, gpu: &Gpu, out: &mut [u32]) -> Result<()> {
        gpu.download(&self.ids, 0, out, "greedy ids")
    }

    /// Token id of every row.
    pub(crate) fn tokens(&self) -> CudaView<'_, u32> {
        self.inputs.slice(0..self.host.rows())
    }

    /// Address of the rows' positions.
    pub(crate) fn positions_ptr(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(&self.inputs, self.host.rows())
    }

    /// Address of the sequences' cached lengths (`p0`).
    pub(crate) fn seq_p0_ptr(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(&self.inputs, 2 * self.host.rows())
    }
}
