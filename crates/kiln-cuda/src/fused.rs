//! Launchers of `kernels/fused.cu`: the add + sandwich norms, the split of
//! a fused q/k/v projection (per-head norms and RoPE on the way) and the
//! GELU gate of a fused gate/up projection, each one kernel where the
//! `Backend` defaults take several.

use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, LaunchConfig};
use kiln_model::{ModelError, Result};

use crate::gpu::{Gpu, Source};
use crate::ops::{check, launch, pointwise, to_u32};

pub(crate) const FUSED: Source = Source {
    name: "fused",
    text: concat!(
        include_str!("../kernels/common.cuh"),
        include_str!("../kernels/fused.cu")
    ),
};

/// Parts a fused projection splits into (q, k, v).
pub(crate) const MAX_PARTS: usize = 3;
/// Widest head the split stages in shared memory.
const MAX_HEAD_DIM: usize = 512;
/// Threads per head of the split.
const SPLIT_THREADS: u32 = 128;

/// The split kernel's argument block (`struct HeadsArgs` in fused.cu: same
/// fields, same order).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct HeadsArgs {
    pub src: u64,
    pub positions: u64,
    pub inv_freq: u64,
    pub dst: [u64; MAX_PARTS],
    pub norm: [u64; MAX_PARTS],
    pub heads: [u32; MAX_PARTS],
    pub rope: [u32; MAX_PARTS],
    pub n_parts: u32,
    pub width: u32,
    pub head_dim: u32,
    pub half: u32,
    pub eps: f32,
    pub pad: u32,
}

// SAFETY: plain `repr(C)` integers and floats, laid out as the CUDA struct.
unsafe impl DeviceRepr for HeadsArgs {}

/// One part of a split, as buffers.
pub(crate) struct SplitPart<'a> {
    pub dst: &'a mut CudaSlice<f32>,
    pub heads: usize,
    pub norm: Option<&'a CudaSlice<f32>>,
    pub rope: bool,
}

/// The loaded fused kernels.
pub(crate) struct Fused {
    add_rms_norm_v4: CudaFunction,
    add_rms_norm_v1: CudaFunction,
    split_heads: CudaFunction,
    gelu_mul_halves: CudaFunction,
}

impl Fused {
    pub(crate) fn new(gpu: &Gpu) -> Result<Fused> {
        let f = |name| gpu.function(&FUSED, name);
        Ok(Fused {
            add_rms_norm_v4: f("add_rms_norm_v4")?,
            add_rms_norm_v1: f("add_rms_norm_v1")?,
            split_heads: f("split_heads")?,
            gelu_mul_halves: f("gelu_mul_halves")?,
        })
    }

    /// `y = norm(y)·post; x[x_row0..] += y;` then with `pre` `y =
    /// norm(x)·pre`, over `n` rows of `d` (one block per row).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_rms_norm(
        &self,
        gpu: &Gpu,
        y: &mut CudaSlice<f32>,
        post: &CudaSlice<f32>,
        x: &mut CudaSlice<f32>,
        x_row0: usize,
        n: usize,
        d: usize,
        pre: Option<&CudaSlice<f32>>,
        eps: f32,
    ) -> Result<()> {
        check("add_rms_norm y", n * d, y.len())?;
        check("add_rms_norm x", (x_row0 + n) * d, x.len())?;
        check("add_rms_norm post weight", d, post.len())?;
        if let Some(pre) = pre {
            check("add_rms_norm pre weight", d, pre.len())?;
        }
        if n == 0 || d == 0 {
            return Ok(());
        }
        // float4 loads need 16-byte rows (allocations are 256-byte aligned).
        let v4 = d.is_multiple_of(4);
        let per_thread = if v4 { 4 } else { 1 };
        let threads = d.div_ceil(per_thread).next_multiple_of(32).min(1024);
        let cfg = LaunchConfig {
            grid_dim: (to_u32("add_rms_norm rows", n)?, 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = if v4 {
            &self.add_rms_norm_v4
        } else {
            &self.add_rms_norm_v1
        };
        let pre_ptr = pre.map_or(0, |w| gpu.ptr(w, 0));
        launch!(gpu, f, cfg, "add_rms_norm";
            gpu.ptr(y, 0), gpu.ptr(post, 0), gpu.ptr(x, x_row0 * d), pre_ptr,
            to_u32("add_rms_norm width", d)?, eps)
    }

    /// Splits `src [n_tok, Σ heads·head_dim]` into `parts`; `positions`
    /// and `inv_freq` (device addresses, RoPE pairs `half`) serve the
    /// roped parts.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn split_heads(
        &self,
        gpu: &Gpu,
        src: &CudaSlice<f32>,
        n_tok: usize,
        head_dim: usize,
        parts: &mut [SplitPart<'_>],
        rope: (u64, u64, usize),
        eps: f32,
    ) -> Result<()> {
        if parts.is_empty() || parts.len() > MAX_PARTS {
            return Err(ModelError::Backend(format!(
                "split_heads: {} parts (1 to {MAX_PARTS})",
                parts.len()
            )));
        }
        if head_dim == 0 || head_dim > MAX_HEAD_DIM {
            return Err(ModelError::Backend(format!(
                "split_heads: head dim {head_dim} (1 to {MAX_HEAD_DIM})"
            )));
        }
        let (positions, inv_freq, half) = rope;
        if 2 * half > head_dim {
            return Err(ModelError::Backend(format!(
                "split_heads: {} rotated dimensions exceed the head dim {head_dim}",
                2 * half
            )));
        }
        let heads: usize = parts.iter().map(|p| p.heads).sum();
        let width = heads * head_dim;
        check("split_heads source", n_tok * width, src.len())?;
        let mut a = HeadsArgs {
            src: gpu.ptr(src, 0),
            positions,
            inv_freq,
            n_parts: parts.len() as u32,
            width: to_u32("split_heads width", width)?,
            head_dim: head_dim as u32,
            half: half as u32,
            eps,
            ..HeadsArgs::default()
        };
        for (i, p) in parts.iter_mut().enumerate() {
            check(
                "split_heads destination",
                n_tok * p.heads * head_dim,
                p.dst.len(),
            )?;
            if let Some(w) = p.norm {
                check("split_heads norm weight", head_dim, w.len())?;
                a.norm[i] = gpu.ptr(w, 0);
            }
            a.dst[i] = gpu.ptr(p.dst, 0);
            a.heads[i] = to_u32("split_heads heads", p.heads)?;
            a.rope[i] = u32::from(p.rope && half > 0);
        }
        if n_tok == 0 || heads == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32("split_heads rows", n_tok)?,
                to_u32("split_heads heads", heads)?,
                1,
            ),
            block_dim: (SPLIT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(gpu, &self.split_heads, cfg, "split_heads"; a)
    }

    /// `out[t, i] = gelu_tanh(gu[t, i]) * gu[t, ff + i]`.
    pub(crate) fn gelu_mul_halves(
        &self,
        gpu: &Gpu,
        gu: &CudaSlice<f32>,
        n_tok: usize,
        ff: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        check("gelu_mul_halves source", n_tok * 2 * ff, gu.len())?;
        check("gelu_mul_halves output", n_tok * ff, out.len())?;
        let n = n_tok * ff;
        if n == 0 {
            return Ok(());
        }
        launch!(gpu, &self.gelu_mul_halves, pointwise(n), "gelu_mul_halves";
            gpu.ptr(gu, 0), gpu.ptr(out, 0), to_u32("gelu_mul_halves width", ff)?, n as u64)
    }
}
