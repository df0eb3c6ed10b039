//! AMX-BF16 GEMM for prefill, as exact as the f32 kernels.
//!
//! `tdpbf16ps` multiplies bf16 tiles (8 significant bits) into f32
//! accumulators, 16× the multiply rate of AVX-512 FMA. To keep f32
//! accuracy both operands are split into three bf16 parts,
//! `v = h + m + l` (24 significant bits, the whole f32 mantissa), and the
//! six products above 2^-24 of `|w·x|` are accumulated: `hh, hm, mh, mm,
//! hl, lh`. The three dropped ones (`ml, lm, ll`) are below 2^-25 each, under
//! the f32 rounding of the sum itself. Weights of at most 16 significant
//! bits (Q4_0, Q5_0, F16) have no `l` part, bf16 ones neither `m`: their
//! products are skipped.
//!
//! Layout: `C[token][row] += A[token][k] · B[k][row]`, tiles of 16 tokens
//! × 16 rows over 32 columns of `k`. Weight rows are dequantized by the
//! same [`Fill`] as the f32 GEMM, 32 rows × [`KC`] columns at a time,
//! split, and packed into the pair-interleaved B layout; then every token
//! group of 32 runs 2 × 2 tiles of C against them. Each thread splits the
//! activations of one column chunk for all tokens into its scratch.

use core::arch::asm;
use core::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use kiln_quant::GgmlType;

use super::avx512::Avx512;
use super::kern::{self, Fill, GemmShape, Out, Simd, Tiler};

/// Columns per chunk: activations of 512 tokens in three parts fit
/// 768 KiB (L2) per thread; C tiles are flushed into `y` per chunk.
const KC: usize = 256;
/// Tile shape: 16 rows of 64 bytes (32 bf16, or 16 f32 for C).
const T: usize = 16;
const TK: usize = 32;
/// Weight rows per packed group (two B tiles) and tokens per token group
/// (two A tiles).
const RG: usize = 2 * T;
const TG: usize = 2 * T;

/// Tokens per pass: bounds the activation scratch (three parts of
/// [`KC`] columns) at 768 KiB per thread; longer batches repack the
/// weights once per pass.
const MAX_TOKENS: usize = 512;

/// Fewer tokens than this run the AVX-512 micro-kernel: AMX pads the
/// token count to 16 and repacks every weight tile per call.
pub(super) const MIN_TOKENS: usize = 48;

/// Whether the CPU has AMX-TILE + AMX-BF16 and the OS granted this
/// process the tile data state (Linux 5.16+: `arch_prctl`). Probed once.
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(probe)
}

#[cfg(target_os = "linux")]
fn probe() -> bool {
    let edx = core::arch::x86_64::__cpuid_count(7, 0).edx;
    let (bf16, tile) = (edx & (1 << 22) != 0, edx & (1 << 24) != 0);
    if !(bf16 && tile) {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain syscall with integer arguments; it fails cleanly
    // (non-zero) on kernels or hypervisors without AMX state.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn probe() -> bool {
    false
}

/// The 64-byte `ldtilecfg` operand: palette 1, every tile 16 × 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// One cache line of bf16: tile loads from unaligned rows cost ~6× more.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u16; 32]);

/// A zeroed, 64-byte aligned `u16` buffer of at least `len` values.
fn lines(v: &mut Vec<Line>, len: usize) -> &mut [u16] {
    let n = len.div_ceil(32);
    if v.len() < n {
        v.resize(n, Line([0; 32]));
    }
    // SAFETY: `Line` is 32 `u16` with no padding, and `v` holds `n` lines.
    unsafe { core::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), len) }
}

/// 16 × 16 f32 C tiles, aligned for `tilestored`.
#[repr(C, align(64))]
struct CTiles([f32; 4 * T * T]);

/// Per-thread buffers, kept between calls (prefill calls GEMM per layer).
#[derive(Default)]
struct Scratch {
    /// Activation parts: `a[p][token][j]`, rows of `KC` bf16.
    a: Vec<Line>,
    /// Weight parts of one row group: `b[p][tile][kstep]` blocks of 16 × 32.
    b: Vec<Line>,
    /// Dequantized rows of one group, `RG × KC`.
    tile: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// `v = h + m + l` per lane in bf16 (`vcvtneps2bf16`: nearest, ties to
/// even; exact for normal f32 far from overflow), as 16 u16 each.
///
/// # Safety
/// AVX-512 F and BF16 enabled.
#[inline(always)]
unsafe fn split16(v: __m512) -> [__m256i; 3] {
    // SAFETY: the caller's contract.
    unsafe {
        let widen = |h: __m256bh| {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                core::mem::transmute::<__m256bh, __m256i>(h),
            )))
        };
        let h = _mm512_cvtneps_pbh(v);
        let r = _mm512_sub_ps(v, widen(h));
        let m = _mm512_cvtneps_pbh(r);
        let l = _mm512_cvtneps_pbh(_mm512_sub_ps(r, widen(m)));
        [h, m, l].map(|p| core::mem::transmute::<__m256bh, __m256i>(p))
    }
}

