//! The multi-row Q8_0 screen with AVX-512 VNNI, vocab rows in lanes (see
//! `crate::screen` for the math; same bounds up to f32 summation order).
//!
//! The `maddubs` form ([`super::screen::screen_avx2_multi`]) spends about
//! eight 256-bit ops per (vocab row, block, activation row): the integer
//! products, then a conversion, a scale product and an FMA per block, so a
//! batch of 8 costs 5-7x one row's memory-bound screen on Zen 4 (see
//! bench/RESULTS.md). Here a tile of 16 vocab rows is transposed once per
//! block so that 32-bit lane `i` of register `W_j` holds bytes `4j .. 4j +
//! 4` of row `i` (shifted to `w + 128`); an activation row then takes
//! eight `vpdpbusd` against its own four bytes broadcast, which sum the
//! whole block in integers for all 16 rows (started at `−128 · Σ q`, which
//! takes the shift back out), and one conversion, scale product and FMA
//! per 16 rows and block. The transposed tile is kept on the stack and
//! reused by every group of [`GROUP`] activation rows, or, for a matrix
//! screened again and again (an LM head), made once for all its tiles
//! ([`Packed`]).

use core::arch::x86_64::*;

use super::screen::{screen_avx2_multi, BLK};
use crate::screen::{ScreenX, VnniBlock, ABS_SLACK};

/// Fewest activation rows this form takes (Zen 4, 32,768 x 640 in L3, one
/// thread: 2 rows 1.18 vs 2.17 ms for the `maddubs` form, 4 rows 1.42 vs
/// 3.31, 8 rows 2.01 vs 5.91, 16 rows 3.25 vs 11.47).
pub(super) const MIN_ACTIVATIONS: usize = 2;
/// Vocab rows of a tile: one per 32-bit lane.
const ROWS: usize = 16;
/// Activation rows per pass over a tile (their integer sums, products and
/// bounds stay in registers).
const GROUP: usize = 8;
/// Most blocks per row (heads up to 5,632 columns); longer rows take the
/// `maddubs` form. The transposed tile takes 640 bytes per block.
const MAX_BLOCKS: usize = 176;
/// Per block of a tile: the eight code registers and `dw`.
const PER_BLOCK: usize = 9;
/// How far ahead of the tile being transposed its rows are prefetched
/// into L2, in tiles. On Zen 4 (real 270M head, 262,144 x 640, 2 threads)
/// the 8-row screen took 16.4 ms without prefetching, 19.0 one tile ahead
/// into L1, 14.4 two tiles ahead into L2, 13.2 four (16 rows: 22.6, 27.0,
/// 21.0, 19.7); six to twelve tiles measured no better than four.
const PREFETCH_TILES: usize = 4;
/// How far ahead the screen of packed tiles prefetches into L2, in tiles
/// (nine lines per block, on the first group's pass), and from how many
/// activation rows. Packed tiles are one sequential stream, but with the
/// hardware prefetcher alone it fell behind once the kernel had enough
/// work per line: on Zen 4 (real 270M head, 2 threads, `batch_decode`,
/// alternating) the 8-row screen took 10.2-11.5 ms without, 7.4-9.3 with
/// one or two tiles ahead, 8.2-8.8 with four; 16 rows 19.8-22.9 without,
/// 14.1-17.6 two tiles ahead; 5 rows 8.1-8.4 vs 7.4-7.7. With 2-4 rows it
/// cost 0.1-0.3 ms instead (memory-bound either way).
const PACKED_PREFETCH_TILES: usize = 2;
const PACKED_PREFETCH_MIN: usize = 5;

