//! The f32 tiled GEMM ([`Micro`]): packed weights are dequantized a block
//! of rows at a time into an f32 scratch and multiplied against the
//! activations by a register-blocked micro-kernel of `MR` rows × `NR`
//! tokens (vector dots along `k`, one horizontal sum per output).
//!
//! Blocking, for Zen 3 (32 KiB L1d, 512 KiB L2 per core): a block of up
//! to [`TILE`] f32 (24 rows × 1024 columns) sits in L2, and each token
//! panel (`NR` × `kc`) is swept across all the block's row slices, so the
//! panel is read from L1. Tried and dropped (no gain, or a loss, at 8-64
//! tokens): decoding the next block into a second buffer a packed block
//! at a time, inside the micro-kernel's loop (accumulator spills) or
//! between its calls; horizontal sums over four tokens at once.

use super::kern::{fill_rows, Fill, GemmShape, Out, Simd, Tiler};

/// f32 elements of one weight block: 96 KiB, in L2.
const TILE: usize = 24 * 1024;
/// Most columns per block.
const KC_MAX: usize = 1024;
const MAX_MR: usize = 8;

/// The f32 micro-kernel of `MR` rows × `NR` tokens.
#[derive(Clone, Copy)]
pub(super) struct Micro<const MR: usize, const NR: usize>;

impl<const MR: usize, const NR: usize> Tiler for Micro<MR, NR> {
    #[inline(always)]
    fn run<S: Simd>(self, s: S, sh: &GemmShape, w: &[u8], x: &[f32], y: Out<'_>, fill: &impl Fill) {
        let Out::Slice(y) = y else {
            unreachable!("shared outputs take the AMX path only")
        };
        gemm_tiles::<S, MR, NR>(s, sh, w, x, y, fill)
    }
}

/// Columns per block for rows of `k`: `k` split into equal parts of at
/// most [`KC_MAX`], each a whole number of `elems`-element blocks.
fn block_cols(k: usize, elems: usize) -> usize {
    let parts = k.div_ceil(KC_MAX);
    k.div_ceil(parts).next_multiple_of(elems).min(KC_MAX)
}

/// Cache-line alignment: a vector load that straddles two lines costs two.
#[repr(align(64))]
struct Aligned<T>(T);

/// Walks the blocks rows outer, columns inner: each is dequantized once
/// by `fill` into a stack scratch, then swept by the `MR × NR`
/// micro-kernel, tokens outermost. Partial sums over column blocks
/// accumulate in `y`.
#[inline(always)]
fn gemm_tiles<S: Simd, const MR: usize, const NR: usize>(
    s: S,
    sh: &GemmShape,
    w: &[u8],
    x: &[f32],
    y: &mut [f32],
    fill: &impl Fill,
) {
    const { assert!(MR <= MAX_MR && NR <= 8 && NR > 0) };
    let GemmShape {
        row_bytes,
        rows,
        k,
        n,
        ldy,
    } = *sh;
    let (elems, bytes) = fill.block();
    let kcb = block_cols(k, elems);
    let mcb = TILE / kcb / MR * MR;
    let mut tile = Aligned([0.0f32; TILE]);
    for r0 in (0..rows).step_by(mcb) {
        let mc = mcb.min(rows - r0);
        for k0 in (0..k).step_by(kcb) {
            let kc = kcb.min(k - k0);
            let tile = &mut tile.0[..mc.next_multiple_of(MR) * kc];
            // Padding rows: computed, never stored.
            fill_rows(fill, w, row_bytes, (r0, mc), (k0, kc), tile, kc, kc);
            let (nr0, nk0) = if k0 + kc < k {
                (r0, k0 + kc)
            } else {
                (r0 + mcb, 0)
            };
            let mut m = MicroArgs {
                kc,
                ldx: k,
                ldy,
                mc,
                first: k0 == 0,
                next: None,
            };
            let mut t0 = 0;
            while t0 < n {
                let nt = NR.min(n - t0);
                let xs = &x[t0 * k + k0..];
                let ys = &mut y[t0 * ldy + r0..];
                // The next block's packed bytes, fetched during the last
                // token panel: the weights of a batched decode step come
                // from DRAM, and the decoder stalled on them.
                if t0 + nt == n {
                    m.next = Some(Prefetch {
                        at: w
                            .as_ptr()
                            .wrapping_add(nr0 * row_bytes + nk0 / elems * bytes),
                        row_bytes,
                        bytes: kcb.min(k - nk0) / elems * bytes,
                        rows: mcb.min(rows.saturating_sub(nr0)),
                    });
                }
                match nt {
                    1 => panel::<S, MR, 1>(s, tile, xs, ys, &m),
                    2 => panel::<S, MR, 2>(s, tile, xs, ys, &m),
                    3 => panel::<S, MR, 3>(s, tile, xs, ys, &m),
                    4 => panel::<S, MR, 4>(s, tile, xs, ys, &m),
                    5 => panel::<S, MR, 5>(s, tile, xs, ys, &m),
                    6 => panel::<S, MR, 6>(s, tile, xs, ys, &m),
                    7 => panel::<S, MR, 7>(s, tile, xs, ys, &m),
                    _ => panel::<S, MR, 8>(s, tile, xs, ys, &m),
                }
                t0 += nt;
            }
        }
    }
}

