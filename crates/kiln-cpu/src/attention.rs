//! Causal attention on `kiln_kernels::{dot_rows, axpy_rows}`.
//!
//! A task takes a block of query tokens and, per KV head, all their query
//! heads (GQA group × tokens): every K/V row loaded serves all of them,
//! which matters for long prefills, where each token would otherwise
//! stream the whole cache from L3. Keys come as at most three contiguous
//! runs (cache ring before / after its wrap, current chunk) cut into
//! blocks; softmax is online across blocks, per-query causal and window
//! bounds are masks. Decode (one token) instead splits the keys across
//! threads and merges the partial softmaxes.

use std::cell::RefCell;

use kiln_kernels::Isa;
use kiln_model::{AttnParams, ModelError, PastKv, Result};

use crate::par::{Par, SendPtr};
use crate::{check, CpuBackend, CpuBuf};

/// Query tokens per prefill task.
const TOKEN_BLOCK: usize = 16;
/// Keys scored at a time: the block's K/V rows stay in L2 while every
/// query of the task uses them, and the scores stay small.
const KEY_BLOCK: usize = 256;
/// Fewest queries whose scores take the GEMM (keys as F32 weight rows)
/// instead of the strided-row dots: a prefill task's 16 tokens x query
/// heads. On Zen 4 (270M, pp512, 2 threads) attention went from 98.7 to
/// 85.0 ms on `avx2` (prefill 688 -> 719 tok/s); decode rows (a lone
/// token's few heads) keep the dots.
const GEMM_QUERIES: usize = 8;
/// Fewest keys a decode split gets: below this the merge and fork cost
/// more than they save.
const MIN_SPLIT_KEYS: usize = 256;

#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    q: Vec<f32>,
    acc: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    vis: Vec<(usize, usize)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// Decode split partials of the calling thread.
    static PARTS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Cached K/V before `p0`: position `pos` lives in row `pos % rows`.
#[derive(Clone, Copy)]
pub(crate) struct Past<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub start: usize,
    pub rows: usize,
}

/// Sequences of an `attention_batch` call checked and run together.
const BATCH_GROUP: usize = 64;

/// One sequence's attention call, its shapes checked against the
/// buffers.
#[derive(Clone, Copy)]
pub(crate) struct Seq<'a> {
    past: Option<Past<'a>>,
    p: &'a AttnParams,
}

impl<'a> Seq<'a> {
    /// The backend's `attention` arguments, checked: every row the call
    /// reads or writes lies inside its buffer.
    pub(crate) fn checked(
        q: &CpuBuf,
        cur_k: &CpuBuf,
        cur_v: &CpuBuf,
        past: Option<PastKv<'a, CpuBackend>>,
        p: &'a AttnParams,
        out: &CpuBuf,
    ) -> Result<Seq<'a>> {
        let hd = p.head_dim;
        let qd = p.n_head * hd;
        let kvd = p.n_kv_head * hd;
        let end = p.row0 + p.n_tok;
        check("attention q", end * qd, q.len())?;
        check("attention k", end * kvd, cur_k.len())?;
        check("attention v", end * kvd, cur_v.len())?;
        check("attention out", end * qd, out.len())?;
        if let Some(pk) = &past {
            let held = p.p0 - pk.start.min(p.p0);
            if held > pk.rows || pk.k.len() < pk.rows * kvd || pk.v.len() < pk.rows * kvd {
                return Err(ModelError::Backend(format!(
                    "attention: cache of {} rows cannot hold positions {}..{}",
                    pk.rows, pk.start, p.p0
                )));
            }
        }
        if p.n_kv_head == 0 || !p.n_head.is_multiple_of(p.n_kv_head) {
            return Err(ModelError::Backend(format!(
                "attention: {} heads do not group over {} KV heads",
                p.n_head, p.n_kv_head
            )));
        }
        let past = past.map(|pk| Past {
            k: &pk.k[..],
            v: &pk.v[..],
            start: pk.start,
            rows: pk.rows,
        });
        Ok(Seq { past, p })
    }

    /// Runs the call, writing its rows of `out`.
    ///
    /// # Safety
    /// `out` points at the buffer `checked` saw, and nothing else reads or
    /// writes this sequence's rows of it during the call.
    pub(crate) unsafe fn run(
        &self,
        par: &Par,
        isa: Isa,
        q: &[f32],
        cur_k: &[f32],
        cur_v: &[f32],
        out: *mut f32,
    ) {
        let p = self.p;
        let (qd, kvd) = (p.n_head * p.head_dim, p.n_kv_head * p.head_dim);
        let (r0, r1) = (p.row0, p.row0 + p.n_tok);
        // SAFETY: rows r0..r1 of `out` are inside it (checked) and this
        // call's alone (the caller's contract).
        let out = unsafe { std::slice::from_raw_parts_mut(out.add(r0 * qd), (r1 - r0) * qd) };
        attention(
            par,
            isa,
            &q[r0 * qd..r1 * qd],
            &cur_k[r0 * kvd..r1 * kvd],
            &cur_v[r0 * kvd..r1 * kvd],
            self.past.as_ref(),
            p,
            out,
        );
    }
}

