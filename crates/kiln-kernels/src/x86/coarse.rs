//! SIMD forms of `crate::coarse`: the one-row screen of a [`CoarseRows`]
//! (256-bit, in `super::screen`'s shape: rows in groups, one linear
//! prefetch sweep) and the rebuild of a row's Q8_0 bytes, generic over
//! the level's [`Unpack`] of a block's 32 six-bit `u` from its 24 bytes:
//!
//! - [`Vbmi`] (AVX-512 VBMI + VNNI), three ops: `vpermb` gives each qword
//!   its group's 6 bytes, `vpmultishiftqb` takes the byte at bit `6i` for
//!   byte `i` of the qword, an AND drops the two bits above; `vpdpbusd`
//!   takes the dot.
//! - [`Avx2`], base64-encoder style: one 32-byte load from 4 bytes
//!   before the block puts its bytes 0..12 (values 0..16) in the low
//!   128-bit lane and 12..24 in the high one; `vpshufb` gives dword `j`
//!   of a lane its bytes `[3j, 3j+1, 3j+1, 3j+2]`, whose words hold the
//!   stream's bits `24j ..` and `24j + 8 ..`: `u_{4j}` at bit 0 and
//!   `u_{4j+2}` at bit 4 of the words under a mask, `u_{4j+1}` and
//!   `u_{4j+3}` under the same mask after a shift by 6. The dot takes
//!   them as they lie: two `vpmaddwd` against `x̂` widened to words
//!   (times 16 where `u` is at bit 0; once per call), which leaves 16
//!   times the lane sums, scaled by a sixteenth of the scale. (Moving the
//!   fields into bytes for `vpmaddubsw` with `vpmullw` by per-word powers
//!   of two took an op more per block, and an asm barrier: LLVM turns
//!   products by constant powers of two into per-word shifts, which
//!   AVX2 lacks, and widened them to dwords, 2x slower.)
//!
//! Both give every lane the same integer sum and then run the same f32
//! ops in the same order, so their bounds agree bit for bit.

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

/// What the coarse kernels need of a level. Every method is inlined into
/// a caller that enables the level's features (its `# Safety`), and
/// reads a block's codes at `row` (a row's screen part, `nb` blocks) with
/// a 32-byte load: from the block's start, or for [`Avx2`] from 4 bytes
/// before it (the rows' zero tail covers the last block's 8 or 4 over).
pub(super) trait Unpack {
    /// A block of `x̂` as [`Unpack::dot`] takes it.
    type X: Copy;

    /// What scales [`Unpack::dot`]'s lane sums, per unit of `d_w·d_x`:
    /// `w'`'s step 4 over the power of two they come in.
    const SCALE: f32;

    /// A block of `x̂` (32 bytes) as [`Unpack::dot`] takes it.
    ///
    /// # Safety
    /// The level's features.
    unsafe fn x(xv: __m256i) -> Self::X;

    /// Per 4-value lane, the exact `Σ u·x̂` of block `b` of `row`, times
    /// a power of two (`4 / SCALE`).
    ///
    /// # Safety
    /// The level's features; `row` holds block `b`.
    unsafe fn dot(row: *const u8, nb: usize, b: usize, x: Self::X) -> __m256i;

    /// Block `b`'s 32 `u` values (bytes in `[0, 63]`), in order.
    ///
    /// # Safety
    /// As [`Unpack::dot`].
    unsafe fn u(row: *const u8, nb: usize, b: usize) -> __m256i;

    /// Blocks `b .. b + n` (`n ≥ 1`; 8 at most are read) of a row's scales
    /// (as f32) and of `sx`'s `d`, `coarse_off` and `coarse_c`; zeros past
    /// `n`.
    ///
    /// # Safety
    /// The level's features; `row` is a row's screen part, `b < nb`, and
    /// `sx` holds `b + n` blocks.
    unsafe fn terms(sx: &ScreenX, row: *const u8, b: usize, n: usize) -> [__m256; 4];
}

/// AVX-512 VL, BW, VNNI and VBMI (see the module doc).
pub(super) struct Vbmi;

impl Unpack for Vbmi {
    type X = __m256i;
    const SCALE: f32 = 4.0;

    #[inline(always)]
    unsafe fn x(xv: __m256i) -> __m256i {
        xv
    }

