//! Launchers of `kernels/attention.cu`: flash-style prefill over causal and
//! sliding-window masks (Gemma 2 softcap included) and split-K decode whose
//! last block merges the partials. Launch shapes depend only on the step's KV bucket, never on
//! `p0` itself, which the kernels read from the step: a graph captured for
//! a bucket replays at every position inside it. A step's decode rows run
//! in one launch, and its K/V rows are stored in one, each sequence's
//! cache found in the step's KV table (step.rs), so the graph holds no
//! cache address.

use std::sync::Mutex;

use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, LaunchConfig};
use kiln_model::{AttnParams, ModelError, Result};

use crate::gpu::{env_number, Gpu, Source};
use crate::ops::{check, launch, pointwise, to_u32};

pub(crate) const ATTENTION: Source = Source {
    name: "attention",
    text: concat!(
        include_str!("../kernels/common.cuh"),
        include_str!("../kernels/attention.cu")
    ),
};

/// Warps per decode block (each one split).
const DECODE_WARPS: u32 = 4;
/// Warps per prefill block.
const PREFILL_WARPS: u32 = 4;
/// Query rows per prefill warp (`attn_prefill_e*_r4`).
const PREFILL_ROWS: usize = 4;
/// Fewest keys a decode split takes (a tile of 8): a warp's keys are
/// folded one tile after another, so fewer keys per split means less
/// latency, until the partials cost more than that saves.
const MIN_SPLIT_KEYS: usize = 8;
/// Decode warps to aim for over all KV heads (a few per SM on an H200).
const DECODE_TARGET_WARPS: usize = 512;
/// F of `sqrt(F span)` decode splits ([`decode_splits`]).
const DECODE_SPLIT_FACTOR: usize = 8;

/// The kernel's argument block (`struct AttnArgs` in attention.cu: same
/// fields, same order).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct AttnArgs {
    q: u64,
    cur_k: u64,
    cur_v: u64,
    past_k: u64,
    past_v: u64,
    out: u64,
    part_acc: u64,
    part_ml: u64,
    seq_p0: u64,
    done: u64,
    kv: u64,
    seq_end: u64,
    seq_row0: u64,
    seq: u32,
    n_tok: u32,
    n_head: u32,
    n_kv_head: u32,
    past_rows: u32,
    window: u32,
    chunk: u32,
    scale: f32,
    softcap: f32,
    row_groups: u32,
}

// SAFETY: plain `repr(C)` integers and floats, laid out as the CUDA struct.
unsafe impl DeviceRepr for AttnArgs {}

/// Device buffers of one attention call, as addresses.
pub(crate) struct AttnBufs<'a> {
    pub q: &'a CudaSlice<f32>,
    pub cur_k: &'a CudaSlice<f32>,
    pub cur_v: &'a CudaSlice<f32>,
    /// `(k, v, rows)` of the cache, positions `p0 - rows..p0` (or from 0).
    pub past: Option<(&'a CudaSlice<f32>, &'a CudaSlice<f32>, usize)>,
    pub out: &'a mut CudaSlice<f32>,
    /// Address of the step's per-sequence `p0`.
    pub seq_p0: u64,
}

/// The decode partials' workspace and its per-block-group counters.
pub(crate) struct Attention {
    /// Decode partials (grown outside capture only).
    parts: Mutex<Option<CudaSlice<f32>>>,
    /// Finished blocks per (KV head, row group) of a decode call, zero
    /// between calls (the merging block resets its own; grown outside
    /// capture only).
    done: Mutex<Option<CudaSlice<u32>>>,
    store: CudaFunction,
}

/// `E` (floats per lane) of a head dim the kernels take.
fn lane_elems(head_dim: usize) -> Result<usize> {
    match head_dim {
        32 | 64 | 128 | 256 | 512 => Ok(head_dim / 32),
        _ => Err(ModelError::Backend(format!(
            "attention: head dim {head_dim} has no CUDA kernel (32, 64, 128, 256 or 512)"
        ))),
    }
}

