//! AVX-512 (F + BW + VL) instantiation of the generic kernels: 16 lanes,
//! a 4-row × 6-token GEMM micro-kernel (24 zmm accumulators).

use core::arch::x86_64::*;

use kiln_quant::GgmlType;

use super::kern::{self, GemmShape, Simd};
use super::rows;
use super::tile;

/// Proof that the CPU has AVX-512 F/BW/VL, AVX2, FMA and F16C.
#[derive(Clone, Copy)]
pub(super) struct Avx512(());

/// Every intrinsic call below is sound because an [`Avx512`] exists only
/// after [`Avx512::new`], whose caller vouched for the features.
macro_rules! tf {
    ($e:expr) => {
        // SAFETY: see the comment on the macro; pointer arguments are
        // checked by each caller.
        unsafe { $e }
    };
}

impl Avx512 {
    /// # Safety
    /// The CPU must support AVX-512 F, BW and VL, AVX2, FMA and F16C.
    pub(super) unsafe fn new() -> Self {
        Self(())
    }
}

impl Simd for Avx512 {
    const LANES: usize = 16;
    type F = __m512;
    type I = __m512i;

    #[inline(always)]
    fn zero(self) -> __m512 {
        tf!(_mm512_setzero_ps())
    }
    #[inline(always)]
    fn splat(self, v: f32) -> __m512 {
        tf!(_mm512_set1_ps(v))
    }
    #[inline(always)]
    unsafe fn load_ptr(self, p: *const f32) -> __m512 {
        tf!(_mm512_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn store_ptr(self, p: *mut f32, v: __m512) {
        tf!(_mm512_storeu_ps(p, v))
    }
    #[inline(always)]
    fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        tf!(_mm512_fmadd_ps(a, b, c))
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        tf!(_mm512_add_ps(a, b))
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        tf!(_mm512_mul_ps(a, b))
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        tf!(_mm512_div_ps(a, b))
    }
    #[inline(always)]
    fn min(self, a: __m512, b: __m512) -> __m512 {
        tf!(_mm512_min_ps(a, b))
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        tf!(_mm512_max_ps(a, b))
    }
    #[inline(always)]
    fn round(self, a: __m512) -> __m512 {
        tf!(_mm512_roundscale_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(a))
    }
    #[inline(always)]
    fn pow2i(self, n: __m512) -> __m512 {
        tf!(_mm512_scalef_ps(_mm512_set1_ps(1.0), n))
    }
    #[inline(always)]
    fn hsum(self, v: __m512) -> f32 {
        tf!(_mm512_reduce_add_ps(v))
    }
    #[inline(always)]
    fn hsum4(self, v: [__m512; 4]) -> [f32; 4] {
        tf!({
            // Fold 512 -> 256 bits, then two rounds of hadd leave
            // [s0 s1 s2 s3 | s0' s1' s2' s3'] with s = s + s'.
            let h = |z: __m512| {
                _mm256_add_ps(
                    _mm512_castps512_ps256(z),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(z))),
                )
            };
            let ab = _mm256_hadd_ps(h(v[0]), h(v[1]));
            let cd = _mm256_hadd_ps(h(v[2]), h(v[3]));
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
    fn u8s(self, b: &[u8]) -> __m512i {
        assert!(b.len() >= 16);
        tf!(_mm512_cvtepu8_epi32(_mm_loadu_si128(b.as_ptr().cast())))
    }
    #[inline(always)]
    fn i8s(self, b: &[u8]) -> __m512i {
        assert!(b.len() >= 16);
        tf!(_mm512_cvtepi8_epi32(_mm_loadu_si128(b.as_ptr().cast())))
    }
    #[inline(always)]
    fn f16s(self, b: &[u8]) -> __m512 {
        assert!(b.len() >= 32);
        tf!(_mm512_cvtph_ps(_mm256_loadu_si256(b.as_ptr().cast())))
    }
    #[inline(always)]
    fn bf16s(self, b: &[u8]) -> __m512 {
        assert!(b.len() >= 32);
        tf!(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(b.as_ptr().cast()))
        )))
    }
    #[inline(always)]
    fn f32s(self, b: &[u8]) -> __m512 {
        assert!(b.len() >= 64);
        tf!(_mm512_loadu_ps(b.as_ptr().cast()))
    }
    #[inline(always)]
    fn and(self, v: __m512i, m: i32) -> __m512i {
        tf!(_mm512_and_si512(v, _mm512_set1_epi32(m)))
    }
    #[inline(always)]
    fn or(self, a: __m512i, b: __m512i) -> __m512i {
        tf!(_mm512_or_si512(a, b))
    }
    #[inline(always)]
    fn srl(self, v: __m512i, n: u32) -> __m512i {
        tf!(_mm512_srl_epi32(v, _mm_cvtsi32_si128(n as i32)))
    }
    #[inline(always)]
    fn sll(self, v: __m512i, n: u32) -> __m512i {
        tf!(_mm512_sll_epi32(v, _mm_cvtsi32_si128(n as i32)))
    }
    #[inline(always)]
    fn cvt(self, v: __m512i) -> __m512 {
        tf!(_mm512_cvtepi32_ps(v))
    }
    #[inline(always)]
    fn or_bits(self, v: __m512i, bits: u32, val: i32) -> __m512i {
        tf!(_mm512_mask_or_epi32(
            v,
            bits as u16,
            v,
            _mm512_set1_epi32(val)
        ))
    }
    #[inline(always)]
    fn or_test(self, v: __m512i, t: __m512i, bit: i32, val: i32) -> __m512i {
        tf!({
            let k = _mm512_test_epi32_mask(t, _mm512_set1_epi32(bit));
            _mm512_mask_or_epi32(v, k, v, _mm512_set1_epi32(val))
        })
    }
    #[inline(always)]
    fn f16(self, h: [u8; 2]) -> f32 {
        tf!(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            u16::from_le_bytes(h) as i32
        ))))
    }
    #[inline(always)]
    fn splat_f16(self, h: [u8; 2]) -> __m512 {
        tf!(_mm512_cvtph_ps(_mm256_set1_epi16(i16::from_le_bytes(h))))
    }
    #[inline(always)]
    fn prefetch(self, p: *const u8) {
        tf!(_mm_prefetch::<_MM_HINT_T0>(p.cast()))
    }
}

entry_points!(Avx512, "avx512f,avx512bw,avx512vl,avx2,fma,f16c", 4, 6);
