//! Integer GEMV: packed weight bytes against the three int8 planes of a
//! [`QuantX`] (see `crate::qx` for the math and its error bound).
//!
//! Every supported type is decoded 32 weights at a time: 32 integer codes
//! `u` (unsigned, or signed for Q8_0) with `w = s·(u + c)` per half of 16,
//! `c` a constant of the type, or for Q4_K/Q5_K `w = s·u − m` with one
//! `m` per group. Per 4-weight lane the planes give
//! `Σ u·x ≈ d_b/S² · (S²·H + S·M + L)` from three integer dots, so
//! `y = Σ s · d_b/S² · (S²·H + S·M + L) + c · Σ s · sum(x)` (the offset
//! term uses the exact sums of `x`, per lane or per group).
//!
//! AVX2 multiplies with `pmaddubsw` (no i16 saturation: codes are below
//! 64, or `|q| · sign` for Q8_0) and folds `S·H + M` in integers
//! (`pmaddwd` by `S`, exact: below 2^24), so each group costs two
//! conversions and three FMAs. AVX-512 VNNI ([`vnni`]) decodes two groups
//! per `vpdpbusd`.

use core::arch::x86_64::*;

use kiln_quant::GgmlType;

use crate::qx::{QuantX, S};

/// Runs `$body` with `$B` naming the decoder of `$ty`, else `$other`.
macro_rules! by_qtype {
    ($ty:expr, $B:ident => $body:expr, _ => $other:expr) => {
        by_decoder!($ty, $B => $body, _ => $other;
            Q4_0 => Q40, Q5_0 => Q50, Q8_0 => Q80, Q4K => Q4K, Q5K => Q5K, Q6K => Q6K)
    };
}

mod vnni;

pub(super) use vnni::gemv_vnni;

/// A packed format as the AVX2 kernel decodes it: per block a header
/// (scales), then 32 codes per group.
trait QBlock {
    const BYTES: usize;
    /// Groups of 32 per block.
    const GROUPS: usize;
    /// Codes are signed bytes (`s·q`, no offset).
    const SIGNED: bool;
    /// `Some(c)`: `w = s·(u + c)`; `None`: `w = s·u + o` with the eight
    /// groups' `o` from [`QBlock::offsets`] (then `GROUPS == 8`).
    const OFFSET: Option<f32>;

    /// The block's scales, decoded once per block.
    type Hdr: Copy;

    /// # Safety
    /// `b` is valid for `BYTES` reads; AVX2, FMA and F16C are enabled.
    unsafe fn header(b: *const u8) -> Self::Hdr;

    /// Scales of group `g`: lanes 0..4 for its first 16 weights, 4..8 for
    /// the second 16.
    ///
    /// # Safety
    /// AVX2 enabled; `g < GROUPS`.
    unsafe fn scales(h: &Self::Hdr, g: usize) -> __m256;

    /// `o` of the block's eight groups ([`QBlock::OFFSET`] `None` only).
    ///
    /// # Safety
    /// AVX enabled.
    unsafe fn offsets(_h: &Self::Hdr) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_setzero_ps() }
    }

    /// The 32 codes of group `g` of the block at `b`.
    ///
    /// # Safety
    /// As [`QBlock::header`]; `g < GROUPS`.
    unsafe fn codes(b: *const u8, g: usize) -> __m256i;
}

/// Spreads the 32 bits of the little-endian `u32` at `p` to bytes: `val`
/// where set, else 0 (shuffle + compare: AVX2 has no byte masks).
///
/// # Safety
/// AVX2 enabled; `p` valid for 4 reads.
#[inline(always)]
unsafe fn bits_to_bytes(p: *const u8, val: i8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let bits = i32::from_le(p.cast::<i32>().read_unaligned());
        // Byte j takes byte j / 8 of `bits`, then tests bit j % 8.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits),
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
        let w = |i: usize| u32::from_le(b.add(4 + i).cast::<u32>().read_unaligned());
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

/// The f16 at `p` in every lane.
///
/// # Safety
/// AVX2 and F16C enabled; `p` valid for 2 reads.
#[inline(always)]
unsafe fn f16_splat(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le(
            p.cast::<i16>().read_unaligned(),
        )))
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
        let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
        // Bits shifted in from the next byte land above the mask.
        let q = _mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        _mm256_and_si256(q, _mm256_set1_epi8(0x0F))
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

/// Lane `j` of `v` in every lane.
///
/// # Safety
/// AVX2 enabled.
#[inline(always)]
unsafe fn lane(v: __m256, j: usize) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe { _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(j as i32)) }
}

