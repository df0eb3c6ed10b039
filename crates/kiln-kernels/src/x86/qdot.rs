//! Integer GEMV: packed weight bytes against the three int8 planes of a
//! [`QuantX`] (see `crate::qx` for the math and its error bound).
//!
//! Every supported type is decoded 32 weights at a time into a [`Group`]:
//! 32 integer codes `u` (unsigned, or signed for Q8_0) with `w = s·u + o`
//! per half of 16. Per 4-weight lane `j` the planes give
//! `Σ u·x ≈ d_b/S² · (S²·H + S·M + L)` from three integer dots, so
//! `y = Σ_j s_j · d_j · v_j + Σ_j o_j · sum_j` (the offset term uses the
//! exact lane sums of `x`). AVX2 multiplies with `pmaddubsw` (no i16
//! saturation: codes are below 64, or `|q| · sign` for Q8_0); AVX-512
//! VNNI decodes two groups per `vpdpbusd` (signed codes shifted by 128,
//! the shift folded into the offset).

use core::arch::x86_64::*;

use kiln_quant::block::scale_min_k4;
use kiln_quant::GgmlType;

use crate::qx::{QuantX, S};

/// 32 weights: codes and, per half of 16, scale and offset.
#[derive(Clone, Copy)]
struct Group {
    u: __m256i,
    s: [f32; 2],
    o: [f32; 2],
}

/// 64 weights (groups `gi`, `gi + 1`) for `vpdpbusd`: unsigned codes and
/// per-lane (4 weights) scale and offset.
#[derive(Clone, Copy)]
struct Pair {
    u: __m512i,
    s: __m512,
    o: __m512,
}

/// Spreads the 32 bits of `bits` to bytes: `val` where set, else 0.
trait Bits: Copy {
    /// # Safety
    /// The implementing level's features must be enabled.
    unsafe fn bytes(self, bits: u32, val: i8) -> __m256i;
}

/// Shuffle + compare (AVX2 has no byte masks).
#[derive(Clone, Copy)]
struct Avx2Bits;

impl Bits for Avx2Bits {
    #[inline(always)]
    unsafe fn bytes(self, bits: u32, val: i8) -> __m256i {
        // SAFETY: AVX2 per the trait contract.
        unsafe {
            // Byte j takes byte j / 8 of `bits`, then tests bit j % 8.
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(bits as i32),
                _mm256_set_epi64x(
                    0x0303_0303_0303_0303,
                    0x0202_0202_0202_0202,
                    0x0101_0101_0101_0101,
                    0,
                ),
            );
            let probe = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, probe), probe);
            _mm256_and_si256(set, _mm256_set1_epi8(val))
        }
    }
}

/// One masked move (AVX-512 BW + VL).
#[derive(Clone, Copy)]
struct MaskBits;

impl Bits for MaskBits {
    #[inline(always)]
    unsafe fn bytes(self, bits: u32, val: i8) -> __m256i {
        // SAFETY: AVX-512 BW/VL per the trait contract.
        unsafe { _mm256_maskz_set1_epi8(bits, val) }
    }
}

/// A packed format decoded 32 weights at a time.
trait QBlock {
    const BYTES: usize;
    /// Groups of 32 per block.
    const GROUPS: usize;
    /// Codes are signed bytes (`s·q`, no offset).
    const SIGNED: bool;
    /// Group `g` of the block at `b`.
    ///
    /// # Safety
    /// `b` is valid for `BYTES` reads; `g < GROUPS`; AVX2, FMA and F16C
    /// (plus what `B` needs) are enabled.
    unsafe fn group<B: Bits>(bits: B, b: *const u8, g: usize) -> Group;

    /// What [`QBlock::pair`] needs from a block's header, decoded once
    /// per block (the K-quants' scales).
    type Hdr: Copy;

    /// # Safety
    /// As [`QBlock::pair`]; `b` is a block.
    unsafe fn header(b: *const u8) -> Self::Hdr;

