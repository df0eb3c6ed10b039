//! The device interface the forward pass is written against: a small set of
//! fused ops on device buffers (`Buf`, f32 activations) and packed weights.

use std::sync::Arc;

use kiln_gguf::Gguf;

use crate::config::RopeConfig;
use crate::error::Result;
pub use crate::step_input::{GraphKey, SeqSpan, StepInput};

/// Shape and masking of one attention call: the query rows
/// `row0..row0 + n_tok` of one sequence.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    /// Query rows in this call; query `t` is at position `p0 + t`.
    pub n_tok: usize,
    pub p0: usize,
    /// First row of this sequence in `q`, the current K/V and `out`.
    pub row0: usize,
    /// Index of the sequence in the step (device backends read `p0` from
    /// the step through it, so it need not be baked into a graph).
    pub seq: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Score multiplier.
    pub scale: f32,
    /// `s = c * tanh(s / c)` after scaling.
    pub softcap: Option<f32>,
    /// A query at `p` sees keys at `p - window + 1 ..= p`; None = all.
    pub window: Option<usize>,
}

/// Keys/values of positions before `p0`, held in a cache: position `pos`
/// (for `start <= pos < p0`) lives in row `pos % rows`.
pub struct PastKv<'a, B: ?Sized + Backend> {
    pub k: &'a B::Buf,
    pub v: &'a B::Buf,
    pub start: usize,
    pub rows: usize,
}

// Manual: a derive would ask `B: Clone`.
impl<B: ?Sized + Backend> Clone for PastKv<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: ?Sized + Backend> Copy for PastKv<'_, B> {}

/// One sequence's cache of one layer, as a step binds it
/// ([`Backend::bind_kv`]): its K and V buffers of `rows` rows.
pub struct KvBinding<'a, B: ?Sized + Backend> {
    pub k: &'a B::Buf,
    pub v: &'a B::Buf,
    pub rows: usize,
}

/// One sequence's part of a [`Backend::store_kv_batch`]: rows `src_row0..
/// src_row0 + n` of the step's K/V, its positions `p0..p0 + n`, into `dst`.
pub struct KvStore<'a, B: ?Sized + Backend> {
    pub dst: KvDst<'a, B>,
    pub src_row0: usize,
    pub n: usize,
    pub p0: usize,
    /// Index of the sequence in the step.
    pub seq: usize,
}

/// Device ops. Buffers hold row-major f32 `[rows, width]` data; every op
/// says which prefix of a buffer it touches, so scratch buffers may be
/// larger than the current batch.
pub trait Backend: Send + Sync {
    type Buf: Send + Sync;
    /// The backend's copy of a [`StepInput`] (host memory on the CPU,
    /// device memory on a GPU), plus the ids an argmax writes.
    type Step: Send + Sync;
    /// A packed 2-D or 3-D weight (3-D tensors are viewed as one matrix of
    /// `dims[1] * dims[2]` rows).
    type Weight: Send + Sync;

    fn name(&self) -> &str;

