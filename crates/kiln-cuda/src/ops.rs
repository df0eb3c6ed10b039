//! Launchers of `kernels/elementwise.cu`: RMS norm, add, scale, GELU-gate,
//! softcap, strided copy, NEOX RoPE and the KV-cache store. Each checks the
//! buffers hold what the launch touches, picks the geometry and launches.

use std::sync::Mutex;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use kiln_model::{ModelError, Result, RopeConfig};

use crate::gpu::{Gpu, Source};

pub(crate) const ELEMENTWISE: Source = Source {
    name: "elementwise",
    text: concat!(
        include_str!("../kernels/common.cuh"),
        include_str!("../kernels/elementwise.cu")
    ),
};

/// Threads per block of the pointwise kernels.
const BLOCK: u32 = 256;
/// Most blocks of a grid-stride launch (more only queue).
const MAX_BLOCKS: u64 = 8192;

/// Enqueues kernel `$f` with `$cfg` and arguments (each evaluated into a
/// local that outlives the launch) as a programmatic dependent launch
/// (`Gpu::launch_pdl`: the kernel calls `grid_dep_wait()` first).
macro_rules! launch {
    ($gpu:expr, $f:expr, $cfg:expr, $what:expr; $($arg:expr),* $(,)?) => {{
        let mut params = [std::ptr::null_mut::<std::ffi::c_void>(); 24];
        let mut n = 0usize;
        $(
            let a = $arg;
            params[n] = std::ptr::addr_of!(a) as *mut std::ffi::c_void;
            n += 1;
        )*
        // SAFETY: the caller checked every buffer against the extents the
        // kernel indexes, the arguments follow its signature, and each
        // `a` lives until the end of this block.
        unsafe { $gpu.launch_pdl($f, $cfg, &mut params[..n], $what) }
    }};
}
pub(crate) use launch;

/// An error unless a buffer of `have` values holds `need`.
pub(crate) fn check(what: &str, need: usize, have: usize) -> Result<()> {
    if need > have {
        return Err(ModelError::Backend(format!(
            "{what}: needs {need} elements, buffer has {have}"
        )));
    }
    Ok(())
}

/// A `u32` kernel argument, or an error naming `what` when it does not fit.
pub(crate) fn to_u32(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| ModelError::Backend(format!("{what} {v} exceeds u32")))
}