/// As [`screen_avx2_multi`] (same contract), vocab rows in tiles of 16;
/// a remainder of rows, or rows over [`MAX_BLOCKS`] blocks, take that form.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; `w` holds
/// `hi.len() / sxs.len()` rows of `sxs[0].len() / 32` Q8_0 blocks at
/// stride `row_bytes`; every `sxs[t]` has that length.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn screen_vnni_multi(
    sxs: &[ScreenX],
    w: &[u8],
    row_bytes: usize,
    hi: &mut [f32],
    lo: &mut [f32],
) -> bool {
    let n = sxs.len();
    let nb = sxs[0].k / 32;
    let rows = hi.len() / n;
    let tiles = if nb <= MAX_BLOCKS { rows / ROWS } else { 0 };
    // Left unwritten: zeroing all of it (112 KB) on each call cost more
    // than the transposes of a 64-row call; `transpose_tile` writes the
    // `nb * PER_BLOCK` registers read below.
    let mut scratch = [core::mem::MaybeUninit::<__m512i>::uninit(); MAX_BLOCKS * PER_BLOCK];
    for t in 0..tiles {
        let r0 = t * ROWS;
        // SAFETY: rows r0 .. r0 + 16 of `nb` blocks lie in `w` (the
        // caller's contract); `scratch` holds `nb * PER_BLOCK` registers,
        // all written by `transpose_tile` before the slice below reads them.
        let tile = unsafe {
            transpose_tile(&w[r0 * row_bytes..], row_bytes, nb, &mut scratch);
            core::slice::from_raw_parts(scratch.as_ptr().cast::<__m512i>(), nb * PER_BLOCK)
        };
        // SAFETY: as above.
        // (The transposes prefetch the rows.)
        unsafe {
            let hs = &mut hi[r0 * n..(r0 + ROWS) * n];
            tile_bounds(tile, nb, sxs, hs, lo, core::ptr::null())
        };
    }
    let done = tiles * ROWS;
    if done < rows {
        // SAFETY: the caller's contract, for the remaining rows.
        return unsafe {
            screen_avx2_multi(
                sxs,
                &w[done * row_bytes..],
                row_bytes,
                &mut hi[done * n..],
                lo,
            )
        };
    }
    true
}

/// The bounds of one transposed tile's 16 vocab rows against every
/// activation row: `hi[i * n + t]`, and `lo[t]` folded. Unless null,
/// `ahead` is a later tile of as many blocks, prefetched into L2 a block
/// at a time on the first pass.
///
/// # Safety
/// As [`screen_vnni_multi`]; `tile` holds `nb` transposed blocks, each
/// `sxs[t]` `nb` blocks, `hi` `16 * sxs.len()` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile_bounds(
    tile: &[__m512i],
    nb: usize,
    sxs: &[ScreenX],
    hi: &mut [f32],
    lo: &mut [f32],
    ahead: *const u8,
) {
    let n = sxs.len();
    for g in (0..n).step_by(GROUP) {
        let ahead = if g == 0 { ahead } else { core::ptr::null() };
        let m = GROUP.min(n - g);
        let xs = &sxs[g..g + m];
        // SAFETY: the caller's contract.
        let (a, b) = unsafe {
            match m {
                1 => group_dots::<1>(tile, nb, xs, ahead),
                2 => group_dots::<2>(tile, nb, xs, ahead),
                3 => group_dots::<3>(tile, nb, xs, ahead),
                4 => group_dots::<4>(tile, nb, xs, ahead),
                5 => group_dots::<5>(tile, nb, xs, ahead),
                6 => group_dots::<6>(tile, nb, xs, ahead),
                7 => group_dots::<7>(tile, nb, xs, ahead),
                _ => group_dots::<8>(tile, nb, xs, ahead),
            }
        };
        for j in 0..m {
            let bj = _mm512_add_ps(b[j], _mm512_set1_ps(ABS_SLACK));
            let (h, l) = (_mm512_add_ps(a[j], bj), _mm512_sub_ps(a[j], bj));
            let mut hs = [0.0f32; ROWS];
            // SAFETY: `hs` holds 16 f32.
            unsafe { _mm512_storeu_ps(hs.as_mut_ptr(), h) };
            for (i, &v) in hs.iter().enumerate() {
                hi[i * n + g + j] = v;
            }
            // SAFETY: plain AVX-512 arithmetic.
            lo[g + j] = unsafe { fold_lo_lanes(lo[g + j], l, h) };
        }
    }
}

/// A Q8_0 matrix's whole 16-row tiles, transposed once as
/// [`transpose_tile`] writes them (9 registers per tile and block: 576
/// bytes where the rows take 544), so that every later screen of it skips
/// the transposes.
pub(crate) struct Packed {
    pub(crate) nb: usize,
    pub(crate) tiles: usize,
    regs: Vec<__m512i>,
}

impl Packed {
    /// The whole tiles of `rows` rows of `nb` blocks at `w` (stride
    /// `row_bytes`); `None` for rows over [`MAX_BLOCKS`] blocks.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; `w` holds `rows`
    /// rows of `nb` Q8_0 blocks at stride `row_bytes`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(crate) unsafe fn new(w: &[u8], row_bytes: usize, rows: usize, nb: usize) -> Option<Packed> {
        if nb == 0 || nb > MAX_BLOCKS {
            return None;
        }
        let tiles = rows / ROWS;
        let per = nb * PER_BLOCK;
        let mut regs: Vec<__m512i> = Vec::new();
        regs.try_reserve_exact(tiles * per).ok()?;
        let spare = &mut regs.spare_capacity_mut()[..tiles * per];
        for (t, tile) in spare.chunks_exact_mut(per).enumerate() {
            let r0 = t * ROWS;
            // SAFETY: rows r0 .. r0 + 16 lie in `w` (the caller's contract).
            unsafe { transpose_tile(&w[r0 * row_bytes..], row_bytes, nb, tile) };
        }
        // SAFETY: `transpose_tile` wrote all `per` registers of every tile.
        unsafe { regs.set_len(tiles * per) };
        Some(Packed { nb, tiles, regs })
    }
}

