//! AVX2 + FMA + F16C instantiation of the generic kernels: 8 lanes, a
//! 4-row × 3-token GEMM micro-kernel (12 of the 16 ymm registers hold
//! accumulators).

use core::arch::x86_64::*;

use kiln_quant::GgmlType;

use super::kern::{self, GemmShape, Simd};
use super::rows;
use super::tile;

/// Proof that the CPU has AVX2, FMA and F16C.
#[derive(Clone, Copy)]
pub(super) struct Avx2(());

/// Every intrinsic call below is sound because an [`Avx2`] exists only
/// after [`Avx2::new`], whose caller vouched for the features.
macro_rules! tf {
    ($e:expr) => {
        // SAFETY: see the comment on the macro; pointer arguments are
        // checked by each caller.
        unsafe { $e }
    };
}

impl Avx2 {
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn new() -> Self {
        Self(())
    }

    /// Lane `j` holds `1 << j`: tests bit `j` of a broadcast mask.
    #[inline(always)]
    fn lane_bits(self) -> __m256i {
        tf!(_mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128))
    }
}

impl Simd for Avx2 {
    const LANES: usize = 8;
    type F = __m256;
    type I = __m256i;

    #[inline(always)]
    fn zero(self) -> __m256 {
        tf!(_mm256_setzero_ps())
    }
    #[inline(always)]
    fn splat(self, v: f32) -> __m256 {
        tf!(_mm256_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn load_ptr(self, p: *const f32) -> __m256 {
        tf!(_mm256_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn store_ptr(self, p: *mut f32, v: __m256) {
        tf!(_mm256_storeu_ps(p, v))
    }
    #[inline(always)]
    fn fma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        tf!(_mm256_fmadd_ps(a, b, c))
    }
    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        tf!(_mm256_add_ps(a, b))
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        tf!(_mm256_mul_ps(a, b))
    }
    #[inline(always)]
    fn div(self, a: __m256, b: __m256) -> __m256 {
        tf!(_mm256_div_ps(a, b))
    }
    #[inline(always)]
    fn min(self, a: __m256, b: __m256) -> __m256 {
        tf!(_mm256_min_ps(a, b))
    }
    #[inline(always)]
    fn max(self, a: __m256, b: __m256) -> __m256 {
        tf!(_mm256_max_ps(a, b))
    }
    #[inline(always)]
    fn round(self, a: __m256) -> __m256 {
        tf!(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(a))
    }
    #[inline(always)]
    fn pow2i(self, n: __m256) -> __m256 {
        // The biased exponent, shifted into place.
        tf!(_mm256_castsi256_ps(_mm256_slli_epi32::<23>(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127))
        )))
    }
    #[inline(always)]
    fn hsum(self, v: __m256) -> f32 {
        tf!({
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        })
    }
    #[inline(always)]
    fn hsum4(self, v: [__m256; 4]) -> [f32; 4] {
        tf!({
            // Two rounds of hadd give [s0 s1 s2 s3 | s0' s1' s2' s3'].
            let ab = _mm256_hadd_ps(v[0], v[1]);
            let cd = _mm256_hadd_ps(v[2], v[3]);
            let abcd = _mm256_hadd_ps(ab, cd);
            let r = _mm_add_ps(
                _mm256_castps256_ps128(abcd),
                _mm256_extractf128_ps::<1>(abcd),
            );
            let mut out = [0.0f32; 4];
            _mm_storeu_ps(out.as_mut_ptr(), r);
            out
        })
    }
    #[inline(always)]
    fn u8s(self, b: &[u8]) -> __m256i {
        assert!(b.len() >= 8);
        tf!(_mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr().cast())))
    }
    #[inline(always)]
    fn i8s(self, b: &[u8]) -> __m256i {
        assert!(b.len() >= 8);
        tf!(_mm256_cvtepi8_epi32(_mm_loadl_epi64(b.as_ptr().cast())))
    }
    #[inline(always)]
    fn f16s(self, b: &[u8]) -> __m256 {
        assert!(b.len() >= 16);
        tf!(_mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().cast())))
    }
    #[inline(always)]
    fn bf16s(self, b: &[u8]) -> __m256 {
        assert!(b.len() >= 16);
        tf!(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(b.as_ptr().cast()))
        )))
    }
    #[inline(always)]
    fn f32s(self, b: &[u8]) -> __m256 {
        assert!(b.len() >= 32);
        tf!(_mm256_loadu_ps(b.as_ptr().cast()))
    }
    #[inline(always)]
    fn and(self, v: __m256i, m: i32) -> __m256i {
        tf!(_mm256_and_si256(v, _mm256_set1_epi32(m)))
    }
    #[inline(always)]
    fn or(self, a: __m256i, b: __m256i) -> __m256i {
        tf!(_mm256_or_si256(a, b))
    }
    #[inline(always)]
    fn srl(self, v: __m256i, n: u32) -> __m256i {
        tf!(_mm256_srl_epi32(v, _mm_cvtsi32_si128(n as i32)))
    }
    #[inline(always)]
    fn sll(self, v: __m256i, n: u32) -> __m256i {
        tf!(_mm256_sll_epi32(v, _mm_cvtsi32_si128(n as i32)))
    }
    #[inline(always)]
    fn cvt(self, v: __m256i) -> __m256 {
        tf!(_mm256_cvtepi32_ps(v))
    }
    #[inline(always)]
    fn or_bits(self, v: __m256i, bits: u32, val: i32) -> __m256i {
        let lane = self.lane_bits();
        tf!({
            let set =
                _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits as i32), lane), lane);
            _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi32(val)))
        })
    }
    #[inline(always)]
    fn or_test(self, v: __m256i, t: __m256i, bit: i32, val: i32) -> __m256i {
        tf!({
            let b = _mm256_set1_epi32(bit);
            let set = _mm256_cmpeq_epi32(_mm256_and_si256(t, b), b);
            _mm256_or_si256(v, _mm256_and_si256(set, _mm256_set1_epi32(val)))
        })
    }
    #[inline(always)]
    fn f16(self, h: [u8; 2]) -> f32 {
        tf!(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            u16::from_le_bytes(h) as i32
        ))))
    }
    #[inline(always)]
    fn splat_f16(self, h: [u8; 2]) -> __m256 {
        tf!(_mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(h))))
    }
    #[inline(always)]
    fn prefetch(self, p: *const u8) {
        tf!(_mm_prefetch::<_MM_HINT_T0>(p.cast()))
    }
}

entry_points!(Avx2, "avx2,fma,f16c", 3, 4);
