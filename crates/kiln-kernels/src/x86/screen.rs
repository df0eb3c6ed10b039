//! SIMD screens for `crate::screen` (same math, same lane layout): AVX2
//! with `maddubs` (`|w| · sign(x, w)`, no i16 overflow since
//! `2 · 128 · 127 < 2^15`) for one activation row, and on levels without
//! VNNI for several. With VNNI the one-row screen keeps its 256-bit shape
//! and takes `vpdpbusd` for the block product (Zen 4, one thread: 1,024
//! rows in cache 26.8 -> 22.4 us, the 270M's 262,144-row head 7.6 -> 6.8
//! ms; decode of the real 270M at 1 thread 69-70 -> 72-73 tok/s, at 2
//! threads memory-bound and unchanged). A 512-bit form (two blocks per
//! step) was 20-30% slower there: its per-pair scale gather (`vpermw`)
//! and 512-bit ops cost more than they save. Two or more activation rows
//! on VNNI take `super::screen_vnni`, which puts vocab rows in lanes.

use core::arch::x86_64::*;

use crate::screen::{fold_lo, ScreenX, ABS_SLACK};

/// Q8_0 block bytes: f16 scale + 32 quants.
pub(super) const BLK: usize = 34;

/// How many row groups ahead the screens prefetch.
const PREFETCH_GROUPS: usize = 2;

/// Prefetches the `step` bytes at `base + dist + i · step`: one linear
/// sweep over the rows a few groups ahead, `step` bytes per loop step (a
/// single sequential stream gets more from DRAM than one per row).
///
/// # Safety
/// SSE enabled (prefetches never fault, any address is fine).
#[inline(always)]
pub(super) unsafe fn sweep_prefetch(base: *const u8, dist: usize, step: usize, i: usize) {
    let pf = base.wrapping_add(dist + i * step);
    for off in (0..step).step_by(64) {
        // SAFETY: the caller's contract.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(off).cast()) };
    }
}

/// Rows screened together: the `x` loads, lane values and the prefetch
/// setup are shared across the group (each row's arithmetic is unchanged,
/// so the results match the one-row loop bit for bit).
const GROUP: usize = 4;

