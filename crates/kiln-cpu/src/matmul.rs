//! Packed-weight products on `kiln_kernels`: decode rows through `gemv`,
//! batches through `gemm`, both split by output rows across the pool, so
//! every weight byte is read once per call.

use std::cell::RefCell;

use kiln_kernels::{Isa, QuantX, RowMax};
use kiln_model::{ModelError, Result};

use crate::par::{Par, SendPtr};
use crate::CpuWeight;

/// Tasks per thread: dynamic hand-out evens out a noisy, shared machine.
const TASKS_PER_THREAD: usize = 4;

/// Applied to each task's finished outputs (the LM head's softcap).
pub(crate) type Post<'a> = dyn Fn(&mut [f32]) + Sync + 'a;

thread_local! {
    /// Per-thread output block of a task, grown once.
    static BLOCK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Integer-GEMV planes of the last input's tokens and the f32 values
    /// they were made from: Q, K and V (and gate, up) share one input.
    static PLANES: RefCell<(Vec<f32>, Vec<QuantX>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// The greedy head's screen buffers.
    static SCREEN: RefCell<Screen> = RefCell::new(Screen::default());
}

/// Buffers of [`argmax_screened`], reused across decode steps.
#[derive(Default)]
struct Screen {
    sx: kiln_kernels::ScreenX,
    /// Upper bounds (one per vocab row).
    hi: Vec<f32>,
    /// Each chunk's best lower bound.
    parts: Vec<Option<std::result::Result<f32, kiln_kernels::KernelError>>>,
    /// A candidate's Q8_0 bytes, rebuilt from the coarse split.
    row: Vec<u8>,
    /// The rows to re-score, ascending.
    cands: Vec<u32>,
    /// `crate::coarse_head::narrow`'s buffers.
    refine: crate::coarse_head::Narrow,
}

/// A screen's floor: the largest of `floor` and the tasks' lower bounds
/// (`parts`, each taken: every task ran); None when one is NaN (a bound
/// was not finite: take the exact path).
pub(crate) fn best_floor<'a>(
    w: &CpuWeight,
    parts: impl Iterator<Item = &'a mut Option<std::result::Result<f32, kiln_kernels::KernelError>>>,
    mut floor: f32,
) -> Result<Option<f32>> {
    for p in parts {
        let m = p
            .take()
            .expect("every chunk ran")
            .map_err(|e| kernel_err(w, e))?;
        if m.is_nan() {
            return Ok(None);
        }
        floor = floor.max(m);
    }
    Ok(Some(floor))
}

pub(crate) fn kernel_err(w: &CpuWeight, e: kiln_kernels::KernelError) -> ModelError {
    ModelError::Backend(format!("{}: {e}", w.name))
}

/// Rows per task: about `TASKS_PER_THREAD` tasks per thread, at least
/// `min`, a multiple of 16 (the GEMM micro-kernel's row tiles).
pub(crate) fn rows_per_task(par: &Par, rows: usize, min: usize, max: usize) -> usize {
    let want = rows.div_ceil(par.threads() * TASKS_PER_THREAD);
    want.clamp(min, max).next_multiple_of(16)
}

/// Packed bytes of rows `r0..r0 + n` (the last row without padding).
pub(crate) fn rows_bytes<'a>(w: &CpuWeight, data: &'a [u8], r0: usize, n: usize) -> &'a [u8] {
    let packed = w.cols / w.ty.block_elems() * w.ty.block_bytes();
    &data[r0 * w.row_bytes..(r0 + n - 1) * w.row_bytes + packed]
}

/// `f` of the integer planes of the `n_tok` rows of `x` (`cols` each),
/// split on the pool once per distinct input (products sharing an input
/// reuse them, whichever integer kernel runs them); None when a row is
/// not finite (the f32 path reports it).
pub(crate) fn with_planes<R>(
    par: &Par,
    x: &[f32],
    n_tok: usize,
    cols: usize,
    f: impl FnOnce(&[QuantX]) -> R,
) -> Option<R> {
    PLANES.with(|p| {
        let (src, qxs) = &mut *p.borrow_mut();
        let x = &x[..n_tok * cols];
        if src.as_slice() != x {
            src.clear();
            if qxs.len() < n_tok {
                qxs.resize_with(n_tok, QuantX::new);
            }
            let ok = std::sync::atomic::AtomicBool::new(true);
            par.chunks_mut(&mut qxs[..n_tok], 1, |i, q| {
                if !q[0].set(&x[i * cols..(i + 1) * cols]) {
                    ok.store(false, std::sync::atomic::Ordering::Relaxed);
                }
            });
            if !ok.into_inner() {
                return None;
            }
            src.extend_from_slice(x);
        }
        Some(f(&qxs[..n_tok]))
    })
}

