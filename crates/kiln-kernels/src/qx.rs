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
}

impl QuantX {
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `x`; `false` (and left empty) when `x` holds a non-finite
    /// value or is not whole blocks of 32: the caller keeps the f32 path.
    pub fn set(&mut self, x: &[f32]) -> bool {
        self.k = 0;
        for v in [&mut self.h, &mut self.m, &mut self.l] {
            v.clear();
        }
        self.lane_d.clear();
        self.lane_sum.clear();
        self.group_sum.clear();
        if !x.len().is_multiple_of(32) || x.iter().any(|v| !v.is_finite()) {
            return false;
        }
        let k = x.len();
        for v in [&mut self.h, &mut self.m, &mut self.l] {
            v.resize(k, 0);
        }
        for (b, xb) in x.chunks_exact(32).enumerate() {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            if d == 0.0 || !d.is_normal() {
                // Zeros (or subnormals, which cannot be scaled safely):
                // all-zero planes; the lane sums still carry the values.
                self.lane_d.extend([0.0; 8]);
            } else {
                let inv = 1.0 / f64::from(d);
                let s = f64::from(S);
                for (i, &v) in xb.iter().enumerate() {
                    // f64: the remainders below are exact.
                    let t = f64::from(v) * inv;
                    let h = round(t).clamp(-127.0, 127.0);
                    let r = (t - h) * s;
                    let m = round(r).clamp(-127.0, 127.0);
                    let l = round((r - m) * s).clamp(-127.0, 127.0);
                    self.h[b * 32 + i] = h as i8;
                    self.m[b * 32 + i] = m as i8;
                    self.l[b * 32 + i] = l as i8;
                }
                self.lane_d.extend([d / (S * S); 8]);
            }
            let lanes = self.lane_sum.len();
            self.lane_sum
                .extend(xb.chunks_exact(4).map(|l| (l[0] + l[1]) + (l[2] + l[3])));
            self.group_sum.push(self.lane_sum[lanes..].iter().sum());
        }
        self.k = k;
        true
    }

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
}
