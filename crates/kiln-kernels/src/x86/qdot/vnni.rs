//! The AVX-512 VNNI form of the integer GEMV: two groups of 32 per
//! 512-bit `vpdpbusd` (signed codes shifted by 128, the shift folded into
//! the offset); an odd last group takes the 256-bit form on the AVX2
//! decoders ([`QBlock`]).
//!
//! Codes below 64 (every type but Q8_0) fold the three planes in
//! integers, `((H·S + M)·S + L)` by chaining `vpdpbusd` through two
//! `vpmulld` by `S` (at most `4·63·127·(S² + S + 1) < 2^31`, exact), so a
//! pair costs one conversion; the offset term sums `s · sum(x)` per lane
//! and takes the type's constant once per row (K-quants: their eight
//! mins once per block).

use core::arch::x86_64::*;

use kiln_quant::GgmlType;

use super::{each_row, hsum8, lane, prefetch_ahead, QBlock, Q40, Q4K, Q50, Q5K, Q6K, Q80};
use crate::qx::{QuantX, S};

/// 64 weights (groups `gi`, `gi + 1`) for `vpdpbusd`: unsigned codes and
/// per-lane (4 weights) scale.
#[derive(Clone, Copy)]
struct Pair {
    u: __m512i,
    s: __m512,
}

/// A packed format decoded 64 weights at a time in 512-bit registers.
trait QPair: QBlock {
    /// Codes below 64: the planes fold in integers (see the module notes).
    const SMALL: bool = true;

    /// 64 weights, signed codes shifted by 128: groups `g`, `g + 1` (`g`
    /// even) of the block at `b` with its [`QBlock::header`], or for
    /// one-group types the blocks at `b` and `b + BYTES` (the header is
    /// then unused).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C enabled; the groups lie
    /// inside the row.
    unsafe fn pair(b: *const u8, g: usize, hdr: &Self::Hdr) -> Pair;
}

/// Groups `2j`, `2j + 1` of a Q4_K/Q5_K block: low then high nibbles of
/// the 32 bytes at `p`.
///
/// # Safety
/// AVX-512 F/BW enabled; `p` valid for 32 reads.
#[inline(always)]
unsafe fn nibbles32x2(p: *const u8) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe {
        let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast()));
        let sh = _mm512_setr_epi64(
            0,
            0,
            0,
            0,
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
        );
        _mm512_and_si512(_mm512_srlv_epi16(q, sh), _mm512_set1_epi8(0x0F))
    }
}

/// Lanes 0..8 from lane `g` of `v`, 8..16 from lane `g + 1`.
///
/// # Safety
/// AVX-512 F enabled.
#[inline(always)]
unsafe fn kpair(v: __m256, g: usize) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        let idx = _mm512_add_epi32(
            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
            _mm512_set1_epi32(g as i32),
        );
        _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(v))
    }
}

/// Lanes 0..8 get the f16 at `p0`, lanes 8..16 the one at `p1`.
///
/// # Safety
/// AVX-512 F and F16C enabled; both pointers valid for 2 reads.
#[inline(always)]
unsafe fn f16_halves(p0: *const u8, p1: *const u8) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        let bits = u32::from(u16::from_le_bytes([*p0, *p0.add(1)]))
            | u32::from(u16::from_le_bytes([*p1, *p1.add(1)])) << 16;
        let d = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
        let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(d))
    }
}

/// `[q & 15, q >> 4]` of the 16 bytes at `p0`, then of those at `p1`.
///
/// # Safety
/// AVX-512 F/BW enabled; both pointers valid for 16 reads.
#[inline(always)]
unsafe fn nibbles16x2(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe {
        let ab = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(p0.cast())),
            _mm_loadu_si128(p1.cast()),
        );
        let aabb = _mm512_permutexvar_epi64(
            _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
            _mm512_castsi256_si512(ab),
        );
        // 16-bit lanes: shift the second and fourth 128 bits by 4.
        let sh = _mm512_setr_epi64(
            0,
            0,
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
            0,
            0,
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
        );
        _mm512_and_si512(_mm512_srlv_epi16(aabb, sh), _mm512_set1_epi8(0x0F))
    }
}