/// The kernel arguments of `p` with its rows from `row0` of the buffers
/// (no past, no workspace yet).
fn args(gpu: &Gpu, b: &AttnBufs<'_>, p: &AttnParams, row0: usize) -> Result<AttnArgs> {
    let (qd, kvd) = (p.n_head * p.head_dim, p.n_kv_head * p.head_dim);
    Ok(AttnArgs {
        q: gpu.ptr(b.q, row0 * qd),
        cur_k: gpu.ptr(b.cur_k, row0 * kvd),
        cur_v: gpu.ptr(b.cur_v, row0 * kvd),
        out: gpu.ptr(&*b.out, row0 * qd),
        seq_p0: b.seq_p0,
        seq: to_u32("attention sequence", p.seq)?,
        n_tok: to_u32("attention rows", p.n_tok)?,
        n_head: to_u32("attention heads", p.n_head)?,
        n_kv_head: to_u32("attention KV heads", p.n_kv_head)?,
        window: to_u32("attention window", p.window.unwrap_or(0))?,
        scale: p.scale,
        softcap: p.softcap.unwrap_or(0.0),
        ..AttnArgs::default()
    })
}

/// `E` of `p`'s head dim, once its heads group over its KV heads.
fn kernel_elems(p: &AttnParams) -> Result<usize> {
    if p.n_kv_head == 0 || !p.n_head.is_multiple_of(p.n_kv_head) {
        return Err(ModelError::Backend(format!(
            "attention: {} heads do not group over {} KV heads",
            p.n_head, p.n_kv_head
        )));
    }
    lane_elems(p.head_dim)
}

/// Decode geometry for a KV bucket: `(chunk, splits)` with `splits` a
/// multiple of [`DECODE_WARPS`] and `chunk * splits` covering the widest
/// visible range of any position in the bucket.
///
/// A split folds its keys a tile (8) at a time, each tile a memory round
/// trip, and the merge reads every split's partial, eight at a time: time
/// grows with `span / splits` on one side and with `splits` on the other,
/// so `splits ~ sqrt(F span)` balances them, capped by the warps worth
/// running at once. F = 8 (4,096 keys: 172 splits of 24; a 512-key window
/// 64 of 8) measured best on an H100 (bench/RESULTS.md, 2026-12-06: tg128
/// at depth 4,096 270M 1,242-1,250 -> 1,280-1,292 tok/s, 1B 638 -> 649;
/// F = 4 and 16 in between; depth 0 the same), where it was 2 before the
/// merge kept eight splits' loads in flight.
///
/// `kv_end`: the longest sequence's `p0 + n_tok`; `seqs`: sequences in the
/// launch (each gets the same geometry, sharing the warps).
/// `KILN_CUDA_ATTN_SPLIT=F` (1-64, default 8) and `KILN_CUDA_ATTN_WARPS=N`
/// (32-8,192, default 512: the cap) are for A/B timing of the geometry.
fn decode_splits(p: &AttnParams, row_groups: usize, kv_end: usize, seqs: usize) -> (usize, usize) {
    static KNOBS: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    let (factor, warps_cap) = *KNOBS.get_or_init(|| {
        (
            env_number(
                "KILN_CUDA_ATTN_SPLIT",
                |n| (1..=64).contains(&n),
                DECODE_SPLIT_FACTOR,
            ),
            env_number(
                "KILN_CUDA_ATTN_WARPS",
                |n| (32..=8192).contains(&n),
                DECODE_TARGET_WARPS,
            ),
        )
    });
    let bucket = kv_end.next_power_of_two();
    let span = p.window.map_or(bucket, |w| w.min(bucket)).max(1);
    let cap = (warps_cap / (p.n_kv_head * row_groups * seqs)).max(1);
    let target = (factor * span).isqrt().clamp(1, cap);
    let chunk = span
        .div_ceil(target)
        .max(MIN_SPLIT_KEYS)
        .next_multiple_of(8);
    let warps = DECODE_WARPS as usize;
    let splits = span.div_ceil(chunk).next_multiple_of(warps);
    (chunk, splits)
}

