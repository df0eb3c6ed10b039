//! CPU backend: weights stay packed (as mapped from the GGUF file) and are
//! dequantized inside `kiln_kernels` (runtime ISA dispatch: this crate is
//! built for baseline x86-64, so hot loops must live there); activations
//! are f32, accumulation f32, split over output rows on a fork/join pool.

mod attention;
mod buf;
mod coarse_head;
mod head;
mod matmul;
mod par;
pub mod profile;
mod qtiles;
mod rope;

use std::sync::Arc;

use kiln_gguf::Gguf;
pub use kiln_kernels::Isa;
use kiln_model::{AttnParams, Backend, ModelError, PastKv, Result, RopeConfig, StepInput};
use kiln_quant::GgmlType;

pub use crate::buf::CpuBuf;
use crate::par::Par;

/// Elements below which an elementwise op is not worth a fork/join.
const PAR_MIN_ELEMS: usize = 1 << 14;

/// A packed matrix bound by tensor name in a mapped GGUF file.
pub struct CpuWeight {
    gguf: Arc<Gguf>,
    name: String,
    ty: GgmlType,
    cols: usize,
    rows: usize,
    row_bytes: usize,
    /// The batch head's packed screen tiles, made on the first batched
    /// greedy head (see `head`).
    screen_tiles: std::sync::OnceLock<Option<kiln_kernels::ScreenTiles>>,
    /// The rows in tiles for the tiled integer GEMV, made on first use
    /// (see `qtiles`).
    qtiles: std::sync::OnceLock<Option<kiln_kernels::QTiles>>,
    /// The head's rows split for the one-row screen, made on the first
    /// greedy step (see `matmul::argmax_screened`).
    coarse: std::sync::OnceLock<Option<kiln_kernels::CoarseRows>>,
}

impl CpuWeight {
    fn data(&self) -> &[u8] {
        // The file is immutable and the name was checked at bind time.
        self.gguf
            .tensor(&self.name)
            .map(|t| t.data)
            .expect("bound tensor present in its file")
    }
}

/// A step's inputs in host memory, and the ids its argmax ops wrote.
#[derive(Debug, Default)]
pub struct CpuStep {
    input: StepInput,
    max_rows: usize,
    ids: Vec<u32>,
    rope: rope::RopeCache,
}

/// Settings of a [`CpuBackend`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuConfig {
    /// Threads running the kernels, the caller included; 0 = one per
    /// available core.
    pub threads: usize,
    /// Kernel instruction set; `None` = [`Isa::detect`] (the best this
    /// CPU runs, lowered by `KILN_ISA`). Clamped to the CPU.
    pub isa: Option<Isa>,
}

#[derive(Clone)]
pub struct CpuBackend {
    par: Arc<Par>,
    isa: Isa,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("threads", &self.par.threads())
            .field("isa", &self.isa)
            .finish()
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        Self::with_config(CpuConfig::default())
    }

    /// `threads` kernel threads (0 = one per core), detected ISA.
    pub fn with_threads(threads: usize) -> Self {
        Self::with_config(CpuConfig {
            threads,
            ..CpuConfig::default()
        })
    }

    pub fn with_config(cfg: CpuConfig) -> Self {
        let threads = match cfg.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let isa = cfg.isa.map_or_else(Isa::detect, |i| i.min(Isa::cpu_max()));
        CpuBackend {
            par: Arc::new(Par::new(threads)),
            isa,
        }
    }

    pub fn threads(&self) -> usize {
        self.par.threads()
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The LM head into any f32 slice (a device buffer or host memory).
    fn lm_head_into(
        &self,
        w: &CpuWeight,
        h: &[f32],
        n_tok: usize,
        softcap: Option<f32>,
        out: &mut [f32],
    ) -> Result<()> {
        let _p = profile::op(
            || format!("lm_head {} {}x{} n={n_tok}", w.ty, w.rows, w.cols),
            (w.rows * w.row_bytes) as u64,
        );
        check_w("lm_head", &w.name, "input", n_tok * w.cols, h.len())?;
        check_w("lm_head", &w.name, "output", n_tok * w.rows, out.len())?;
        // Softcap fused per task, on outputs still in cache.
        let isa = self.isa;
        let cap = softcap.map(|c| move |y: &mut [f32]| kiln_kernels::softcap(isa, y, c));
        let post = cap.as_ref().map(|f| f as &matmul::Post<'_>);
        matmul::matmul(&self.par, isa, w, 0, w.rows, h, n_tok, out, post)
    }
}

thread_local! {
    /// A row of [`CpuBackend::embed`] rebuilt from a coarse copy, grown
    /// once.
    static EMBED_ROW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn dequant(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    // Lengths and type were validated when the weight was bound.
    kiln_quant::dequantize(ty, src, dst).expect("validated packed row");
}

/// `Σ v²` in f64 over eight partial sums: one chain of dependent f64 adds
/// ran at one add per 4 cycles (47 us per 128 x 640 call on Zen 4, 3% of
/// a prefill).
fn sum_squares(g: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut chunks = g.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v) * f64::from(v);
        }
    }
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum();
    acc.iter().sum::<f64>() + tail
}