    #[inline(always)]
    unsafe fn dot(row: *const u8, nb: usize, b: usize, x: __m256i) -> __m256i {
        // SAFETY: the caller's contract.
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), Vbmi::u(row, nb, b), x) }
    }

    /// (An in-lane `vpshufb` of a load from 4 bytes before the block,
    /// instead of `vpermb`, was 5% slower on Zen 4.)
    #[inline(always)]
    unsafe fn u(row: *const u8, nb: usize, b: usize) -> __m256i {
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

    #[inline(always)]
    unsafe fn terms(sx: &ScreenX, row: *const u8, b: usize, n: usize) -> [__m256; 4] {
        let k: __mmask8 = if n >= 8 { 0xff } else { (1u8 << n) - 1 };
        // SAFETY: the mask keeps every read below `b + n` (masked-off
        // elements are not read).
        unsafe {
            [
                _mm256_cvtph_ps(_mm_maskz_loadu_epi16(k, row.add(2 * b).cast())),
                _mm256_maskz_loadu_ps(k, sx.d.as_ptr().add(b)),
                _mm256_maskz_loadu_ps(k, sx.coarse_off.as_ptr().add(b)),
                _mm256_maskz_loadu_ps(k, sx.coarse_c.as_ptr().add(b)),
            ]
        }
    }
}

/// AVX2, FMA and F16C (see the module doc).
pub(super) struct Avx2;

impl Avx2 {
    /// Block `b`'s fields as words, per dword `j` (values `4j ..`): `u_{4j}`
    /// and `16·u_{4j+2}`, then `u_{4j+1}` and `16·u_{4j+3}`. One 32-byte
    /// load from 4 bytes before the codes puts bytes 0..12 in the low
    /// lane and 12..24 in the high one (two 16-byte loads and an insert
    /// were 9% slower).
    ///
    /// # Safety
    /// AVX2; as [`Unpack::dot`], and `nb >= 2` (the 4 bytes before block
    /// 0's codes are the row's last two scales).
    #[inline(always)]
    unsafe fn fields(row: *const u8, nb: usize, b: usize) -> (__m256i, __m256i) {
        // Per lane, dword j: the lane's codes' bytes [3j, 3j+1, 3j+1,
        // 3j+2] (the low lane's start 4 bytes in).
        const SPREAD: [u8; 32] = {
            let mut idx = [0u8; 32];
            let mut i = 0;
            while i < 32 {
                let lane_start = if i < 16 { 4 } else { 0 };
                idx[i] = (lane_start + 3 * ((i % 16) / 4) + [0, 1, 1, 2][i % 4]) as u8;
                i += 1;
            }
            idx
        };
        // SAFETY: the caller's contract bounds the load (from 4 bytes
        // before the block's codes).
        unsafe {
            let raw = _mm256_loadu_si256(row.add(2 * nb + 24 * b - 4).cast());
            let v = _mm256_shuffle_epi8(raw, _mm256_loadu_si256(SPREAD.as_ptr().cast()));
            // Word 0: bits 0..6 and 6..12; word 1: 4..10 and 10..16.
            let mask = _mm256_set1_epi32(0x03f0_003f);
            (
                _mm256_and_si256(v, mask),
                _mm256_and_si256(_mm256_srli_epi16::<6>(v), mask),
            )
        }
    }
}

impl Unpack for Avx2 {
    /// Per dword `j`: `16·x̂_{4j}` and `x̂_{4j+2}`, then `16·x̂_{4j+1}` and
    /// `x̂_{4j+3}` (words).
    type X = [__m256i; 2];
    /// The lane sums come 16 times over: the products are the same
    /// where the scales are exact ([`scales_exact`]).
    const SCALE: f32 = 0.25;

    #[inline(always)]
    unsafe fn x(xv: __m256i) -> [__m256i; 2] {
        // SAFETY: the caller's features.
        unsafe {
            let even = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(xv));
            let odd = _mm256_srai_epi16::<8>(xv);
            [
                _mm256_blend_epi16::<0xAA>(_mm256_slli_epi16::<4>(even), even),
                _mm256_blend_epi16::<0xAA>(_mm256_slli_epi16::<4>(odd), odd),
            ]
        }
    }

    #[inline(always)]
    unsafe fn dot(row: *const u8, nb: usize, b: usize, x: [__m256i; 2]) -> __m256i {
        // SAFETY: the caller's contract; every product is 16 times its
        // term, `|Σ| ≤ 16 · 4 · 63 · 128 < 2^24` (exact in f32).
        unsafe {
            let (lo, hi) = Avx2::fields(row, nb, b);
            _mm256_add_epi32(_mm256_madd_epi16(lo, x[0]), _mm256_madd_epi16(hi, x[1]))
        }
    }

    #[inline(always)]
    unsafe fn u(row: *const u8, nb: usize, b: usize) -> __m256i {
        // SAFETY: the caller's contract.
        unsafe {
            let (lo, hi) = Avx2::fields(row, nb, b);
            // Words 0: u_{4j} | u_{4j+1} << 8; words 1 the same of
            // u_{4j+2}, u_{4j+3} (from their 16-fold fields).
            let w0 = _mm256_or_si256(lo, _mm256_slli_epi16::<8>(hi));
            let w1 = _mm256_or_si256(_mm256_srli_epi16::<4>(lo), _mm256_slli_epi16::<4>(hi));
            _mm256_blend_epi16::<0xAA>(w0, w1)
        }
    }

    #[inline(always)]
    unsafe fn terms(sx: &ScreenX, row: *const u8, b: usize, n: usize) -> [__m256; 4] {
        // SAFETY: `maskload` reads only the lanes below `n`; the scales'
        // 16 bytes lie in the row's screen part (`26 · nb` bytes, `b + 8
        // <= 13 · nb`), their lanes past `n` zeroed.
        unsafe {
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let k = _mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(8) as i32), lanes);
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(row.add(2 * b).cast()));
            [
                _mm256_and_ps(dw, _mm256_castsi256_ps(k)),
                _mm256_maskload_ps(sx.d.as_ptr().add(b), k),
                _mm256_maskload_ps(sx.coarse_off.as_ptr().add(b), k),
                _mm256_maskload_ps(sx.coarse_c.as_ptr().add(b), k),
            ]
        }
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