    /// 64 weights decoded in 512-bit registers, signed codes shifted by
    /// 128: groups `g`, `g + 1` (`g` even) of the block at `b` with its
    /// header, or for one-group types the blocks at `b` and `b + BYTES`.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C enabled; the groups lie
    /// inside the row.
    unsafe fn pair(b: *const u8, g: usize, hdr: Self::Hdr) -> Pair;
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

/// The eight `d·sc` and `−dmin·m` of a Q4_K/Q5_K block (SWAR unpacking
/// of `scale_min_k4`'s layout: groups 0..4 in the low six bits of bytes
/// 0..8, groups 4..8 in the nibbles of bytes 8..12 plus the spare top bits).
///
/// # Safety
/// AVX2 and F16C enabled; `b` valid for the 16-byte block header.
#[inline(always)]
unsafe fn kscales(b: *const u8) -> (__m256, __m256) {
    // SAFETY: the caller's contract.
    unsafe {
        let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
        let w = |i: usize| {
            u32::from_le_bytes([*b.add(4 + i), *b.add(5 + i), *b.add(6 + i), *b.add(7 + i)])
        };
        let (w0, w1, w2) = (w(0), w(4), w(8));
        let sc = u64::from(w0 & 0x3F3F_3F3F)
            | u64::from((w2 & 0x0F0F_0F0F) | ((w0 >> 2) & 0x3030_3030)) << 32;
        let m = u64::from(w1 & 0x3F3F_3F3F)
            | u64::from(((w2 >> 4) & 0x0F0F_0F0F) | ((w1 >> 2) & 0x3030_3030)) << 32;
        let f = |v: u64| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
        (
            _mm256_mul_ps(f(sc), _mm256_set1_ps(d)),
            _mm256_mul_ps(f(m), _mm256_set1_ps(-dmin)),
        )
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

/// # Safety
/// F16C enabled; `p` valid for 2 reads.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        let h = u16::from_le_bytes([*p, *p.add(1)]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
    }
}

/// `[q & 15, q >> 4]` of 16 bytes: elements 0..16 then 16..32.
///
/// # Safety
/// AVX2 enabled; `p` valid for 16 reads.
#[inline(always)]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let q = _mm_loadu_si128(p.cast());
        let both = _mm256_set_m128i(_mm_srli_epi16::<4>(q), q);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
    }
}

/// Low (`hi == false`) or high nibbles of 32 bytes.
///
/// # Safety
/// AVX2 enabled; `p` valid for 32 reads.
#[inline(always)]
unsafe fn nibbles32(p: *const u8, hi: bool) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let q = _mm256_loadu_si256(p.cast());
        let q = if hi { _mm256_srli_epi16::<4>(q) } else { q };
        _mm256_and_si256(q, _mm256_set1_epi8(0x0F))
    }
}

/// Bits `n..n + width` of each byte of 32 bytes at `p`, moved to bit 4
/// (`n <= 7`; epi16 shifts are safe: bits crossing from the neighbour
/// byte never reach the masked positions).
///
/// # Safety
/// AVX2 enabled; `p` valid for 32 reads.
#[inline(always)]
unsafe fn bits_to_4(p: *const u8, n: u32, mask: i8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let q = _mm256_loadu_si256(p.cast());
        let q = if n <= 4 {
            _mm256_sll_epi16(q, _mm_cvtsi32_si128(4 - n as i32))
        } else {
            _mm256_srl_epi16(q, _mm_cvtsi32_si128(n as i32 - 4))
        };
        _mm256_and_si256(q, _mm256_set1_epi8(mask))
    }
}