/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` holds `hi.len()` rows of
/// `sx.k / 32` Q8_0 blocks at stride `row_bytes` (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn screen_avx2(sx: &ScreenX, w: &[u8], row_bytes: usize, hi: &mut [f32]) -> f32 {
    // SAFETY: this function's contract.
    unsafe { screen_one::<false>(sx, w, row_bytes, hi) }
}

/// [`screen_avx2`] with 256-bit `vpdpbusd` for the block products (the
/// same integer sums, so the same bounds bit for bit).
///
/// # Safety
/// As [`screen_avx2`], and the CPU must support AVX-512 VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn screen_vnni256(
    sx: &ScreenX,
    w: &[u8],
    row_bytes: usize,
    hi: &mut [f32],
) -> f32 {
    // SAFETY: this function's contract.
    unsafe { screen_one::<true>(sx, w, row_bytes, hi) }
}

/// The one-row screen in groups of [`GROUP`] rows.
///
/// # Safety
/// As [`screen_avx2`]; with `VNNI`, as [`screen_vnni256`].
#[inline(always)]
unsafe fn screen_one<const VNNI: bool>(
    sx: &ScreenX,
    w: &[u8],
    row_bytes: usize,
    hi: &mut [f32],
) -> f32 {
    let mut max_lo = f32::NEG_INFINITY;
    let mut groups = hi.chunks_exact_mut(GROUP);
    let mut r0 = 0;
    for hs in &mut groups {
        let hs: &mut [f32; GROUP] = hs.try_into().expect("exact chunk");
        // SAFETY: the caller's features; `w` holds these rows.
        unsafe { rows_screen::<VNNI, GROUP>(sx, w, row_bytes, r0, hs, &mut max_lo) };
        r0 += GROUP;
    }
    for h in groups.into_remainder() {
        let hs: &mut [f32; 1] = core::array::from_mut(h);
        // SAFETY: as above.
        unsafe { rows_screen::<VNNI, 1>(sx, w, row_bytes, r0, hs, &mut max_lo) };
        r0 += 1;
    }
    max_lo
}

/// The first `len` bytes of rows `r0..r0 + R`. A loop, not
/// `array::from_fn`: that closure is not inlined into the screens (a call
/// per row group, 3% of a decode step).
#[inline(always)]
fn group<const R: usize>(w: &[u8], row_bytes: usize, r0: usize, len: usize) -> [&[u8]; R] {
    let mut rows: [&[u8]; R] = [&[]; R];
    for (i, row) in rows.iter_mut().enumerate() {
        *row = &w[(r0 + i) * row_bytes..][..len];
    }
    rows
}

/// `R` rows from row `r0`: per row the same ops, in the same order, as
/// the one-row screen. A block's integer dot is `maddubs(|w|, sign(x,
/// w))` summed in pairs, or with `VNNI` one `vpdpbusd` of `w + 128`
/// against `x` started at `−128 · Σ x` per lane (4 ops fewer per row and
/// block; both are the exact sums).
///
/// # Safety
/// As [`screen_avx2`], with rows `r0..r0 + R` inside `w`; with `VNNI`,
/// AVX-512 VL and VNNI.
#[inline(always)]
unsafe fn rows_screen<const VNNI: bool, const R: usize>(
    sx: &ScreenX,
    w: &[u8],
    row_bytes: usize,
    r0: usize,
    hs: &mut [f32; R],
    max_lo: &mut f32,
) {
    let nb = sx.k / 32;
    let ones = _mm256_set1_epi16(1);
    let bias = _mm256_set1_epi8(-128);
    let rows = group::<R>(w, row_bytes, r0, nb * BLK);
    let base = w.as_ptr().wrapping_add(r0 * row_bytes);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut bacc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        // SAFETY: SSE is enabled.
        unsafe { sweep_prefetch(base, PREFETCH_GROUPS * R * row_bytes, R * BLK, b) };
        let xq = &sx.q[b * 32..][..32];
        let ld = &sx.lane_d[b * 8..][..8];
        let lc = &sx.lane_c[b * 8..][..8];
        // SAFETY: the slices bound the shared loads (32 `qx`, 8 lane
        // values).
        let (xv, ldv, lcv) = unsafe {
            (
                _mm256_loadu_si256(xq.as_ptr().cast()),
                _mm256_loadu_ps(ld.as_ptr()),
                _mm256_loadu_ps(lc.as_ptr()),
            )
        };
        // −128 · (sum of each lane's 4 x), taking back the `w + 128`.
        // SAFETY: register-only ops of the caller's features.
        let x_off = if VNNI {
            unsafe {
                _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, xv),
                )
            }
        } else {
            _mm256_setzero_si256()
        };
        for i in 0..R {
            let blk = &rows[i][b * BLK..][..BLK];
            // SAFETY: `blk` bounds the 32 quant bytes after the 2-byte
            // scale.
            unsafe {
                let wv = _mm256_loadu_si256(blk.as_ptr().add(2).cast());
                let p32 = if VNNI {
                    _mm256_dpbusd_epi32(x_off, _mm256_xor_si256(wv, bias), xv)
                } else {
                    let p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
                    _mm256_madd_epi16(p16, ones)
                };
                let hbits = u16::from_le_bytes([blk[0], blk[1]]) as i16;
                let dw = _mm256_cvtph_ps(_mm_set1_epi16(hbits));
                let scale = _mm256_mul_ps(dw, ldv);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), scale, acc[i]);
                let adw = _mm256_andnot_ps(_mm256_set1_ps(-0.0), dw);
                bacc[i] = _mm256_fmadd_ps(adw, lcv, bacc[i]);
            }
        }
    }
    for i in 0..R {
        // SAFETY: register-only AVX ops.
        let (a, b) = unsafe { (hsum8(acc[i]), hsum8(bacc[i])) };
        let b = b + ABS_SLACK;
        hs[i] = a + b;
        *max_lo = fold_lo(*max_lo, a - b, hs[i]);
    }
}

/// Most blocks per row of the multi-row screen (its `|d_w|` scratch lives
/// on the stack): rows of up to 16,384 values.
const MULTI_MAX_BLOCKS: usize = 512;

/// Activation rows per register tile of the multi-row screen (one
/// accumulator each, next to the weight block and its temporaries).
const MULTI_TILE: usize = 8;