/// The screen of rows `r0 .. r0 + hi.len()` with [`Vbmi`].
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 BW, VL, VNNI and VBMI; rows `r0 .. r0 + hi.len()`
/// inside `c`, whose rows have `sx.k / 32 <= MAX_BLOCKS` blocks (checked
/// by the caller).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
pub(super) unsafe fn screen_vbmi(sx: &ScreenX, c: &CoarseRows, r0: usize, hi: &mut [f32]) -> f32 {
    // SAFETY: this function's contract.
    unsafe { screen::<Vbmi>(sx, c, r0, hi) }
}

/// The screen of rows `r0 .. r0 + hi.len()` with [`Avx2`].
///
/// # Safety
/// AVX2, FMA and F16C; rows of 2 blocks or more; as [`screen_vbmi`]
/// otherwise.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn screen_avx2(sx: &ScreenX, c: &CoarseRows, r0: usize, hi: &mut [f32]) -> f32 {
    // SAFETY: this function's contract.
    unsafe { screen::<Avx2>(sx, c, r0, hi) }
}

/// The screen in groups of [`GROUP`] rows.
///
/// # Safety
/// As [`screen_vbmi`] or [`screen_avx2`], for `L`.
#[inline(always)]
unsafe fn screen<L: Unpack>(sx: &ScreenX, c: &CoarseRows, r0: usize, hi: &mut [f32]) -> f32 {
    let mut max_lo = f32::NEG_INFINITY;
    let mut groups = hi.chunks_exact_mut(GROUP);
    let mut r = r0;
    // `x̂` as the level's dot takes it, once per call (per row group, the
    // AVX2 widening cost 9% in cache). Not zeroed: the first `nb` are
    // written here, and only those are read.
    let mut xs = [MaybeUninit::<L::X>::uninit(); MAX_BLOCKS];
    for (x, q) in xs.iter_mut().zip(sx.q.chunks_exact(32)) {
        // SAFETY: the chunk bounds the load; the caller's features.
        *x = MaybeUninit::new(unsafe { L::x(_mm256_loadu_si256(q.as_ptr().cast())) });
    }
    let xs = &xs;
    for hs in &mut groups {
        let hs: &mut [f32; GROUP] = hs.try_into().expect("exact chunk");
        // SAFETY: the caller's features; these rows are inside `c`.
        unsafe { rows_screen::<L, GROUP>(sx, xs, c, r, hs, &mut max_lo) };
        r += GROUP;
    }
    for h in groups.into_remainder() {
        // SAFETY: as above.
        unsafe { rows_screen::<L, 1>(sx, xs, c, r, core::array::from_mut(h), &mut max_lo) };
        r += 1;
    }
    max_lo
}

