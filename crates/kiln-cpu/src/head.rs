//! The greedy head of a batch: the argmax of several hidden rows against
//! the LM head, reading its rows once for all of them.
//!
//! Q8_0 heads go through `kiln_kernels::screen_rows_multi`: one integer
//! pass bounds every (vocab row, hidden row) logit; each task keeps the
//! pairs whose upper bound reaches its running best lower bound, and only
//! those that reach the global one are re-scored with the exact `gemv`, in
//! ascending vocab order, so every pick equals [`matmul::argmax`]'s. Other
//! types (and a hidden row the screen refuses) take the exact path.
//!
//! Without VNNI the batch screen costs as much per (weight block, row) as
//! the f32 GEMM (`pmaddubsw` + `pmaddwd` + scaling, ~2 cycles per 32
//! products either way; measured on a 2-core AVX2 AMD EPYC, real 270M: 16
//! rows 135 ms per step screened vs 124.5 ms through the logits), so there
//! a batch's logits are computed whole and scanned, which picks the same
//! ids. With VNNI, the batch takes the kernels' transposed form (vocab
//! rows in lanes, a whole block summed in integers), from tiles of the
//! head packed once, on the first batched head (`ScreenTiles`: 6% more
//! bytes than the Q8_0 head, 189 MB for Gemma 3's 262,144 x 640; 6 ms on
//! Zen 4; `KILN_BATCH_HEAD=unpacked` transposes per call instead and keeps
//! no copy). On Zen 4 the real 270M's screen of 8 rows went from 29-44 ms
//! (the `maddubs` form) to 8-10 ms, then 7-9 with the tiles prefetched, 16
//! rows from 57-76 to ~17, then 14-17. A lone row is screened from the
//! rows on every level, tiles or not: one int8 plane per block against
//! the integer GEMV's three (AVX2, one thread, 262,144 Q8_0 rows in cache:
//! 20 vs 13 GB/s); the tiles' form, made for several rows, took 6.0 ms for
//! one where the rows take 4.6 (Zen 4, real 270M, 2 threads).

use std::cell::RefCell;

use kiln_kernels::{Isa, KernelError, RowMax, ScreenX};
use kiln_model::{ModelError, Result};

use crate::matmul::{self, kernel_err, rows_bytes, rows_per_task};
use crate::par::{Par, SendPtr};
use crate::CpuWeight;

/// Vocab rows screened per kernel call inside a task: their bounds stay
/// in L1 while the candidates are picked out.
const SUB_ROWS: usize = 64;