pub(crate) fn check(what: &str, need: usize, have: usize) -> Result<()> {
    if need > have {
        return Err(ModelError::Backend(format!(
            "{what}: needs {need} elements, buffer has {have}"
        )));
    }
    Ok(())
}

/// [`check`] for the `part` buffer of `op` on weight `name`; the message is
/// only formatted on failure (this runs on every decode matmul).
fn check_w(op: &str, name: &str, part: &str, need: usize, have: usize) -> Result<()> {
    if need > have {
        return check(&format!("{op} {name} {part}"), need, have);
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Buf = CpuBuf;
    type Weight = CpuWeight;
    type Step = CpuStep;

    fn name(&self) -> &str {
        "cpu"
    }

    fn load_weight(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CpuWeight> {
        let info = gguf
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        if !kiln_quant::is_supported(info.ty) {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!("type {} has no CPU kernel", info.ty),
            });
        }
        if info.dims.is_empty() || info.dims.len() > 3 {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!("shape {:?} is not a 2-D or 3-D matrix", info.dims),
            });
        }
        let cols = info.row_len();
        if cols % info.ty.block_elems() != 0 {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!(
                    "row length {cols} is not a multiple of the {} block size {}",
                    info.ty,
                    info.ty.block_elems()
                ),
            });
        }
        Ok(CpuWeight {
            gguf: gguf.clone(),
            name: name.to_string(),
            ty: info.ty,
            cols,
            rows: info.n_rows(),
            row_bytes: info.row_bytes(),
            screen_tiles: std::sync::OnceLock::new(),
            qtiles: std::sync::OnceLock::new(),
            coarse: std::sync::OnceLock::new(),
        })
    }

    fn weight_shape(&self, w: &CpuWeight) -> (usize, usize) {
        (w.cols, w.rows)
    }

    fn alloc(&self, len: usize) -> Result<CpuBuf> {
        CpuBuf::zeroed(len)
    }

    fn upload(&self, data: &[f32]) -> Result<CpuBuf> {
        CpuBuf::from_slice(data)
    }

    fn buf_len(&self, b: &CpuBuf) -> usize {
        b.len()
    }

    fn download(&self, b: &CpuBuf, offset: usize, out: &mut [f32]) -> Result<()> {
        check("download", offset + out.len(), b.len())?;
        out.copy_from_slice(&b[offset..offset + out.len()]);
        Ok(())
    }

    fn new_step(&self, max_rows: usize) -> Result<CpuStep> {
        Ok(CpuStep {
            input: StepInput::default(),
            max_rows,
            ids: vec![0; max_rows],
            rope: rope::RopeCache::default(),
        })
    }

    fn load_step(&self, input: &StepInput, step: &mut CpuStep) -> Result<()> {
        check("step rows", input.rows(), step.max_rows)?;
        step.input.clone_from(input);
        step.rope.clear();
        Ok(())
    }

    fn read_ids(&self, step: &CpuStep, out: &mut [u32]) -> Result<()> {
        check("read_ids", out.len(), step.ids.len())?;
        out.copy_from_slice(&step.ids[..out.len()]);
        Ok(())
    }

    fn embed(
        &self,
        table: &CpuWeight,
        step: &CpuStep,
        n_tok: usize,
        scale: f32,
        out: &mut CpuBuf,
    ) -> Result<()> {
        let _p = profile::op(|| "embed".into(), 0);
        check("embed ids", n_tok, step.input.tokens.len())?;
        let ids = &step.input.tokens[..n_tok];
        let cols = table.cols;
        check("embed", ids.len() * cols, out.len())?;
        let data = table.data();
        // A tied head's coarse copy, where it exists, is the table's
        // resident copy: its rows are rebuilt from there (the same bytes)
        // rather than faulting the file's rows back in.
        EMBED_ROW.with(|buf| {
            let mut buf = buf.borrow_mut();
            for (t, &id) in ids.iter().enumerate() {
                let r = id as usize;
                if r >= table.rows {
                    return Err(ModelError::Invalid(format!(
                        "token {id} out of range for {} ({} rows)",
                        table.name, table.rows
                    )));
                }
                let row = coarse_head::row(self.isa, table, data, r, &mut buf)?;
                let dst = &mut out[t * cols..(t + 1) * cols];
                dequant(table.ty, row, dst);
                dst.iter_mut().for_each(|v| *v *= scale);
            }
            Ok(())
        })
    }

    fn matmul(
        &self,
        w: &CpuWeight,
        row0: usize,
        n_rows: usize,
        x: &CpuBuf,
        n_tok: usize,
        out: &mut CpuBuf,
    ) -> Result<()> {
        if row0 + n_rows > w.rows {
            return Err(ModelError::Backend(format!(
                "{}: rows {row0}..{} out of {}",
                w.name,
                row0 + n_rows,
                w.rows
            )));
        }
        let _p = profile::op(
            || {
                let kind = if n_tok == 1 { "gemv" } else { "gemm" };
                format!("{kind} {} {}x{}", w.ty, n_rows, w.cols)
            },
            (n_rows * w.row_bytes) as u64,
        );
        check_w("matmul", &w.name, "input", n_tok * w.cols, x.len())?;
        check_w("matmul", &w.name, "output", n_tok * n_rows, out.len())?;
        matmul::matmul(&self.par, self.isa, w, row0, n_rows, x, n_tok, out, None)
    }

    fn rms_norm(
        &self,
        x: &mut CpuBuf,
        n_groups: usize,
        dim: usize,
        w: Option<&CpuBuf>,
        eps: f32,
    ) -> Result<()> {
        let _p = profile::op(|| format!("rms_norm x{dim}"), 0);
        check("rms_norm", n_groups * dim, x.len())?;
        if let Some(w) = w {
            check("rms_norm weight", dim, w.len())?;
        }
        if dim == 0 {
            return Ok(());
        }
        // Whole groups per task, enough of them to be worth a fork (a
        // decode-sized call runs inline).
        let per_task = PAR_MIN_ELEMS.div_ceil(dim) * dim;
        self.par
            .chunks_mut(&mut x[..n_groups * dim], per_task, |_, c| {
                for g in c.chunks_mut(dim) {
                    // Sum of squares in f64: residual rows reach |x| ~ 1e4 on Gemma 3.
                    let ss = sum_squares(g);
                    let inv = (1.0 / (ss / dim as f64 + f64::from(eps)).sqrt()) as f32;
                    match w {
                        Some(w) => g
                            .iter_mut()
                            .zip(w.iter())
                            .for_each(|(v, &s)| *v = *v * inv * s),
                        None => g.iter_mut().for_each(|v| *v *= inv),
                    }
                }
            });
        Ok(())
    }

    fn rope(
        &self,
        x: &mut CpuBuf,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        step: &CpuStep,
        rope: &RopeConfig,
    ) -> Result<()> {
        let _p = profile::op(|| "rope".into(), 0);
        let row = n_heads * head_dim;
        check("rope", n_tok * row, x.len())?;
        check("rope positions", n_tok, step.input.positions.len())?;
        let pos = &step.input.positions[..n_tok];
        rope::rope(
            &self.par,
            &mut x[..n_tok * row],
            head_dim,
            pos,
            rope,
            &step.rope,
        );
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuBuf,
        cur_k: &CpuBuf,
        cur_v: &CpuBuf,
        past: Option<PastKv<'_, Self>>,
        p: &AttnParams,
        _step: &CpuStep,
        out: &mut CpuBuf,
    ) -> Result<()> {
        let _p = profile::op(|| "attention".into(), 0);
        let seq = attention::Seq::checked(q, cur_k, cur_v, past, p, out)?;
        // SAFETY: `out` is borrowed mutably for the call and `checked`
        // found the sequence's rows inside it.
        unsafe { seq.run(&self.par, self.isa, q, cur_k, cur_v, out.as_mut_ptr()) };
        Ok(())
    }

    fn attention_batch<'c>(
        &self,
        _layer: usize,
        q: &CpuBuf,
        cur_k: &CpuBuf,
        cur_v: &CpuBuf,
        pasts: &mut dyn Iterator<Item = Option<PastKv<'c, Self>>>,
        params: &[AttnParams],
        _step: &CpuStep,
        out: &mut CpuBuf,
    ) -> Result<()> {
        let _p = profile::op(|| "attention".into(), 0);
        attention::batch(&self.par, self.isa, q, cur_k, cur_v, pasts, params, out)
    }

    fn gelu_mul(&self, gate: &mut CpuBuf, up: &CpuBuf, n: usize) -> Result<()> {
        let _p = profile::op(|| "gelu_mul".into(), 0);
        check("gelu_mul", n, gate.len().min(up.len()))?;
        let isa = self.isa;
        const CHUNK: usize = PAR_MIN_ELEMS;
        self.par.chunks_mut(&mut gate[..n], CHUNK, |i, g| {
            kiln_kernels::gelu_mul(isa, g, &up[i * CHUNK..][..g.len()]);
        });
        Ok(())
    }

    fn add(&self, x: &mut CpuBuf, y: &CpuBuf, n: usize) -> Result<()> {
        let _p = profile::op(|| "add".into(), 0);
        check("add", n, x.len().min(y.len()))?;
        x[..n].iter_mut().zip(&y[..n]).for_each(|(a, &b)| *a += b);
        Ok(())
    }

    fn scale(&self, x: &mut CpuBuf, s: f32, n: usize) -> Result<()> {
        let _p = profile::op(|| "scale".into(), 0);
        check("scale", n, x.len())?;
        x[..n].iter_mut().for_each(|a| *a *= s);
        Ok(())
    }

    fn copy_strided(
        &self,
        src: &CpuBuf,
        src_off: usize,
        src_stride: usize,
        dst: &mut CpuBuf,
        dst_off: usize,
        dst_stride: usize,
        rows: usize,
        len: usize,
        alpha: f32,
        accumulate: bool,
    ) -> Result<()> {
        let _p = profile::op(|| "copy_strided".into(), 0);
        if rows == 0 || len == 0 {
            return Ok(());
        }
        check(
            "copy src",
            src_off + (rows - 1) * src_stride + len,
            src.len(),
        )?;
        check(
            "copy dst",
            dst_off + (rows - 1) * dst_stride + len,
            dst.len(),
        )?;
        for r in 0..rows {
            let s = &src[src_off + r * src_stride..src_off + r * src_stride + len];
            let d = &mut dst[dst_off + r * dst_stride..dst_off + r * dst_stride + len];
            match (accumulate, alpha == 1.0) {
                (false, true) => d.copy_from_slice(s),
                (false, false) => d.iter_mut().zip(s).for_each(|(a, &b)| *a = alpha * b),
                (true, _) => d.iter_mut().zip(s).for_each(|(a, &b)| *a += alpha * b),
            }
        }
        Ok(())
    }

    fn softcap(&self, x: &mut CpuBuf, c: f32, n: usize) -> Result<()> {
        let _p = profile::op(|| "softcap".into(), 0);
        check("softcap", n, x.len())?;
        let isa = self.isa;
        self.par.chunks_mut(&mut x[..n], PAR_MIN_ELEMS, |_, ch| {
            kiln_kernels::softcap(isa, ch, c);
        });
        Ok(())
    }

    fn lm_head(
        &self,
        w: &CpuWeight,
        h: &CpuBuf,
        n_tok: usize,
        softcap: Option<f32>,
        out: &mut CpuBuf,
    ) -> Result<()> {
        self.lm_head_into(w, h, n_tok, softcap, out)
    }

    /// Host memory is this backend's memory: straight into `out`.
    fn lm_head_to_host(
        &self,
        w: &CpuWeight,
        h: &CpuBuf,
        n_tok: usize,
        softcap: Option<f32>,
        _buf: &mut Option<CpuBuf>,
        out: &mut [f32],
    ) -> Result<()> {
        self.lm_head_into(w, h, n_tok, softcap, out)
    }

    /// Logits of the rows, then the scalar sampler on each (the reference
    /// the device heads are held to).
    fn sample_head(
        &self,
        w: &CpuWeight,
        h: &CpuBuf,
        rows: std::ops::Range<usize>,
        softcap: Option<f32>,
        states: &mut dyn Iterator<Item = Option<&mut CpuBuf>>,
        logits: &mut CpuBuf,
        step: &mut CpuStep,
    ) -> Result<()> {
        check("sample_head", rows.end * w.cols, h.len())?;
        check("sample_head id", rows.end, step.ids.len())?;
        let n = rows.len();
        let v = w.rows;
        let hr = &h[rows.start * w.cols..rows.end * w.cols];
        self.lm_head_into(w, hr, n, softcap, &mut logits[..n * v])?;
        head::sample_ids(&logits[..n * v], v, states, &mut step.ids[rows])
    }

    fn argmax_head(
        &self,
        w: &CpuWeight,
        h: &CpuBuf,
        rows: std::ops::Range<usize>,
        step: &mut CpuStep,
    ) -> Result<()> {
        let _p = profile::op(
            || {
                format!(
                    "argmax_head {} {}x{} n={}",
                    w.ty,
                    w.rows,
                    w.cols,
                    rows.len()
                )
            },
            head::screened_bytes(w, rows.len()) as u64,
        );
        check("argmax_head", rows.end * w.cols, h.len())?;
        check("argmax_head id", rows.end, step.ids.len())?;
        let h = &h[rows.start * w.cols..rows.end * w.cols];
        head::argmax_ids(
            &self.par,
            self.isa,
            w,
            h,
            exact_argmax(),
            &mut step.ids[rows],
        )
    }
}

/// `KILN_EXACT_ARGMAX=1` skips the greedy head's integer screen (read once;
/// the result is the same, this is for timing and triage).
fn exact_argmax() -> bool {
    static EXACT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EXACT.get_or_init(|| std::env::var("KILN_EXACT_ARGMAX").is_ok_and(|v| v.trim() == "1"))
}