/// Transposes 16 rows of 16 u32 in place.
///
/// # Safety
/// AVX-512 F enabled.
#[inline(always)]
unsafe fn transpose16(r: &mut [__m512i; 16]) {
    // SAFETY: the caller's contract.
    unsafe {
        let mut t = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        // u[4i + j], 128-bit lane L: rows 4i.. of column 4L + j.
        let mut u = [_mm512_setzero_si512(); 16];
        for i in 0..4 {
            u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        for j in 0..4 {
            let x0 = _mm512_shuffle_i32x4::<0x88>(u[j], u[4 + j]);
            let x1 = _mm512_shuffle_i32x4::<0xDD>(u[j], u[4 + j]);
            let y0 = _mm512_shuffle_i32x4::<0x88>(u[8 + j], u[12 + j]);
            let y1 = _mm512_shuffle_i32x4::<0xDD>(u[8 + j], u[12 + j]);
            r[j] = _mm512_shuffle_i32x4::<0x88>(x0, y0);
            r[4 + j] = _mm512_shuffle_i32x4::<0x88>(x1, y1);
            r[8 + j] = _mm512_shuffle_i32x4::<0xDD>(x0, y0);
            r[12 + j] = _mm512_shuffle_i32x4::<0xDD>(x1, y1);
        }
    }
}

/// Part products accumulated, as (activation part, weight parts).
const PRODUCTS: [(usize, &[usize]); 3] = [(0, &[0, 1, 2]), (1, &[0, 1]), (2, &[0])];

/// # Safety
/// AMX-TILE configured; `p` valid for 16 rows of 64 bytes at `stride`.
#[inline(always)]
unsafe fn load_a(m: usize, p: *const u16, stride: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if m == 0 {
            asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride, options(nostack, readonly));
        } else {
            asm!("tileloadd tmm5, [{p} + {s}*1]", p = in(reg) p, s = in(reg) stride, options(nostack, readonly));
        }
    }
}

/// Loads B tiles 6 and 7 from two 1 KiB blocks.
///
/// # Safety
/// AMX-TILE configured; both pointers valid for 1 KiB.
#[inline(always)]
unsafe fn load_b(p0: *const u16, p1: *const u16) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tileloadd tmm6, [{p0} + {s}*1]",
            "tileloadd tmm7, [{p1} + {s}*1]",
            p0 = in(reg) p0, p1 = in(reg) p1, s = in(reg) 64usize,
            options(nostack, readonly),
        );
    }
}

/// `C[m][n] += A[m] · B[n]` for `m < MT`, `n < 2` (C tiles 0..4).
///
/// # Safety
/// AMX-BF16 enabled and the tiles loaded.
#[inline(always)]
unsafe fn dot<const MT: usize>() {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            options(nostack, nomem),
        );
        if MT == 2 {
            asm!(
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                options(nostack, nomem),
            );
        }
    }
}

/// Tiles of `MT` × 2 over `ksteps` steps of 32 columns; C is left in tiles
/// 0..2 (token tile 0) and 2..4 (token tile 1).
///
/// # Safety
/// AMX configured; `a` holds `MT * 16` token rows of `KC` bf16 per part
/// (part stride `a_part`), `b` the packed group.
#[inline(always)]
unsafe fn block<const MT: usize>(
    a: *const u16,
    a_part: usize,
    b: *const u16,
    w_parts: usize,
    ksteps: usize,
) {
    let b_part = 2 * (KC / TK) * T * TK;
    // SAFETY: the caller's contract; offsets stay inside the buffers.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        for ks in 0..ksteps {
            for (pa, pbs) in PRODUCTS {
                let ap = a.add(pa * a_part + ks * TK);
                load_a(0, ap, KC * 2);
                if MT == 2 {
                    load_a(1, ap.add(T * KC), KC * 2);
                }
                // Weight parts past `w_parts` are zero.
                for &pb in pbs.iter().filter(|&&pb| pb < w_parts) {
                    let bp = b.add(pb * b_part + ks * T * TK);
                    load_b(bp, bp.add((KC / TK) * T * TK));
                    dot::<MT>();
                }
            }
        }
    }
}

/// Stores C tiles `0..2 * MT` to `c` (16 × 16 f32 each).
///
/// # Safety
/// AMX configured; `c` valid for `2 * MT` KiB.
#[inline(always)]
unsafe fn store_c<const MT: usize>(c: *mut f32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            c0 = in(reg) c, c1 = in(reg) c.add(256), s = in(reg) 64usize,
            options(nostack),
        );
        if MT == 2 {
            asm!(
                "tilestored [{c2} + {s}*1], tmm2",
                "tilestored [{c3} + {s}*1], tmm3",
                c2 = in(reg) c.add(512), c3 = in(reg) c.add(768), s = in(reg) 64usize,
                options(nostack),
            );
        }
    }
}