struct Q40;
impl QBlock for Q40 {
    const BYTES: usize = 18;
    const GROUPS: usize = 1;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn group<B: Bits>(_: B, b: *const u8, _: usize) -> Group {
        // SAFETY: the trait contract.
        unsafe {
            let d = f16_at(b);
            Group {
                u: nibbles16(b.add(2)),
                s: [d; 2],
                o: [-8.0 * d; 2],
            }
        }
    }
    type Hdr = ();
    #[inline(always)]
    unsafe fn header(_: *const u8) {}
    #[inline(always)]
    unsafe fn pair(b0: *const u8, _: usize, _: ()) -> Pair {
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

struct Q50;
impl QBlock for Q50 {
    const BYTES: usize = 22;
    const GROUPS: usize = 1;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn group<B: Bits>(bits: B, b: *const u8, _: usize) -> Group {
        // SAFETY: the trait contract.
        unsafe {
            let d = f16_at(b);
            let qh = u32::from_le_bytes([*b.add(2), *b.add(3), *b.add(4), *b.add(5)]);
            Group {
                u: _mm256_or_si256(nibbles16(b.add(6)), bits.bytes(qh, 0x10)),
                s: [d; 2],
                o: [-16.0 * d; 2],
            }
        }
    }
    type Hdr = ();
    #[inline(always)]
    unsafe fn header(_: *const u8) {}
    #[inline(always)]
    unsafe fn pair(b0: *const u8, _: usize, _: ()) -> Pair {
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

struct Q80;
impl QBlock for Q80 {
    const BYTES: usize = 34;
    const GROUPS: usize = 1;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn group<B: Bits>(_: B, b: *const u8, _: usize) -> Group {
        // SAFETY: the trait contract.
        unsafe {
            let d = f16_at(b);
            Group {
                u: _mm256_loadu_si256(b.add(2).cast()),
                s: [d; 2],
                o: [0.0; 2],
            }
        }
    }
    type Hdr = ();
    #[inline(always)]
    unsafe fn header(_: *const u8) {}
    #[inline(always)]
    unsafe fn pair(b0: *const u8, _: usize, _: ()) -> Pair {
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

struct Q4K;
impl QBlock for Q4K {
    const BYTES: usize = 144;
    const GROUPS: usize = 8;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn group<B: Bits>(_: B, b: *const u8, g: usize) -> Group {
        // SAFETY: the trait contract.
        unsafe {
            let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
            let scales = &*b.add(4).cast::<[u8; 12]>();
            let (sc, m) = scale_min_k4(g, scales);
            let s = d * f32::from(sc);
            Group {
                u: nibbles32(b.add(16 + 32 * (g / 2)), g % 2 == 1),
                s: [s; 2],
                o: [-(dmin * f32::from(m)); 2],
            }
        }
    }
    type Hdr = (__m256, __m256);
    #[inline(always)]
    unsafe fn header(b: *const u8) -> Self::Hdr {
        // SAFETY: the trait contract.
        unsafe { kscales(b) }
    }
    #[inline(always)]
    unsafe fn pair(b: *const u8, g: usize, hdr: Self::Hdr) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
            let (s, o) = kpair(hdr, g);
            Pair {
                u: nibbles32x2(b.add(16 + 16 * g)),
                s,
                o,
            }
        }
    }
}

struct Q5K;
impl QBlock for Q5K {
    const BYTES: usize = 176;
    const GROUPS: usize = 8;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn group<B: Bits>(_: B, b: *const u8, g: usize) -> Group {
        // SAFETY: the trait contract.
        unsafe {
            let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
            let scales = &*b.add(4).cast::<[u8; 12]>();
            let (sc, m) = scale_min_k4(g, scales);
            let s = d * f32::from(sc);
            // Bit g of qh[l] is the fifth bit of element l of group g.
            let hi = bits_to_4(b.add(16), g as u32, 0x10);
            Group {
                u: _mm256_or_si256(nibbles32(b.add(48 + 32 * (g / 2)), g % 2 == 1), hi),
                s: [s; 2],
                o: [-(dmin * f32::from(m)); 2],
            }
        }
    }
    type Hdr = (__m256, __m256);
    #[inline(always)]
    unsafe fn header(b: *const u8) -> Self::Hdr {
        // SAFETY: the trait contract.
        unsafe { kscales(b) }
    }
    #[inline(always)]
    unsafe fn pair(b: *const u8, g: usize, hdr: Self::Hdr) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
            let (s, o) = kpair(hdr, g);
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

struct Q6K;
impl QBlock for Q6K {
    const BYTES: usize = 210;
    const GROUPS: usize = 8;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn group<B: Bits>(_: B, b: *const u8, g: usize) -> Group {
        // SAFETY: the trait contract.
        unsafe {
            let d = f16_at(b.add(208));
            // Element 128·half + 32·kq + l: nibble kq / 2 of
            // ql[64·half + 32·(kq % 2) + l], bits 2kq.. of qh[32·half + l].
            let (half, kq) = (g / 4, g % 4);
            let lo = nibbles32(b.add(64 * half + 32 * (kq % 2)), kq >= 2);
            // Bits 2kq, 2kq + 1 to bits 4, 5.
            let hi = bits_to_4(b.add(128 + 32 * half), 2 * kq as u32, 0x30);
            let sc = |i: usize| d * f32::from(*b.add(192 + 8 * half + 2 * kq + i) as i8);
            let s = [sc(0), sc(1)];
            Group {
                u: _mm256_or_si256(lo, hi),
                s,
                o: [-32.0 * s[0], -32.0 * s[1]],
            }
        }
    }
    /// The 16 scales times `d`.
    type Hdr = __m512;
    #[inline(always)]
    unsafe fn header(b: *const u8) -> __m512 {
        // SAFETY: the trait contract.
        unsafe {
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(192).cast())));
            _mm512_mul_ps(sc, _mm512_set1_ps(f16_at(b.add(208))))
        }
    }
    #[inline(always)]
    unsafe fn pair(b: *const u8, g: usize, hdr: __m512) -> Pair {
        // SAFETY: the trait contract.
        unsafe {
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

/// Runs `$body` with `$B` naming the decoder of `$ty`, else `$other`.
macro_rules! by_qtype {
    ($ty:expr, $B:ident => $body:expr, _ => $other:expr) => {
        match $ty {
            GgmlType::Q4_0 => {
                type $B = Q40;
                $body
            }
            GgmlType::Q5_0 => {
                type $B = Q50;
                $body
            }
            GgmlType::Q8_0 => {
                type $B = Q80;
                $body
            }
            GgmlType::Q4K => {
                type $B = Q4K;
                $body
            }
            GgmlType::Q5K => {
                type $B = Q5K;
                $body
            }
            GgmlType::Q6K => {
                type $B = Q6K;
                $body
            }
            _ => $other,
        }
    };
}

/// Whether the integer GEMV covers `ty`.
pub(crate) fn has_qkernel(ty: GgmlType) -> bool {
    use GgmlType as T;
    matches!(ty, T::Q4_0 | T::Q5_0 | T::Q8_0 | T::Q4K | T::Q5K | T::Q6K)
}

/// Prefetch distance in bytes for the weight stream: one core's demand
/// misses alone stream ~6 GB/s from DRAM here; 3 KiB ahead gives ~12
/// (768 B: ~8.5; measured on 262,144 Q5_0 rows, `cargo bench`).
const PREFETCH: usize = 3072;

/// Prefetches every cache line of `bytes` bytes at `p + PREFETCH`.
///
/// # Safety
/// SSE enabled (prefetches never fault, any address is fine).
#[inline(always)]
unsafe fn prefetch_ahead(p: *const u8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        // SAFETY: the caller's contract.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + off).cast()) };
    }
}

/// `S²·H + S·M + L` as f32.
///
/// # Safety
/// AVX2 and FMA enabled.
#[inline(always)]
unsafe fn combine8(h: __m256i, m: __m256i, l: __m256i) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        let ml = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(m),
            _mm256_set1_ps(S),
            _mm256_cvtepi32_ps(l),
        );
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_set1_ps(S * S), ml)
    }
}