/// The backend's `attention_batch`: the sequences with one query row (a
/// decode step's) run side by side, one per task, instead of one after
/// another on a single thread each (a lone query over fewer than
/// [`MIN_SPLIT_KEYS`] keys is one task); the inner fork/joins of those
/// tasks run inline, with the key splits a lone call would make, so every
/// row gets the same arithmetic either way. Longer chunks (prefill) run
/// one after another, each across the pool.
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch<'c, 'p>(
    par: &Par,
    isa: Isa,
    q: &CpuBuf,
    cur_k: &CpuBuf,
    cur_v: &CpuBuf,
    pasts: &mut dyn Iterator<Item = Option<PastKv<'c, CpuBackend>>>,
    params: &'p [AttnParams],
    out: &mut CpuBuf,
) -> Result<()> {
    let dst = SendPtr(out.as_mut_ptr());
    // Sequences in groups on the stack: a decode step allocates nothing.
    let mut done = 0;
    for group in params.chunks(BATCH_GROUP) {
        let mut seqs: [Option<Seq<'_>>; BATCH_GROUP] = [None; BATCH_GROUP];
        let mut lone = [0u8; BATCH_GROUP];
        let mut n_lone = 0;
        for (i, p) in group.iter().enumerate() {
            let Some(past) = pasts.next() else {
                return Err(ModelError::Backend(format!(
                    "attention of {} sequences given {} caches",
                    params.len(),
                    done + i
                )));
            };
            let s = Seq::checked(q, cur_k, cur_v, past, p, out)?;
            if p.n_tok == 1 {
                lone[n_lone] = i as u8;
                n_lone += 1;
            }
            seqs[i] = Some(s);
        }
        done += group.len();
        let run = |i: usize| {
            if let Some(s) = &seqs[i] {
                // SAFETY: `dst` is `out`, borrowed mutably for the call;
                // each sequence's rows are its own (the model gives every
                // sequence of a step distinct rows) and each runs once.
                unsafe { s.run(par, isa, q, cur_k, cur_v, dst.get()) };
            }
        };
        par.run(n_lone, |j| run(usize::from(lone[j])));
        for (i, p) in group.iter().enumerate() {
            if p.n_tok != 1 {
                run(i);
            }
        }
    }
    Ok(())
}

/// `n` consecutive key rows (row `j` at `k[j * kvd..]`) for positions
/// `pos..pos + n`.
#[derive(Clone, Copy)]
struct Run<'a> {
    k: &'a [f32],
    v: &'a [f32],
    n: usize,
    pos: usize,
}