/// [`screen_vnni_multi`] of the packed tiles `t0 .. t0 + hi.len() / 16 /
/// sxs.len()`: the same bounds, without the transposes.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C present; those tiles exist in
/// `p`; every `sxs[t]` holds `p.nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn screen_packed_multi(
    sxs: &[ScreenX],
    p: &Packed,
    t0: usize,
    hi: &mut [f32],
    lo: &mut [f32],
) {
    let n = sxs.len();
    let per = p.nb * PER_BLOCK;
    let ahead = if n >= PACKED_PREFETCH_MIN {
        PACKED_PREFETCH_TILES * per
    } else {
        0
    };
    for (i, hs) in hi.chunks_exact_mut(ROWS * n).enumerate() {
        let tile = &p.regs[(t0 + i) * per..][..per];
        let pf = match ahead {
            0 => core::ptr::null(),
            // Past the last tile it points outside the tiles: a prefetch
            // never faults.
            d => tile.as_ptr().wrapping_add(d).cast::<u8>(),
        };
        // SAFETY: the caller's contract.
        unsafe { tile_bounds(tile, p.nb, sxs, hs, lo, pf) };
    }
}

/// Writes, per block `b` of the 16 rows at `w` (stride `row_bytes`),
/// `tile[b * PER_BLOCK + j]` (lane `i`: bytes `4j .. 4j + 4` of row `i`'s
/// codes, each `+ 128`), then the rows' scales; prefetches the tile
/// [`PREFETCH_TILES`] ahead on the way. (Sixteen gathers instead measured
/// 2x slower on Zen 4.)
///
/// # Safety
/// As [`screen_vnni_multi`]; `w` holds 16 rows of `nb` blocks and `tile`
/// `nb * PER_BLOCK` registers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn transpose_tile(
    w: &[u8],
    row_bytes: usize,
    nb: usize,
    tile: &mut [core::mem::MaybeUninit<__m512i>],
) {
    assert!(
        w.len() >= (ROWS - 1) * row_bytes + nb * BLK
            && tile.len() >= nb * PER_BLOCK
            && nb <= MAX_BLOCKS
    );
    let shift = _mm512_set1_epi8(-128);
    // Per 256-bit half: 128-bit lane 0 of both operands, then lane 1 (the
    // last step of the 8 x 8 word transpose).
    let lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let hi_idx = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    let base = w.as_ptr();
    // The scales first, as f16 bits per block: read back as one vector
    // per block only after the transposes below (sixteen 2-byte stores
    // right before a 32-byte load of them would stall its forwarding).
    let mut bits = [[0u16; ROWS]; MAX_BLOCKS];
    for i in 0..ROWS {
        let row = &w[i * row_bytes..][..nb * BLK];
        for (b, blk) in row.chunks_exact(BLK).enumerate() {
            bits[b][i] = u16::from_le_bytes([blk[0], blk[1]]);
        }
    }
    // A later tile's lines (see `PREFETCH_TILES`), a share per block:
    // the hardware prefetcher alone leaves the tile's first reads (the
    // scales above) waiting on DRAM.
    let next = base.wrapping_add(PREFETCH_TILES * ROWS * row_bytes);
    let lines = (ROWS * row_bytes).div_ceil(64);
    let per_block = lines.div_ceil(nb);
    for b in 0..nb {
        for l in b * per_block..((b + 1) * per_block).min(lines) {
            // A prefetch never faults, wherever it points.
            _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * l).cast());
        }
        // SAFETY: every row's block `b` lies in `w` (asserted above).
        unsafe {
            let at = |i: usize| base.add(i * row_bytes + b * BLK);
            // z[k]: row k's eight code words, then row k + 8's.
            let z: [__m512i; 8] = core::array::from_fn(|k| {
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(at(k).add(2).cast())),
                    _mm256_loadu_si256(at(k + 8).add(2).cast()),
                )
            });
            // Rows 2m, 2m + 1 interleaved by word.
            let t: [__m512i; 8] = core::array::from_fn(|i| {
                let (p, q) = (z[2 * (i / 2)], z[2 * (i / 2) + 1]);
                if i % 2 == 0 {
                    _mm512_unpacklo_epi32(p, q)
                } else {
                    _mm512_unpackhi_epi32(p, q)
                }
            });
            // u[4h + c]: word c (high 128 bits: c + 4) of rows 4h .. 4h + 4.
            let u: [__m512i; 8] = core::array::from_fn(|i| {
                let (h, c) = (i / 4, i % 4);
                let (p, q) = (t[4 * h + c / 2], t[4 * h + 2 + c / 2]);
                if c % 2 == 0 {
                    _mm512_unpacklo_epi64(p, q)
                } else {
                    _mm512_unpackhi_epi64(p, q)
                }
            });
            let out = &mut tile[b * PER_BLOCK..][..PER_BLOCK];
            for c in 0..4 {
                let (p, q) = (u[c], u[4 + c]);
                out[c].write(_mm512_xor_si512(
                    _mm512_permutex2var_epi64(p, lo_idx, q),
                    shift,
                ));
                out[c + 4].write(_mm512_xor_si512(
                    _mm512_permutex2var_epi64(p, hi_idx, q),
                    shift,
                ));
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(bits[b].as_ptr().cast()));
            out[8].write(_mm512_castps_si512(dw));
        }
    }
}