impl Attention {
    pub(crate) fn new(gpu: &Gpu) -> Result<Attention> {
        // Loads the source now: a missing or broken kernel fails here.
        gpu.function(&ATTENTION, "attn_decode_e8_r4")?;
        Ok(Attention {
            parts: Mutex::new(None),
            done: Mutex::new(None),
            store: gpu.function(&ATTENTION, "store_kv_batch")?,
        })
    }

    /// Attention of the query rows `p.row0..p.row0 + p.n_tok` (see
    /// [`kiln_model::Backend::attention`]).
    pub(crate) fn run(&self, gpu: &Gpu, b: AttnBufs<'_>, p: &AttnParams) -> Result<()> {
        let e = kernel_elems(p)?;
        let hd = p.head_dim;
        let (qd, kvd) = (p.n_head * hd, p.n_kv_head * hd);
        let end = p.row0 + p.n_tok;
        check("attention q", end * qd, b.q.len())?;
        check("attention k", end * kvd, b.cur_k.len())?;
        check("attention v", end * kvd, b.cur_v.len())?;
        check("attention out", end * qd, b.out.len())?;
        if p.n_tok == 0 {
            return Ok(());
        }
        let mut a = args(gpu, &b, p, p.row0)?;
        if let Some((k, v, rows)) = b.past {
            if rows == 0 || k.len() < rows * kvd || v.len() < rows * kvd {
                return Err(ModelError::Backend(format!(
                    "attention: cache of {rows} rows is shorter than its buffers claim"
                )));
            }
            a.past_k = gpu.ptr(k, 0);
            a.past_v = gpu.ptr(v, 0);
            a.past_rows = to_u32("attention cache rows", rows)?;
        } else if p.p0 > 0 {
            return Err(ModelError::Backend(format!(
                "attention: positions before {} have no cache",
                p.p0
            )));
        }
        if p.n_tok == 1 {
            self.decode(gpu, a, p, e, p.p0 + 1, 1)
        } else {
            let rows = p.n_tok * (p.n_head / p.n_kv_head);
            let per_block = PREFILL_WARPS as usize * PREFILL_ROWS;
            let cfg = LaunchConfig {
                grid_dim: (
                    to_u32("attention row blocks", rows.div_ceil(per_block))?,
                    a.n_kv_head,
                    1,
                ),
                block_dim: (PREFILL_WARPS * 32, 1, 1),
                shared_mem_bytes: 0,
            };
            a.row_groups = 1;
            let f = gpu.function(&ATTENTION, &format!("attn_prefill_e{e}_r{PREFILL_ROWS}"))?;
            launch!(gpu, &f, cfg, "attention (prefill)"; a)
        }
    }

    /// The one-row sequences of a step (`params[i]` of sequence `i`, the
    /// same layer shapes), all in one launch, each over the cache the
    /// step's KV table at `table.0` names; `table.1`/`table.2`: the
    /// step's sequence ends and first rows. The launch covers every
    /// sequence (its shape depends only on their count); the others'
    /// blocks leave at once.
    pub(crate) fn run_batch(
        &self,
        gpu: &Gpu,
        b: AttnBufs<'_>,
        table: (u64, u64, u64),
        params: &[AttnParams],
    ) -> Result<()> {
        let Some(p) = params.first() else {
            return Ok(());
        };
        let e = kernel_elems(p)?;
        let seqs = params.len();
        let (qd, kvd) = (p.n_head * p.head_dim, p.n_kv_head * p.head_dim);
        let rows = params.iter().map(|p| p.row0 + p.n_tok).max().unwrap_or(0);
        check("attention q", rows * qd, b.q.len())?;
        check("attention k", rows * kvd, b.cur_k.len())?;
        check("attention v", rows * kvd, b.cur_v.len())?;
        check("attention out", rows * qd, b.out.len())?;
        let decode = params.iter().filter(|p| p.n_tok == 1);
        let kv_end = decode.map(|p| p.p0 + 1).max().unwrap_or(1);
        let a = AttnArgs {
            kv: table.0,
            seq_end: table.1,
            seq_row0: table.2,
            seq: 0,
            n_tok: 1,
            ..args(gpu, &b, p, 0)?
        };
        self.decode(gpu, a, p, e, kv_end, seqs)
    }