thread_local! {
    /// The caller's buffers, grown once.
    static BATCH: RefCell<Batch> = RefCell::new(Batch::default());
    /// The picks of [`argmax_ids`], grown once.
    static PICKS: RefCell<Vec<RowMax>> = const { RefCell::new(Vec::new()) };
    /// A batch's logits where they are computed whole, grown once.
    static LOGITS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A task's bounds for [`SUB_ROWS`] rows, grown once per worker.
    static HI: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[derive(Default)]
struct Batch {
    sxs: Vec<ScreenX>,
    /// Which hidden row each screen is for.
    of: Vec<usize>,
    /// Per task: (vocab row, screen, upper bound) pairs that reached the
    /// task's running floor, in ascending vocab row.
    cands: Vec<Vec<(u32, u32, f32)>>,
    /// Per task × screen: the task's best lower bound.
    floors: Vec<f32>,
    errs: Vec<Option<KernelError>>,
    /// Per screen: best (row, logit) so far, and whether an exact dot was
    /// not finite (that hidden row then takes the exact path).
    best: Vec<Option<(usize, f32)>>,
    bad: Vec<bool>,
    /// Per task × screen: the task's exact best and whether it met a
    /// non-finite logit.
    slots: Vec<(Option<(usize, f32)>, bool)>,
}

/// The backend's greedy head: `ids[t]` for hidden row `t` of `h`; a row
/// with a non-finite logit gets `u32::MAX`, or, when it is the only row,
/// the error naming that logit. A lone row takes the one-row screen
/// (`matmul::argmax_screened`); `exact` skips every screen.
/// Bytes of `w` a greedy head of `n` rows streams (for the profile's
/// bandwidth figures): a lone row screens the coarse copy where one was
/// made (26 of every 34 bytes), anything else the rows' bytes.
pub(crate) fn screened_bytes(w: &CpuWeight, n: usize) -> usize {
    match w.coarse.get() {
        Some(Some(c)) if n == 1 => c.screen_bytes(),
        _ => w.rows * w.row_bytes,
    }
}

pub(crate) fn argmax_ids(
    par: &Par,
    isa: Isa,
    w: &CpuWeight,
    h: &[f32],
    exact: bool,
    ids: &mut [u32],
) -> Result<()> {
    PICKS.with(|p| {
        let mut picks = p.borrow_mut();
        // A lone row takes the rows' screen even where packed tiles exist
        // (a server that has batched): see the module doc.
        if ids.len() == 1 {
            let screened = if exact {
                None
            } else {
                matmul::argmax_screened(par, isa, w, h)?
            };
            let m = match screened {
                Some(m) => m,
                None => matmul::argmax(par, isa, w, h)?,
            };
            picks.clear();
            picks.push(m);
        } else {
            argmax_batch(par, isa, w, h, exact, &mut picks)?;
        }
        if let [m] = &picks[..] {
            // A NaN must be reported, not lost to `z > best` being false;
            // the model fills in the position.
            if let Some((token, value)) = m.non_finite {
                return Err(ModelError::NonFiniteLogit {
                    pos: 0,
                    token: token as u32,
                    value,
                });
            }
        }
        for (id, m) in ids.iter_mut().zip(picks.iter()) {
            *id = match m.non_finite {
                Some(_) => u32::MAX,
                None => m.index as u32,
            };
        }
        Ok(())
    })
}

/// `out[t]`: the greedy pick of hidden row `t` of `h` (`n` rows of
/// `w.cols`), as [`matmul::argmax`] finds it, non-finite logits included.
fn argmax_batch(
    par: &Par,
    isa: Isa,
    w: &CpuWeight,
    h: &[f32],
    exact: bool,
    out: &mut Vec<RowMax>,
) -> Result<()> {
    let cols = w.cols;
    let n = h.len() / cols;
    out.clear();
    out.resize(
        n,
        RowMax {
            index: 0,
            value: f32::NAN,
            non_finite: None,
        },
    );
    let mut todo: Vec<usize> = Vec::new();
    if !screen_pays(isa) || exact || !kiln_kernels::can_screen(w.ty) {
        return through_logits(par, isa, w, h, out);
    } else if w.rows == 0 {
        todo.extend(0..n);
    } else {
        BATCH.with(|b| screened(par, isa, w, h, &mut b.borrow_mut(), out, &mut todo))?;
    }
    for t in todo {
        out[t] = matmul::argmax(par, isa, w, &h[t * cols..(t + 1) * cols])?;
    }
    Ok(())
}

/// `KILN_BATCH_HEAD` (read once): `screen`, `unpacked` (screen, no packed
/// tiles) or `logits`; None when unset or unknown.
fn batch_head_setting() -> Option<&'static str> {
    static SETTING: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *SETTING.get_or_init(|| match std::env::var("KILN_BATCH_HEAD").as_deref() {
        Ok("screen") => Some("screen"),
        Ok("unpacked") => Some("unpacked"),
        Ok("logits") => Some("logits"),
        _ => None,
    })
}

/// Whether the batch screen beats the GEMM on `isa` (see the module
/// doc); `KILN_BATCH_HEAD` overrides it.
fn screen_pays(isa: Isa) -> bool {
    match batch_head_setting() {
        Some("logits") => false,
        Some(_) => true,
        None => isa >= Isa::Avx512Vnni,
    }
}

/// The head's packed screen tiles, made on first use where `isa` runs
/// them (AVX-512 VNNI) unless `KILN_BATCH_HEAD=unpacked`.
fn screen_tiles(isa: Isa, w: &CpuWeight) -> Option<&kiln_kernels::ScreenTiles> {
    w.screen_tiles
        .get_or_init(|| {
            if batch_head_setting() == Some("unpacked") {
                return None;
            }
            let _p = crate::profile::op(|| "  head: packing its tiles".into(), 0);
            kiln_kernels::ScreenTiles::pack(isa, w.ty, w.data(), w.row_bytes, w.rows, w.cols)
        })
        .as_ref()
}

