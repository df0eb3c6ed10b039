//! A step's inputs on the device: token ids, positions, each sequence's
//! cached length and each sequence's cache of each layer (a table of
//! device addresses), written by one small host→device copy per step, and
//! the ids the greedy head writes, read back as 4 bytes a row.

use cudarc::driver::{CudaSlice, CudaView};
use kiln_model::{ModelError, Result, StepInput};

use crate::gpu::Gpu;

/// `u32` words of one KV table entry (`struct KvEntry` in attention.cu):
/// K address, V address (two words each), rows, padding.
const ENTRY_WORDS: usize = 6;

/// One sequence's cache of one layer, as [`CudaStep::bind`] records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KvEntry {
    pub k: u64,
    pub v: u64,
    pub rows: u32,
}

/// See the module doc. For a step of `rows` rows, `inputs` holds
/// `[tokens; rows] [positions; rows] [p0; rows] [row's sequence; rows]
/// [sequence's p0 + n_rows; rows] [sequence's first row; rows]
/// [sampler state address of head row j; rows, two words each]`, then the KV
/// table, `[layer][sequence; rows]` entries of [`ENTRY_WORDS`] (zero: no
/// cache). Every region's address depends only on the row count (one
/// graph key), so a captured graph replays with the next step's values,
/// whichever caches its sequences use.
pub struct CudaStep {
    pub(crate) inputs: CudaSlice<u32>,
    pub(crate) ids: CudaSlice<u32>,
    /// The loaded step, host side (shapes, and checks on the host).
    pub(crate) host: StepInput,
    pub(crate) max_rows: usize,
    /// Host staging of `inputs` (reused): after a load, what the device
    /// holds.
    staging: Vec<u32>,
    /// Caches bound for the next load: (layer, sequence, entry).
    bound: Vec<(usize, usize, KvEntry)>,
    /// Sampler states bound for the next load: (head row, address).
    samplers: Vec<(usize, u64)>,
    /// Layers in the loaded step's KV table.
    layers: usize,
}

/// Word offset of the KV table in a step of `rows` rows.
fn table_offset(rows: usize) -> usize {
    8 * rows
}

impl CudaStep {
    pub(crate) fn new(gpu: &Gpu, max_rows: usize) -> Result<CudaStep> {
        Ok(CudaStep {
            inputs: gpu.alloc(table_offset(max_rows.max(1)), "step inputs")?,
            ids: gpu.alloc(max_rows.max(1), "step ids")?,
            host: StepInput::default(),
            max_rows,
            staging: Vec::with_capacity(table_offset(max_rows)),
            bound: Vec::new(),
            samplers: Vec::new(),
            layers: 0,
        })
    }

    /// Records sequence `seq`'s cache of `layer` for the next load.
    pub(crate) fn bind(&mut self, seq: usize, layer: usize, entry: KvEntry) {
        self.bound.push((layer, seq, entry));
    }

    /// Records head row `j`'s sampler state (its address) for the next load.
    pub(crate) fn bind_sampler(&mut self, j: usize, addr: u64) {
        self.samplers.push((j, addr));
    }

    /// Copies `input` and the bound caches and samplers to the device
    /// (checks that they fit); the bindings are consumed either way.
    pub(crate) fn load(&mut self, gpu: &Gpu, input: &StepInput) -> Result<()> {
        let mut bound = std::mem::take(&mut self.bound);
        let r = self.stage(input, &bound);
        bound.clear();
        self.bound = bound;
        let r = r.and_then(|()| self.stage_samplers(input.rows()));
        self.samplers.clear();
        r?;
        let need = self.staging.len();
        if need > self.inputs.len() {
            // Once per scratch (the first step with caches bound): room
            // for the table at the most rows.
            let layers_max =
                table_offset(self.max_rows) + self.layers * self.max_rows * ENTRY_WORDS;
            self.inputs = gpu.alloc(layers_max.max(need), "step inputs")?;
            // Graphs captured with the old buffer are dropped.
            gpu.workspace_reallocated();
        }
        gpu.upload(&self.staging, &mut self.inputs, "step inputs")?;
        self.host.clone_from(input);
        Ok(())
    }

