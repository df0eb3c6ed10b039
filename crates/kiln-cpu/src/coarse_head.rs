//! The one-row greedy head's coarse copy (`kiln_kernels::CoarseRows`):
//! made on the first greedy step, it replaces the Q8_0 head's mapped rows
//! (handed back piece by piece as they are copied) for the screen, the
//! candidates' exact re-scoring and the token embeddings.
//!
//! Its bounds are looser than the Q8_0 screen's: ~150 candidates of
//! 262,144 on the real 270M, but on a flat distribution (the last token
//! of a random-token prompt) a third of the vocabulary. So many are
//! first narrowed with the Q8_0 screen of their rebuilt rows (the tighter
//! bounds of the same logits), in parallel, before the exact re-scoring.

use kiln_kernels::{CoarseRows, Isa, KernelError, ScreenX};
use kiln_model::Result;

use crate::matmul::{best_floor, kernel_err};
use crate::par::{Par, SendPtr};
use crate::CpuWeight;

/// Candidates re-scored directly; more are narrowed first
/// (`KILN_NARROW_MIN` overrides it, for tests).
fn narrow_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("KILN_NARROW_MIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256)
    })
}
/// Candidates screened per kernel call (their rebuilt rows stay in L2).
const NARROW_ROWS: usize = 64;
/// Narrowing tasks per thread.
const TASKS_PER_THREAD: usize = 4;

/// Buffers of [`narrow`], sized on the first call for the worst case (every
/// row a candidate), so that no later step allocates.
#[derive(Default)]
pub(crate) struct Narrow {
    /// The Q8_0 screen's upper bound of each candidate.
    hi: Vec<f32>,
    /// Each task's best lower bound.
    parts: Vec<Option<std::result::Result<f32, KernelError>>>,
    /// Each task's rebuilt rows.
    rows: Vec<std::sync::Mutex<Vec<u8>>>,
}

impl Narrow {
    /// Room for `n` candidates of `rb`-byte rows in `tasks` tasks.
    fn reserve(&mut self, n: usize, rb: usize, tasks: usize) {
        self.hi.reserve(n.saturating_sub(self.hi.len()));
        self.parts.reserve(tasks.saturating_sub(self.parts.len()));
        self.rows
            .resize_with(tasks, || std::sync::Mutex::new(Vec::new()));
        for buf in &mut self.rows {
            let buf = buf.get_mut().unwrap_or_else(|p| p.into_inner());
            if buf.len() < NARROW_ROWS * rb {
                buf.resize(NARROW_ROWS * rb, 0);
            }
        }
    }
}

/// `KILN_HEAD_SCREEN` (read once): `Some(true)` for `coarse`,
/// `Some(false)` for `q8_0`, None when unset or unknown.
fn setting() -> Option<bool> {
    static SETTING: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *SETTING.get_or_init(|| match std::env::var("KILN_HEAD_SCREEN").as_deref() {
        Ok("coarse") => Some(true),
        Ok("q8_0") => Some(false),
        _ => None,
    })
}

/// `w`'s coarse copy where the one-row screen takes it (by default where
/// its SIMD form runs; forced, anywhere: the portable form, for tests),
/// made on first use.
pub(crate) fn rows<'w>(par: &Par, isa: Isa, w: &'w CpuWeight) -> Option<&'w CoarseRows> {
    if !setting().unwrap_or_else(|| kiln_kernels::coarse_screen_runs(isa)) {
        return None;
    }
    w.coarse
        .get_or_init(|| {
            let _p = crate::profile::op(|| "  head: packing its coarse copy".into(), 0);
            // Each packed piece's pages go back at once, so the head is
            // never resident twice.
            let done = |r: std::ops::Range<usize>| {
                w.gguf.release_range(&w.name, r);
            };
            let (data, pool) = (w.data(), Some(par.pool()));
            let c = CoarseRows::pack(w.ty, data, w.row_bytes, w.rows, w.cols, pool, &done)?;
            w.gguf.release_pages(&w.name);
            Some(c)
        })
        .as_ref()
}

/// Row `r` of `w` (`data`, its file bytes) as its packed bytes: rebuilt
/// into `buf` from the coarse copy where one exists (the file's rows were
/// handed back), else the file's.
pub(crate) fn row<'a>(
    isa: Isa,
    w: &CpuWeight,
    data: &'a [u8],
    r: usize,
    buf: &'a mut Vec<u8>,
) -> Result<&'a [u8]> {
    match w.coarse.get().and_then(Option::as_ref) {
        Some(c) => {
            buf.resize(w.row_bytes, 0);
            c.q8_0_row(isa, r, buf).map_err(|e| kernel_err(w, e))?;
            Ok(&buf[..])
        }
        None => Ok(&data[r * w.row_bytes..(r + 1) * w.row_bytes]),
    }
}

/// Where the coarse screen left more than [`narrow_min`] candidates
/// (ascending rows of `c`, all of upper bound ≥ `floor`): screens their
/// rebuilt rows with the Q8_0 screen against the same `sx`, raises
/// `floor` to the best of its lower bounds and keeps, in order, the
/// candidates whose tighter upper bound still reaches it. `false` when a
/// bound is not finite (take the exact path).
#[allow(clippy::too_many_arguments)]
pub(crate) fn narrow(
    par: &Par,
    isa: Isa,
    w: &CpuWeight,
    c: &CoarseRows,
    sx: &ScreenX,
    floor: &mut f32,
    cands: &mut Vec<u32>,
    b: &mut Narrow,
) -> Result<bool> {
    let (n, rb) = (cands.len(), w.row_bytes);
    let tasks = par.threads() * TASKS_PER_THREAD;
    b.reserve(c.rows(), rb, tasks);
    if n <= narrow_min() {
        return Ok(true);
    }
    b.hi.resize(n, 0.0);
    b.parts.clear();
    b.parts.resize(tasks, None);
    let parts = SendPtr(b.parts.as_mut_ptr());
    let (ids, bufs) = (&cands[..], &b.rows);
    let per_task = n.div_ceil(tasks);
    par.chunks_mut(&mut b.hi[..], per_task, |i, hs| {
        // Each task locks its own buffer: no contention.
        let mut buf = bufs[i].lock().unwrap_or_else(|p| p.into_inner());
        let ids = &ids[i * per_task..][..hs.len()];
        let mut lo = f32::NEG_INFINITY;
        let mut run = || {
            for (hs, ids) in hs.chunks_mut(NARROW_ROWS).zip(ids.chunks(NARROW_ROWS)) {
                for (dst, &r) in buf.chunks_exact_mut(rb).zip(ids) {
                    c.q8_0_row(isa, r as usize, dst)?;
                }
                let ws = &buf[..hs.len() * rb];
                let m = kiln_kernels::screen_rows(isa, w.ty, ws, rb, sx, hs)?;
                lo = if m.is_nan() { f32::NAN } else { lo.max(m) };
            }
            Ok(lo)
        };
        let r = run();
        // SAFETY: `chunks_mut` hands out each chunk index once and
        // `parts` has a slot for each of the at most `tasks` chunks.
        unsafe { *parts.get().add(i) = Some(r) };
    });
    let ran = b.parts.iter_mut().take(n.div_ceil(per_task));
    match best_floor(w, ran, *floor)? {
        Some(f) => *floor = f,
        None => return Ok(false),
    }
    let mut kept = 0;
    for j in 0..n {
        if b.hi[j] >= *floor {
            cands[kept] = cands[j];
            kept += 1;
        }
    }
    cands.truncate(kept);
    Ok(true)
}