/// A grid-stride launch over `n` elements.
pub(crate) fn pointwise(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            (n as u64).div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32,
            1,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The loaded elementwise kernels, and the RoPE frequency tables.
pub(crate) struct Ops {
    rms_norm_v4: CudaFunction,
    rms_norm_v1: CudaFunction,
    add: CudaFunction,
    scale: CudaFunction,
    gelu_mul: CudaFunction,
    softcap: CudaFunction,
    copy_strided: CudaFunction,
    rope_neox: CudaFunction,
    /// Per RoPE config, its f64 inverse frequencies on the device (a model
    /// has one or two configs).
    rope_tables: Mutex<Vec<(RopeConfig, CudaSlice<f64>)>>,
}

impl Ops {
    pub(crate) fn new(gpu: &Gpu) -> Result<Ops> {
        let f = |name| gpu.function(&ELEMENTWISE, name);
        Ok(Ops {
            rms_norm_v4: f("rms_norm_v4")?,
            rms_norm_v1: f("rms_norm_v1")?,
            add: f("add")?,
            scale: f("scale")?,
            gelu_mul: f("gelu_mul")?,
            softcap: f("softcap_inplace")?,
            copy_strided: f("copy_strided")?,
            rope_neox: f("rope_neox")?,
            rope_tables: Mutex::default(),
        })
    }

    /// `x = x / sqrt(mean(x²) + eps) * w` over `n_groups` groups of `dim`.
    pub(crate) fn rms_norm(
        &self,
        gpu: &Gpu,
        x: &mut CudaSlice<f32>,
        n_groups: usize,
        dim: usize,
        w: Option<&CudaSlice<f32>>,
        eps: f32,
    ) -> Result<()> {
        check("rms_norm", n_groups * dim, x.len())?;
        if let Some(w) = w {
            check("rms_norm weight", dim, w.len())?;
        }
        if n_groups == 0 || dim == 0 {
            return Ok(());
        }
        let w_ptr = w.map_or(0, |w| gpu.ptr(w, 0));
        // float4 loads need 16-byte rows (allocations are 256-byte aligned).
        let v4 = dim.is_multiple_of(4);
        let per_thread = if v4 { 4 } else { 1 };
        let tpg = dim.div_ceil(per_thread).next_multiple_of(32).min(1024);
        let groups_per_block = (BLOCK as usize / tpg).max(1);
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32("rms_norm groups", n_groups.div_ceil(groups_per_block))?,
                1,
                1,
            ),
            block_dim: (tpg as u32, groups_per_block as u32, 1),
            shared_mem_bytes: 0,
        };
        let f = if v4 {
            &self.rms_norm_v4
        } else {
            &self.rms_norm_v1
        };
        launch!(gpu, f, cfg, "rms_norm";
            gpu.ptr(x, 0), w_ptr, n_groups as u32, to_u32("rms_norm dim", dim)?, eps)
    }

    /// `x[i] += y[i]` for `i < n`.
    pub(crate) fn add(
        &self,
        gpu: &Gpu,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        n: usize,
    ) -> Result<()> {
        check("add", n, x.len().min(y.len()))?;
        if n == 0 {
            return Ok(());
        }
        launch!(gpu, &self.add, pointwise(n), "add"; gpu.ptr(x, 0), gpu.ptr(y, 0), n as u64)
    }

    /// `x[i] *= s` for `i < n`.
    pub(crate) fn scale(&self, gpu: &Gpu, x: &mut CudaSlice<f32>, s: f32, n: usize) -> Result<()> {
        check("scale", n, x.len())?;
        if n == 0 {
            return Ok(());
        }
        launch!(gpu, &self.scale, pointwise(n), "scale"; gpu.ptr(x, 0), s, n as u64)
    }

    /// `gate[i] = gelu_tanh(gate[i]) * up[i]` for `i < n`.
    pub(crate) fn gelu_mul(
        &self,
        gpu: &Gpu,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
        n: usize,
    ) -> Result<()> {
        check("gelu_mul", n, gate.len().min(up.len()))?;
        if n == 0 {
            return Ok(());
        }
        launch!(gpu, &self.gelu_mul, pointwise(n), "gelu_mul";
            gpu.ptr(gate, 0), gpu.ptr(up, 0), n as u64)
    }

    /// `x[i] = c * tanh(x[i] / c)` for `i < n`.
    pub(crate) fn softcap(
        &self,
        gpu: &Gpu,
        x: &mut CudaSlice<f32>,
        c: f32,
        n: usize,
    ) -> Result<()> {
        check("softcap", n, x.len())?;
        if n == 0 {
            return Ok(());
        }
        launch!(gpu, &self.softcap, pointwise(n), "softcap"; gpu.ptr(x, 0), c, n as u64)
    }

    /// `dst[dst_off + r*dst_stride + i] (+)= alpha * src[src_off + r*src_stride + i]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn copy_strided(
        &self,
        gpu: &Gpu,
        src: &CudaSlice<f32>,
        src_off: usize,
        src_stride: usize,
        dst: &mut CudaSlice<f32>,
        dst_off: usize,
        dst_stride: usize,
        rows: usize,
        len: usize,
        alpha: f32,
        accumulate: bool,
    ) -> Result<()> {
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
        launch!(gpu, &self.copy_strided, pointwise(rows * len), "copy_strided";
            gpu.ptr(src, 0), src_off as u64, src_stride as u64,
            gpu.ptr(dst, 0), dst_off as u64, dst_stride as u64,
            rows as u64, len as u64, alpha, u32::from(accumulate))
    }

    /// NEOX RoPE on `x [n_tok, n_heads, head_dim]`, row `t` at
    /// `positions[t]` (device).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope(
        &self,
        gpu: &Gpu,
        x: &mut CudaSlice<f32>,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        positions: u64,
        rope: &RopeConfig,
    ) -> Result<()> {
        check("rope", n_tok * n_heads * head_dim, x.len())?;
        let half = rope.n_rot / 2;
        if half == 0 || n_tok == 0 {
            return Ok(());
        }
        if rope.n_rot > head_dim {
            return Err(ModelError::Backend(format!(
                "rope: {} rotated dimensions exceed the head dim {head_dim}",
                rope.n_rot
            )));
        }
        let table = self.rope_table(gpu, rope)?;
        // A thread per pair and head, heads filling blocks of ~256.
        let pairs = half.next_multiple_of(32).min(BLOCK as usize);
        let heads_per_block = (BLOCK as usize / pairs).clamp(1, n_heads.max(1));
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32("rope tokens", n_tok)?,
                to_u32("rope heads", n_heads.div_ceil(heads_per_block))?,
                1,
            ),
            block_dim: (pairs as u32, heads_per_block as u32, 1),
            shared_mem_bytes: 0,
        };
        launch!(gpu, &self.rope_neox, cfg, "rope";
            gpu.ptr(x, 0), positions, table, n_heads as u32, head_dim as u32, half as u32)
    }

    /// The device address of `rope`'s inverse frequencies, uploaded on
    /// first use (a warm-up step, never a captured one).
    pub(crate) fn rope_table(&self, gpu: &Gpu, rope: &RopeConfig) -> Result<u64> {
        let mut tables = self.rope_tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, t)) = tables.iter().find(|(c, _)| c == rope) {
            return Ok(gpu.ptr(t, 0));
        }
        gpu.check_not_capturing("uploading a RoPE table")?;
        let inv = rope_inv_freq(rope);
        let mut t = gpu.alloc::<f64>(inv.len(), "RoPE table")?;
        gpu.upload(&inv, &mut t, "RoPE table")?;
        let p = gpu.ptr(&t, 0);
        tables.push((rope.clone(), t));
        Ok(p)
    }
}

/// Per-pair inverse frequencies of `rope`, in f64, exactly as the CPU
/// backend computes them.
pub(crate) fn rope_inv_freq(rope: &RopeConfig) -> Vec<f64> {
    (0..rope.n_rot / 2)
        .map(|i| {
            let f = f64::from(rope.base).powf(-2.0 * i as f64 / rope.n_rot as f64)
                * f64::from(rope.freq_scale);
            match &rope.freq_factors {
                Some(ff) => f / f64::from(ff.get(i).copied().unwrap_or(1.0)),
                None => f,
            }
        })
        .collect()
}
