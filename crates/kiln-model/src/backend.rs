//! The device interface the forward pass is written against: a small set of
//! fused ops on device buffers (`Buf`, f32 activations) and packed weights.

use std::sync::Arc;

use kiln_gguf::Gguf;

use crate::config::RopeConfig;
use crate::error::Result;

/// Shape and masking of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    /// Query rows in this call; query `t` is at position `p0 + t`.
    pub n_tok: usize,
    pub p0: usize,
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

/// Device ops. Buffers hold row-major f32 `[rows, width]` data; every op
/// says which prefix of a buffer it touches, so scratch buffers may be
/// larger than the current batch.
pub trait Backend: Send + Sync {
    type Buf: Send + Sync;
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

    /// `out[t] = table[ids[t]] * scale` (dequantizes only those rows).
    fn embed(
        &self,
        table: &Self::Weight,
        ids: &[u32],
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
    /// NEOX RoPE in place on `[n_tok, n_heads, head_dim]`, token `t` at
    /// position `p0 + t`.
    fn rope(
        &self,
        x: &mut Self::Buf,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        p0: usize,
        rope: &RopeConfig,
    ) -> Result<()>;
    /// Causal attention of `q [n_tok, n_head*hd]` over `past` (positions
    /// before `p0`) and `cur_k/cur_v [n_tok, n_kv*hd]` (positions
    /// `p0..p0+n_tok`) into `out [n_tok, n_head*hd]`.
    fn attention(
        &self,
        q: &Self::Buf,
        cur_k: &Self::Buf,
        cur_v: &Self::Buf,
        past: Option<PastKv<'_, Self>>,
        p: &AttnParams,
        out: &mut Self::Buf,
    ) -> Result<()>;
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
    /// Index of the largest logit of row 0 of `h` against `W` (ties: lowest
    /// id), without materialising the logits. Softcaps are monotonic, so
    /// they do not change it.
    fn argmax_head(&self, w: &Self::Weight, h: &Self::Buf) -> Result<u32>;
}