/// `R` rows from `r0`, each with the same ops in the same order as alone:
/// per row first its scales (as `4·d_w·d_x` for the products), the offset
/// `Σ d_w·off_b` and the bound `Σ |d_w|·c'_b`, eight blocks at a time;
/// then per block `u`, its integer dot with `x̂` per 4-value lane, scaled.
///
/// # Safety
/// As [`screen`], rows `r0..r0 + R` inside `c`.
#[inline(always)]
unsafe fn rows_screen<L: Unpack, const R: usize>(
    sx: &ScreenX,
    xs: &[MaybeUninit<L::X>; MAX_BLOCKS],
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
    let mut scale = [[MaybeUninit::<f32>::uninit(); MAX_BLOCKS]; R];
    let mut acc = [_mm256_setzero_ps(); R];
    let mut beta = [_mm256_setzero_ps(); R];
    for i in 0..R {
        // SAFETY: the row holds `2 · nb` scale bytes; `scale[i]` and
        // `sx`'s terms hold `nb` values.
        (acc[i], beta[i]) = unsafe { row_terms::<L>(sx, rows[i], nb, &mut scale[i]) };
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
        // SAFETY: `screen` wrote `xs[..nb]`.
        let xv = unsafe { xs[b].assume_init() };
        for i in 0..R {
            // SAFETY: row `i` holds block `b`; register ops of the
            // caller's features.
            unsafe {
                let p32 = L::dot(rows[i], nb, b, xv);
                // `row_terms` wrote `scale[i][..nb]`.
                let s = _mm256_set1_ps(scale[i][b].assume_init());
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), s, acc[i]);
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

/// A row's `4·d_w·d_x` per block into `scale` (`x̂`'s block scale `d_x`
/// is every lane's `lane_d`); returns the lanes of `Σ d_w·off_b`
/// (the block loop's starting sums) and of `Σ |d_w|·c'_b`, eight blocks
/// at a time (the last ones zero past `nb`).
///
/// # Safety
/// `L`'s features, AVX2, FMA and F16C; `row` holds `2 · nb` scale bytes,
/// `nb <= MAX_BLOCKS`, `sx` has `nb` blocks.
#[inline(always)]
unsafe fn row_terms<L: Unpack>(
    sx: &ScreenX,
    row: *const u8,
    nb: usize,
    scale: &mut [MaybeUninit<f32>; MAX_BLOCKS],
) -> (__m256, __m256) {
    let (mut o, mut bt) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for b in (0..nb).step_by(8) {
        // SAFETY: `terms` reads below `nb`; `scale` holds `b + 8` values.
        unsafe {
            let [dw, d, off, c] = L::terms(sx, row, b, nb - b);
            let s = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(L::SCALE)), d);
            // Whole (`b + 8 <= MAX_BLOCKS`): the block loop's loads of
            // `scale` forward from plain stores, not from masked ones.
            _mm256_storeu_ps(scale.as_mut_ptr().add(b).cast(), s);
            o = _mm256_fmadd_ps(dw, off, o);
            let adw = _mm256_andnot_ps(_mm256_set1_ps(-0.0), dw);
            bt = _mm256_fmadd_ps(adw, c, bt);
        }
    }
    (o, bt)
}

/// Row `r` of `c` as Q8_0 bytes with [`Vbmi`].
///
/// # Safety
/// AVX2, AVX-512 VL and VBMI; `r < c.rows()` and `out` holds `34 · nb`
/// bytes (checked by the caller).
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vbmi")]
pub(super) unsafe fn q8_0_row_vbmi(c: &CoarseRows, r: usize, out: &mut [u8]) {
    // SAFETY: this function's contract.
    unsafe { q8_0_row::<Vbmi>(c, r, out) }
}

/// Row `r` of `c` as Q8_0 bytes with [`Avx2`].
///
/// # Safety
/// AVX2; rows of 2 blocks or more; as [`q8_0_row_vbmi`] otherwise.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn q8_0_row_avx2(c: &CoarseRows, r: usize, out: &mut [u8]) {
    // SAFETY: this function's contract.
    unsafe { q8_0_row::<Avx2>(c, r, out) }
}

/// Row `r` of `c` as Q8_0 bytes: `q = 4·u + l − 128` per byte (no carry:
/// `4·u + l ≤ 255`).
///
/// # Safety
/// As [`q8_0_row_vbmi`] or [`q8_0_row_avx2`], for `L`.
#[inline(always)]
unsafe fn q8_0_row<L: Unpack>(c: &CoarseRows, r: usize, out: &mut [u8]) {
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
            let u = L::u(row, nb, b);
            let l = crumbs_at(low.as_ptr().add(8 * b));
            let q = _mm256_add_epi8(_mm256_slli_epi16::<2>(u), l);
            let q = _mm256_xor_si256(q, _mm256_set1_epi8(-128));
            _mm256_storeu_si256(blk.as_mut_ptr().add(2).cast(), q);
        }
    }
}

/// Whether [`Avx2`]'s scales (`d_w·d_x / 4`) on its 16-fold sums give
/// [`Vbmi`]'s products (`4·d_w·d_x` on the sums) bit for bit: where
/// `4·d_w·d_x` is at least `2^-122` and finite, so that its sixteenth is
/// exact, which every nonzero `d_w` (an f16: `2^-24` to `2^16`) meets
/// when each `d_x` is 0 or in `[2^-100, 2^100]` (else the portable
/// screen runs: `|x| < 1e-28` or `> 1e32`).
pub(super) fn scales_exact(sx: &ScreenX) -> bool {
    const LO: f32 = f32::from_bits((127 - 100) << 23);
    const HI: f32 = f32::from_bits((127 + 100) << 23);
    sx.d.iter().all(|&d| d == 0.0 || (LO..=HI).contains(&d))
}