/// Per-lane scales of one group: lanes 0..4 from `v[0]`, 4..8 from `v[1]`.
///
/// # Safety
/// AVX enabled.
#[inline(always)]
unsafe fn halves8(v: [f32; 2]) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe { _mm256_setr_m128(_mm_set1_ps(v[0]), _mm_set1_ps(v[1])) }
}

/// How [`add_group8`] multiplies codes by plane bytes (i32 per 4 bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dot8 {
    /// `pmaddubsw` on unsigned codes (below 64: no i16 saturation).
    Unsigned,
    /// `pmaddubsw(|q|, sign(x, q))` on signed codes (`128 · 127 · 2 < 2^15`).
    Signed,
    /// 256-bit `vpdpbusd` (AVX-512 VNNI + VL) on unsigned codes.
    Vnni,
}

/// # Safety
/// AVX2 enabled, and AVX-512 VNNI + VL for [`Dot8::Vnni`].
#[inline(always)]
unsafe fn dot8(kind: Dot8, u: __m256i, x: __m256i) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            Dot8::Vnni => _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x),
            Dot8::Unsigned => _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)),
            Dot8::Signed => _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_abs_epi8(u), _mm256_sign_epi8(x, u)),
                _mm256_set1_epi16(1),
            ),
        }
    }
}

/// Adds group `g` against the planes at element `e` to the accumulators.
///
/// # Safety
/// As [`dot8`], plus FMA; `e + 32 <= qx.k`.
#[inline(always)]
unsafe fn add_group8(
    kind: Dot8,
    qx: &QuantX,
    e: usize,
    g: &Group,
    acc: &mut __m256,
    off: &mut __m256,
) {
    // SAFETY: the caller's contract; the planes hold `qx.k` values and
    // the lane vectors `qx.k / 4`.
    unsafe {
        let h = dot8(kind, g.u, _mm256_loadu_si256(qx.h.as_ptr().add(e).cast()));
        let m = dot8(kind, g.u, _mm256_loadu_si256(qx.m.as_ptr().add(e).cast()));
        let l = dot8(kind, g.u, _mm256_loadu_si256(qx.l.as_ptr().add(e).cast()));
        let v = _mm256_mul_ps(
            combine8(h, m, l),
            _mm256_loadu_ps(qx.lane_d.as_ptr().add(e / 4)),
        );
        *acc = _mm256_fmadd_ps(v, halves8(g.s), *acc);
        let sums = _mm256_loadu_ps(qx.lane_sum.as_ptr().add(e / 4));
        *off = _mm256_fmadd_ps(halves8(g.o), sums, *off);
    }
}

