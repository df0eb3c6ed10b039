//! Integer screening for an exact greedy head over Q8_0 rows.
//!
//! `x` is quantized like a Q8_0 row (blocks of 32, `d_b = absmax / 127`).
//! For row `r` with block scales `dw_b` the screen computes
//! `a_r = Σ_b dw_b · d_b · Σ_i qw_i · qx_i` (integer inner sums) and a bound
//! `β_r = Σ_b |dw_b| · c_b` with
//! `c_b = 128·√32·‖e_b‖₂ + γ·128·(‖x_b‖₁ + ‖x̂_b‖₁)`, `e = x − x̂`.
//! The first term is block-wise Cauchy–Schwarz on `Σ wq_i e_i` with
//! `‖qw_b‖₂ ≤ 128·√32` (no per-row precompute, one FMA per block); the
//! second covers the f32 rounding of both `a_r` and the exact kernel's dot
//! (each below `γ · Σ|w_i x_i|`). So the exact logit lies in
//! `[a_r − β_r, a_r + β_r]` and only rows with `a_r + β_r ≥ max(a − β)`
//! can be (or tie) the argmax.

/// Relative rounding slack: the exact kernels and the screen each sum at
/// most a few hundred f32 terms per row (scalar reference: `k` in order),
/// far below `γ` for the row lengths of a model's LM head.
pub(crate) const GAMMA: f64 = 2e-4;

/// Q8_0-quantized activations with the per-block bound terms, laid out per
/// 4-byte lane (8 lanes per block) for the SIMD screens.
#[derive(Clone, Debug, Default)]
pub struct ScreenX {
    pub(crate) k: usize,
    /// `x̂ / d`, `k` values in `[-127, 127]`.
    pub(crate) q: Vec<i8>,
    /// `d_b` per block.
    pub(crate) d: Vec<f32>,
    /// `c_b` per block.
    pub(crate) c: Vec<f32>,
    /// Per lane (`k / 4`): `d_b` and `c_b / 8`.
    pub(crate) lane_d: Vec<f32>,
    pub(crate) lane_c: Vec<f32>,
    /// Per block, what the VNNI screen's inner loop reads, behind one
    /// pointer per activation row.
    pub(crate) vnni: Vec<VnniBlock>,
    /// Per block, for the screen of [`crate::CoarseRows`]: its bound term
    /// `c'_b` and its offset `−126.5 · d_b · Σ q` (see `crate::coarse`).
    pub(crate) coarse_c: Vec<f32>,
    pub(crate) coarse_off: Vec<f32>,
}

/// One block of [`ScreenX`] for the VNNI screen.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct VnniBlock {
    /// The block's `q`.
    pub(crate) q: [i8; 32],
    /// `−128 · Σ q` (the VNNI screen sums `(w + 128) · q` from there,
    /// which leaves `Σ w · q`).
    pub(crate) qsum: i32,
    /// `d_b`.
    pub(crate) d: f32,
}

impl ScreenX {
    /// `None` when `x` holds a non-finite value or is not whole blocks of
    /// 32 (the caller then takes the exact path).
    pub fn new(x: &[f32]) -> Option<ScreenX> {
        let mut sx = ScreenX::default();
        sx.set(x).then_some(sx)
    }