/// GEMM over tiles of 32 rows × [`KC`] columns (see the module docs).
///
/// # Safety
/// AMX-TILE and AMX-BF16 usable ([`available`]), plus the features `S`
/// proves; `y` valid for writes at `t * ldy + r` (`t < n`, `r < rows`),
/// elements nothing else accesses during the call.
#[inline(always)]
pub(super) unsafe fn gemm_tiles<S: Simd>(
    s: S,
    sh: &GemmShape,
    w: &[u8],
    x: &[f32],
    y: *mut f32,
    fill: &impl Fill,
) {
    for t0 in (0..sh.n).step_by(MAX_TOKENS) {
        let pass = GemmShape {
            n: MAX_TOKENS.min(sh.n - t0),
            ..*sh
        };
        // SAFETY: this function's contract, for tokens `t0..t0 + pass.n`.
        unsafe { tiles(s, &pass, w, &x[t0 * sh.k..], y.add(t0 * sh.ldy), fill) };
    }
}

/// One pass of [`gemm_tiles`] over at most [`MAX_TOKENS`] tokens.
///
/// # Safety
/// As [`gemm_tiles`].
#[inline(always)]
unsafe fn tiles<S: Simd>(
    _s: S,
    sh: &GemmShape,
    w: &[u8],
    x: &[f32],
    y: *mut f32,
    fill: &impl Fill,
) {
    let GemmShape {
        row_bytes,
        rows,
        k,
        n,
        ldy,
    } = *sh;
    assert!(x.len() >= n * k);
    let w_parts = fill.bf16_parts();
    assert!(KC.is_multiple_of(fill.block().0));
    let n_pad = n.div_ceil(TG) * TG;
    // Taken out of the thread-local, not used inside a `with` closure: a
    // closure is compiled without the caller's target features.
    let mut sc = SCRATCH.with_borrow_mut(std::mem::take);
    {
        let a_part = n_pad * KC;
        let sa = lines(&mut sc.a, 3 * a_part);
        let sb = lines(&mut sc.b, 3 * 2 * (KC / TK) * T * TK);
        sc.tile.resize(RG * KC, 0.0);
        let mut c = CTiles([0.0; 4 * T * T]);
        // SAFETY: `CONFIG` is a valid palette-1 configuration.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) &CONFIG, options(nostack, readonly)) };
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let ksteps = kc.div_ceil(TK);
            // SAFETY: AVX-512 per this function's contract.
            unsafe { split_x(sa, a_part, x, k, k0, kc, n, n_pad) };
            for r0 in (0..rows).step_by(RG) {
                let mr = RG.min(rows - r0);
                // Zero past `kc`: the last step of 32 columns reads them.
                kern::fill_rows(fill, w, row_bytes, (r0, mr), (k0, kc), &mut sc.tile, KC, KC);
                // SAFETY: as above.
                unsafe { pack_w(sb, &sc.tile, w_parts, ksteps) };
                for t0 in (0..n).step_by(TG) {
                    let a = sa[t0 * KC..].as_ptr();
                    let mt = if n - t0 > T { 2 } else { 1 };
                    // SAFETY: `a` has `n_pad - t0 >= 32` token rows left in
                    // each part, `b` the packed group, `c` 4 KiB.
                    unsafe {
                        if mt == 2 {
                            block::<2>(a, a_part, sb.as_ptr(), w_parts, ksteps);
                            store_c::<2>(c.0.as_mut_ptr());
                        } else {
                            block::<1>(a, a_part, sb.as_ptr(), w_parts, ksteps);
                            store_c::<1>(c.0.as_mut_ptr());
                        }
                    }
                    // SAFETY: as above.
                    unsafe { scatter(&c.0, y, ldy, t0, n, r0, mr, k0 == 0) };
                }
            }
        }
        // SAFETY: releases the tile state configured above.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
    SCRATCH.set(sc);
}

/// Splits columns `k0..k0 + kc` of every token into the three parts,
/// zero-padded to `KC` columns and `n_pad` tokens.
///
/// # Safety
/// AVX-512 F/BW enabled.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn split_x(
    a: &mut [u16],
    a_part: usize,
    x: &[f32],
    k: usize,
    k0: usize,
    kc: usize,
    n: usize,
    n_pad: usize,
) {
    assert!(a.len() >= 3 * a_part && a_part >= n_pad * KC && kc <= KC);
    assert!(n == 0 || x.len() >= (n - 1) * k + k0 + kc);
    let a = a.as_mut_ptr();
    for t in 0..n_pad {
        for j in (0..KC).step_by(16) {
            let take = if t < n {
                kc.saturating_sub(j).min(16)
            } else {
                0
            };
            // SAFETY: the asserts above; the load reads `take` values of
            // token `t` inside `x`, the stores stay inside `a`.
            unsafe {
                let v = _mm512_maskz_loadu_ps(
                    ((1u32 << take) - 1) as u16,
                    x.as_ptr().wrapping_add(t * k + k0 + j),
                );
                for (p, part) in split16(v).into_iter().enumerate() {
                    _mm256_storeu_si256(a.add(p * a_part + t * KC + j).cast(), part);
                }
            }
        }
    }
}

