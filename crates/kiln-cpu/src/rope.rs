//! Rotary position embedding of the CPU backend: angles in f64, one
//! exact `sin_cos` per task, then a rotation by one position step per
//! token. A step's rotations are computed once per RoPE config and kept
//! in the step ([`RopeCache`]): every layer's queries and keys reuse them
//! (a batched decode step, whose rows are other sequences' positions,
//! otherwise paid 128 `sin_cos` per row in each of its 36 RoPE calls on
//! Gemma 3 270M, 1 ms of a 16-row step on Zen 4).

use std::cell::RefCell;
use std::sync::Mutex;

use kiln_model::RopeConfig;

use crate::par::Par;

thread_local! {
    /// A rotations task's running `(cos, sin)` per pair.
    static ROPE_CS: RefCell<Vec<(f64, f64)>> = const { RefCell::new(Vec::new()) };
    /// The caller's RoPE inverse frequencies with the `(cos, sin)` of one
    /// position step, and the config they are for.
    static ROPE_INV: RefCell<(Option<RopeConfig>, Vec<RopePair>)> = const { RefCell::new((None, Vec::new())) };
}

/// A step's `(cos, sin)` per (row, pair), per RoPE config seen since the
/// step was loaded: the first `live` tables; the rest keep their memory
/// for the next steps (a decode step allocates nothing).
#[derive(Debug, Default)]
pub(crate) struct RopeCache(Mutex<Tables>);

#[derive(Debug, Default)]
struct Tables {
    live: usize,
    tables: Vec<(RopeConfig, Vec<(f32, f32)>)>,
}

impl RopeCache {
    /// Forgets the tables (the step's positions changed).
    pub(crate) fn clear(&mut self) {
        self.0.get_mut().unwrap_or_else(|e| e.into_inner()).live = 0;
    }
}

/// Tokens per RoPE task (see [`rope`]).
const ROPE_TOKENS: usize = 16;

/// One RoPE pair: inverse frequency and the `(cos, sin)` of one position.
#[derive(Clone, Copy)]
struct RopePair {
    f: f64,
    cos: f64,
    sin: f64,
}

/// Rotates every head (`head_dim` values) of row `t` of `x` by position
/// `pos[t]`; `x` holds one row per position, `pos` the step's positions.
pub(crate) fn rope(
    par: &Par,
    x: &mut [f32],
    head_dim: usize,
    pos: &[u32],
    rope: &RopeConfig,
    cache: &RopeCache,
) {
    let row = x.len() / pos.len().max(1);
    let half = rope.n_rot / 2;
    if half == 0 {
        return;
    }
    let mut cached = cache.0.lock().unwrap_or_else(|e| e.into_inner());
    let Tables { live, tables } = &mut *cached;
    let at = match tables[..*live]
        .iter()
        .position(|(c, t)| c == rope && t.len() == pos.len() * half)
    {
        Some(at) => at,
        None => {
            if *live == tables.len() {
                tables.push((rope.clone(), Vec::new()));
            }
            let (c, t) = &mut tables[*live];
            c.clone_from(rope);
            rotations(par, pos, rope, t);
            *live += 1;
            *live - 1
        }
    };
    let table = &tables[at].1;
    par.chunks_mut(x, ROPE_TOKENS * row, |ci, block| {
        let t0 = ci * ROPE_TOKENS;
        for (j, r) in block.chunks_mut(row).enumerate() {
            let cs = &table[(t0 + j) * half..][..half];
            for h in r.chunks_mut(head_dim) {
                for (i, &(c, s)) in cs.iter().enumerate() {
                    let (a, b) = (h[i], h[i + half]);
                    h[i] = a * c - b * s;
                    h[i + half] = a * s + b * c;
                }
            }
        }
    });
}

/// `table`: `(cos, sin)` of every pair of `rope` at each of `pos`,
/// row-major.
fn rotations(par: &Par, pos: &[u32], rope: &RopeConfig, table: &mut Vec<(f32, f32)>) {
    let half = rope.n_rot / 2;
    // Per-pair inverse frequencies, in f64 (angles reach 1e5 radians),
    // computed once per RoPE config (a model has one or two).
    let inv = ROPE_INV.with(|c| {
        let mut c = c.borrow_mut();
        if c.0.as_ref() != Some(rope) || c.1.len() != half {
            c.1.clear();
            c.1.extend((0..half).map(|i| {
                let f = f64::from(rope.base).powf(-2.0 * i as f64 / rope.n_rot as f64)
                    * f64::from(rope.freq_scale);
                let f = match &rope.freq_factors {
                    Some(ff) => f / f64::from(ff.get(i).copied().unwrap_or(1.0)),
                    None => f,
                };
                let (sin, cos) = f.sin_cos();
                RopePair { f, cos, sin }
            }));
            c.0 = Some(rope.clone());
        }
        // Swapped out so the tasks can read it while other threads
        // keep their own cells; put back below.
        std::mem::take(&mut c.1)
    });
    table.clear();
    table.resize(pos.len() * half, (0.0, 0.0));
    // Each task takes the exact angles of its first token, then
    // rotates by one position step per token: f64 drifts ~1e-16 per
    // step, far below the f32 the values are stored in, and saves
    // ROPE_TOKENS - 1 of every ROPE_TOKENS `sin_cos` calls. A row that
    // does not follow its predecessor (the next sequence of a batch)
    // takes exact angles again.
    par.chunks_mut(table, ROPE_TOKENS * half, |ci, block| {
        let t0 = ci * ROPE_TOKENS;
        ROPE_CS.with(|cs| {
            let mut cs = cs.borrow_mut();
            for (j, r) in block.chunks_mut(half).enumerate() {
                let p = pos[t0 + j];
                if j == 0 || p != pos[t0 + j - 1].wrapping_add(1) {
                    cs.clear();
                    cs.extend(inv.iter().map(|pair| {
                        let (s, c) = (f64::from(p) * pair.f).sin_cos();
                        (c, s)
                    }));
                } else {
                    for ((c, s), p) in cs.iter_mut().zip(&inv) {
                        (*c, *s) = (*c * p.cos - *s * p.sin, *s * p.cos + *c * p.sin);
                    }
                }
                for (t, &(c, s)) in r.iter_mut().zip(cs.iter()) {
                    *t = (c as f32, s as f32);
                }
            }
        });
    });
    ROPE_INV.with(|c| c.borrow_mut().1 = inv);
}