    /// [`ScreenX::new`] into existing buffers (no allocation once they
    /// have grown); `false` (and left empty) where `new` gives `None`.
    pub fn set(&mut self, x: &[f32]) -> bool {
        self.k = 0;
        self.q.clear();
        self.d.clear();
        self.c.clear();
        self.lane_d.clear();
        self.lane_c.clear();
        self.vnni.clear();
        self.coarse_c.clear();
        self.coarse_off.clear();
        if !x.len().is_multiple_of(32) || x.iter().any(|v| !v.is_finite()) {
            return false;
        }
        let sx = self;
        for xb in x.chunks_exact(32) {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let (mut e2, mut l1x, mut l1h) = (0.0f64, 0.0f64, 0.0f64);
            for &v in xb {
                let q = (v * inv).round().clamp(-127.0, 127.0) as i8;
                sx.q.push(q);
                // f64 holds `d · q` exactly (11 + 24 bits).
                let xh = f64::from(d) * f64::from(q);
                let e = f64::from(v) - xh;
                e2 += e * e;
                l1x += f64::from(v).abs();
                l1h += xh.abs();
            }
            // Rounded up: the f64 sums are off by far less than 1e-6.
            let ce = 128.0 * 32f64.sqrt() * e2.sqrt() * (1.0 + 1e-6);
            let c = ce + GAMMA * 128.0 * (l1x + l1h);
            let c = c as f32 * (1.0 + 1e-6);
            let cc = crate::coarse::bound_term(ce, l1x, l1h);
            sx.coarse_c.push(cc);
            sx.d.push(d);
            sx.c.push(c);
            sx.lane_d.extend([d; 8]);
            sx.lane_c.extend([c / 8.0; 8]);
        }
        let blocks = sx.q.chunks_exact(32).zip(&sx.d).map(|(b, &d)| VnniBlock {
            q: b.try_into().expect("blocks of 32"),
            qsum: -128 * b.iter().map(|&q| i32::from(q)).sum::<i32>(),
            d,
        });
        sx.vnni.extend(blocks);
        let offs = sx.q.chunks_exact(32).zip(&sx.d).map(|(b, &d)| {
            let sum: i32 = b.iter().map(|&q| i32::from(q)).sum();
            crate::coarse::offset_term(d, sum)
        });
        sx.coarse_off.extend(offs);
        sx.k = x.len();
        true
    }

    /// Row length the screen was built for.
    pub fn len(&self) -> usize {
        self.k
    }

    pub fn is_empty(&self) -> bool {
        self.k == 0
    }
}

/// Tiny absolute slack: products of tiny scales may underflow.
pub(crate) const ABS_SLACK: f32 = 1e-30;

/// Portable screen: `hi[r] = a_r + β_r`; returns `max_r (a_r − β_r)`, NaN
/// when any bound is not finite.
pub(crate) fn screen_q8_0(sx: &ScreenX, w: &[u8], row_bytes: usize, hi: &mut [f32]) -> f32 {
    let nb = sx.k / 32;
    let mut max_lo = f32::NEG_INFINITY;
    for (r, h) in hi.iter_mut().enumerate() {
        let row = &w[r * row_bytes..][..nb * 34];
        let (mut a, mut b) = (0.0f32, 0.0f32);
        for (bi, blk) in row.chunks_exact(34).enumerate() {
            let dw = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            let qx = &sx.q[bi * 32..][..32];
            let s: i32 = blk[2..]
                .iter()
                .zip(qx)
                .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
                .sum();
            a += dw * (sx.d[bi] * s as f32);
            b += dw.abs() * sx.c[bi];
        }
        let b = b + ABS_SLACK;
        *h = a + b;
        max_lo = fold_lo(max_lo, a - b, *h);
    }
    max_lo
}

/// Portable multi-row screen: for weight row `r` and activation row `t`
/// (of `n = sxs.len()`), `hi[r * n + t] = a + β` as [`screen_q8_0`]
/// computes it for `sxs[t]`, and `lo[t]` folds in `a − β`.
pub(crate) fn screen_q8_0_multi(
    sxs: &[ScreenX],
    w: &[u8],
    row_bytes: usize,
    hi: &mut [f32],
    lo: &mut [f32],
) {
    let n = sxs.len();
    for (r, hs) in hi.chunks_exact_mut(n).enumerate() {
        let row = &w[r * row_bytes..][..row_bytes.min(w.len() - r * row_bytes)];
        for ((h, sx), l) in hs.iter_mut().zip(sxs).zip(lo.iter_mut()) {
            *l = fold_lo(
                *l,
                screen_q8_0(sx, row, row_bytes, core::slice::from_mut(h)),
                *h,
            );
        }
    }
}