/// # Safety
/// AVX enabled.
#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// AVX2 row dot: `pmaddubsw` + `pmaddwd`.
///
/// # Safety
/// AVX2, FMA and F16C enabled; `row` holds `qx.k / 32 / GROUPS` blocks.
#[inline(always)]
unsafe fn row_avx2<Q: QBlock>(row: &[u8], qx: &QuantX) -> f32 {
    // SAFETY: the caller's contract; every block pointer is inside `row`.
    unsafe {
        let kind = if Q::SIGNED {
            Dot8::Signed
        } else {
            Dot8::Unsigned
        };
        let (mut acc, mut off) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let nb = qx.k / 32 / Q::GROUPS;
        for bi in 0..nb {
            let b = row.as_ptr().add(bi * Q::BYTES);
            prefetch_ahead(b, Q::BYTES);
            for g in 0..Q::GROUPS {
                let gr = Q::group(Avx2Bits, b, g);
                let e = (bi * Q::GROUPS + g) * 32;
                add_group8(kind, qx, e, &gr, &mut acc, &mut off);
            }
        }
        hsum8(_mm256_add_ps(acc, off))
    }
}

/// AVX-512 VNNI row dot: two groups per `vpdpbusd`; an odd last group
/// takes the 256-bit form.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C enabled; `row` as for
/// [`row_avx2`].
#[inline(always)]
unsafe fn row_vnni<Q: QBlock>(row: &[u8], qx: &QuantX) -> f32 {
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
                let p = Q::pair(b, g, hdr);
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
        let mut off8 = _mm256_add_ps(
            _mm512_castps512_ps256(off),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(off))),
        );
        if gi < n {
            let mut g = vnni_group::<Q>(row, gi);
            if Q::SIGNED {
                g.u = _mm256_xor_si256(g.u, _mm256_set1_epi8(-128));
            }
            add_group8(Dot8::Vnni, qx, gi * 32, &g, &mut acc8, &mut off8);
        }
        hsum8(_mm256_add_ps(acc8, off8))
    }
}

/// Group `gi` of the row for `vpdpbusd`: signed codes get the offset of
/// their `+ 128` shift (`w = s·(u − 128)`); the caller flips the bytes.
///
/// # Safety
/// As [`row_vnni`]; group `gi` is inside `row`.
#[inline(always)]
unsafe fn vnni_group<Q: QBlock>(row: &[u8], gi: usize) -> Group {
    // SAFETY: the caller's contract.
    unsafe {
        let b = row.as_ptr().add(gi / Q::GROUPS * Q::BYTES);
        let mut g = Q::group(MaskBits, b, gi % Q::GROUPS);
        if Q::SIGNED {
            g.o = [g.o[0] - 128.0 * g.s[0], g.o[1] - 128.0 * g.s[1]];
        }
        g
    }
}

/// Integer GEMV with AVX2 (also the AVX-512 level without VNNI).
///
/// # Safety
/// AVX2, FMA and F16C present; `w` holds `y.len()` rows of `qx.k`
/// elements of `ty` at stride `row_bytes` (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemv_avx2(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    qx: &QuantX,
    y: &mut [f32],
) -> bool {
    by_qtype!(ty, Q => {
        for (r, yr) in y.iter_mut().enumerate() {
            // SAFETY: this function's contract.
            *yr = unsafe { row_avx2::<Q>(&w[r * row_bytes..], qx) };
        }
        true
    }, _ => false)
}

/// Integer GEMV with AVX-512 VNNI.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; `w` as for
/// [`gemv_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn gemv_vnni(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    qx: &QuantX,
    y: &mut [f32],
) -> bool {
    by_qtype!(ty, Q => {
        for (r, yr) in y.iter_mut().enumerate() {
            // SAFETY: this function's contract.
            *yr = unsafe { row_vnni::<Q>(&w[r * row_bytes..], qx) };
        }
        true
    }, _ => false)
}