/// `f` of this thread's output block, at least `len` values (grown once).
pub(crate) fn with_block<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    BLOCK.with(|b| {
        let mut buf = b.borrow_mut();
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        f(&mut buf[..len])
    })
}

/// Copies the token rows of `yb` (`nr` values each) to columns `c0 .. c0
/// + nr` of rows `t0 ..` of `dst` (rows of `n_rows`).
///
/// # Safety
/// `dst` holds those rows, and no other thread writes these columns.
pub(crate) unsafe fn write_columns(
    dst: &SendPtr<f32>,
    n_rows: usize,
    c0: usize,
    t0: usize,
    yb: &[f32],
    nr: usize,
) {
    for (t, src) in yb.chunks_exact(nr).enumerate() {
        // SAFETY: the caller's contract.
        unsafe {
            let d = dst.get().add((t0 + t) * n_rows + c0);
            std::ptr::copy_nonoverlapping(src.as_ptr(), d, nr);
        }
    }
}

/// `out[t * n_rows + r] = post(dot(W[row0 + r], x[t]))`, `post` applied
/// per task while the outputs are in cache (the LM head's softcap).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    par: &Par,
    isa: Isa,
    w: &CpuWeight,
    row0: usize,
    n_rows: usize,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    post: Option<&Post<'_>>,
) -> Result<()> {
    if n_rows == 0 || n_tok == 0 {
        return Ok(());
    }
    // Decode-sized products on the tiles where they run (AMX keeps its
    // batched GEMM).
    let amx = n_tok > 1 && kiln_kernels::gemm_uses_amx(isa, n_tok);
    if !amx && crate::qtiles::matmul(par, isa, w, row0, n_rows, x, n_tok, out, post)? {
        return Ok(());
    }
    let data = w.data();
    let cols = w.cols;
    let err = std::sync::Mutex::new(None);
    if n_tok == 1 && kiln_kernels::has_gemv_q(isa, w.ty) {
        let done = with_planes(par, x, 1, cols, |qxs| {
            let qx = &qxs[0];
            let chunk = rows_per_task(par, n_rows, 16, 2048);
            par.chunks_mut(&mut out[..n_rows], chunk, |i, y| {
                let r0 = row0 + i * chunk;
                let ws = rows_bytes(w, data, r0, y.len());
                match kiln_kernels::gemv_q(isa, w.ty, ws, w.row_bytes, qx, y) {
                    Ok(_) => {
                        if let Some(f) = post {
                            f(y);
                        }
                    }
                    Err(e) => *err.lock().expect("error slot") = Some(e),
                }
            });
        })
        .is_some();
        if done {
            return match err.into_inner().expect("error slot") {
                Some(e) => Err(kernel_err(w, e)),
                None => Ok(()),
            };
        }
    }
    if n_tok == 1 {
        let chunk = rows_per_task(par, n_rows, 16, 2048);
        par.chunks_mut(&mut out[..n_rows], chunk, |i, y| {
            let r0 = row0 + i * chunk;
            let ws = rows_bytes(w, data, r0, y.len());
            match kiln_kernels::gemv(isa, w.ty, ws, w.row_bytes, cols, &x[..cols], y) {
                Ok(()) => {
                    if let Some(f) = post {
                        f(y);
                    }
                }
                Err(e) => *err.lock().expect("error slot") = Some(e),
            }
        });
    } else {
        let (tb, align) = kiln_kernels::gemm_blocking(isa, n_tok);
        let dst = SendPtr(out.as_mut_ptr());
        if kiln_kernels::gemm_uses_amx(isa, n_tok) && post.is_none() {
            // AMX: one task per thread, each packing its rows once and
            // writing its columns of `out` in place.
            let chunk = n_rows.div_ceil(par.threads()).next_multiple_of(align);
            let all_shared = std::sync::atomic::AtomicBool::new(true);
            par.run(n_rows.div_ceil(chunk), |i| {
                let c0 = i * chunk;
                let nr = chunk.min(n_rows - c0);
                let ws = rows_bytes(w, data, row0 + c0, nr);
                // SAFETY: `out` holds `n_tok * n_rows` values (checked by
                // the caller) and this task alone writes columns
                // `c0..c0 + nr` of every token row.
                let r = unsafe {
                    kiln_kernels::gemm_shared(
                        isa,
                        w.ty,
                        ws,
                        w.row_bytes,
                        cols,
                        &x[..n_tok * cols],
                        n_tok,
                        dst.get().add(c0),
                        n_rows,
                    )
                };
                match r {
                    Ok(true) => {}
                    Ok(false) => all_shared.store(false, std::sync::atomic::Ordering::Relaxed),
                    Err(e) => *err.lock().expect("error slot") = Some(e),
                }
            });
            if all_shared.into_inner() {
                return match err.into_inner().expect("error slot") {
                    Some(e) => Err(kernel_err(w, e)),
                    None => Ok(()),
                };
            }
        }
        let chunk = rows_per_task(par, n_rows, 16, 256);
        par.run(n_rows.div_ceil(chunk), |i| {
            let c0 = i * chunk;
            let nr = chunk.min(n_rows - c0);
            let ws = rows_bytes(w, data, row0 + c0, nr);
            with_block(tb * nr, |buf| {
                for t0 in (0..n_tok).step_by(tb) {
                    let nt = tb.min(n_tok - t0);
                    let xs = &x[t0 * cols..(t0 + nt) * cols];
                    let yb = &mut buf[..nt * nr];
                    let r = kiln_kernels::gemm(isa, w.ty, ws, w.row_bytes, cols, xs, nt, yb, nr);
                    if let Err(e) = r {
                        *err.lock().expect("error slot") = Some(e);
                        return;
                    }
                    if let Some(f) = post {
                        f(yb);
                    }
                    // SAFETY: `out` holds `n_tok * n_rows` values (checked
                    // by the caller) and this task alone writes columns
                    // `c0..c0 + nr` of every token row.
                    unsafe { write_columns(&dst, n_rows, c0, t0, yb, nr) };
                }
            });
        });
    }
    match err.into_inner().expect("error slot") {
        Some(e) => Err(kernel_err(w, e)),
        None => Ok(()),
    }
}

