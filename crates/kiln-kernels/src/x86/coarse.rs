//! SIMD forms of `crate::coarse` on AVX-512 VBMI: the one-row screen of
//! a [`CoarseRows`] (256-bit `vpdpbusd`, in `super::screen`'s shape: rows
//! in groups, one linear prefetch sweep) and the rebuild of a row's Q8_0
//! bytes. A block's 32 six-bit `u` come out of its 24 bytes in three ops:
//! `vpermb` gives each qword its group's 6 bytes, `vpmultishiftqb` takes
//! the byte at bit `6i` for byte `i` of the qword, an AND drops the two
//! bits above.

use core::arch::x86_64::*;
use core::mem::MaybeUninit;

use crate::coarse::{CoarseRows, SCREEN_BLOCK};
use crate::screen::{fold_lo, ScreenX, ABS_SLACK};

use super::screen::sweep_prefetch;

/// Rows screened together (as `super::screen`).
const GROUP: usize = 4;
/// How many row groups ahead the screen prefetches.
const PREFETCH_GROUPS: usize = 2;
/// Most blocks per row (the rows' f32 scales live on the stack): rows of
/// up to 16,384 values; longer ones take the portable screen.
pub(super) const MAX_BLOCKS: usize = 512;

/// Block `b`'s 32 `u` values (bytes in `[0, 63]`) from a row's screen
/// part at `row` (`nb` blocks). (An in-lane `vpshufb` of a load from 4
/// bytes before the block, instead of `vpermb`, was 5% slower on Zen 4.)
///
/// # Safety
/// AVX-512 VL and VBMI; 32 bytes readable from the block's codes (the
/// rows' zero tail covers the last block's 8 over).
#[inline(always)]
unsafe fn unpack_u(row: *const u8, nb: usize, b: usize) -> __m256i {
    // Qword k: bytes 6k..6k+6 (the two above are not used).
    const GROUPS: [u8; 32] = {
        let mut idx = [0u8; 32];
        let mut i = 0;
        while i < 32 {
            idx[i] = (6 * (i / 8) + i % 8) as u8;
            i += 1;
        }
        idx
    };
    // SAFETY: the caller's contract bounds the load.
    unsafe {
        let raw = _mm256_loadu_si256(row.add(2 * nb + 24 * b).cast());
        let grouped = _mm256_permutexvar_epi8(_mm256_loadu_si256(GROUPS.as_ptr().cast()), raw);
        let shifts = _mm256_set1_epi64x(0x2A24_1E18_120C_0600);
        _mm256_and_si256(
            _mm256_multishift_epi64_epi8(shifts, grouped),
            _mm256_set1_epi8(63),
        )
    }
}

/// The 32 two-bit values of 8 crumb bytes at `p` (byte `j` holds value
/// `j + 8k` at bits `2k`), one per byte.
///
/// # Safety
/// AVX2; `p` holds 8 bytes.
#[inline(always)]
unsafe fn crumbs_at(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm256_set1_epi64x(p.cast::<i64>().read_unaligned());
        let v = _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 2, 4, 6));
        _mm256_and_si256(v, _mm256_set1_epi8(3))
    }
}

/// The screen of rows `r0 .. r0 + hi.len()` in groups of [`GROUP`].
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 BW, VL, VNNI and VBMI; rows `r0 .. r0 + hi.len()`
/// inside `c`, whose rows have `sx.k / 32 <= MAX_BLOCKS` blocks (checked
/// by the caller).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) unsafe fn screen_vbmi(sx: &ScreenX, c: &CoarseRows, r0: usize, hi: &mut [f32]) -> f32 {
    let mut max_lo = f32::NEG_INFINITY;
    let mut groups = hi.chunks_exact_mut(GROUP);
    let mut r = r0;
    for hs in &mut groups {
        let hs: &mut [f32; GROUP] = hs.try_into().expect("exact chunk");
        // SAFETY: the caller's features; these rows are inside `c`.
        unsafe { rows_screen::<GROUP>(sx, c, r, hs, &mut max_lo) };
        r += GROUP;
    }
    for h in groups.into_remainder() {
        // SAFETY: as above.
        unsafe { rows_screen::<1>(sx, c, r, core::array::from_mut(h), &mut max_lo) };
        r += 1;
    }
    max_lo
}