/// Every row's logits through the GEMM (one read of the head for all
/// rows), then a scan per row: the largest logit, ties to the lowest id,
/// and the lowest non-finite one.
fn through_logits(par: &Par, isa: Isa, w: &CpuWeight, h: &[f32], out: &mut [RowMax]) -> Result<()> {
    let n = out.len();
    LOGITS.with(|l| {
        let mut logits = l.borrow_mut();
        logits.resize(n * w.rows, 0.0);
        matmul::matmul(par, isa, w, 0, w.rows, h, n, &mut logits, None)?;
        for (o, row) in out.iter_mut().zip(logits.chunks_exact(w.rows)) {
            let (mut index, mut value, mut non_finite) = (0, f32::NEG_INFINITY, None);
            for (r, &z) in row.iter().enumerate() {
                if !z.is_finite() {
                    non_finite.get_or_insert((r, z));
                } else if z > value {
                    (index, value) = (r, z);
                }
            }
            *o = RowMax {
                index,
                value,
                non_finite,
            };
        }
        Ok(())
    })
}

/// The screened path; hidden rows it cannot settle go to `todo`.
fn screened(
    par: &Par,
    isa: Isa,
    w: &CpuWeight,
    h: &[f32],
    b: &mut Batch,
    out: &mut [RowMax],
    todo: &mut Vec<usize>,
) -> Result<()> {
    let cols = w.cols;
    let n = out.len();
    if b.sxs.len() < n {
        b.sxs.resize_with(n, ScreenX::default);
    }
    b.of.clear();
    for t in 0..n {
        let m = b.of.len();
        if b.sxs[m].set(&h[t * cols..(t + 1) * cols]) {
            b.of.push(t);
        } else {
            todo.push(t);
        }
    }
    let m = b.of.len();
    if m == 0 {
        return Ok(());
    }
    let sxs = &b.sxs[..m];
    let data = w.data();
    let tiles = screen_tiles(isa, w);
    let screen_timer = crate::profile::op(|| "  head: screen".into(), 0);
    let chunk = rows_per_task(par, w.rows, SUB_ROWS, 4096);
    let tasks = w.rows.div_ceil(chunk);
    b.cands.resize_with(tasks.max(b.cands.len()), Vec::new);
    b.floors.clear();
    b.floors.resize(tasks * m, f32::NEG_INFINITY);
    b.errs.clear();
    b.errs.resize(tasks, None);
    let (cands, floors, errs) = (
        SendPtr(b.cands.as_mut_ptr()),
        SendPtr(b.floors.as_mut_ptr()),
        SendPtr(b.errs.as_mut_ptr()),
    );
    par.run(tasks, |i| {
        // SAFETY: `run` hands out each task index once; task `i` alone
        // touches candidate list `i`, floors `i * m..(i + 1) * m` and
        // error slot `i`, all inside their vectors.
        let (cand, lo, err) = unsafe {
            (
                &mut *cands.get().add(i),
                std::slice::from_raw_parts_mut(floors.get().add(i * m), m),
                &mut *errs.get().add(i),
            )
        };
        cand.clear();
        let r_end = ((i + 1) * chunk).min(w.rows);
        HI.with(|hi| {
            let mut hi = hi.borrow_mut();
            hi.resize(SUB_ROWS * m, 0.0);
            for r0 in (i * chunk..r_end).step_by(SUB_ROWS) {
                let nr = SUB_ROWS.min(r_end - r0);
                let hs = &mut hi[..nr * m];
                let r = match tiles {
                    // Chunks are whole tiles (multiples of 16 from a tile
                    // start) but for the matrix's last `rows % 16`.
                    Some(t) if r0 + nr <= t.rows() && nr.is_multiple_of(16) => {
                        kiln_kernels::screen_tiles_multi(isa, t, r0, sxs, hs, lo)
                    }
                    _ => {
                        let ws = rows_bytes(w, data, r0, nr);
                        kiln_kernels::screen_rows_multi(isa, w.ty, ws, w.row_bytes, sxs, hs, lo)
                    }
                };
                if let Err(e) = r {
                    *err = Some(e);
                    return;
                }
                for (j, row) in hs.chunks_exact(m).enumerate() {
                    for (s, (&v, &f)) in row.iter().zip(lo.iter()).enumerate() {
                        // A NaN floor settles nothing here: the caller
                        // sends that row to the exact path.
                        if v >= f {
                            cand.push(((r0 + j) as u32, s as u32, v));
                        }
                    }
                }
            }
        });
    });
    drop(screen_timer);
    if let Some(e) = b.errs.iter_mut().find_map(Option::take) {
        return Err(kernel_err(w, e));
    }
    let _rescore_timer = crate::profile::op(|| "  head: exact re-scoring".into(), 0);
    // Global floors, then the exact re-scoring in ascending vocab rows.
    let mut floor = vec![f32::NEG_INFINITY; m];
    for task in b.floors.chunks_exact(m) {
        for (g, &f) in floor.iter_mut().zip(task) {
            *g = if f.is_nan() || g.is_nan() {
                f32::NAN
            } else {
                g.max(f)
            };
        }
    }
    // Each task's candidates re-scored on the pool (a 16-row batch keeps
    // hundreds per row: 2 ms of serial work on Zen 4), into one slot per
    // (task, screen); merged in task order, so the pick is the one a
    // serial pass in ascending rows makes.
    b.slots.clear();
    b.slots.resize(tasks * m, (None, false));
    let slots = SendPtr(b.slots.as_mut_ptr());
    let (cands, of, floor) = (&b.cands[..tasks], &b.of, &floor);
    par.run(tasks, |i| {
        // SAFETY: task `i` alone touches slots `i * m..(i + 1) * m` and
        // error slot `i`, all inside their vectors.
        let (slot, err) = unsafe {
            (
                std::slice::from_raw_parts_mut(slots.get().add(i * m), m),
                &mut *errs.get().add(i),
            )
        };
        let mut y = [0.0f32];
        for &(r, s, v) in &cands[i] {
            let (r, s) = (r as usize, s as usize);
            let (best, bad) = &mut slot[s];
            if *bad || floor[s].is_nan() || v < floor[s] {
                continue;
            }
            let x = &h[of[s] * cols..(of[s] + 1) * cols];
            let ws = rows_bytes(w, data, r, 1);
            if let Err(e) = kiln_kernels::gemv(isa, w.ty, ws, w.row_bytes, cols, x, &mut y) {
                *err = Some(e);
                return;
            }
            if !y[0].is_finite() {
                *bad = true;
            } else if best.is_none_or(|(_, bv)| y[0] > bv) {
                // Ascending rows: `>` keeps the lowest id of equal logits.
                *best = Some((r, y[0]));
            }
        }
    });
    if let Some(e) = b.errs.iter_mut().find_map(Option::take) {
        return Err(kernel_err(w, e));
    }
    b.best.clear();
    b.best.resize(m, None);
    b.bad.clear();
    b.bad.resize(m, false);
    for task in b.slots.chunks_exact(m) {
        for (s, &(best, bad)) in task.iter().enumerate() {
            b.bad[s] |= bad;
            if let Some((r, v)) = best {
                // Tasks in ascending rows: `>` again keeps the lowest id.
                if b.best[s].is_none_or(|(_, bv)| v > bv) {
                    b.best[s] = Some((r, v));
                }
            }
        }
    }
    for s in 0..m {
        match b.best[s] {
            Some((index, value)) if !b.bad[s] && !floor[s].is_nan() => {
                out[b.of[s]] = RowMax {
                    index,
                    value,
                    non_finite: None,
                };
            }
            _ => todo.push(b.of[s]),
        }
    }
    Ok(())
}

/// The sampling head's picks over logits rows `[ids.len(), v]` (already
/// softcapped): row `j` with the `j`-th of `states` (its words updated in
/// place; None: the argmax, `u32::MAX` when a logit is NaN or +inf).
pub(crate) fn sample_ids(
    logits: &[f32],
    v: usize,
    states: &mut dyn Iterator<Item = Option<&mut crate::CpuBuf>>,
    ids: &mut [u32],
) -> Result<()> {
    let mut row = Vec::with_capacity(v);
    for (j, id) in ids.iter_mut().enumerate() {
        row.clear();
        row.extend_from_slice(&logits[j * v..(j + 1) * v]);
        *id = match states.next().flatten() {
            Some(st) => kiln_model::sample::sample_row(&mut row, st),
            None => kiln_model::sample::argmax_row(&row),
        };
    }
    Ok(())
}