impl QPair for Q40 {
    #[inline(always)]
    unsafe fn pair(b0: *const u8, _: usize, _: &__m256) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
            let b1 = b0.add(18);
            let s = f16_halves(b0, b1);
            Pair {
                u: nibbles16x2(b0.add(2), b1.add(2)),
                s,
            }
        }
    }
}

impl QPair for Q50 {
    #[inline(always)]
    unsafe fn pair(b0: *const u8, _: usize, _: &__m256) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
            let b1 = b0.add(22);
            let qh = |b: *const u8| {
                u64::from(u32::from_le_bytes([
                    *b.add(2),
                    *b.add(3),
                    *b.add(4),
                    *b.add(5),
                ]))
            };
            let k = qh(b0) | qh(b1) << 32;
            let u = nibbles16x2(b0.add(6), b1.add(6));
            let s = f16_halves(b0, b1);
            Pair {
                u: _mm512_mask_add_epi8(u, k, u, _mm512_set1_epi8(0x10)),
                s,
            }
        }
    }
}

impl QPair for Q80 {
    const SMALL: bool = false;
    #[inline(always)]
    unsafe fn pair(b0: *const u8, _: usize, _: &__m256) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
            let b1 = b0.add(34);
            let q = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(b0.add(2).cast())),
                _mm256_loadu_si256(b1.add(2).cast()),
            );
            let s = f16_halves(b0, b1);
            Pair {
                u: _mm512_xor_si512(q, _mm512_set1_epi8(-128)),
                s,
            }
        }
    }
}

impl QPair for Q4K {
    #[inline(always)]
    unsafe fn pair(b: *const u8, g: usize, hdr: &Self::Hdr) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
            Pair {
                u: nibbles32x2(b.add(16 + 16 * g)),
                s: kpair(hdr.0, g),
            }
        }
    }
}

impl QPair for Q5K {
    #[inline(always)]
    unsafe fn pair(b: *const u8, g: usize, hdr: &Self::Hdr) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
            let s = kpair(hdr.0, g);
            let u = nibbles32x2(b.add(48 + 16 * g));
            // Fifth bits: bit g (then g + 1) of the 32 qh bytes.
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(16).cast()));
            let probe = _mm512_mask_blend_epi8(
                0xFFFF_FFFF_0000_0000,
                _mm512_set1_epi8((1u8 << g) as i8),
                _mm512_set1_epi8((2u8 << g) as i8),
            );
            let k = _mm512_test_epi8_mask(qh, probe);
            Pair {
                u: _mm512_mask_add_epi8(u, k, u, _mm512_set1_epi8(0x10)),
                s,
            }
        }
    }
}

