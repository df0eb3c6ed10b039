//! CUDA backend: packed weights and the KV cache live on one NVIDIA GPU;
//! kernels are CUDA C sources compiled by NVRTC for the GPU at hand on
//! first use; a step whose shape repeats is captured once as a CUDA graph
//! and replayed. The CUDA libraries are loaded at run time, so this crate
//! builds and its tests run (skipping) on machines without CUDA.
//!
//! ```no_run
//! use kiln_model::Backend;
//! if kiln_cuda::device_count() > 0 {
//!     let cuda = kiln_cuda::CudaBackend::new(0).expect("GPU 0 opens");
//!     println!("{} on {}", cuda.name(), cuda.device_name());
//! }
//! ```
//!
//! Files: `gpu.rs` (context, stream, NVRTC and its cache), `weight.rs`
//! (packed upload), `step.rs` (per-step device inputs), `graph.rs`
//! (capture/replay), `kv_batch.rs` (a step's attention and K/V stores
//! over all its sequences), `ops.rs` + `kernels/elementwise.cu`, `fused.rs` +
//! `kernels/fused.cu` (one kernel for several ops), `attention.rs` +
//! `kernels/attention.cu`, `matmul.rs` + `kernels/{quant.cuh,matmul.cu}`,
//! `sample.rs` + `kernels/sample.cu` (the sampling head).

mod attention;
mod fused;
mod gpu;
mod graph;
mod kv_batch;
mod matmul;
mod ops;
mod profile;
mod sample;
mod step;
mod weight;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use kiln_gguf::Gguf;
use kiln_model::{
    AttnParams, Backend, GraphKey, HeadsPart, KvBinding, KvStore, ModelError, PastKv, Result,
    RopeConfig, StepInput,
};

use crate::attention::{Attention, AttnBufs};
use crate::fused::{Fused, SplitPart};
use crate::gpu::Gpu;
use crate::graph::Graphs;
use crate::matmul::Matmul;
use crate::ops::{check, Ops};
pub use crate::step::CudaStep;
use crate::step::KvEntry;
pub use crate::weight::CudaWeight;

/// GPUs present: 0 without a driver (never panics).
pub fn device_count() -> usize {
    gpu::count_devices().unwrap_or(0)
}

/// Why there is no usable GPU (no driver, none present, ...); `None` when
/// device 0 exists. For "skipped" lines and `--device auto` messages.
pub fn unavailable_reason() -> Option<String> {
    match gpu::count_devices() {
        Ok(0) => Some("the CUDA driver reports no device".into()),
        Ok(_) => None,
        Err(ModelError::Backend(m)) => Some(m),
        Err(e) => Some(e.to_string()),
    }
}

/// Every kernel translation unit: its name (the module cache's, and
/// `KILN_CUDA_SOURCE_DIR`'s file stem) and its built-in text. For tests
/// and the `dump_kernels` example.
#[doc(hidden)]
pub fn kernel_sources() -> Vec<(&'static str, &'static str)> {
    let mut sources = vec![
        &ops::ELEMENTWISE,
        &fused::FUSED,
        &attention::ATTENTION,
        &sample::SAMPLE,
    ];
    sources.extend(matmul::sources());
    sources.into_iter().map(|s| (s.name, s.text)).collect()
}

/// Compiles every kernel source for `arch` (e.g. `compute_90`) with NVRTC,
/// without a GPU; returns each source's name and image size. For tests.
#[doc(hidden)]
pub fn compile_kernel_sources(arch: &str) -> Result<Vec<(&'static str, usize)>> {
    kernel_sources()
        .into_iter()
        .map(|(name, text)| {
            gpu::compile(&gpu::Source { name, text }, arch).map(|img| (name, img.len()))
        })
        .collect()
}

/// Whether NVRTC can be loaded (the kernels are compiled at run time).
#[doc(hidden)]
pub fn nvrtc_present() -> bool {
    gpu::nvrtc_present()
}

/// Work a backend has enqueued since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaStats {
    /// Kernels launched one by one (not counting those inside graphs).
    pub kernel_launches: u64,
    pub graph_launches: u64,
    pub graph_captures: u64,
    /// Host→device copies (step inputs, uploads).
    pub host_to_device: u64,
    /// Device→host copies (ids, logits, downloads).
    pub device_to_host: u64,
    /// Captured graphs held now.
    pub graphs_held: usize,
    /// Nanoseconds spent in device→host copies, waiting for the device.
    pub download_ns: u64,
}