/// For the `M` activation rows `xs`: per vocab row of the tile (lanes),
/// `a = Σ_b dw_b · d_b · Σ w · q` and `β` without its slack.
///
/// Each activation row's block data sits behind one pointer (its
/// `vnni` blocks) and `β` takes a loop of its own: the block loop then
/// keeps its sums, products and pointers in registers (with `β` and a
/// pointer per field it spilled on every block).
///
/// # Safety
/// As [`screen_vnni_multi`]; `tile` holds `nb` transposed blocks and each
/// `xs[t]` `nb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn group_dots<const M: usize>(
    tile: &[__m512i],
    nb: usize,
    xs: &[ScreenX],
    ahead: *const u8,
) -> ([__m512; GROUP], [__m512; GROUP]) {
    assert!(
        xs.len() == M
            && tile.len() >= nb * PER_BLOCK
            && xs.iter().all(|x| x.vnni.len() >= nb && x.c.len() >= nb)
    );
    let blocks: [*const VnniBlock; M] = core::array::from_fn(|t| xs[t].vnni.as_ptr());
    let mut acc = [_mm512_setzero_ps(); M];
    for b in 0..nb {
        let blk = &tile[b * PER_BLOCK..][..PER_BLOCK];
        if !ahead.is_null() {
            for l in b * PER_BLOCK..(b + 1) * PER_BLOCK {
                // A prefetch never faults, wherever it points.
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * l).cast());
            }
        }
        // SAFETY: block `b` of every activation row exists (asserted).
        unsafe {
            let xb: [&VnniBlock; M] = core::array::from_fn(|t| &*blocks[t].add(b));
            let mut dot: [__m512i; M] = core::array::from_fn(|t| _mm512_set1_epi32(xb[t].qsum));
            for (j, &wj) in blk[..8].iter().enumerate() {
                for (d, x) in dot.iter_mut().zip(&xb) {
                    let q4 = x.q.as_ptr().add(4 * j).cast::<i32>().read_unaligned();
                    *d = _mm512_dpbusd_epi32(*d, wj, _mm512_set1_epi32(q4));
                }
            }
            let dw = _mm512_castsi512_ps(blk[8]);
            for t in 0..M {
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(xb[t].d));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t]), scale, acc[t]);
            }
        }
    }
    let mut bnd = [_mm512_setzero_ps(); M];
    for b in 0..nb {
        let adw = _mm512_abs_ps(_mm512_castsi512_ps(tile[b * PER_BLOCK + 8]));
        for (bt, x) in bnd.iter_mut().zip(xs) {
            *bt = _mm512_fmadd_ps(adw, _mm512_set1_ps(x.c[b]), *bt);
        }
    }
    let mut a = [_mm512_setzero_ps(); GROUP];
    let mut bo = [_mm512_setzero_ps(); GROUP];
    a[..M].copy_from_slice(&acc);
    bo[..M].copy_from_slice(&bnd);
    (a, bo)
}

/// [`crate::screen::fold_lo`] over the 16 lanes of `lo` and `hi` at once:
/// the running max of `lo`, NaN once any bound is not finite.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn fold_lo_lanes(max_lo: f32, lo: __m512, hi: __m512) -> f32 {
    // x − x is 0 exactly when x is finite.
    let zero = _mm512_setzero_ps();
    let finite = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_sub_ps(lo, lo), zero)
        & _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_sub_ps(hi, hi), zero);
    if finite != 0xFFFF || max_lo.is_nan() {
        f32::NAN
    } else {
        max_lo.max(_mm512_reduce_max_ps(lo))
    }
}