impl QPair for Q6K {
    #[inline(always)]
    unsafe fn pair(b: *const u8, g: usize, hdr: &Self::Hdr) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
            // The 16 scales times `d` in one register.
            let hdr = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(hdr[0])),
                _mm256_castps_pd(hdr[1]),
            ));
            // Groups kq, kq + 1 (kq = 0 or 2) of a half: the 64 ql bytes
            // hold both (low nibbles for kq = 0, high for 2); their high
            // bits are bits 2kq.. and 2kq + 2.. of the same 32 qh bytes.
            let (half, kq) = (g / 4, g % 4);
            let ql = _mm512_loadu_si512(b.add(64 * half).cast());
            let ql = if kq == 0 {
                ql
            } else {
                _mm512_srli_epi16::<4>(ql)
            };
            let lo = _mm512_and_si512(ql, _mm512_set1_epi8(0x0F));
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(128 + 32 * half).cast()));
            let qh = if kq == 0 {
                _mm512_sllv_epi16(
                    qh,
                    _mm512_setr_epi64(
                        0x0004_0004_0004_0004,
                        0x0004_0004_0004_0004,
                        0x0004_0004_0004_0004,
                        0x0004_0004_0004_0004,
                        0x0002_0002_0002_0002,
                        0x0002_0002_0002_0002,
                        0x0002_0002_0002_0002,
                        0x0002_0002_0002_0002,
                    ),
                )
            } else {
                _mm512_srlv_epi16(
                    qh,
                    _mm512_setr_epi64(
                        0,
                        0,
                        0,
                        0,
                        0x0002_0002_0002_0002,
                        0x0002_0002_0002_0002,
                        0x0002_0002_0002_0002,
                        0x0002_0002_0002_0002,
                    ),
                )
            };
            let hi = _mm512_and_si512(qh, _mm512_set1_epi8(0x30));
            // Scales 8·half + 2·kq .. + 4, one per 4 lanes.
            let idx = _mm512_add_epi32(
                _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                _mm512_set1_epi32((8 * half + 2 * kq) as i32),
            );
            let s = _mm512_permutexvar_ps(idx, hdr);
            Pair {
                u: _mm512_or_si512(lo, hi),
                s,
            }
        }
    }
}

/// `S²·H + S·M + L` per lane of 4 codes of `u` against the planes at
/// element `e`: folded in integers for [`QPair::SMALL`] codes, else three
/// conversions.
///
/// # Safety
/// As [`row_vnni`]; `e + 64 <= qx.k`.
#[inline(always)]
unsafe fn pair_dot<Q: QPair>(u: __m512i, qx: &QuantX, e: usize) -> __m512 {
    // SAFETY: the caller's contract; the planes hold `qx.k` values.
    unsafe {
        let plane = |p: &[i8]| _mm512_loadu_si512(p.as_ptr().add(e).cast());
        let z = _mm512_setzero_si512();
        let h = _mm512_dpbusd_epi32(z, u, plane(&qx.h));
        if Q::SMALL {
            let s = _mm512_set1_epi32(S as i32);
            let hm = _mm512_dpbusd_epi32(_mm512_mullo_epi32(h, s), u, plane(&qx.m));
            let hml = _mm512_dpbusd_epi32(_mm512_mullo_epi32(hm, s), u, plane(&qx.l));
            _mm512_cvtepi32_ps(hml)
        } else {
            let m = _mm512_dpbusd_epi32(z, u, plane(&qx.m));
            let l = _mm512_dpbusd_epi32(z, u, plane(&qx.l));
            let ml = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(m),
                _mm512_set1_ps(S),
                _mm512_cvtepi32_ps(l),
            );
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), _mm512_set1_ps(S * S), ml)
        }
    }
}

/// 512-bit to 256-bit: the two halves added.
///
/// # Safety
/// AVX-512 F enabled.
#[inline(always)]
unsafe fn fold8(v: __m512) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        _mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        )
    }
}