    /// Fills `staging` with the layout the type doc gives.
    fn stage(&mut self, input: &StepInput, bound: &[(usize, usize, KvEntry)]) -> Result<()> {
        let rows = input.rows();
        let n_seqs = input.seqs.len();
        if rows > self.max_rows || n_seqs > rows {
            return Err(ModelError::Backend(format!(
                "step of {rows} rows and {n_seqs} sequences exceeds the step buffer's {} rows",
                self.max_rows
            )));
        }
        if input.positions.len() != rows {
            return Err(ModelError::Backend(format!(
                "step of {rows} tokens has {} positions",
                input.positions.len()
            )));
        }
        let word = |what: &str, v: usize| {
            u32::try_from(v)
                .map_err(|_| ModelError::Backend(format!("{what} {v} exceeds the device's u32")))
        };
        let st = &mut self.staging;
        st.clear();
        st.extend_from_slice(&input.tokens);
        st.extend_from_slice(&input.positions);
        for s in &input.seqs {
            st.push(word("position", s.p0)?);
        }
        st.resize(3 * rows, 0);
        for (i, s) in input.seqs.iter().enumerate() {
            if s.row0 != st.len() - 3 * rows || s.row0 + s.n_rows > rows {
                return Err(ModelError::Backend(format!(
                    "step sequence {i}: rows {}..{} are not laid end to end",
                    s.row0,
                    s.row0 + s.n_rows
                )));
            }
            st.extend(std::iter::repeat_n(i as u32, s.n_rows));
        }
        st.resize(4 * rows, 0);
        for s in &input.seqs {
            st.push(word("position", s.p0 + s.n_rows)?);
        }
        st.resize(5 * rows, 0);
        // Rows fit in u32: `rows <= max_rows`, a device buffer's count.
        st.extend(input.seqs.iter().map(|s| s.row0 as u32));
        // The sampler table, filled by `stage_samplers`.
        st.resize(8 * rows, 0);
        self.layers = bound.iter().map(|&(l, ..)| l + 1).max().unwrap_or(0);
        let table = table_offset(rows);
        st.resize(table + self.layers * rows * ENTRY_WORDS, 0);
        for &(layer, seq, e) in bound {
            if seq >= n_seqs {
                return Err(ModelError::Backend(format!(
                    "a cache bound for sequence {seq} of a step of {n_seqs}"
                )));
            }
            let at = table + (layer * rows + seq) * ENTRY_WORDS;
            st[at..at + 5].copy_from_slice(&[
                e.k as u32,
                (e.k >> 32) as u32,
                e.v as u32,
                (e.v >> 32) as u32,
                e.rows,
            ]);
        }
        Ok(())
    }

    /// Writes the bound samplers' addresses into the staged table.
    fn stage_samplers(&mut self, rows: usize) -> Result<()> {
        for &(j, addr) in &self.samplers {
            if j >= rows {
                return Err(ModelError::Backend(format!(
                    "a sampler bound for head row {j} of a step of {rows} rows"
                )));
            }
            let at = 6 * rows + 2 * j;
            self.staging[at] = addr as u32;
            self.staging[at + 1] = (addr >> 32) as u32;
        }
        Ok(())
    }

    /// Address of the head rows' sampler table (two words a row).
    pub(crate) fn sampler_table_ptr(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(&self.inputs, 6 * self.host.rows())
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

    /// Address of each row's sequence index.
    pub(crate) fn row_seq_ptr(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(&self.inputs, 3 * self.host.rows())
    }

    /// Address of each sequence's end (`p0 + n_rows`).
    pub(crate) fn seq_end_ptr(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(&self.inputs, 4 * self.host.rows())
    }

    /// Address of each sequence's first row.
    pub(crate) fn seq_row0_ptr(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(&self.inputs, 5 * self.host.rows())
    }

    /// Address of `layer`'s KV table (an entry per sequence), or an error
    /// when the loaded step bound no cache of it.
    pub(crate) fn kv_table_ptr(&self, gpu: &Gpu, layer: usize) -> Result<u64> {
        if layer >= self.layers {
            return Err(ModelError::Backend(format!(
                "layer {layer}: the step bound no caches of it (Backend::bind_kv)"
            )));
        }
        let rows = self.host.rows();
        Ok(gpu.ptr(
            &self.inputs,
            table_offset(rows) + layer * rows * ENTRY_WORDS,
        ))
    }

    /// The loaded entry of sequence `seq`'s cache of `layer` (None: none
    /// bound).
    pub(crate) fn kv_entry(&self, layer: usize, seq: usize) -> Option<KvEntry> {
        let rows = self.host.rows();
        if layer >= self.layers || seq >= rows {
            return None;
        }
        let at = table_offset(rows) + (layer * rows + seq) * ENTRY_WORDS;
        let w = &self.staging[at..at + 5];
        let e = KvEntry {
            k: u64::from(w[0]) | u64::from(w[1]) << 32,
            v: u64::from(w[2]) | u64::from(w[3]) << 32,
            rows: w[4],
        };
        (e.k != 0).then_some(e)
    }
}
