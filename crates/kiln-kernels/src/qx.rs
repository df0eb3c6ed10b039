//! Activations split into three int8 planes for the integer GEMV.
//!
//! Per block `b` of 32 values, `d_b = absmax / 127` and each value is
//! written as `x ≈ d_b · (h + m/S + l/S²)` with `h, m, l` in
//! `[-127, 127]` and `S = 254`: `h` is `x / d_b` rounded, `m` and `l` round
//! the remainders. The representation error is at most `d_b / (2·S²)`,
//! about `6·10⁻⁸ · absmax` of the block, the size of an f32 rounding of
//! the block's largest value. So an integer dot product against the three
//! planes (`vpdpbusd`/`pmaddubsw` on the packed weight bytes) is as exact
//! as the f32 dequantize-and-FMA kernels, unlike llama.cpp's single int8
//! plane (2⁻⁸ relative), which moves Gemma 3's logits by up to 1.4.
//!
//! Per 4-value lane the kernels also need `d_b / S²` and the exact f32 sum
//! of the lane's values (the weights' offset term `Σ_j o · x_j` uses the
//! true `x`, not the planes).

/// Plane scale `S`: the largest with `|m|, |l| <= 127` (`|rem| <= S / 2`).
pub(crate) const S: f32 = 254.0;

/// Round to nearest, ties to even, for `|t| < 2^51` (here below 300):
/// adding `1.5 · 2^52` leaves no fraction bits. Inline arithmetic, where
/// `f64::round` is a libm call on baseline x86-64.
#[inline(always)]
fn round(t: f64) -> f64 {
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    (t + MAGIC) - MAGIC
}

/// `x` as three int8 planes with per-lane scales and sums; reusable across
/// calls ([`QuantX::set`] keeps the allocations).
#[derive(Clone, Debug, Default)]
pub struct QuantX {
    pub(crate) k: usize,
    pub(crate) h: Vec<i8>,
    pub(crate) m: Vec<i8>,
    pub(crate) l: Vec<i8>,
    /// `d_b / S²` per lane of 4 values.
    pub(crate) lane_d: Vec<f32>,
    /// Exact f32 sum of each lane's 4 values.
    pub(crate) lane_sum: Vec<f32>,
    /// f32 sum of each block's 32 values (the K-quants' per-group mins).
    pub(crate) group_sum: Vec<f32>,
    /// `sum(x)` per 16 values (types with a scale per 16 weights).
    pub(crate) half_sum: Vec<f32>,
}

impl QuantX {
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `x`; `false` (and left empty) when `x` holds a non-finite
    /// value or is not whole blocks of 32: the caller keeps the f32 path.
    ///
    /// It runs before every integer product (one token per task), so it
    /// is compiled per level: the same f64 operations, no FMA contraction,
    /// identical bytes on every one. The level is `Isa::detect()`'s, so a
    /// forced `KILN_ISA` runs the code that level's CPUs would.
    pub fn set(&mut self, x: &[f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::Isa;
            let isa = Isa::detect();
            if isa >= Isa::Avx512 {
                // SAFETY: the CPU runs `isa`, which includes AVX-512F.
                return unsafe { self.set_avx512(x) };
            }
            if isa >= Isa::Avx2 {
                // SAFETY: the CPU runs `isa`, which includes AVX2.
                return unsafe { self.set_avx2(x) };
            }
        }
        self.set_any(x, planes_scalar)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn set_avx2(&mut self, x: &[f32]) -> bool {
        self.set_any(x, planes_scalar)
    }

    /// # Safety
    /// The CPU must support AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn set_avx512(&mut self, x: &[f32]) -> bool {
        // SAFETY: the caller checked AVX-512F.
        self.set_any(x, |xb, inv, hb, mb, lb| unsafe {
            planes_avx512(xb, inv, hb, mb, lb)
        })
    }