/// AVX-512 VNNI row dot: two groups per `vpdpbusd`; an odd last group
/// takes the 256-bit form.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C enabled; `row` holds
/// `qx.k / 32 / GROUPS` blocks.
#[inline(always)]
unsafe fn row_vnni<Q: QPair>(row: &[u8], qx: &QuantX) -> f32 {
    // SAFETY: the caller's contract; every block pointer is inside `row`.
    unsafe {
        let n = qx.k / 32;
        // `acc`: Σ s·d·(planes); `off`: Σ s·sum(x) per lane (times the
        // type's constant at the end); `koff`: the K-quants' mins.
        let (mut acc, mut off) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut koff = _mm256_setzero_ps();
        let mut gi = 0;
        while gi + 2 <= n {
            let b = row.as_ptr().add(gi / Q::GROUPS * Q::BYTES);
            prefetch_ahead(b, Q::BYTES * (2 / Q::GROUPS).max(1));
            let hdr = Q::header(b);
            // One pair of one-group blocks, or every pair of a block.
            for g in (0..Q::GROUPS.max(2)).step_by(2) {
                let p = Q::pair(b, g, &hdr);
                let e = (gi + g) * 32;
                let v = pair_dot::<Q>(p.u, qx, e);
                let v = _mm512_mul_ps(v, _mm512_loadu_ps(qx.lane_d.as_ptr().add(e / 4)));
                acc = _mm512_fmadd_ps(v, p.s, acc);
                if Q::OFFSET.is_some() {
                    let sums = _mm512_loadu_ps(qx.lane_sum.as_ptr().add(e / 4));
                    off = _mm512_fmadd_ps(p.s, sums, off);
                }
            }
            if Q::OFFSET.is_none() {
                let sums = _mm256_loadu_ps(qx.group_sum.as_ptr().add(gi));
                koff = _mm256_fmadd_ps(Q::offsets(&hdr), sums, koff);
            }
            gi += Q::GROUPS.max(2);
        }
        // Signed codes were shifted by 128: `w = s·(u − 128)`.
        let c = Q::OFFSET.unwrap_or(0.0) - if Q::SIGNED { 128.0 } else { 0.0 };
        let mut acc8 = _mm256_fmadd_ps(fold8(off), _mm256_set1_ps(c), fold8(acc));
        acc8 = _mm256_add_ps(acc8, koff);
        if gi < n {
            acc8 = _mm256_add_ps(acc8, last_group::<Q>(row, gi, qx));
        }
        hsum8(acc8)
    }
}

/// Group `gi` of the row on 256-bit `vpdpbusd`, offset term included:
/// signed codes are shifted by 128 (`w = s·(u − 128)`).
///
/// # Safety
/// As [`row_vnni`]; group `gi` is inside `row`.
#[inline(always)]
unsafe fn last_group<Q: QBlock>(row: &[u8], gi: usize, qx: &QuantX) -> __m256 {
    // SAFETY: the caller's contract; the planes hold `qx.k` values and
    // the lane vectors `qx.k / 4`.
    unsafe {
        let b = row.as_ptr().add(gi / Q::GROUPS * Q::BYTES);
        let g = gi % Q::GROUPS;
        let mut u = Q::codes(b, g);
        let hdr = Q::header(b);
        let s = Q::scales(&hdr, g);
        let shift = if Q::SIGNED {
            u = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
            -128.0
        } else {
            0.0
        };
        let o = match Q::OFFSET {
            Some(c) => _mm256_mul_ps(s, _mm256_set1_ps(c + shift)),
            None => lane(Q::offsets(&hdr), g),
        };
        let e = gi * 32;
        let z = _mm256_setzero_si256();
        let plane = |p: &[i8]| _mm256_loadu_si256(p.as_ptr().add(e).cast());
        let h = _mm256_dpbusd_epi32(z, u, plane(&qx.h));
        let m = _mm256_dpbusd_epi32(z, u, plane(&qx.m));
        let l = _mm256_dpbusd_epi32(z, u, plane(&qx.l));
        let ml = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(m),
            _mm256_set1_ps(S),
            _mm256_cvtepi32_ps(l),
        );
        let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_set1_ps(S * S), ml);
        let v = _mm256_mul_ps(v, _mm256_loadu_ps(qx.lane_d.as_ptr().add(e / 4)));
        let sums = _mm256_loadu_ps(qx.lane_sum.as_ptr().add(e / 4));
        _mm256_fmadd_ps(o, sums, _mm256_mul_ps(v, s))
    }
}

/// Integer GEMV with AVX-512 VNNI.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; `w` holds `y.len()`
/// rows of `qx.k` elements of `ty` at stride `row_bytes` (checked by the
/// caller).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in crate::x86) unsafe fn gemv_vnni(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    qx: &QuantX,
    y: &mut [f32],
) -> bool {
    // SAFETY: this function's contract.
    by_qtype!(ty, Q => each_row(w, row_bytes, y, |row| unsafe { row_vnni::<Q>(row, qx) }),
        _ => false)
}