/// Splits the dequantized group and packs it into B tiles: block
/// `[p][tile][ks]` holds rows `16·tile..` and columns `32·ks..` as
/// `[k / 2][row][k % 2]` (pairs of bf16 transposed as u32).
///
/// # Safety
/// AVX-512 F/BW enabled.
#[inline(always)]
unsafe fn pack_w(b: &mut [u16], tile: &[f32], w_parts: usize, ksteps: usize) {
    let part = 2 * (KC / TK) * T * TK;
    assert!(b.len() >= 3 * part && tile.len() >= RG * KC && ksteps <= KC / TK);
    let (b, tp) = (b.as_mut_ptr(), tile.as_ptr());
    for nt in 0..2 {
        for ks in 0..ksteps {
            let off = (nt * (KC / TK) + ks) * T * TK;
            // SAFETY: the asserts above bound every load and store.
            unsafe {
                let mut rows = [[_mm512_setzero_si512(); 16]; 3];
                // Row `r` fills entry `r` of all three parts.
                #[allow(clippy::needless_range_loop)]
                for r in 0..T {
                    let src = tp.add((nt * T + r) * KC + ks * TK);
                    let lo = split16(_mm512_loadu_ps(src));
                    let hi = split16(_mm512_loadu_ps(src.add(16)));
                    for p in 0..3 {
                        rows[p][r] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo[p]), hi[p]);
                    }
                }
                for (p, rows) in rows.iter_mut().enumerate().take(w_parts) {
                    transpose16(rows);
                    for (kp, v) in rows.iter().enumerate() {
                        _mm512_storeu_si512(b.add(p * part + off + kp * 2 * T).cast(), *v);
                    }
                }
            }
        }
    }
}

/// Adds (or stores, for the first chunk) the C tiles of tokens `t0..` and
/// rows `r0..r0 + mr` into `y`.
///
/// # Safety
/// AVX-512 F enabled; `y` as in [`gemm_tiles`], with `r0 + mr <= rows`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn scatter(
    c: &[f32; 4 * T * T],
    y: *mut f32,
    ldy: usize,
    t0: usize,
    n: usize,
    r0: usize,
    mr: usize,
    first: bool,
) {
    for t in t0..n.min(t0 + TG) {
        let (mt, m) = ((t - t0) / T, (t - t0) % T);
        for nt in 0..mr.div_ceil(T) {
            let cnt = (mr - nt * T).min(T);
            let mask = ((1u32 << cnt) - 1) as u16;
            let src = &c[(2 * mt + nt) * T * T + m * T..][..T];
            // SAFETY: the `cnt` outputs from row `r0 + nt * T` of token
            // `t` are this call's (the caller's contract).
            unsafe {
                let dst = y.add(t * ldy + r0 + nt * T);
                let mut v = _mm512_loadu_ps(src.as_ptr());
                if !first {
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, dst));
                }
                _mm512_mask_storeu_ps(dst, mask, v);
            }
        }
    }
}

/// The AMX tile walk as a [`Tiler`]; made only by [`gemm`], after
/// [`available`].
#[derive(Clone, Copy)]
struct AmxTiles(());

impl Tiler for AmxTiles {
    #[inline(always)]
    fn run<S: Simd>(self, s: S, sh: &GemmShape, w: &[u8], x: &[f32], y: Out<'_>, fill: &impl Fill) {
        let y = match y {
            Out::Slice(y) => {
                assert!(y.len() >= (sh.n - 1) * sh.ldy + sh.rows);
                y.as_mut_ptr()
            }
            Out::Shared(y) => y,
        };
        // SAFETY: an `AmxTiles` exists only once `available()` said yes;
        // `y` holds the outputs (checked above, or `Out::Shared`'s contract).
        unsafe { gemm_tiles(s, sh, w, x, y, fill) }
    }
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2, FMA and F16C, and
/// [`available`] must have returned `true`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
pub(super) unsafe fn gemm(ty: GgmlType, w: &[u8], x: &[f32], y: Out<'_>, sh: &GemmShape) -> bool {
    // SAFETY: this function's contract.
    let s = unsafe { Avx512::new() };
    kern::gemm(s, ty, w, x, y, sh, AmxTiles(()))
}