    /// The planes of one block are `planes(x, 1 / d, h, m, l)`: every
    /// implementation performs the same IEEE operations in the same order
    /// (`set` gives identical bytes on every CPU).
    #[inline(always)]
    fn set_any(
        &mut self,
        x: &[f32],
        planes: impl Fn(&[f32], f64, &mut [i8], &mut [i8], &mut [i8]),
    ) -> bool {
        self.k = 0;
        for v in [&mut self.h, &mut self.m, &mut self.l] {
            v.clear();
        }
        self.lane_d.clear();
        self.lane_sum.clear();
        self.group_sum.clear();
        self.half_sum.clear();
        // The largest |v|'s bits: a max that vectorizes, where `any` exits
        // early and stays scalar (a fifth of the work).
        let top = x.iter().fold(0, |a, v| a.max(v.to_bits() & 0x7FFF_FFFF));
        if !x.len().is_multiple_of(32) || top >= f32::INFINITY.to_bits() {
            return false;
        }
        let k = x.len();
        for v in [&mut self.h, &mut self.m, &mut self.l] {
            v.resize(k, 0);
        }
        self.lane_d.resize(k / 4, 0.0);
        self.lane_sum.resize(k / 4, 0.0);
        self.group_sum.resize(k / 32, 0.0);
        self.half_sum.resize(k / 16, 0.0);
        // Zipped fixed-size chunks, no pushes or indexing: the loops
        // vectorize.
        let blocks = x
            .chunks_exact(32)
            .zip(self.h.chunks_exact_mut(32))
            .zip(self.m.chunks_exact_mut(32))
            .zip(self.l.chunks_exact_mut(32))
            .zip(self.lane_d.chunks_exact_mut(8))
            .zip(self.lane_sum.chunks_exact_mut(8))
            .zip(
                self.group_sum
                    .iter_mut()
                    .zip(self.half_sum.chunks_exact_mut(2)),
            );
        for ((((((xb, hb), mb), lb), ld), ls), (gs, hs)) in blocks {
            // Finite values: the bits of |v| order as the values (an
            // integer max vectorizes; a float max chain does not).
            let amax = f32::from_bits(xb.iter().fold(0, |a, v| a.max(v.to_bits() & 0x7FFF_FFFF)));
            let d = amax / 127.0;
            if d == 0.0 || !d.is_normal() {
                // Zeros (or subnormals, which cannot be scaled safely):
                // all-zero planes; the lane sums still carry the values.
                ld.fill(0.0);
            } else {
                planes(xb, 1.0 / f64::from(d), hb, mb, lb);
                ld.fill(d / (S * S));
            }
            for (o, l) in ls.iter_mut().zip(xb.chunks_exact(4)) {
                *o = (l[0] + l[1]) + (l[2] + l[3]);
            }
            *gs = ls.iter().sum();
            hs[0] = ls[..4].iter().sum();
            hs[1] = ls[4..].iter().sum();
        }
        self.k = k;
        true
    }
}

/// One block's planes (`inv` = 1 / d): `x · inv` rounded, then each
/// remainder times `S` rounded, clamped to `[-127, 127]`; f64 makes the
/// remainders exact.
#[inline(always)]
fn planes_scalar(xb: &[f32], inv: f64, hb: &mut [i8], mb: &mut [i8], lb: &mut [i8]) {
    let s = f64::from(S);
    let planes = hb.iter_mut().zip(mb.iter_mut()).zip(lb.iter_mut());
    for (&v, ((ph, pm), pl)) in xb.iter().zip(planes) {
        let t = f64::from(v) * inv;
        let h = round(t).clamp(-127.0, 127.0);
        let r = (t - h) * s;
        let m = round(r).clamp(-127.0, 127.0);
        let l = round((r - m) * s).clamp(-127.0, 127.0);
        // Integral and within i8: the i32 cast is exact.
        *ph = h as i32 as i8;
        *pm = m as i32 as i8;
        *pl = l as i32 as i8;
    }
}