/// Implements [`QBlock`] for a one-group block with an f16 scale first.
macro_rules! one_group_block {
    ($name:ident, $bytes:literal, $signed:literal, $offset:expr, |$b:ident| $codes:expr) => {
        struct $name;
        impl QBlock for $name {
            const BYTES: usize = $bytes;
            const GROUPS: usize = 1;
            const SIGNED: bool = $signed;
            const OFFSET: Option<f32> = Some($offset);
            /// The block's scale in every lane.
            type Hdr = __m256;
            #[inline(always)]
            unsafe fn header(b: *const u8) -> __m256 {
                // SAFETY: the trait contract.
                unsafe { f16_splat(b) }
            }
            #[inline(always)]
            unsafe fn scales(h: &__m256, _: usize) -> __m256 {
                *h
            }
            #[inline(always)]
            unsafe fn codes($b: *const u8, _: usize) -> __m256i {
                // SAFETY: the trait contract.
                unsafe { $codes }
            }
        }
    };
}

one_group_block!(Q40, 18, false, -8.0, |b| nibbles16(b.add(2)));
one_group_block!(Q50, 22, false, -16.0, |b| _mm256_or_si256(
    nibbles16(b.add(6)),
    bits_to_bytes(b.add(2), 0x10)
));
one_group_block!(Q80, 34, true, 0.0, |b| _mm256_loadu_si256(b.add(2).cast()));

/// The [`QBlock`] items Q4_K and Q5_K share: 8 groups, `d·sc` and
/// `−dmin·m` per group from [`kscales`].
macro_rules! kquant_scales {
    ($bytes:literal) => {
        const BYTES: usize = $bytes;
        const GROUPS: usize = 8;
        const SIGNED: bool = false;
        const OFFSET: Option<f32> = None;
        type Hdr = (__m256, __m256);
        #[inline(always)]
        unsafe fn header(b: *const u8) -> Self::Hdr {
            // SAFETY: the trait contract.
            unsafe { kscales(b) }
        }
        #[inline(always)]
        unsafe fn scales(h: &Self::Hdr, g: usize) -> __m256 {
            // SAFETY: the trait contract.
            unsafe { lane(h.0, g) }
        }
        #[inline(always)]
        unsafe fn offsets(h: &Self::Hdr) -> __m256 {
            h.1
        }
    };
}

struct Q4K;
impl QBlock for Q4K {
    kquant_scales!(144);
    #[inline(always)]
    unsafe fn codes(b: *const u8, g: usize) -> __m256i {
        // SAFETY: the trait contract.
        unsafe { nibbles32(b.add(16 + 32 * (g / 2)), g % 2 == 1) }
    }
}

struct Q5K;
impl QBlock for Q5K {
    kquant_scales!(176);
    #[inline(always)]
    unsafe fn codes(b: *const u8, g: usize) -> __m256i {
        // SAFETY: the trait contract.
        unsafe {
            // Bit g of qh[l] is the fifth bit of element l of group g.
            let hi = bits_to_4(b.add(16), g as u32, 0x10);
            _mm256_or_si256(nibbles32(b.add(48 + 32 * (g / 2)), g % 2 == 1), hi)
        }
    }
}

struct Q6K;
impl QBlock for Q6K {
    const BYTES: usize = 210;
    const GROUPS: usize = 8;
    const SIGNED: bool = false;
    const OFFSET: Option<f32> = Some(-32.0);
    /// The 16 scales times `d`.
    type Hdr = [__m256; 2];
    #[inline(always)]
    unsafe fn header(b: *const u8) -> Self::Hdr {
        // SAFETY: the trait contract.
        unsafe {
            let q = _mm_loadu_si128(b.add(192).cast());
            let d = f16_splat(b.add(208));
            let f = |q: __m128i| _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
            [f(q), f(_mm_unpackhi_epi64(q, q))]
        }
    }
    #[inline(always)]
    unsafe fn scales(h: &Self::Hdr, g: usize) -> __m256 {
        // Scales 2g (first 16 weights) and 2g + 1.
        let j = 2 * (g % 4) as i32;
        // SAFETY: the trait contract.
        unsafe {
            _mm256_permutevar8x32_ps(
                h[g / 4],
                _mm256_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1),
            )
        }
    }
    #[inline(always)]
    unsafe fn codes(b: *const u8, g: usize) -> __m256i {
        // SAFETY: the trait contract.
        unsafe {
            // Element 128·half + 32·kq + l: nibble kq / 2 of
            // ql[64·half + 32·(kq % 2) + l], bits 2kq.. of qh[32·half + l].
            let (half, kq) = (g / 4, g % 4);
            let lo = nibbles32(b.add(64 * half + 32 * (kq % 2)), kq >= 2);
            // Bits 2kq, 2kq + 1 to bits 4, 5.
            let hi = bits_to_4(b.add(128 + 32 * half), 2 * kq as u32, 0x30);
            _mm256_or_si256(lo, hi)
        }
    }
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

