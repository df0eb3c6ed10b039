//! The greedy head of a batch: the argmax of several hidden rows against
//! the LM head, reading its rows once for all of them.
//!
//! Q8_0 heads go through `kiln_kernels::screen_rows_multi`: one integer
//! pass bounds every (vocab row, hidden row) logit; each task keeps the
//! pairs whose upper bound reaches its running best lower bound, and only
//! those that reach the global one are re-scored with the exact `gemv`, in
//! ascending vocab order, so every pick equals [`matmul::argmax`]'s. Other
//! types (and a hidden row the screen refuses) take the exact path.

use std::cell::RefCell;

use kiln_kernels::{Isa, KernelError, RowMax, ScreenX};
use kiln_model::Result;

use crate::matmul::{self, kernel_err, rows_bytes, rows_per_task};
use crate::par::{Par, SendPtr};
use crate::CpuWeight;

/// Vocab rows screened per kernel call inside a task: their bounds stay
/// in L1 while the candidates are picked out.
const SUB_ROWS: usize = 64;

thread_local! {
    /// The caller's buffers, grown once.
    static BATCH: RefCell<Batch> = RefCell::new(Batch::default());
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
}

/// `out[t]`: the greedy pick of hidden row `t` of `h` (`n` rows of
/// `w.cols`), as [`matmul::argmax`] finds it, non-finite logits included.
pub(crate) fn argmax_batch(
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
    if exact || !kiln_kernels::can_screen(w.ty) || w.rows == 0 {
        todo.extend(0..n);
    } else {
        BATCH.with(|b| screened(par, isa, w, h, &mut b.borrow_mut(), out, &mut todo))?;
    }
    for t in todo {
        out[t] = matmul::argmax(par, isa, w, &h[t * cols..(t + 1) * cols])?;
    }
    Ok(())
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
                let ws = rows_bytes(w, data, r0, nr);
                let hs = &mut hi[..nr * m];
                let r = kiln_kernels::screen_rows_multi(isa, w.ty, ws, w.row_bytes, sxs, hs, lo);
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
    if let Some(e) = b.errs.iter_mut().find_map(Option::take) {
        return Err(kernel_err(w, e));
    }
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
    b.best.clear();
    b.best.resize(m, None);
    b.bad.clear();
    b.bad.resize(m, false);
    let mut y = [0.0f32];
    for &(r, s, v) in b.cands[..tasks].iter().flatten() {
        let (r, s) = (r as usize, s as usize);
        if b.bad[s] || floor[s].is_nan() || v < floor[s] {
            continue;
        }
        let x = &h[b.of[s] * cols..(b.of[s] + 1) * cols];
        let ws = rows_bytes(w, data, r, 1);
        kiln_kernels::gemv(isa, w.ty, ws, w.row_bytes, cols, x, &mut y)
            .map_err(|e| kernel_err(w, e))?;
        if !y[0].is_finite() {
            b.bad[s] = true;
        } else if b.best[s].is_none_or(|(_, bv)| y[0] > bv) {
            // Ascending rows: `>` keeps the lowest id of equal logits.
            b.best[s] = Some((r, y[0]));
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