    /// Binds the tensor `name` as a matrix, keeping its packed type.
    fn load_weight(&self, gguf: &Arc<Gguf>, name: &str) -> Result<Self::Weight>;
    /// `(row_len, n_rows)` of a weight.
    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize);

    fn alloc(&self, len: usize) -> Result<Self::Buf>;
    fn upload(&self, data: &[f32]) -> Result<Self::Buf>;
    fn buf_len(&self, b: &Self::Buf) -> usize;
    /// Copies `out.len()` values starting at `offset` to the host.
    fn download(&self, b: &Self::Buf, offset: usize, out: &mut [f32]) -> Result<()>;

    /// A step buffer for up to `max_rows` rows.
    fn new_step(&self, max_rows: usize) -> Result<Self::Step>;
    /// Copies `input` into `step` (checks that ids and rows fit).
    fn load_step(&self, input: &StepInput, step: &mut Self::Step) -> Result<()>;
    /// Copies the ids the argmax ops wrote to rows `0..out.len()`.
    fn read_ids(&self, step: &Self::Step, out: &mut [u32]) -> Result<()>;

    /// `out[t] = table[step.tokens[t]] * scale` for `t < n_tok`
    /// (dequantizes only those rows).
    fn embed(
        &self,
        table: &Self::Weight,
        step: &Self::Step,
        n_tok: usize,
        scale: f32,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// `out[t, r] = Σ_c x[t, c] · W[row0 + r, c]` for `t < n_tok`, `r < n_rows`.
    fn matmul(
        &self,
        w: &Self::Weight,
        row0: usize,
        n_rows: usize,
        x: &Self::Buf,
        n_tok: usize,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// In place over `n_groups` contiguous groups of `dim`:
    /// `x = x / sqrt(mean(x²) + eps) * w` (no weight: `* 1`).
    fn rms_norm(
        &self,
        x: &mut Self::Buf,
        n_groups: usize,
        dim: usize,
        w: Option<&Self::Buf>,
        eps: f32,
    ) -> Result<()>;
    /// NEOX RoPE in place on `[n_tok, n_heads, head_dim]`, row `t` at
    /// position `step.positions[t]`.
    fn rope(
        &self,
        x: &mut Self::Buf,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        step: &Self::Step,
        rope: &RopeConfig,
    ) -> Result<()>;
    /// Causal attention of one sequence: its queries (rows `row0..row0 +
    /// n_tok` of `q [rows, n_head*hd]`) over `past` (positions before
    /// `p0`) and its rows of `cur_k/cur_v [rows, n_kv*hd]` (positions
    /// `p0..p0+n_tok`), into the same rows of `out [rows, n_head*hd]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buf,
        cur_k: &Self::Buf,
        cur_v: &Self::Buf,
        past: Option<PastKv<'_, Self>>,
        p: &AttnParams,
        step: &Self::Step,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// Attention of every sequence of a step in one call: sequence `i`
    /// with `params[i]` over the `i`-th of `pasts` (its cache of `layer`,
    /// the layer whose K/V it reads; an iterator, so a step allocates
    /// nothing). The default runs [`Backend::attention`] per sequence; a
    /// device backend may run all of them at once, reading each
    /// sequence's cache from what [`Backend::bind_kv`] recorded.
    #[allow(clippy::too_many_arguments)]
    fn attention_batch<'c>(
        &self,
        layer: usize,
        q: &Self::Buf,
        cur_k: &Self::Buf,
        cur_v: &Self::Buf,
        pasts: &mut dyn Iterator<Item = Option<PastKv<'c, Self>>>,
        params: &[AttnParams],
        step: &Self::Step,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let _ = layer;
        let mut n = 0;
        for (past, p) in pasts.zip(params) {
            self.attention(q, cur_k, cur_v, past, p, step, out)?;
            n += 1;
        }
        if n != params.len() {
            return Err(crate::ModelError::Backend(format!(
                "attention of {} sequences given {n} caches",
                params.len()
            )));
        }
        Ok(())
    }
    /// Records, before [`Backend::load_step`], that sequence `seq` of the
    /// step keeps layer `layer`'s K/V in `kv` (None: no cache, e.g. a
    /// padding row's sequence). A backend that replays steps as graphs
    /// keeps these in the step's inputs, so a graph does not depend on
    /// which caches are in the batch. The default records nothing (the
    /// ops get the buffers as arguments).
    fn bind_kv(
        &self,
        _step: &mut Self::Step,
        _seq: usize,
        _layer: usize,
        _kv: Option<KvBinding<'_, Self>>,
    ) -> Result<()> {
        Ok(())
    }
    /// Whether the backend replays decode steps as graphs: the model then
    /// pads an all-decode step to a power-of-two row count (rows of no
    /// sequence's cache), so a few graphs serve every batch size. The CPU
    /// keeps exact batches.
    fn replays_steps(&self) -> bool {
        false
    }
    /// [`Backend::store_kv`] of every sequence of a step for `layer` (an
    /// iterator, so a step allocates nothing; an item's error ends the
    /// call). The default stores them one by one; a device backend may
    /// store all in one launch from the caches [`Backend::bind_kv`]
    /// recorded.
    fn store_kv_batch<'c>(
        &self,
        layer: usize,
        k: &Self::Buf,
        v: &Self::Buf,
        stores: &mut dyn Iterator<Item = Result<KvStore<'c, Self>>>,
        step: &Self::Step,
    ) -> Result<()> {
        let _ = layer;
        for st in stores {
            let st = st?;
            self.store_kv(k, v, st.src_row0, st.dst, st.n, st.p0, st.seq, step)?;
        }
        Ok(())
    }
    /// Stores rows `src_row0..src_row0 + n` of `k`/`v` (a sequence's
    /// positions `p0..p0 + n`) in its cache: position `pos` in row `pos %
    /// rows` of a ring, row `pos` otherwise. A ring keeps only the last
    /// `rows` of the batch. The default copies with [`Backend::copy_strided`]
    /// from the host `p0`; a device backend may read it from the step.
    #[allow(clippy::too_many_arguments)]
    fn store_kv(
        &self,
        k: &Self::Buf,
        v: &Self::Buf,
        src_row0: usize,
        dst: KvDst<'_, Self>,
        n: usize,
        p0: usize,
        _seq: usize,
        _step: &Self::Step,
    ) -> Result<()> {
        let first = if dst.ring {
            n.saturating_sub(dst.rows)
        } else {
            0
        };
        let mut t = first;
        while t < n {
            let slot = if dst.ring {
                (p0 + t) % dst.rows
            } else {
                p0 + t
            };
            // Contiguous run until the ring wraps.
            let run = if dst.ring {
                (n - t).min(dst.rows - slot)
            } else {
                n - t
            };
            let (off_s, off_d) = ((src_row0 + t) * dst.row_len, slot * dst.row_len);
            let len = run * dst.row_len;
            self.copy_strided(k, off_s, 0, dst.k, off_d, 0, 1, len, 1.0, false)?;
            self.copy_strided(v, off_s, 0, dst.v, off_d, 0, 1, len, 1.0, false)?;
            t += run;
        }
        Ok(())
    }
    /// One matrix holding the rows of `parts` in order, when the backend
    /// gains by it (one launch instead of several) and can (same type and
    /// row length): the model then runs one matmul over the whole and
    /// splits its output ([`Backend::split_heads`],
    /// [`Backend::gelu_mul_halves`]). `None`: keep the parts.
    fn concat_rows(&self, _parts: &[&Self::Weight]) -> Result<Option<Self::Weight>> {
        Ok(None)
    }
    /// Gemma's sandwich norms around a residual add, over `n` rows of `d`:
    /// `y = rms_norm(y)·post`, `x[x_row0 + t] += y[t]`, then with `pre`
    /// `y = rms_norm(x[x_row0 + t])·pre` (the next sublayer's input);
    /// without it `y` keeps the normed sublayer output.
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm(
        &self,
        y: &mut Self::Buf,
        post: &Self::Buf,
        x: &mut Self::Buf,
        x_row0: usize,
        n: usize,
        d: usize,
        pre: Option<&Self::Buf>,
        eps: f32,
    ) -> Result<()> {
        self.rms_norm(y, n, d, Some(post), eps)?;
        self.copy_strided(y, 0, 0, x, x_row0 * d, 0, 1, n * d, 1.0, true)?;
        if let Some(pre) = pre {
            self.copy_strided(x, x_row0 * d, 0, y, 0, 0, 1, n * d, 1.0, false)?;
            self.rms_norm(y, n, d, Some(pre), eps)?;
        }
        Ok(())
    }
    /// Splits the rows of a fused projection `src [n_tok, Σ heads·hd]`
    /// (each part's heads in turn, `head_dim` values each) into each
    /// part's `dst [n_tok, heads·hd]`: RMS-normed per head by its `norm`
    /// when it has one, then NEOX-rotated at the step's positions when
    /// `rope` is set (q and k), or just copied (v).
    #[allow(clippy::too_many_arguments)]
    fn split_heads(
        &self,
        src: &Self::Buf,
        n_tok: usize,
        head_dim: usize,
        parts: &mut [HeadsPart<'_, Self>],
        rope: &RopeConfig,
        eps: f32,
        step: &Self::Step,
    ) -> Result<()> {
        let width: usize = parts.iter().map(|p| p.heads * head_dim).sum();
        let mut off = 0;
        for p in parts.iter_mut() {
            let w = p.heads * head_dim;
            self.copy_strided(src, off, width, p.dst, 0, w, n_tok, w, 1.0, false)?;
            if let Some(norm) = p.norm {
                self.rms_norm(p.dst, n_tok * p.heads, head_dim, Some(norm), eps)?;
            }
            if p.rope {
                self.rope(p.dst, n_tok, p.heads, head_dim, step, rope)?;
            }
            off += w;
        }
        Ok(())
    }
    /// `out[t, i] = gelu_tanh(gu[t, i]) * gu[t, ff + i]` for `t < n_tok`,
    /// `i < ff`: the gate and up halves of a fused `[n_tok, 2·ff]`
    /// projection. The default stages the up half in a buffer it
    /// allocates: a backend that fuses gate and up overrides it.
    fn gelu_mul_halves(
        &self,
        gu: &Self::Buf,
        n_tok: usize,
        ff: usize,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let mut up = self.alloc(n_tok * ff)?;
        self.copy_strided(gu, ff, 2 * ff, &mut up, 0, ff, n_tok, ff, 1.0, false)?;
        self.copy_strided(gu, 0, 2 * ff, out, 0, ff, n_tok, ff, 1.0, false)?;
        self.gelu_mul(out, &up, n_tok * ff)
    }
    /// `gate[i] = gelu_tanh(gate[i]) * up[i]` for `i < n`.
    fn gelu_mul(&self, gate: &mut Self::Buf, up: &Self::Buf, n: usize) -> Result<()>;
    /// `x[i] += y[i]` for `i < n`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, n: usize) -> Result<()>;
    /// `x[i] *= s` for `i < n`.
    fn scale(&self, x: &mut Self::Buf, s: f32, n: usize) -> Result<()>;
    /// `dst[dst_off + r*dst_stride + i] (+)= alpha * src[src_off + r*src_stride + i]`
    /// for `r < rows`, `i < len`; `accumulate` adds instead of overwriting.
    #[allow(clippy::too_many_arguments)]
    fn copy_strided(
        &self,
        src: &Self::Buf,
        src_off: usize,
        src_stride: usize,
        dst: &mut Self::Buf,
        dst_off: usize,
        dst_stride: usize,
        rows: usize,
        len: usize,
        alpha: f32,
        accumulate: bool,
    ) -> Result<()>;
    /// Logits `out[t, v] = softcap(Σ_c h[t, c] · W[v, c])` for `t < n_tok`.
    fn lm_head(
        &self,
        w: &Self::Weight,
        h: &Self::Buf,
        n_tok: usize,
        softcap: Option<f32>,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let (_, rows) = self.weight_shape(w);
        self.matmul(w, 0, rows, h, n_tok, out)?;
        if let Some(c) = softcap {
            self.softcap(out, c, n_tok * rows)?;
        }
        Ok(())
    }
    /// [`Backend::lm_head`] into host memory `out` (`n_tok * rows` values).
    /// The default computes into `buf` (kept by the caller, grown as
    /// needed) and downloads; a backend whose buffers are host memory
    /// writes `out` directly, sparing a buffer as large as the logits.
    #[allow(clippy::too_many_arguments)]
    fn lm_head_to_host(
        &self,
        w: &Self::Weight,
        h: &Self::Buf,
        n_tok: usize,
        softcap: Option<f32>,
        buf: &mut Option<Self::Buf>,
        out: &mut [f32],
    ) -> Result<()> {
        let b = match buf {
            Some(b) if self.buf_len(b) >= out.len() => b,
            _ => buf.insert(self.alloc(out.len())?),
        };
        self.lm_head(w, h, n_tok, softcap, b)?;
        self.download(b, 0, out)
    }
    /// `x[i] = c * tanh(x[i] / c)` for `i < n`.
    fn softcap(&self, x: &mut Self::Buf, c: f32, n: usize) -> Result<()>;
    /// For each row `r` of `rows`: the index of the largest logit of row
    /// `r` of `h` against `W` (ties: lowest id) into the step's id `r`
    /// ([`Backend::read_ids`]), without materialising the logits. Softcaps
    /// are monotonic, so they do not change it. A row with a non-finite
    /// logit gets id `u32::MAX`, so the other rows of a batch stand; with
    /// a single row a backend may instead return
    /// [`crate::ModelError::NonFiniteLogit`] (`pos` 0: the model fills it
    /// in).
    fn argmax_head(
        &self,
        w: &Self::Weight,
        h: &Self::Buf,
        rows: std::ops::Range<usize>,
        step: &mut Self::Step,
    ) -> Result<()>;

    /// Records, before [`Backend::load_step`], the sampler state (a
    /// buffer of [`crate::sample::state_words`]) of the `j`-th row of the
    /// step's [`Backend::sample_head`]; None: that row takes the argmax.
    /// A backend that replays steps keeps these in the step's inputs.
    fn bind_sampler(
        &self,
        _step: &mut Self::Step,
        _j: usize,
        _state: Option<&Self::Buf>,
    ) -> Result<()> {
        Ok(())
    }
    /// The sampling head: row `rows.start + j` of `h` against `W`, logits
    /// softcapped (into `logits`, at least `rows.len() * n_vocab` values),
    /// then [`crate::sample::sample_row`] with the `j`-th of `states` (the
    /// states bound with [`Backend::bind_sampler`], in that order; None:
    /// the argmax) into the step's id `rows.start + j`
    /// ([`Backend::read_ids`]), each state updated in place. `u32::MAX`
    /// marks a row that could not be sampled (the others stand).
    #[allow(clippy::too_many_arguments)]
    fn sample_head(
        &self,
        w: &Self::Weight,
        h: &Self::Buf,
        rows: std::ops::Range<usize>,
        softcap: Option<f32>,
        states: &mut dyn Iterator<Item = Option<&mut Self::Buf>>,
        logits: &mut Self::Buf,
        step: &mut Self::Step,
    ) -> Result<()>;

    /// Runs `f`, the whole of a step whose shape and buffers `key`
    /// identifies. A backend with graphs may capture `f`'s work the first
    /// time a key is seen and replay it later without calling `f` again,
    /// so `f` must do nothing on the host besides enqueueing ops. `None`:
    /// not replayable, just run it. The default runs `f`.
    fn run_step(&self, _key: Option<GraphKey>, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        f()
    }

    /// Bytes of memory free on the device that holds this backend's
    /// buffers, for sizing a KV pool there; `None` when the buffers live
    /// in host memory (the CPU), where the caller picks its own budget.
    fn device_memory_free(&self) -> Option<usize> {
        None
    }

    /// A CPU backend of the same type to redo a step on when this one
    /// produced a non-finite value (a device backend offers one; the CPU
    /// has nothing to fall back to). `threads` sizes its kernels' pool
    /// (0: one per core).
    fn cpu_fallback(&self, _threads: usize) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
}

/// A layer's cache as a [`Backend::store_kv`] destination.
pub struct KvDst<'a, B: ?Sized + Backend> {
    pub k: &'a mut B::Buf,
    pub v: &'a mut B::Buf,
    /// Allocated rows.
    pub rows: usize,
    /// Values per row.
    pub row_len: usize,
    /// A sliding-window ring (`pos % rows`) rather than `pos` rows.
    pub ring: bool,
}

/// One part of a fused projection for [`Backend::split_heads`].
pub struct HeadsPart<'a, B: ?Sized + Backend> {
    pub dst: &'a mut B::Buf,
    pub heads: usize,
    /// Per-head RMS norm weight (`head_dim` values); None: no norm.
    pub norm: Option<&'a B::Buf>,
    /// Whether RoPE follows (q and k, not v).
    pub rope: bool,
}