/// Packed rows to prefetch: `rows` rows of `bytes` from `at`, `row_bytes`
/// apart.
#[derive(Clone, Copy)]
struct Prefetch {
    at: *const u8,
    row_bytes: usize,
    bytes: usize,
    rows: usize,
}

struct MicroArgs {
    kc: usize,
    ldx: usize,
    ldy: usize,
    /// Rows of the block that are real (the rest are zero padding).
    mc: usize,
    /// Whether this is the first column block (store, else accumulate).
    first: bool,
    /// Rows to prefetch, spread over the panel's row slices.
    next: Option<Prefetch>,
}

/// One token panel of `NT` tokens against every `MR`-row slice of the
/// block `tile` (rows of `kc`).
#[inline(always)]
fn panel<S: Simd, const MR: usize, const NT: usize>(
    s: S,
    tile: &[f32],
    x: &[f32],
    y: &mut [f32],
    m: &MicroArgs,
) {
    for (i, w) in tile.chunks_exact(MR * m.kc).enumerate() {
        let r0 = i * MR;
        if let Some(p) = m.next {
            for r in r0..(r0 + MR).min(p.rows) {
                let row = p.at.wrapping_add(r * p.row_bytes);
                // Rows start mid-line: one more line covers the last byte.
                for off in (0..p.bytes + 63).step_by(64) {
                    s.prefetch(row.wrapping_add(off));
                }
            }
        }
        micro::<S, MR, NT>(s, w, x, &mut y[r0..], MR.min(m.mc - r0), m);
    }
}

/// `MR × NT` dots over `kc` columns, `MR * NT` vector accumulators.
#[inline(always)]
fn micro<S: Simd, const MR: usize, const NT: usize>(
    s: S,
    tile: &[f32],
    x: &[f32],
    y: &mut [f32],
    mr: usize,
    m: &MicroArgs,
) {
    let MicroArgs {
        kc,
        ldx,
        ldy,
        first,
        ..
    } = *m;
    assert!(tile.len() >= MR * kc);
    assert!(x.len() >= (NT - 1) * ldx + kc);
    assert!(y.len() >= (NT - 1) * ldy + mr && mr <= MR);
    let main = kc / S::LANES * S::LANES;
    let (tp, xp) = (tile.as_ptr(), x.as_ptr());
    // acc[t][i]: token t, tile row i.
    let mut acc = [[s.zero(); MR]; NT];
    let mut kk = 0;
    while kk < main {
        // kk + LANES <= kc, and the asserts above keep row `i < MR` of the
        // tile and token `t < NT` of `x` within bounds below column kc.
        let mut wv = [s.zero(); MR];
        for (i, v) in wv.iter_mut().enumerate() {
            // SAFETY: as above.
            *v = unsafe { s.load_ptr(tp.add(i * kc + kk)) };
        }
        for (t, at) in acc.iter_mut().enumerate() {
            // SAFETY: as above.
            let xv = unsafe { s.load_ptr(xp.add(t * ldx + kk)) };
            for (a, &wi) in at.iter_mut().zip(&wv) {
                *a = s.fma(wi, xv, *a);
            }
        }
        kk += S::LANES;
    }
    for (t, at) in acc.iter().enumerate() {
        let mut sums = [0.0f32; MR];
        for (sum, a) in sums.chunks_mut(4).zip(at.chunks(4)) {
            if let Ok(a4) = <[S::F; 4]>::try_from(a) {
                sum.copy_from_slice(&s.hsum4(a4));
            } else {
                for (o, &v) in sum.iter_mut().zip(a) {
                    *o = s.hsum(v);
                }
            }
        }
        let yt = &mut y[t * ldy..][..mr];
        for (i, out) in yt.iter_mut().enumerate() {
            // Column tail when k % LANES != 0 (plain types only).
            let tail: f32 = (main..kc).map(|j| tile[i * kc + j] * x[t * ldx + j]).sum();
            let v = sums[i] + tail;
            *out = if first { v } else { *out + v };
        }
    }
}