/// The CUDA backend on one GPU.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    ops: Ops,
    fused: Fused,
    attention: Attention,
    matmul: Matmul,
    sampling: sample::Sampling,
    graphs: Graphs,
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
    /// Opens GPU `ordinal` and compiles (or loads from the cache) its
    /// kernels. Errors, never panics, when there is no driver, no such
    /// device, NVRTC/cuBLAS are missing or a kernel fails to compile.
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        let n = gpu::count_devices()?;
        if ordinal >= n {
            return Err(ModelError::Backend(format!(
                "CUDA device {ordinal} not found ({n} present)"
            )));
        }
        let gpu = Arc::new(Gpu::new(ordinal)?);
        for src in [
            &ops::ELEMENTWISE,
            &fused::FUSED,
            &attention::ATTENTION,
            &sample::SAMPLE,
        ] {
            gpu.prepare(src);
        }
        Ok(CudaBackend {
            ops: Ops::new(&gpu)?,
            fused: Fused::new(&gpu)?,
            attention: Attention::new(&gpu)?,
            matmul: Matmul::new(&gpu)?,
            sampling: sample::Sampling::new(&gpu)?,
            graphs: Graphs::default(),
            gpu,
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

    /// Counts of enqueued work (see [`CudaStats`]).
    pub fn stats(&self) -> CudaStats {
        let c = &self.gpu.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        CudaStats {
            kernel_launches: get(&c.kernel_launches),
            graph_launches: get(&c.graph_launches),
            graph_captures: get(&c.graph_captures),
            host_to_device: get(&c.host_to_device),
            device_to_host: get(&c.device_to_host),
            graphs_held: self.graphs.captured(),
            download_ns: get(&c.download_ns),
        }
    }

    /// Waits for all enqueued work (for timing).
    pub fn synchronize(&self) -> Result<()> {
        self.gpu
            .stream
            .synchronize()
            .map_err(|e| gpu::cuda_err("synchronizing the stream", e))
    }

    /// The step's sequence `seq`, checked against what the host passed.
    fn seq_of(step: &CudaStep, seq: usize, p0: usize) -> Result<()> {
        match step.host.seqs.get(seq) {
            Some(s) if s.p0 == p0 => Ok(()),
            Some(s) => Err(ModelError::Backend(format!(
                "sequence {seq} of the step is at position {}, the op was given {p0}",
                s.p0
            ))),
            None => Err(ModelError::Backend(format!(
                "sequence {seq} is not in the step ({} sequences)",
                step.host.seqs.len()
            ))),
        }
    }
}

/// A device buffer of f32 activations (`data.len()` values).
pub struct CudaBuf {
    pub(crate) data: CudaSlice<f32>,
}

impl Backend for CudaBackend {
    type Buf = CudaBuf;
    type Step = CudaStep;
    type Weight = CudaWeight;

    fn name(&self) -> &str {
        "cuda"
    }

    fn device_memory_free(&self) -> Option<usize> {
        self.memory_info().ok().map(|(free, _)| free)
    }

    fn load_weight(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CudaWeight> {
        let w = weight::upload(&self.gpu, gguf, name)?;
        Matmul::prepare(&self.gpu, w.ty);
        Ok(w)
    }

    fn weight_shape(&self, w: &CudaWeight) -> (usize, usize) {
        (w.cols, w.rows)
    }

    fn alloc(&self, len: usize) -> Result<CudaBuf> {
        Ok(CudaBuf {
            data: self.gpu.alloc(len, "activations")?,
        })
    }

    fn upload(&self, data: &[f32]) -> Result<CudaBuf> {
        let mut b = self.alloc(data.len())?;
        self.gpu.upload(data, &mut b.data, "a vector")?;
        Ok(b)
    }

    fn buf_len(&self, b: &CudaBuf) -> usize {
        b.data.len()
    }

    fn download(&self, b: &CudaBuf, offset: usize, out: &mut [f32]) -> Result<()> {
        self.gpu.download(&b.data, offset, out, "activations")
    }

    fn new_step(&self, max_rows: usize) -> Result<CudaStep> {
        CudaStep::new(&self.gpu, max_rows)
    }

    fn load_step(&self, input: &StepInput, step: &mut CudaStep) -> Result<()> {
        step.load(&self.gpu, input)
    }

    fn read_ids(&self, step: &CudaStep, out: &mut [u32]) -> Result<()> {
        step.read_ids(&self.gpu, out)
    }

    fn embed(
        &self,
        table: &CudaWeight,
        step: &CudaStep,
        n_tok: usize,
        scale: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        check("embed ids", n_tok, step.host.rows())?;
        if let Some(&id) = step.host.tokens[..n_tok]
            .iter()
            .find(|&&id| id as usize >= table.rows)
        {
            return Err(ModelError::Invalid(format!(
                "token {id} out of range for {} ({} rows)",
                table.name, table.rows
            )));
        }
        let tokens = step.tokens();
        self.matmul
            .embed(&self.gpu, table, &tokens, n_tok, scale, &mut out.data)
    }

    fn matmul(
        &self,
        w: &CudaWeight,
        row0: usize,
        n_rows: usize,
        x: &CudaBuf,
        n_tok: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.matmul
            .matmul(&self.gpu, w, row0, n_rows, &x.data, n_tok, &mut out.data)
    }

    fn rms_norm(
        &self,
        x: &mut CudaBuf,
        n_groups: usize,
        dim: usize,
        w: Option<&CudaBuf>,
        eps: f32,
    ) -> Result<()> {
        self.ops.rms_norm(
            &self.gpu,
            &mut x.data,
            n_groups,
            dim,
            w.map(|w| &w.data),
            eps,
        )
    }

    fn rope(
        &self,
        x: &mut CudaBuf,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        step: &CudaStep,
        rope: &RopeConfig,
    ) -> Result<()> {
        check("rope positions", n_tok, step.host.rows())?;
        let positions = step.positions_ptr(&self.gpu);
        self.ops.rope(
            &self.gpu,
            &mut x.data,
            n_tok,
            n_heads,
            head_dim,
            positions,
            rope,
        )
    }

    fn attention(
        &self,
        q: &CudaBuf,
        cur_k: &CudaBuf,
        cur_v: &CudaBuf,
        past: Option<PastKv<'_, Self>>,
        p: &AttnParams,
        step: &CudaStep,
        out: &mut CudaBuf,
    ) -> Result<()> {
        Self::seq_of(step, p.seq, p.p0)?;
        let past = match past {
            // The kernels find the oldest cached position from p0 and the
            // ring's rows, as the cache lays them out.
            Some(pk) if pk.start != p.p0.saturating_sub(pk.rows) => {
                return Err(ModelError::Backend(format!(
                    "attention: cache of {} rows starting at {} cannot hold positions before {}",
                    pk.rows, pk.start, p.p0
                )))
            }
            Some(pk) => Some((&pk.k.data, &pk.v.data, pk.rows)),
            None => None,
        };
        let bufs = AttnBufs {
            q: &q.data,
            cur_k: &cur_k.data,
            cur_v: &cur_v.data,
            past,
            out: &mut out.data,
            seq_p0: step.seq_p0_ptr(&self.gpu),
        };
        self.attention.run(&self.gpu, bufs, p)
    }

    fn bind_kv(
        &self,
        step: &mut CudaStep,
        seq: usize,
        layer: usize,
        kv: Option<KvBinding<'_, Self>>,
    ) -> Result<()> {
        if let Some(kv) = kv {
            let entry = KvEntry {
                k: self.gpu.ptr(&kv.k.data, 0),
                v: self.gpu.ptr(&kv.v.data, 0),
                rows: ops::to_u32("KV cache rows", kv.rows)?,
            };
            step.bind(seq, layer, entry);
        }
        Ok(())
    }

    fn replays_steps(&self) -> bool {
        true
    }

    fn attention_batch<'c>(
        &self,
        layer: usize,
        q: &CudaBuf,
        cur_k: &CudaBuf,
        cur_v: &CudaBuf,
        pasts: &mut dyn Iterator<Item = Option<PastKv<'c, Self>>>,
        params: &[AttnParams],
        step: &CudaStep,
        out: &mut CudaBuf,
    ) -> Result<()> {
        kv_batch::attention(self, layer, q, cur_k, cur_v, pasts, params, step, out)
    }

    fn store_kv_batch<'c>(
        &self,
        layer: usize,
        k: &CudaBuf,
        v: &CudaBuf,
        stores: &mut dyn Iterator<Item = Result<KvStore<'c, Self>>>,
        step: &CudaStep,
    ) -> Result<()> {
        kv_batch::store(self, layer, k, v, stores, step)
    }

    fn concat_rows(&self, parts: &[&CudaWeight]) -> Result<Option<CudaWeight>> {
        weight::concat(&self.gpu, parts)
    }

    fn add_rms_norm(
        &self,
        y: &mut CudaBuf,
        post: &CudaBuf,
        x: &mut CudaBuf,
        x_row0: usize,
        n: usize,
        d: usize,
        pre: Option<&CudaBuf>,
        eps: f32,
    ) -> Result<()> {
        self.fused.add_rms_norm(
            &self.gpu,
            &mut y.data,
            &post.data,
            &mut x.data,
            x_row0,
            n,
            d,
            pre.map(|w| &w.data),
            eps,
        )
    }

    fn split_heads(
        &self,
        src: &CudaBuf,
        n_tok: usize,
        head_dim: usize,
        parts: &mut [HeadsPart<'_, Self>],
        rope: &RopeConfig,
        eps: f32,
        step: &CudaStep,
    ) -> Result<()> {
        check("split_heads positions", n_tok, step.host.rows())?;
        let roped = parts.iter().any(|p| p.rope) && rope.n_rot >= 2;
        let table = if roped {
            self.ops.rope_table(&self.gpu, rope)?
        } else {
            0
        };
        let half = if roped { rope.n_rot / 2 } else { 0 };
        let rope_args = (step.positions_ptr(&self.gpu), table, half);
        let mut split: Vec<SplitPart<'_>> = parts
            .iter_mut()
            .map(|p| SplitPart {
                dst: &mut p.dst.data,
                heads: p.heads,
                norm: p.norm.map(|w| &w.data),
                rope: p.rope,
            })
            .collect();
        self.fused.split_heads(
            &self.gpu, &src.data, n_tok, head_dim, &mut split, rope_args, eps,
        )
    }

    fn gelu_mul_halves(
        &self,
        gu: &CudaBuf,
        n_tok: usize,
        ff: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.fused
            .gelu_mul_halves(&self.gpu, &gu.data, n_tok, ff, &mut out.data)
    }

    fn gelu_mul(&self, gate: &mut CudaBuf, up: &CudaBuf, n: usize) -> Result<()> {
        self.ops.gelu_mul(&self.gpu, &mut gate.data, &up.data, n)
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf, n: usize) -> Result<()> {
        self.ops.add(&self.gpu, &mut x.data, &y.data, n)
    }

    fn scale(&self, x: &mut CudaBuf, s: f32, n: usize) -> Result<()> {
        self.ops.scale(&self.gpu, &mut x.data, s, n)
    }

    fn copy_strided(
        &self,
        src: &CudaBuf,
        src_off: usize,
        src_stride: usize,
        dst: &mut CudaBuf,
        dst_off: usize,
        dst_stride: usize,
        rows: usize,
        len: usize,
        alpha: f32,
        accumulate: bool,
    ) -> Result<()> {
        self.ops.copy_strided(
            &self.gpu,
            &src.data,
            src_off,
            src_stride,
            &mut dst.data,
            dst_off,
            dst_stride,
            rows,
            len,
            alpha,
            accumulate,
        )
    }

    fn softcap(&self, x: &mut CudaBuf, c: f32, n: usize) -> Result<()> {
        self.ops.softcap(&self.gpu, &mut x.data, c, n)
    }

    fn argmax_head(
        &self,
        w: &CudaWeight,
        h: &CudaBuf,
        rows: std::ops::Range<usize>,
        step: &mut CudaStep,
    ) -> Result<()> {
        check("argmax_head ids", rows.end, step.max_rows)?;
        let n = rows.end.saturating_sub(rows.start);
        // One row: the GEMV-shaped kernel; several: the tiled one, which
        // reads each head row once for all of them.
        self.matmul.argmax(
            &self.gpu,
            w,
            &h.data,
            rows.start,
            n,
            &mut step.ids,
            rows.start,
        )
    }

    fn bind_sampler(&self, step: &mut CudaStep, j: usize, state: Option<&CudaBuf>) -> Result<()> {
        if let Some(st) = state {
            step.bind_sampler(j, self.gpu.ptr(&st.data, 0));
        }
        Ok(())
    }

    fn sample_head(
        &self,
        w: &CudaWeight,
        h: &CudaBuf,
        rows: std::ops::Range<usize>,
        softcap: Option<f32>,
        _states: &mut dyn Iterator<Item = Option<&mut CudaBuf>>,
        logits: &mut CudaBuf,
        step: &mut CudaStep,
    ) -> Result<()> {
        sample::head(self, w, h, rows, softcap, logits, step)
    }

    fn run_step(&self, key: Option<GraphKey>, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.graphs.run(&self.gpu, key, f)
    }
}
