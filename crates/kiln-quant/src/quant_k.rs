//! Reference quantizers for the K-quant super-block types.
//!
//! Ports of ggml's `quantize_row_q{2,4,5,6,8}_K_ref` (the path used when no
//! importance matrix is given). gguf-py has no K-quant quantizers, so these
//! are held to round-trip error bounds instead of byte vectors. Float
//! expressions keep ggml's evaluation order (`w*x*l` is `(w*x)*l`), since a
//! different order can flip a rounding decision and change the bytes.

use crate::block::*;
use crate::quant::signed_absmax;

/// ggml's `GROUP_MAX_EPS`: below this a group is treated as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even via the 1.5 * 2^23 trick.
/// Exact for |v| < 2^22; larger inputs give a wrong but harmless value,
/// as in ggml (where they would trip an assert).
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// Fits `x ~ scale * L - min` with L in 0..=nmax, minimizing the weighted
/// error (squared, or absolute when `use_mad`) over a sweep of `nstep + 1`
/// candidate inverse scales (`make_qkx2_quants`). Returns (scale, min).
#[allow(clippy::too_many_arguments)] // mirrors ggml's signature
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        best_error += weights[i] * err(scale * l as f32 + min - x[i]);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l_out.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Fits `x ~ scale * (L - nmax)` with L in 0..2*nmax, weighting by x^2
/// (`make_qx_quants` with `rmse_type == 1` and no importance weights).
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [u8]) -> f32 {
    let max = signed_absmax(x);
    let amax = max.abs();
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let store = |iscale: f32, l_out: &mut [u8]| {
        for (o, &v) in l_out.iter_mut().zip(x) {
            *o = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as u8;
        }
    };
    let iscale = -(nmax as f32) / max;
    store(iscale, l_out);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            store(iscale, l_out);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Weights used by Q4_K / Q5_K: the group's RMS plus each |x|.
fn rms_weights(x: &[f32]) -> [f32; 32] {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let av_x = (sum_x2 / 32.0).sqrt();
    std::array::from_fn(|l| av_x + x[l].abs())
}

/// The first pass of Q2_K, Q4_K and Q5_K: fits each of the `N` groups of
/// `G` elements with `make_qkx2_quants` (rdelta 0.1, weights from
/// `weights`), writing its L into `l`. Returns the groups' scales and mins
/// and the largest of each.
fn fit_groups<const N: usize, const G: usize>(
    x: &[f32; QK_K],
    l: &mut [u8; QK_K],
    weights: impl Fn(&[f32]) -> [f32; G],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    use_mad: bool,
) -> ([f32; N], [f32; N], f32, f32) {
    const { assert!(N * G == QK_K) };
    let mut scales = [0.0f32; N];
    let mut mins = [0.0f32; N];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..N {
        let xg = &x[G * j..][..G];
        let w = weights(xg);
        let (s, m) = make_qkx2_quants(
            nmax,
            xg,
            &w,
            &mut l[G * j..][..G],
            rmin,
            0.1,
            nstep,
            use_mad,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    (scales, mins, max_scale, max_min)
}

/// The second pass of Q2_K, Q4_K and Q5_K: requantizes each group of `G`
/// elements against its stored scale `d * sc` and min `dmin * m`
/// (`scale_min(j)` is group j's (sc, m)) to L in 0..=nmax; a group whose
/// scale is 0 keeps the L of the first pass.
fn requantize_groups<const G: usize>(
    x: &[f32; QK_K],
    l: &mut [u8; QK_K],
    d: [u8; 2],
    dmin: [u8; 2],
    nmax: i32,
    scale_min: impl Fn(usize) -> (u8, u8),
) {
    for j in 0..QK_K / G {
        let (sc, m) = scale_min(j);
        let dl = f16_to_f32(d) * sc as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * m as f32;
        for i in G * j..G * (j + 1) {
            l[i] = nearest_int((x[i] + dm) / dl).clamp(0, nmax) as u8;
        }
    }
}

/// Shared by Q4_K and Q5_K: fits eight groups of 32, quantizes their scales
/// and mins to 6 bits, then requantizes every element against those.
/// Returns (d, dmin, packed scales, L in 0..=nmax).
fn k4_fit(
    x: &[f32; QK_K],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> ([u8; 2], [u8; 2], [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let (scales, mins, max_scale, max_min) =
        fit_groups::<8, 32>(x, &mut l, rms_weights, nmax, rmin, nstep, false);
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // ggml stores nearest_int into a uint8_t before clamping: keep the wrap.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = f32_to_f16(max_scale / 63.0);
    let dmin = f32_to_f16(max_min / 63.0);
    requantize_groups::<32>(x, &mut l, d, dmin, nmax, |j| scale_min_k4(j, &packed));
    (d, dmin, packed, l)
}

pub(crate) fn q4_k(x: &[f32; QK_K]) -> [u8; BlockQ4K::BYTES] {
    let (d, dmin, scales, l) = k4_fit(x, 15, -1.0, 20);
    let mut qs = [0u8; 128];
    for (c, q) in qs.chunks_exact_mut(32).enumerate() {
        for (i, q) in q.iter_mut().enumerate() {
            *q = l[64 * c + i] | (l[64 * c + i + 32] << 4);
        }
    }
    BlockQ4K {
        d,
        dmin,
        scales,
        qs,
    }
    .to_bytes()
}

pub(crate) fn q5_k(x: &[f32; QK_K]) -> [u8; BlockQ5K::BYTES] {
    let (d, dmin, scales, l) = k4_fit(x, 31, -0.5, 15);
    let mut qs = [0u8; 128];
    let mut qh = [0u8; 32];
    for (c, q) in qs.chunks_exact_mut(32).enumerate() {
        for (i, q) in q.iter_mut().enumerate() {
            let (lo, hi) = (l[64 * c + i], l[64 * c + i + 32]);
            *q = (lo & 0xF) | ((hi & 0xF) << 4);
            qh[i] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
        }
    }
    BlockQ5K {
        d,
        dmin,
        scales,
        qh,
        qs,
    }
    .to_bytes()
}

pub(crate) fn q6_k(x: &[f32; QK_K]) -> [u8; BlockQ6K::BYTES] {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for (ib, s) in scales.iter_mut().enumerate() {
        *s = make_qx_quants(32, &x[16 * ib..][..16], &mut l[16 * ib..][..16]);
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = *s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        return [0u8; BlockQ6K::BYTES];
    }
    let iscale = -128.0 / max_scale;
    let d = f32_to_f16(1.0 / iscale);
    let qscales: [u8; 16] =
        std::array::from_fn(|ib| nearest_int(iscale * scales[ib]).min(127) as i8 as u8);
    for (j, &sc) in qscales.iter().enumerate() {
        let dl = f16_to_f32(d) * sc as i8 as f32;
        if dl == 0.0 {
            continue;
        }
        for i in 16 * j..16 * (j + 1) {
            l[i] = (nearest_int(x[i] / dl).clamp(-32, 31) + 32) as u8;
        }
    }
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for half in 0..2 {
        let lh = &l[128 * half..][..128];
        for i in 0..32 {
            let q = [lh[i], lh[i + 32], lh[i + 64], lh[i + 96]];
            ql[64 * half + i] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
            ql[64 * half + i + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
            qh[32 * half + i] =
                (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
        }
    }
    BlockQ6K {
        ql,
        qh,
        scales: qscales,
        d,
    }
    .to_bytes()
}

pub(crate) fn q2_k(x: &[f32; QK_K]) -> [u8; BlockQ2K::BYTES] {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let abs_weights = |xg: &[f32]| -> [f32; 16] { std::array::from_fn(|i| xg[i].abs()) };
    let (scales, mins, max_scale, max_min) =
        fit_groups::<16, 16>(x, &mut l, abs_weights, 3, -0.5, 15, true);
    let mut packed = [0u8; 16];
    let mut d = f32_to_f16(0.0);
    let mut dmin = f32_to_f16(0.0);
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for (p, &s) in packed.iter_mut().zip(&scales) {
            *p = nearest_int(iscale * s) as u8;
        }
        d = f32_to_f16(max_scale / Q4SCALE);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for (p, &m) in packed.iter_mut().zip(&mins) {
            *p |= (nearest_int(iscale * m) << 4) as u8;
        }
        dmin = f32_to_f16(max_min / Q4SCALE);
    }
    requantize_groups::<16>(x, &mut l, d, dmin, 3, |j| (packed[j] & 0xF, packed[j] >> 4));
    let mut qs = [0u8; 64];
    for half in 0..2 {
        for i in 0..32 {
            let e = 128 * half + i;
            qs[32 * half + i] = l[e] | (l[e + 32] << 2) | (l[e + 64] << 4) | (l[e + 96] << 6);
        }
    }
    BlockQ2K {
        scales: packed,
        qs,
        d,
        dmin,
    }
    .to_bytes()
}

pub(crate) fn q8_k(x: &[f32; QK_K]) -> [u8; BlockQ8K::BYTES] {
    let max = signed_absmax(x);
    let amax = max.abs();
    if amax == 0.0 {
        // ggml leaves bsums untouched here; zero them so the block is
        // deterministic.
        return [0u8; BlockQ8K::BYTES];
    }
    let iscale = -127.0 / max;
    let q: [i8; QK_K] = std::array::from_fn(|j| nearest_int(iscale * x[j]).min(127) as i8);
    let mut bsums = [0u8; 32];
    for (g, s) in bsums.chunks_exact_mut(2).enumerate() {
        let sum: i32 = q[16 * g..][..16].iter().map(|&v| i32::from(v)).sum();
        s.copy_from_slice(&(sum as i16).to_le_bytes());
    }
    BlockQ8K {
        d: (1.0 / iscale).to_le_bytes(),
        qs: q.map(|v| v as u8),
        bsums,
    }
    .to_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(127.49), 127);
    }

    #[test]
    fn qkx2_fits_an_exact_grid_exactly() {
        // Values on the grid 0.5 * L - 1 with L spanning 0..=15.
        let x: Vec<f32> = (0..32).map(|i| 0.5 * (i % 16) as f32 - 1.0).collect();
        let w = rms_weights(&x);
        let mut l = [0u8; 32];
        let (scale, min) = make_qkx2_quants(15, &x, &w, &mut l, -1.0, 0.1, 20, false);
        assert!((scale - 0.5).abs() < 1e-6, "scale {scale}");
        assert!((min - 1.0).abs() < 1e-6, "min {min}");
        for (i, &q) in l.iter().enumerate() {
            assert_eq!(q as usize, i % 16);
        }
    }

    #[test]
    fn qx_quants_recover_an_exact_symmetric_grid() {
        // Integers -8..=7 sit exactly on the grid 0.25 * (L - 32).
        let x: [f32; 16] = std::array::from_fn(|i| i as f32 - 8.0);
        let mut l = [0u8; 16];
        let scale = make_qx_quants(32, &x, &mut l);
        assert_eq!(scale, 0.25);
        for (v, q) in x.iter().zip(l) {
            assert_eq!(scale * (q as i32 - 32) as f32, *v);
        }
    }
}