/// [`planes_scalar`] 8 values at a time: the same f64 operations (no FMA),
/// so the same bytes (with it `set` went from ~4.4 to ~1.5 ns a value on
/// Zen 4; the scalar planes were most of that).
///
/// # Safety
/// The CPU must support AVX-512F; every slice holds 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn planes_avx512(xb: &[f32], inv: f64, hb: &mut [i8], mb: &mut [i8], lb: &mut [i8]) {
    use std::arch::x86_64::*;
    assert!(xb.len() == 32 && hb.len() == 32 && mb.len() == 32 && lb.len() == 32);
    let inv = _mm512_set1_pd(inv);
    let s = _mm512_set1_pd(f64::from(S));
    let magic = _mm512_set1_pd(6_755_399_441_055_744.0);
    let (lo, hi) = (_mm512_set1_pd(-127.0), _mm512_set1_pd(127.0));
    let round = |t: __m512d| _mm512_sub_pd(_mm512_add_pd(t, magic), magic);
    let clamp = |t: __m512d| _mm512_max_pd(_mm512_min_pd(t, hi), lo);
    // Two f64 vectors of 8 make 16 i32, narrowed to 16 saturated bytes.
    let bytes = |a: __m512d, b: __m512d| {
        let v = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm512_cvtpd_epi32(a)),
            _mm512_cvtpd_epi32(b),
        );
        _mm512_cvtsepi32_epi8(v)
    };
    for c in 0..2 {
        // halves[i]: the planes (h, m, l) of values c * 16 + i * 8 ..
        let mut halves = [[_mm512_setzero_pd(); 3]; 2];
        for (half, planes) in halves.iter_mut().enumerate() {
            // SAFETY: 32 values; c * 16 + half * 8 + 8 <= 32.
            let v = unsafe { _mm256_loadu_ps(xb.as_ptr().add(c * 16 + half * 8)) };
            let t = _mm512_mul_pd(_mm512_cvtps_pd(v), inv);
            let h = clamp(round(t));
            let r = _mm512_mul_pd(_mm512_sub_pd(t, h), s);
            let m = clamp(round(r));
            let l = clamp(round(_mm512_mul_pd(_mm512_sub_pd(r, m), s)));
            *planes = [h, m, l];
        }
        for (p, dst) in [&mut *hb, &mut *mb, &mut *lb].into_iter().enumerate() {
            // SAFETY: 16 bytes at c * 16 of a 32-byte block.
            _mm_storeu_si128(
                dst.as_mut_ptr().add(c * 16).cast(),
                bytes(halves[0][p], halves[1][p]),
            );
        }
    }
}

impl QuantX {
    /// Row length of the quantized `x` (0 after a refused [`QuantX::set`]).
    pub fn len(&self) -> usize {
        self.k
    }

    pub fn is_empty(&self) -> bool {
        self.k == 0
    }

    /// The value the planes represent at `i` (tests, scalar reference).
    pub fn value(&self, i: usize) -> f64 {
        let d = f64::from(self.lane_d[i / 4]) * f64::from(S) * f64::from(S);
        let s = f64::from(S);
        d * (f64::from(self.h[i]) + f64::from(self.m[i]) / s + f64::from(self.l[i]) / (s * s))
    }
}

#[cfg(test)]
mod tests {
    use super::QuantX;

    #[test]
    fn planes_represent_x_to_f32_precision() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        let mut x: Vec<f32> = (0..640)
            .map(|i| next() * (1 + i % 7) as f32 * 1e3)
            .collect();
        x[3] = 0.0;
        x[40..72].fill(0.0);
        x[100] = 127.5;
        let mut q = QuantX::new();
        assert!(q.set(&x));
        for (b, xb) in x.chunks(32).enumerate() {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64;
            for (i, &v) in xb.iter().enumerate() {
                let err = (q.value(b * 32 + i) - f64::from(v)).abs();
                assert!(err <= 1e-7 * amax, "x[{}] = {v}: err {err:e}", b * 32 + i);
            }
        }
        assert!(!q.set(&x[..33]));
        assert!(q.is_empty());
        x[7] = f32::NAN;
        assert!(!q.set(&x));
    }

    /// The AVX-512 planes are the scalar planes, byte for byte, ties of
    /// the rounding included.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_planes_equal_scalar() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: no AVX-512F");
            return;
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for round in 0..2000 {
            let mut xb = [0f32; 32];
            for v in xb.iter_mut() {
                let r = next();
                *v = match round % 3 {
                    // Halves and quarters of the scale: ties to even.
                    0 => ((r % 509) as f32 - 254.0) * 0.5,
                    1 => f32::from_bits(
                        (r as u32 & 0x807F_FFFF) | (((r >> 32) % 60 + 100) as u32) << 23,
                    ),
                    _ => ((r >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32 * 3e4,
                };
            }
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let inv = 1.0 / f64::from(amax / 127.0);
            let mut want = [[0i8; 32]; 3];
            let mut got = [[0i8; 32]; 3];
            let [wh, wm, wl] = &mut want;
            super::planes_scalar(&xb, inv, wh, wm, wl);
            let [gh, gm, gl] = &mut got;
            // SAFETY: AVX-512F checked above; 32-value blocks.
            unsafe { super::planes_avx512(&xb, inv, gh, gm, gl) };
            assert_eq!(want, got, "block {xb:?}");
        }
    }
}
