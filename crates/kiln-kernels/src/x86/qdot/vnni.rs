//! The AVX-512 VNNI form of the integer GEMV: two groups of 32 per
//! 512-bit `vpdpbusd` (signed codes shifted by 128, the shift folded into
//! the offset); an odd last group takes the 256-bit form on the AVX2
//! decoders ([`QBlock`]).

use core::arch::x86_64::*;

use kiln_quant::GgmlType;

use super::{each_row, hsum8, lane, prefetch_ahead, QBlock, Q40, Q4K, Q50, Q5K, Q6K, Q80};
use crate::qx::{QuantX, S};

/// 64 weights (groups `gi`, `gi + 1`) for `vpdpbusd`: unsigned codes and
/// per-lane (4 weights) scale and offset.
#[derive(Clone, Copy)]
struct Pair {
    u: __m512i,
    s: __m512,
    o: __m512,
}

/// A packed format decoded 64 weights at a time in 512-bit registers.
trait QPair: QBlock {
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

/// Lanes 0..8 from entry `g` of `hdr`, 8..16 from entry `g + 1`.
///
/// # Safety
/// AVX-512 F enabled.
#[inline(always)]
unsafe fn kpair(hdr: (__m256, __m256), g: usize) -> (__m512, __m512) {
    // SAFETY: the caller's contract.
    unsafe {
        let idx = _mm512_add_epi32(
            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
            _mm512_set1_epi32(g as i32),
        );
        (
            _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(hdr.0)),
            _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(hdr.1)),
        )
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
                o: _mm512_mul_ps(s, _mm512_set1_ps(-8.0)),
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
                o: _mm512_mul_ps(s, _mm512_set1_ps(-16.0)),
            }
        }
    }
}

impl QPair for Q80 {
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
                o: _mm512_mul_ps(s, _mm512_set1_ps(-128.0)),
            }
        }
    }
}

impl QPair for Q4K {
    #[inline(always)]
    unsafe fn pair(b: *const u8, g: usize, hdr: &Self::Hdr) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
            let (s, o) = kpair(*hdr, g);
            Pair {
                u: nibbles32x2(b.add(16 + 16 * g)),
                s,
                o,
            }
        }
    }
}

impl QPair for Q5K {
    #[inline(always)]
    unsafe fn pair(b: *const u8, g: usize, hdr: &Self::Hdr) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
            let (s, o) = kpair(*hdr, g);
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
                o,
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
                o: _mm512_mul_ps(s, _mm512_set1_ps(-32.0)),
            }
        }
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
        let (mut acc, mut off) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut gi = 0;
        while gi + 2 <= n {
            let b = row.as_ptr().add(gi / Q::GROUPS * Q::BYTES);
            prefetch_ahead(b, Q::BYTES * (2 / Q::GROUPS).max(1));
            let hdr = Q::header(b);
            // One pair of one-group blocks, or every pair of a block.
            for g in (0..Q::GROUPS.max(2)).step_by(2) {
                let p = Q::pair(b, g, &hdr);
                let e = (gi + g) * 32;
                let z = _mm512_setzero_si512();
                let h =
                    _mm512_dpbusd_epi32(z, p.u, _mm512_loadu_si512(qx.h.as_ptr().add(e).cast()));
                let m =
                    _mm512_dpbusd_epi32(z, p.u, _mm512_loadu_si512(qx.m.as_ptr().add(e).cast()));
                let l =
                    _mm512_dpbusd_epi32(z, p.u, _mm512_loadu_si512(qx.l.as_ptr().add(e).cast()));
                let ml = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(m),
                    _mm512_set1_ps(S),
                    _mm512_cvtepi32_ps(l),
                );
                let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), _mm512_set1_ps(S * S), ml);
                let v = _mm512_mul_ps(v, _mm512_loadu_ps(qx.lane_d.as_ptr().add(e / 4)));
                acc = _mm512_fmadd_ps(v, p.s, acc);
                off = _mm512_fmadd_ps(p.o, _mm512_loadu_ps(qx.lane_sum.as_ptr().add(e / 4)), off);
            }
            gi += Q::GROUPS.max(2);
        }
        let mut acc8 = _mm256_add_ps(
            _mm512_castps512_ps256(acc),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc))),
        );
        let off8 = _mm256_add_ps(
            _mm512_castps512_ps256(off),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(off))),
        );
        if gi < n {
            acc8 = _mm256_add_ps(acc8, last_group::<Q>(row, gi, qx));
        }
        hsum8(_mm256_add_ps(acc8, off8))
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