/// Greedy LM head: the best row of `W · h` (ties: lowest id) and the
/// lowest row whose logit is not finite, over row chunks in parallel.
pub(crate) fn argmax(par: &Par, isa: Isa, w: &CpuWeight, h: &[f32]) -> Result<RowMax> {
    let data = w.data();
    let chunk = rows_per_task(par, w.rows, 256, 4096);
    let n = w.rows.div_ceil(chunk);
    let mut parts: Vec<Option<std::result::Result<RowMax, kiln_kernels::KernelError>>> =
        vec![None; n];
    par.chunks_mut(&mut parts, 1, |i, slot| {
        let r0 = i * chunk;
        let nr = chunk.min(w.rows - r0);
        let ws = rows_bytes(w, data, r0, nr);
        slot[0] = Some(kiln_kernels::argmax_rows_checked(
            isa,
            w.ty,
            ws,
            w.row_bytes,
            w.cols,
            &h[..w.cols],
            r0,
        ));
    });
    let mut best: Option<RowMax> = None;
    // Chunks in row order: keeping the first of equal values and the first
    // non-finite row gives the lowest ids.
    for p in parts {
        let m = p.expect("every chunk ran").map_err(|e| kernel_err(w, e))?;
        best = Some(match best {
            None => m,
            Some(b) => RowMax {
                index: if m.value > b.value { m.index } else { b.index },
                value: if m.value > b.value { m.value } else { b.value },
                non_finite: b.non_finite.or(m.non_finite),
            },
        });
    }
    best.ok_or_else(|| ModelError::Backend(format!("argmax over {}: no rows", w.name)))
}