/// First key position a query at `pos` sees.
fn lo_of(p: &AttnParams, pos: usize) -> usize {
    p.window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// Key runs covering positions `lo..=hi` (as far as they exist), in order.
fn runs<'a>(
    past: Option<&Past<'a>>,
    cur_k: &'a [f32],
    cur_v: &'a [f32],
    p: &AttnParams,
    (lo, hi): (usize, usize),
    kvh: usize,
) -> ([Run<'a>; 3], usize) {
    let (hd, kvd) = (p.head_dim, p.n_kv_head * p.head_dim);
    let empty = Run {
        k: &[],
        v: &[],
        n: 0,
        pos: 0,
    };
    let mut out = [empty; 3];
    let mut n = 0;
    let mut push = |k: &'a [f32], v: &'a [f32], row: usize, len: usize, pos: usize| {
        if len > 0 {
            let off = row * kvd + kvh * hd;
            out[n] = Run {
                k: &k[off..],
                v: &v[off..],
                n: len,
                pos,
            };
            n += 1;
        }
    };
    if let Some(pk) = past {
        let a = lo.max(pk.start);
        if a < p.p0 {
            let row = a % pk.rows;
            let first = (p.p0 - a).min(pk.rows - row);
            push(pk.k, pk.v, row, first, a);
            push(pk.k, pk.v, 0, p.p0 - a - first, a + first);
        }
    }
    let a = lo.max(p.p0);
    push(cur_k, cur_v, a - p.p0, hi + 1 - a, a);
    (out, n)
}

/// `sc[i * n + j] = dot(q[i], K[j])` for `nq` queries and `n` key rows
/// (`K[j]` at `k[j * kvd..]`, `hd` values). Prefill batches multiply the
/// keys as F32 weight rows in the GEMM (on AMX tiles where it takes
/// them); a few queries run the strided-row dots.
#[allow(clippy::too_many_arguments)]
fn scores(
    isa: Isa,
    q: &[f32],
    nq: usize,
    k: &[f32],
    kvd: usize,
    hd: usize,
    n: usize,
    sc: &mut [f32],
) {
    if kiln_kernels::gemm_uses_amx(isa, nq) || (nq >= GEMM_QUERIES && isa != Isa::Scalar) {
        let k = &k[..(n - 1) * kvd + hd];
        // SAFETY: any f32 is 4 valid bytes, and `u8` needs no alignment.
        let w = unsafe { std::slice::from_raw_parts(k.as_ptr().cast::<u8>(), 4 * k.len()) };
        kiln_kernels::gemm(
            isa,
            kiln_quant::GgmlType::F32,
            w,
            4 * kvd,
            hd,
            &q[..nq * hd],
            nq,
            sc,
            n,
        )
        .expect("attention shapes checked");
    } else {
        kiln_kernels::dot_rows(isa, q, nq, k, kvd, n, sc).expect("attention shapes checked");
    }
}

/// Folds keys `skip..skip + take` (counted across `runs`) into the
/// online-softmax state of `nq = vis.len()` queries `q[i * hd..]`: running
/// max `m`, normaliser `l`, unnormalised output `acc[i * hd..]`. Query `i`
/// sees key positions `vis[i].0..=vis[i].1`.
#[allow(clippy::too_many_arguments)]
fn fold(
    isa: Isa,
    q: &[f32],
    vis: &[(usize, usize)],
    runs: &[Run<'_>],
    mut skip: usize,
    mut take: usize,
    p: &AttnParams,
    m: &mut [f32],
    l: &mut [f32],
    acc: &mut [f32],
    sc: &mut Vec<f32>,
) {
    let (nq, hd, kvd) = (vis.len(), p.head_dim, p.n_kv_head * p.head_dim);
    for r in runs {
        if skip >= r.n {
            skip -= r.n;
            continue;
        }
        let end = skip.saturating_add(take).min(r.n);
        take -= end - skip;
        for j0 in (skip..end).step_by(KEY_BLOCK) {
            let n = KEY_BLOCK.min(end - j0);
            let pos0 = r.pos + j0;
            let (k, v) = (&r.k[j0 * kvd..], &r.v[j0 * kvd..]);
            sc.resize(nq * n, 0.0);
            scores(isa, q, nq, k, kvd, hd, n, sc);
            for (i, &(lo, hi)) in vis.iter().enumerate() {
                let s = &mut sc[i * n..(i + 1) * n];
                let a = lo.saturating_sub(pos0).min(n);
                let b = (hi + 1).saturating_sub(pos0).min(n);
                if a >= b {
                    s.fill(0.0);
                    continue;
                }
                let (mx, sum) =
                    kiln_kernels::softmax_step(isa, &mut s[a..b], p.scale, p.softcap, m[i]);
                if mx > m[i] {
                    // exp(-inf) = 0 clears the empty initial state.
                    let corr = (m[i] - mx).exp();
                    l[i] *= corr;
                    acc[i * hd..(i + 1) * hd]
                        .iter_mut()
                        .for_each(|x| *x *= corr);
                    m[i] = mx;
                }
                // A NaN max fails `>` above and poisons `l`: NaN output.
                l[i] += sum;
                s[..a].fill(0.0);
                s[b..].fill(0.0);
            }
            kiln_kernels::axpy_rows(isa, sc, nq, v, kvd, n, acc).expect("attention shapes checked");
        }
        skip = 0;
        if take == 0 {
            break;
        }
    }
}

/// `out [n_tok, n_head * hd]`; shapes were checked by the caller.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    par: &Par,
    isa: Isa,
    q: &[f32],
    cur_k: &[f32],
    cur_v: &[f32],
    past: Option<&Past<'_>>,
    p: &AttnParams,
    out: &mut [f32],
) {
    let (hd, nkv) = (p.head_dim, p.n_kv_head);
    let g = p.n_head / nkv;
    let (qd, gd) = (p.n_head * hd, g * hd);
    let last = p.p0 + p.n_tok - 1;
    let span = last + 1 - lo_of(p, last).max(past.map_or(p.p0, |pk| pk.start.min(p.p0)));
    let splits = if p.n_tok * nkv >= par.threads() {
        1
    } else {
        (par.threads() * 2 / (p.n_tok * nkv))
            .min(span / MIN_SPLIT_KEYS)
            .max(1)
    };
    if splits == 1 {
        par.chunks_mut(&mut out[..p.n_tok * qd], TOKEN_BLOCK * qd, |bi, o| {
            let t0 = bi * TOKEN_BLOCK;
            let tb = o.len() / qd;
            let nq = tb * g;
            SCRATCH.with(|cell| {
                let sc = &mut *cell.borrow_mut();
                sc.vis.clear();
                for t in t0..t0 + tb {
                    let pos = p.p0 + t;
                    sc.vis.extend(std::iter::repeat_n((lo_of(p, pos), pos), g));
                }
                let range = (lo_of(p, p.p0 + t0), p.p0 + t0 + tb - 1);
                for kvh in 0..nkv {
                    sc.q.clear();
                    for t in t0..t0 + tb {
                        sc.q.extend_from_slice(&q[t * qd + kvh * gd..][..gd]);
                    }
                    sc.m.clear();
                    sc.m.resize(nq, f32::NEG_INFINITY);
                    sc.l.clear();
                    sc.l.resize(nq, 0.0);
                    sc.acc.clear();
                    sc.acc.resize(nq * hd, 0.0);
                    let (rs, nr) = runs(past, cur_k, cur_v, p, range, kvh);
                    fold(
                        isa,
                        &sc.q,
                        &sc.vis,
                        &rs[..nr],
                        0,
                        usize::MAX,
                        p,
                        &mut sc.m,
                        &mut sc.l,
                        &mut sc.acc,
                        &mut sc.scores,
                    );
                    for (i, a) in sc.acc.chunks(hd).enumerate() {
                        let (ti, h) = (i / g, i % g);
                        let inv = 1.0 / sc.l[i];
                        let dst = &mut o[ti * qd + kvh * gd + h * hd..][..hd];
                        dst.iter_mut().zip(a).for_each(|(x, &y)| *x = y * inv);
                    }
                }
            });
        });
        return;
    }
    // Few tokens: split keys; partial (m, l, acc) per (item, split).
    let items = p.n_tok * nkv;
    let part = 2 * g + gd;
    // The caller's partials buffer, reused across calls (no allocation per
    // decode step); put back at the end.
    let mut parts = PARTS.with(|c| std::mem::take(&mut *c.borrow_mut()));
    parts.clear();
    parts.resize(items * splits * part, 0.0);
    par.chunks_mut(&mut parts, part, |i, pp| {
        let (idx, s) = (i / splits, i % splits);
        let (t, kvh) = (idx / nkv, idx % nkv);
        let pos = p.p0 + t;
        let (rs, nr) = runs(past, cur_k, cur_v, p, (lo_of(p, pos), pos), kvh);
        let total: usize = rs[..nr].iter().map(|r| r.n).sum();
        let (a, b) = (total * s / splits, total * (s + 1) / splits);
        let (ml, acc) = pp.split_at_mut(2 * g);
        let (m, l) = ml.split_at_mut(g);
        m.fill(f32::NEG_INFINITY);
        let qg = &q[t * qd + kvh * gd..][..gd];
        SCRATCH.with(|cell| {
            let Scratch { scores, vis, .. } = &mut *cell.borrow_mut();
            vis.clear();
            vis.resize(g, (lo_of(p, pos), pos));
            fold(isa, qg, vis, &rs[..nr], a, b - a, p, m, l, acc, scores);
        });
    });
    for (idx, o) in out[..items * gd].chunks_mut(gd).enumerate() {
        let ps = &parts[idx * splits * part..(idx + 1) * splits * part];
        for h in 0..g {
            let mx = ps
                .chunks(part)
                .map(|pp| pp[h])
                .fold(f32::NEG_INFINITY, f32::max);
            let oh = &mut o[h * hd..(h + 1) * hd];
            oh.fill(0.0);
            let mut l = 0.0f32;
            for pp in ps.chunks(part) {
                if pp[h] == f32::NEG_INFINITY {
                    continue; // an empty split
                }
                let w = (pp[h] - mx).exp();
                l += w * pp[g + h];
                let acc = &pp[2 * g + h * hd..2 * g + (h + 1) * hd];
                oh.iter_mut().zip(acc).for_each(|(x, &a)| *x += w * a);
            }
            let inv = 1.0 / l;
            oh.iter_mut().for_each(|x| *x *= inv);
        }
    }
    PARTS.with(|c| *c.borrow_mut() = parts);
}