/// The multi-row screen (`crate::screen::screen_q8_0_multi`'s math): each
/// weight block is loaded once and multiplied against up to
/// [`MULTI_TILE`] activation rows; `β` is summed per (row, activation)
/// from the row's `|d_w|` and the activation's block terms after the
/// integer pass. `false` when a row has more than [`MULTI_MAX_BLOCKS`]
/// blocks (the caller uses the portable screen).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` holds `hi.len() / n`
/// rows of `k / 32` Q8_0 blocks at stride `row_bytes`, every `sxs[t]` has
/// length `k`, `lo.len() == n` (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn screen_avx2_multi(
    sxs: &[ScreenX],
    w: &[u8],
    row_bytes: usize,
    hi: &mut [f32],
    lo: &mut [f32],
) -> bool {
    let n = sxs.len();
    let nb = sxs[0].k / 32;
    if nb > MULTI_MAX_BLOCKS {
        return false;
    }
    let mut adw = [0.0f32; MULTI_MAX_BLOCKS];
    for (r, hs) in hi.chunks_exact_mut(n).enumerate() {
        let row = &w[r * row_bytes..][..nb * BLK];
        // Next row: one line per block ahead (prefetch never faults).
        for b in (0..nb * BLK).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(row_bytes + b).cast());
        }
        for (b, blk) in row.chunks_exact(BLK).enumerate() {
            adw[b] = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32().abs();
        }
        let mut t0 = 0;
        while t0 < n {
            let m = MULTI_TILE.min(n - t0);
            let (xs, a) = (&sxs[t0..t0 + m], &mut hs[t0..t0 + m]);
            // SAFETY: AVX2/FMA/F16C are enabled; `row` holds `nb` blocks
            // and each `xs[t]` `nb · 32` values.
            unsafe {
                match m {
                    1 => tile_avx2::<1>(xs, row, a),
                    2 => tile_avx2::<2>(xs, row, a),
                    3 => tile_avx2::<3>(xs, row, a),
                    4 => tile_avx2::<4>(xs, row, a),
                    5 => tile_avx2::<5>(xs, row, a),
                    6 => tile_avx2::<6>(xs, row, a),
                    7 => tile_avx2::<7>(xs, row, a),
                    _ => tile_avx2::<8>(xs, row, a),
                }
            }
            t0 += m;
        }
        for ((h, sx), l) in hs.iter_mut().zip(sxs).zip(lo.iter_mut()) {
            let a = *h;
            // SAFETY: AVX2/FMA are enabled; both slices hold `nb` values.
            let b = unsafe { dot_f32(&adw[..nb], &sx.c[..nb]) } + ABS_SLACK;
            *h = a + b;
            *l = fold_lo(*l, a - b, *h);
        }
    }
    true
}

/// `a[t] = Σ_b d_w,b · d_x,b · Σ_i qw_i · qx_i` for the `M` activation
/// rows `xs` against one weight row of whole Q8_0 blocks.
///
/// # Safety
/// AVX2, FMA and F16C; `row` holds `nb` blocks and each `xs[t]` at least
/// `nb · 32` values (`nb = row.len() / BLK`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_avx2<const M: usize>(xs: &[ScreenX], row: &[u8], a: &mut [f32]) {
    let nb = row.len() / BLK;
    assert!(xs.len() == M && a.len() == M && xs.iter().all(|x| x.q.len() >= nb * 32));
    let ones = _mm256_set1_epi16(1);
    let q: [*const i8; M] = core::array::from_fn(|t| xs[t].q.as_ptr());
    let ld: [*const f32; M] = core::array::from_fn(|t| xs[t].lane_d.as_ptr());
    let mut acc = [_mm256_setzero_ps(); M];
    for (b, blk) in row.chunks_exact(BLK).enumerate() {
        // SAFETY: `blk` bounds the 32 quant bytes after its 2-byte scale;
        // `q[t]` holds `nb · 32` values and `ld[t]` `nb · 8` (asserted).
        unsafe {
            let wv = _mm256_loadu_si256(blk.as_ptr().add(2).cast());
            let aw = _mm256_abs_epi8(wv);
            let hbits = u16::from_le_bytes([blk[0], blk[1]]) as i16;
            let dw = _mm256_cvtph_ps(_mm_set1_epi16(hbits));
            for t in 0..M {
                let xv = _mm256_loadu_si256(q[t].add(b * 32).cast());
                let p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv));
                let p32 = _mm256_madd_epi16(p16, ones);
                let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(ld[t].add(b * 8)));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), scale, acc[t]);
            }
        }
    }
    for (o, v) in a.iter_mut().zip(acc) {
        // SAFETY: register-only AVX ops.
        *o = unsafe { hsum8(v) };
    }
}

/// `Σ a_i · b_i` in f32, 8 lanes at a time.
///
/// # Safety
/// AVX2 and FMA; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n8 = a.len() / 8 * 8;
    let mut acc = _mm256_setzero_ps();
    for i in (0..n8).step_by(8) {
        // SAFETY: `i + 8 <= n8 <= len` of both.
        unsafe {
            acc = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc,
            );
        }
    }
    // SAFETY: register-only AVX ops.
    let head = unsafe { hsum8(acc) };
    head + a[n8..]
        .iter()
        .zip(&b[n8..])
        .map(|(x, y)| x * y)
        .sum::<f32>()
}

#[inline(always)]
pub(super) unsafe fn hsum8(v: __m256) -> f32 {
    // SAFETY: callers run with AVX enabled.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}