/// `R` rows from `r0`, each with the same ops in the same order as alone:
/// per row first its scales (as `4·d_w` for the products), the offset
/// `Σ d_w·off_b` and the bound `Σ |d_w|·c'_b`, eight blocks at a time;
/// then per block `u`, its integer dot with `x̂` per 4-value lane, scaled.
///
/// # Safety
/// As [`screen_vbmi`], rows `r0..r0 + R` inside `c`.
#[inline(always)]
unsafe fn rows_screen<const R: usize>(
    sx: &ScreenX,
    c: &CoarseRows,
    r0: usize,
    hs: &mut [f32; R],
    max_lo: &mut f32,
) {
    let nb = c.blocks();
    let stride = nb * SCREEN_BLOCK;
    // Rows `r0..` and the zero tail.
    let base = c.screen_from(r0);
    assert!(base.len() >= R * stride);
    // SAFETY: inside `base` (asserted); pointers into all of it, not a
    // row's slice, as the unpack reads past the last block.
    let rows: [*const u8; R] = core::array::from_fn(|i| unsafe { base.as_ptr().add(i * stride) });
    // Not zeroed (8 KiB a group, for ~2 KiB of rows): `row_terms` writes
    // the first `nb` of each before the block loop reads them.
    let mut s4 = [[MaybeUninit::<f32>::uninit(); MAX_BLOCKS]; R];
    let mut acc = [_mm256_setzero_ps(); R];
    let mut beta = [_mm256_setzero_ps(); R];
    for i in 0..R {
        // SAFETY: the row holds `2 · nb` scale bytes; `s4[i]`, `coarse_off`
        // and `coarse_c` hold `nb` values.
        (acc[i], beta[i]) = unsafe { row_terms(sx, rows[i], nb, &mut s4[i]) };
    }
    // `b` indexes the rows' scales, `x`'s blocks and the prefetch sweep.
    #[allow(clippy::needless_range_loop)]
    for b in 0..nb {
        // SAFETY: SSE is enabled; prefetches never fault.
        unsafe {
            sweep_prefetch(
                base.as_ptr(),
                PREFETCH_GROUPS * R * stride,
                R * SCREEN_BLOCK,
                b,
            )
        };
        let xq = &sx.q[b * 32..][..32];
        let ld = &sx.lane_d[b * 8..][..8];
        // SAFETY: the slices bound the loads.
        let (xv, ldv) = unsafe {
            (
                _mm256_loadu_si256(xq.as_ptr().cast()),
                _mm256_loadu_ps(ld.as_ptr()),
            )
        };
        for i in 0..R {
            // SAFETY: row `i` holds block `b`; register ops of the
            // caller's features.
            unsafe {
                let u = unpack_u(rows[i], nb, b);
                let p32 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, xv);
                // `row_terms` wrote `s4[i][..nb]`.
                let scale = _mm256_mul_ps(_mm256_set1_ps(s4[i][b].assume_init()), ldv);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), scale, acc[i]);
            }
        }
    }
    for i in 0..R {
        // SAFETY: register-only AVX ops.
        let (a, b) = unsafe { (super::screen::hsum8(acc[i]), super::screen::hsum8(beta[i])) };
        let b = b + ABS_SLACK;
        hs[i] = a + b;
        *max_lo = fold_lo(*max_lo, a - b, hs[i]);
    }
}

/// A row's `4·d_w` per block into `s4`; returns the lanes of `Σ d_w·off_b`
/// (the block loop's starting sums) and of `Σ |d_w|·c'_b`, eight blocks
/// at a time (the last ones masked).
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 VL and BW; `row` holds `2 · nb` scale bytes,
/// `nb <= MAX_BLOCKS`, `sx` has `nb` blocks.
#[inline(always)]
unsafe fn row_terms(
    sx: &ScreenX,
    row: *const u8,
    nb: usize,
    s4: &mut [MaybeUninit<f32>; MAX_BLOCKS],
) -> (__m256, __m256) {
    let (mut o, mut bt) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for b in (0..nb).step_by(8) {
        let k: __mmask8 = if nb - b >= 8 {
            0xff
        } else {
            (1u8 << (nb - b)) - 1
        };
        // SAFETY: the mask keeps every read below `nb` (masked-off
        // elements are not read); `s4` holds `b + 8` values.
        unsafe {
            let dw = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(k, row.add(2 * b).cast()));
            let dw4 = _mm256_mul_ps(dw, _mm256_set1_ps(4.0));
            // Unmasked (`b + 8 <= MAX_BLOCKS`): the block loop's loads of
            // `s4` forward from plain stores, not from masked ones.
            _mm256_storeu_ps(s4.as_mut_ptr().add(b).cast(), dw4);
            let off = _mm256_maskz_loadu_ps(k, sx.coarse_off.as_ptr().add(b));
            o = _mm256_fmadd_ps(dw, off, o);
            let adw = _mm256_andnot_ps(_mm256_set1_ps(-0.0), dw);
            let c = _mm256_maskz_loadu_ps(k, sx.coarse_c.as_ptr().add(b));
            bt = _mm256_fmadd_ps(adw, c, bt);
        }
    }
    (o, bt)
}

/// Row `r` of `c` as Q8_0 bytes: `q = 4·u + l − 128` per byte (no carry:
/// `4·u + l ≤ 255`).
///
/// # Safety
/// AVX2, AVX-512 VL and VBMI; `r < c.rows()` and `out` holds `34 · nb`
/// bytes (checked by the caller).
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vbmi")]
pub(super) unsafe fn q8_0_row(c: &CoarseRows, r: usize, out: &mut [u8]) {
    let nb = c.blocks();
    let (_, low) = c.row(r);
    // All of the rest of the rows: the unpack reads past the row.
    let tail = c.screen_from(r);
    assert!(tail.len() >= nb * SCREEN_BLOCK);
    let row = tail.as_ptr();
    for (b, blk) in out.chunks_exact_mut(34).enumerate() {
        blk[..2].copy_from_slice(&tail[2 * b..][..2]);
        // SAFETY: `row` and `low` hold block `b`; `blk` its 32 codes.
        unsafe {
            let u = unpack_u(row, nb, b);
            let l = crumbs_at(low.as_ptr().add(8 * b));
            let q = _mm256_add_epi8(_mm256_slli_epi16::<2>(u), l);
            let q = _mm256_xor_si256(q, _mm256_set1_epi8(-128));
            _mm256_storeu_si256(blk.as_mut_ptr().add(2).cast(), q);
        }
    }
}