/// Exact greedy head through the integer screen (`kiln_kernels::ScreenX`):
/// one int8 pass over every row bounds each logit, then only rows that can
/// reach the best lower bound are re-scored with the same `gemv` as
/// [`argmax`], so the pick is identical. `None` when the screen does not
/// apply (type, non-finite `h` or bounds): the caller runs [`argmax`].
///
/// Where the coarse screen has a SIMD form (VBMI, or AVX2) the pass
/// reads the head's coarse split (`kiln_kernels::CoarseRows`: 26 bytes
/// per block of 32 instead of 34, made on the first call, after
/// which the file's rows are handed back to the OS) and re-scores
/// candidates from its exact rebuild of their rows. Its bounds are looser
/// (~150 candidates of 262,144 on the real 270M against ~10); on Zen 4,
/// real 270M, the head took 3.6-3.7 ms against 4.1 at 2 threads (decode
/// 132 against 112-125 tok/s), 7.1-7.8 against 7.9-8.1 at one.
/// `KILN_HEAD_SCREEN=q8_0|coarse` forces one form (`coarse` on any level:
/// elsewhere the portable form, slower than the Q8_0 screen).
pub(crate) fn argmax_screened(
    par: &Par,
    isa: Isa,
    w: &CpuWeight,
    h: &[f32],
) -> Result<Option<RowMax>> {
    if !kiln_kernels::can_screen(w.ty) || w.rows == 0 {
        return Ok(None);
    }
    let x = &h[..w.cols];
    let data = w.data();
    let chunk = rows_per_task(par, w.rows, 256, 4096);
    let n = w.rows.div_ceil(chunk);
    SCREEN.with(|b| {
        // Grown once: a decode step allocates nothing here.
        let Screen {
            sx,
            hi,
            parts,
            row,
            cands,
            refine,
        } = &mut *b.borrow_mut();
        if !sx.set(x) {
            return Ok(None);
        }
        let sx = &*sx;
        hi.resize(w.rows, 0.0);
        parts.clear();
        parts.resize(n, None);
        let parts_ptr = SendPtr(parts.as_mut_ptr());
        let coarse = crate::coarse_head::rows(par, isa, w);
        par.chunks_mut(&mut hi[..], chunk, |i, hs| {
            let r = match coarse {
                Some(c) => kiln_kernels::screen_coarse_rows(isa, c, i * chunk, sx, hs),
                None => {
                    let ws = rows_bytes(w, data, i * chunk, hs.len());
                    kiln_kernels::screen_rows(isa, w.ty, ws, w.row_bytes, sx, hs)
                }
            };
            // SAFETY: `chunks_mut` hands out each chunk index once and
            // `parts` has one slot per chunk.
            unsafe { *parts_ptr.get().add(i) = Some(r) };
        });
        let Some(mut floor) = best_floor(w, parts.iter_mut(), f32::NEG_INFINITY)? else {
            return Ok(None);
        };
        // Sized for every row once: no later step allocates.
        cands.reserve(w.rows.saturating_sub(cands.len()));
        cands.clear();
        let rows = hi.iter().enumerate().filter(|&(_, &v)| v >= floor);
        cands.extend(rows.map(|(r, _)| r as u32));
        if let Some(c) = coarse {
            if !crate::coarse_head::narrow(par, isa, w, c, sx, &mut floor, cands, refine)? {
                return Ok(None);
            }
        }
        let mut best: Option<(usize, f32)> = None;
        let mut y = [0.0f32];
        for r in cands.iter().map(|&r| r as usize) {
            let ws = crate::coarse_head::row(isa, w, data, r, row)?;
            kiln_kernels::gemv(isa, w.ty, ws, w.row_bytes, w.cols, x, &mut y)
                .map_err(|e| kernel_err(w, e))?;
            if !y[0].is_finite() {
                // The exact path reports the lowest such row.
                return Ok(None);
            }
            // Ascending rows: `>` keeps the lowest id of equal logits.
            if best.is_none_or(|(_, v)| y[0] > v) {
                best = Some((r, y[0]));
            }
        }
        Ok(best.map(|(index, value)| RowMax {
            index,
            value,
            non_finite: None,
        }))
    })
}
