//! SIMD screens for `crate::screen` (same math, same lane layout): AVX2
//! with `maddubs` (`|w| · sign(x, w)`, no i16 overflow since
//! `2 · 128 · 127 < 2^15`) and AVX-512 VNNI with `vpdpbusd` on
//! `w + 128` (unsigned) against `qx`, the offset removed by starting the
//! accumulator at `-128 · Σ qx` per lane.

use core::arch::x86_64::*;

use crate::screen::{fold_lo, ScreenX, ABS_SLACK};

/// Q8_0 block bytes: f16 scale + 32 quants.
const BLK: usize = 34;
/// Prefetch distance for the weight stream (as the GEMV's).
const PREFETCH: usize = 768;

/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` holds `hi.len()` rows of
/// `sx.k / 32` Q8_0 blocks at stride `row_bytes` (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn screen_avx2(sx: &ScreenX, w: &[u8], row_bytes: usize, hi: &mut [f32]) -> f32 {
    let nb = sx.k / 32;
    let mut max_lo = f32::NEG_INFINITY;
    let ones = _mm256_set1_epi16(1);
    for (r, h) in hi.iter_mut().enumerate() {
        let row = &w[r * row_bytes..][..nb * BLK];
        let mut acc = _mm256_setzero_ps();
        let mut bacc = _mm256_setzero_ps();
        for b in 0..nb {
            let blk = &row[b * BLK..][..BLK];
            let xq = &sx.q[b * 32..][..32];
            let ld = &sx.lane_d[b * 8..][..8];
            let lc = &sx.lane_c[b * 8..][..8];
            // SAFETY: the slices above bound every load (32 quant bytes
            // after the 2-byte scale, 32 `qx`, 8 lane values); prefetch
            // never faults.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(PREFETCH).cast());
                let wv = _mm256_loadu_si256(blk.as_ptr().add(2).cast());
                let xv = _mm256_loadu_si256(xq.as_ptr().cast());
                let p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
                let p32 = _mm256_madd_epi16(p16, ones);
                let hbits = u16::from_le_bytes([blk[0], blk[1]]) as i16;
                let dw = _mm256_cvtph_ps(_mm_set1_epi16(hbits));
                let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(ld.as_ptr()));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), scale, acc);
                let adw = _mm256_andnot_ps(_mm256_set1_ps(-0.0), dw);
                bacc = _mm256_fmadd_ps(adw, _mm256_loadu_ps(lc.as_ptr()), bacc);
            }
        }
        // SAFETY: register-only AVX ops.
        let (a, b) = unsafe { (hsum8(acc), hsum8(bacc)) };
        let b = b + ABS_SLACK;
        *h = a + b;
        max_lo = fold_lo(max_lo, a - b, *h);
    }
    max_lo
}

#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    // SAFETY: callers run with AVX enabled.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// Two blocks per 512-bit step; `None` when the block count is odd (the
/// caller uses the AVX2 screen).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C; `w` as
/// for [`screen_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn screen_vnni(
    sx: &ScreenX,
    w: &[u8],
    row_bytes: usize,
    hi: &mut [f32],
) -> Option<f32> {
    let nb = sx.k / 32;
    if !nb.is_multiple_of(2) {
        return None;
    }
    let mut max_lo = f32::NEG_INFINITY;
    let flip = _mm512_set1_epi8(-128);
    for (r, h) in hi.iter_mut().enumerate() {
        let row = &w[r * row_bytes..][..nb * BLK];
        let mut acc = _mm512_setzero_ps();
        let mut bacc = _mm512_setzero_ps();
        for p in 0..nb / 2 {
            let blk = &row[p * 2 * BLK..][..2 * BLK];
            let xq = &sx.q[p * 64..][..64];
            let ld = &sx.lane_d[p * 16..][..16];
            let lc = &sx.lane_c[p * 16..][..16];
            let lk = &sx.lane_corr[p * 16..][..16];
            // SAFETY: the slices above bound every load (two blocks of
            // 2 + 32 bytes, 64 `qx`, 16 lane values); prefetch never
            // faults.
            unsafe {
                let bp = blk.as_ptr();
                _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(PREFETCH).cast());
                _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(PREFETCH + 64).cast());
                let w0 = _mm256_loadu_si256(bp.add(2).cast());
                let w1 = _mm256_loadu_si256(bp.add(BLK + 2).cast());
                let wv = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(w0), w1);
                let u = _mm512_xor_si512(wv, flip);
                let xv = _mm512_loadu_si512(xq.as_ptr().cast());
                let corr = _mm512_loadu_si512(lk.as_ptr().cast());
                let p32 = _mm512_dpbusd_epi32(corr, u, xv);
                let h0 = u16::from_le_bytes([blk[0], blk[1]]) as i16;
                let h1 = u16::from_le_bytes([blk[BLK], blk[BLK + 1]]) as i16;
                let hv = _mm256_set_m128i(_mm_set1_epi16(h1), _mm_set1_epi16(h0));
                let dw = _mm512_cvtph_ps(hv);
                let scale = _mm512_mul_ps(dw, _mm512_loadu_ps(ld.as_ptr()));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p32), scale, acc);
                bacc = _mm512_fmadd_ps(_mm512_abs_ps(dw), _mm512_loadu_ps(lc.as_ptr()), bacc);
            }
        }
        let (a, b) = (_mm512_reduce_add_ps(acc), _mm512_reduce_add_ps(bacc));
        let b = b + ABS_SLACK;
        *h = a + b;
        max_lo = fold_lo(max_lo, a - b, *h);
    }
    Some(max_lo)
}