/// `S²·H + S·M + L` per lane of 4 codes, `H, M, L` the integer dots of
/// the codes `u` with the planes at element `e`: `pmaddubsw` (signed
/// codes as `|q| · sign(x, q)`), then `S·H + M` by one `pmaddwd` against
/// `S` and one against 1 (exact in i32 and in f32: at most
/// `4·128·127·254 < 2^24`), so two conversions and one FMA.
///
/// # Safety
/// AVX2 and FMA enabled; `e + 32 <= qx.k`.
#[inline(always)]
unsafe fn planes_dot<Q: QBlock>(u: __m256i, qx: &QuantX, e: usize) -> __m256 {
    // SAFETY: the caller's contract; the planes hold `qx.k` values.
    unsafe {
        let plane = |p: &[i8]| _mm256_loadu_si256(p.as_ptr().add(e).cast());
        let a = if Q::SIGNED { _mm256_abs_epi8(u) } else { u };
        let prod = |x: __m256i| {
            let x = if Q::SIGNED { _mm256_sign_epi8(x, u) } else { x };
            _mm256_maddubs_epi16(a, x)
        };
        let ones = _mm256_set1_epi16(1);
        let sm = _mm256_add_epi32(
            _mm256_madd_epi16(prod(plane(&qx.h)), _mm256_set1_epi16(S as i16)),
            _mm256_madd_epi16(prod(plane(&qx.m)), ones),
        );
        let l = _mm256_madd_epi16(prod(plane(&qx.l)), ones);
        _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(sm),
            _mm256_set1_ps(S),
            _mm256_cvtepi32_ps(l),
        )
    }
}

/// AVX2 row dot.
///
/// # Safety
/// AVX2, FMA and F16C enabled; `row` holds `qx.k / 32 / GROUPS` blocks.
#[inline(always)]
unsafe fn row_avx2<Q: QBlock>(row: &[u8], qx: &QuantX) -> f32 {
    // SAFETY: the caller's contract; every block pointer is inside `row`,
    // and the lane (group) vectors hold `qx.k / 4` (`qx.k / 32`) values.
    unsafe {
        let (mut acc, mut off) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let nb = qx.k / 32 / Q::GROUPS;
        for bi in 0..nb {
            let b = row.as_ptr().add(bi * Q::BYTES);
            prefetch_ahead(b, Q::BYTES);
            let hdr = Q::header(b);
            for g in 0..Q::GROUPS {
                let e = (bi * Q::GROUPS + g) * 32;
                let v = planes_dot::<Q>(Q::codes(b, g), qx, e);
                let s = Q::scales(&hdr, g);
                let sd = _mm256_mul_ps(s, _mm256_loadu_ps(qx.lane_d.as_ptr().add(e / 4)));
                acc = _mm256_fmadd_ps(v, sd, acc);
                if matches!(Q::OFFSET, Some(c) if c != 0.0) {
                    let sums = _mm256_loadu_ps(qx.lane_sum.as_ptr().add(e / 4));
                    off = _mm256_fmadd_ps(s, sums, off);
                }
            }
            if Q::OFFSET.is_none() {
                // One FMA per block: the eight groups' `o` times their sums.
                let sums = _mm256_loadu_ps(qx.group_sum.as_ptr().add(bi * 8));
                off = _mm256_fmadd_ps(Q::offsets(&hdr), sums, off);
            }
        }
        hsum8(acc) + Q::OFFSET.unwrap_or(1.0) * hsum8(off)
    }
}

/// `y[r] = dot(r)` of the row at `w[r * row_bytes..]`; `true`.
#[inline(always)]
fn each_row(w: &[u8], row_bytes: usize, y: &mut [f32], dot: impl Fn(&[u8]) -> f32) -> bool {
    for (r, yr) in y.iter_mut().enumerate() {
        *yr = dot(&w[r * row_bytes..]);
    }
    true
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
    // SAFETY: this function's contract.
    by_qtype!(ty, Q => each_row(w, row_bytes, y, |row| unsafe { row_avx2::<Q>(row, qx) }),
        _ => false)
}