    /// Stores every row of a step's `k`/`v` (`n` rows of `row_len`) in its
    /// sequence's cache, as the step's KV table at `kv` names it (see
    /// `store_kv_batch` in attention.cu).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store_batch(
        &self,
        gpu: &Gpu,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        kv: u64,
        step: (u64, u64, u64),
        n: usize,
        row_len: usize,
        ring: bool,
    ) -> Result<()> {
        check("store_kv k", n * row_len, k.len())?;
        check("store_kv v", n * row_len, v.len())?;
        if n == 0 || row_len == 0 {
            return Ok(());
        }
        let (row_seq, positions, seq_end) = step;
        launch!(gpu, &self.store, pointwise(n * row_len), "store_kv_batch";
            gpu.ptr(k, 0), gpu.ptr(v, 0), kv, row_seq, positions, seq_end,
            to_u32("store_kv rows", n)?, to_u32("store_kv row length", row_len)?, u32::from(ring))
    }

    /// One query token of each of `seqs` sequences (one unless `a.kv`
    /// names a step's KV table): split-K partials, merged by each group's
    /// last block.
    fn decode(
        &self,
        gpu: &Gpu,
        mut a: AttnArgs,
        p: &AttnParams,
        e: usize,
        kv_end: usize,
        seqs: usize,
    ) -> Result<()> {
        let g = p.n_head / p.n_kv_head;
        // Rows per warp: the group's heads, at most 8 (4 at E = 16, for
        // registers), the rest over grid z.
        let r_max = if e == 16 { 4 } else { 8 };
        let r = g.next_power_of_two().min(r_max);
        let row_groups = g.div_ceil(r);
        let (chunk, splits) = decode_splits(p, row_groups, kv_end, seqs);
        let hd = p.head_dim;
        let need = seqs * p.n_head * splits * (hd + 2);
        let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        if parts.as_ref().is_none_or(|w| w.len() < need) {
            let grown = need.max(parts.as_ref().map_or(0, |w| 2 * w.len()));
            *parts = Some(gpu.alloc::<f32>(grown, "attention partials")?);
            gpu.workspace_reallocated();
        }
        let w = parts.as_ref().expect("workspace allocated above");
        a.part_acc = gpu.ptr(w, 0);
        a.part_ml = gpu.ptr(w, seqs * p.n_head * splits * hd);
        a.chunk = to_u32("attention chunk", chunk)?;
        a.row_groups = to_u32("attention row groups", row_groups)?;
        let groups = seqs * p.n_kv_head * row_groups;
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        if done.as_ref().is_none_or(|d| d.len() < groups) {
            *done = Some(gpu.alloc::<u32>(groups.max(256), "attention counters")?);
            gpu.workspace_reallocated();
        }
        a.done = gpu.ptr(done.as_ref().expect("counters allocated above"), 0);
        let cfg = LaunchConfig {
            grid_dim: (
                to_u32("attention splits", splits / DECODE_WARPS as usize)?,
                a.n_kv_head,
                to_u32("attention row groups", seqs * row_groups)?,
            ),
            block_dim: (DECODE_WARPS * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = gpu.function(&ATTENTION, &format!("attn_decode_e{e}_r{r}"))?;
        launch!(gpu, &f, cfg, "attention (decode)"; a)
    }
}