/// Running max of `lo`, poisoned to NaN by a non-finite bound.
#[inline(always)]
pub(crate) fn fold_lo(max_lo: f32, lo: f32, hi: f32) -> f32 {
    if !(lo.is_finite() && hi.is_finite()) || max_lo.is_nan() {
        f32::NAN
    } else {
        max_lo.max(lo)
    }
}

#[cfg(test)]
mod tests {
    use super::ScreenX;
    use crate::test_util::{random_q8_0, xorshift};
    use crate::{screen_rows, Isa};
    use kiln_quant::GgmlType;

    /// The multi-row screen bounds every exact dot from above, its floors
    /// from below, and agrees with the one-row screen up to summation
    /// order, on every ISA, for activation counts across register tiles.
    #[test]
    fn multi_row_bounds_hold_and_match_the_one_row_screen() {
        let mut rnd = xorshift(0x2545_f491_4f6c_dd1du64);
        // 37 rows: two 16-row tiles of the VNNI form and a remainder.
        for (k, rows) in [(640, 13), (640, 37), (96, 37)] {
            multi_row_case(k, rows, &mut rnd);
        }
        let w = vec![0u8; 13 * 640 / 32 * 34];
        let rb = 640 / 32 * 34;
        let short = ScreenX::new(&[0.5; 32]).unwrap();
        let sxs = [ScreenX::new(&[0.5; 64]).unwrap(), short];
        let (mut hi, mut lo) = (vec![0.0; 2], vec![0.0; 2]);
        assert!(crate::screen_rows_multi(
            Isa::Scalar,
            GgmlType::Q8_0,
            &w,
            rb,
            &sxs,
            &mut hi,
            &mut lo
        )
        .is_err());
    }

    fn multi_row_case(k: usize, rows: usize, rnd: &mut impl FnMut() -> u64) {
        let rb = k / 32 * 34;
        let w = random_q8_0(rows, k, rnd);
        let mut deq = vec![0.0f32; rows * k];
        kiln_quant::dequantize(GgmlType::Q8_0, &w, &mut deq).unwrap();
        for n in [1, 2, 7, 8, 9, 17] {
            let xs: Vec<Vec<f32>> = (0..n)
                .map(|_| (0..k).map(|_| (rnd() % 2001) as f32 * 1e-3 - 1.0).collect())
                .collect();
            let sxs: Vec<ScreenX> = xs.iter().map(|x| ScreenX::new(x).unwrap()).collect();
            for isa in Isa::available() {
                let mut hi = vec![f32::NAN; rows * n];
                let mut lo = vec![f32::NEG_INFINITY; n];
                crate::screen_rows_multi(isa, GgmlType::Q8_0, &w, rb, &sxs, &mut hi, &mut lo)
                    .unwrap();
                for (t, x) in xs.iter().enumerate() {
                    let mut one = vec![0.0f32; rows];
                    let m1 = screen_rows(isa, GgmlType::Q8_0, &w, rb, &sxs[t], &mut one).unwrap();
                    let mut best = f64::NEG_INFINITY;
                    for r in 0..rows {
                        let exact: f64 = deq[r * k..][..k]
                            .iter()
                            .zip(x)
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum();
                        best = best.max(exact);
                        let h = hi[r * n + t];
                        assert!(
                            f64::from(h) >= exact,
                            "{isa} n {n} t {t} r {r}: {h} < {exact}"
                        );
                        let tol = 1e-5 * (1.0 + one[r].abs());
                        assert!((h - one[r]).abs() <= tol, "{isa} n {n}: {h} vs {}", one[r]);
                    }
                    assert!(f64::from(lo[t]) <= best, "{isa} n {n} t {t}");
                    assert!(
                        (lo[t] - m1).abs() <= 1e-5 * (1.0 + m1.abs()),
                        "{isa} n {n} t {t}"
                    );
                }
            }
        }
    }

    /// Packed tiles screen to the same bits as the rows they came from
    /// (the same transposed registers, the same summation), on every
    /// level that packs; the others refuse to pack.
    #[test]
    fn packed_tiles_match_the_rows_they_hold() {
        let mut rnd = xorshift(0x1234_5678_9abc_def1u64);
        let (k, rows) = (96, 37);
        let rb = k / 32 * 34;
        let w = random_q8_0(rows, k, &mut rnd);
        for isa in Isa::available() {
            let packed = crate::ScreenTiles::pack(isa, GgmlType::Q8_0, &w, rb, rows, k);
            let Some(tiles) = packed else {
                assert!(isa < Isa::Avx512Vnni, "{isa} packs");
                continue;
            };
            assert_eq!((tiles.rows(), tiles.cols()), (32, k));
            for n in [1, 2, 8, 9, 17] {
                let sxs: Vec<ScreenX> = (0..n)
                    .map(|_| {
                        let x: Vec<f32> =
                            (0..k).map(|_| (rnd() % 2001) as f32 * 1e-3 - 1.0).collect();
                        ScreenX::new(&x).unwrap()
                    })
                    .collect();
                let mut want = vec![0.0f32; 32 * n];
                let mut want_lo = vec![f32::NEG_INFINITY; n];
                crate::screen_rows_multi(
                    isa,
                    GgmlType::Q8_0,
                    &w,
                    rb,
                    &sxs,
                    &mut want,
                    &mut want_lo,
                )
                .unwrap();
                // The second tile alone, then both.
                let mut got = vec![0.0f32; 16 * n];
                let mut got_lo = vec![f32::NEG_INFINITY; n];
                crate::screen_tiles_multi(isa, &tiles, 16, &sxs, &mut got, &mut got_lo).unwrap();
                // One activation row takes the `maddubs` form from the
                // rows: equal up to summation order.
                let same = |a: &[f32], b: &[f32]| {
                    a.iter().zip(b).all(|(x, y)| {
                        if n > 1 {
                            x == y
                        } else {
                            (x - y).abs() <= 1e-5 * (1.0 + y.abs())
                        }
                    })
                };
                assert!(same(&got, &want[16 * n..]), "{isa} n {n}");
                let mut got = vec![0.0f32; 32 * n];
                got_lo.fill(f32::NEG_INFINITY);
                crate::screen_tiles_multi(isa, &tiles, 0, &sxs, &mut got, &mut got_lo).unwrap();
                assert!(same(&got, &want) && same(&got_lo, &want_lo), "{isa} n {n}");
                // Rows past the tiles, or not on a tile, are refused.
                let mut hi = vec![0.0f32; 16 * n];
                for r0 in [8, 32] {
                    let r = crate::screen_tiles_multi(isa, &tiles, r0, &sxs, &mut hi, &mut got_lo);
                    assert!(r.is_err(), "{isa} rows {r0}..");
                }
            }
        }
    }

    /// The SIMD screens take rows in groups: any row count (full groups
    /// plus a remainder) gives each row the same bits as screening it
    /// alone, and the same floor as the fold over those rows.
    #[test]
    fn grouped_rows_match_single_rows() {
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15u64);
        for k in [32, 64, 96, 640] {
            let rb = k / 32 * 34;
            let x: Vec<f32> = (0..k).map(|_| (rnd() % 2001) as f32 * 1e-3 - 1.0).collect();
            let sx = ScreenX::new(&x).unwrap();
            let w = random_q8_0(11, k, &mut rnd);
            for isa in Isa::available() {
                for n in 1..=11 {
                    let mut hi = vec![0.0f32; n];
                    let m =
                        screen_rows(isa, GgmlType::Q8_0, &w[..n * rb], rb, &sx, &mut hi).unwrap();
                    let mut want_m = f32::NEG_INFINITY;
                    for (r, &h) in hi.iter().enumerate() {
                        let mut one = [0.0f32];
                        let m1 =
                            screen_rows(isa, GgmlType::Q8_0, &w[r * rb..][..rb], rb, &sx, &mut one)
                                .unwrap();
                        assert_eq!(h.to_bits(), one[0].to_bits(), "{isa} k {k} n {n} row {r}");
                        want_m = want_m.max(m1);
                    }
                    assert_eq!(m.to_bits(), want_m.to_bits(), "{isa} k {k} n {n}");
                }
            }
        }
    }
}
