//! The integer GEMV in tiles of 16 rows (AVX-512 VNNI): weight rows in
//! the 32-bit lanes of `vpdpbusd`, each activation plane's four bytes
//! broadcast, so a block of 32 weights is summed in integers for 16 rows
//! at once and its scales, conversions and offset cost one vector op per
//! 16 rows instead of one per row (the row form, `super::qdot`, spends
//! most of its time there and in decoding: it ran at ~0.2 cycles a weight
//! on Zen 4, compute-bound at a third of the memory's rate). The codes
//! are decoded once per tile and block and used by every activation row.
//!
//! Same math as `crate::qx` and the row form (`Σ u·x` from the three
//! planes, the type's offset against the exact `sum(x)`), except where
//! the planes are folded: a lane here sums 32 weights, not 4, so
//! `(H·S + M)·S + L` would overflow i32; `H·S + M` is folded in integers
//! (below 2^26) and the last step in f32 (one rounding, 2^-24 of the
//! block's sum).
//!
//! Layout: a tile is its rows' source blocks in order, each repacked (see
//! [`Format`]) into an optional header and one tile block per 32 weights:
//! four registers of nibbles (lane `i`, byte `c` of register `p`: low
//! nibble weight `4p + c`, high nibble `4p + c + 16` of row `i`), then what
//! the format adds (Q5_0: the fifth bits and the scales, 352 bytes, as
//! many as the rows' blocks; Q4_K: the groups' 6-bit scales and mins as
//! bytes after a header of the rows' `d` and `dmin`, 2,368 bytes per
//! super-block against the rows' 2,304; Q6_K: the codes' top two bits and
//! the groups' two int8 scales after a header of the rows' `d`, as many
//! bytes as the rows').

use core::arch::x86_64::*;

use kiln_quant::GgmlType;

use crate::qx::{QuantX, S};

/// Rows of a tile: one per 32-bit lane.
pub(crate) const ROWS: usize = 16;

/// A packed type in tiles: how 16 rows' source blocks are repacked, and
/// how a tile block decodes ([`Dec`]) into the codes `u` of its 8 steps of
/// 4 weights and the 16 rows' scale `s` and offset factor `o`, such that a
/// row's dot with `x` is `Σ s · Σ u·x + o · sum(x)` over its blocks (or
/// half blocks).
trait Format {
    /// Source bytes per block and 32-weight groups per block.
    const SRC: usize;
    const GROUPS: usize;
    /// Tile bytes per block: a header, then one part per group.
    const HEADER: usize;
    const PART: usize;
    /// Scales per group: 1, or 2 (one per 16 weights: steps 0..4, 4..8).
    const HALVES: usize = 1;
    /// What the header decodes to.
    type Head: Copy;

    /// Writes the tile bytes of the blocks `src[i]` (row `i`) to `out`.
    fn pack(src: [&[u8]; ROWS], out: &mut [u8]);

    /// # Safety
    /// AVX-512 F/BW and F16C enabled; `h` valid for `HEADER` reads.
    unsafe fn head(h: *const u8) -> Self::Head;

    /// # Safety
    /// AVX-512 F/BW and F16C enabled; `part` valid for `PART` reads.
    unsafe fn decode(part: *const u8, head: &Self::Head) -> Dec;
}

/// A decoded tile block: the codes of its 8 steps of 4 weights, and per
/// half ([`Format::HALVES`]) the 16 rows' scale `s` and offset factor `o`.
struct Dec {
    u: [__m512i; 8],
    s: [__m512; 2],
    o: [__m512; 2],
}

/// The nibble registers' step `j`: low nibbles of register `j`, then
/// (`j >= 4`) the high nibbles of register `j - 4`.
///
/// # Safety
/// AVX-512 F/BW enabled; `part` valid for 256 reads.
#[inline(always)]
unsafe fn nibbles(part: *const u8, j: usize) -> __m512i {
    // SAFETY: the caller's contract.
    unsafe {
        let q = _mm512_loadu_si512(part.add(64 * (j % 4)).cast());
        if j < 4 {
            q
        } else {
            _mm512_srli_epi16::<4>(q)
        }
    }
}

/// The 16 bytes at `p` as f32.
///
/// # Safety
/// AVX-512 F enabled; `p` valid for 16 reads.
#[inline(always)]
unsafe fn bytes16(p: *const u8) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()))) }
}

/// The 16 signed bytes at `p` as f32.
///
/// # Safety
/// AVX-512 F enabled; `p` valid for 16 reads.
#[inline(always)]
unsafe fn sbytes16(p: *const u8) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))) }
}

/// Writes row `i`'s bytes of one group's four nibble registers from its
/// 32 codes (their low 4 bits).
fn pack_nibbles(out: &mut [u8], i: usize, codes: &[u8; 32]) {
    for p in 0..4 {
        for c in 0..4 {
            let l = 4 * p + c;
            out[64 * p + 4 * i + c] = (codes[l] & 0xF) | (codes[l + 16] & 0xF) << 4;
        }
    }
}

struct Q50;
impl Format for Q50 {
    const SRC: usize = 22;
    const GROUPS: usize = 1;
    const HEADER: usize = 0;
    const PART: usize = 5 * 64 + 2 * ROWS;
    type Head = ();

    fn pack(src: [&[u8]; ROWS], out: &mut [u8]) {
        for (i, blk) in src.iter().enumerate() {
            // `qs` byte l holds weights l and l + 16: the nibble layout.
            for p in 0..4 {
                out[64 * p + 4 * i..][..4].copy_from_slice(&blk[6 + 4 * p..][..4]);
            }
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            // Lane i, bit 8c + j: the fifth bit of weight 4j + c, that is
            // bits c, c + 4, .. of `qh` gathered into byte c.
            let mut bits = 0u32;
            for c in 0..4 {
                let x = (qh >> c) & 0x1111_1111;
                let x = (x | x >> 3) & 0x0303_0303;
                let x = (x | x >> 6) & 0x000F_000F;
                bits |= ((x | x >> 12) & 0xFF) << (8 * c);
            }
            out[256 + 4 * i..][..4].copy_from_slice(&bits.to_le_bytes());
            out[320 + 2 * i..][..2].copy_from_slice(&blk[..2]);
        }
    }

    #[inline(always)]
    unsafe fn head(_: *const u8) {}

    #[inline(always)]
    unsafe fn decode(part: *const u8, _: &()) -> Dec {
        // SAFETY: the trait contract.
        unsafe {
            let low = _mm512_set1_epi8(0x0F);
            let five = _mm512_set1_epi8(0x10);
            let qh = _mm512_loadu_si512(part.add(256).cast());
            // No closure here: it would not inherit the caller's target
            // features (its intrinsics would become calls).
            let mut u = [_mm512_setzero_si512(); 8];
            for (j, uj) in u.iter_mut().enumerate() {
                // Bit j of each byte to bit 4 (16-bit shifts: the bits
                // that cross from the neighbour byte never reach bit 4).
                let h = match j {
                    0 => _mm512_slli_epi16::<4>(qh),
                    1 => _mm512_slli_epi16::<3>(qh),
                    2 => _mm512_slli_epi16::<2>(qh),
                    3 => _mm512_slli_epi16::<1>(qh),
                    4 => qh,
                    5 => _mm512_srli_epi16::<1>(qh),
                    6 => _mm512_srli_epi16::<2>(qh),
                    _ => _mm512_srli_epi16::<3>(qh),
                };
                // (q & 0x0F) | (h & 0x10)
                *uj = _mm512_ternarylogic_epi32::<0xEA>(
                    nibbles(part, j),
                    low,
                    _mm512_and_si512(h, five),
                );
            }
            // w = d·(u − 16).
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(part.add(320).cast()));
            let o = _mm512_mul_ps(d, _mm512_set1_ps(-16.0));
            Dec {
                u,
                s: [d, d],
                o: [o, o],
            }
        }
    }
}

struct Q4K;
impl Format for Q4K {
    const SRC: usize = 144;
    const GROUPS: usize = 8;
    const HEADER: usize = 4 * ROWS;
    const PART: usize = 4 * 64 + 2 * ROWS;
    /// The rows' `d` and `dmin`.
    type Head = (__m512, __m512);

    fn pack(src: [&[u8]; ROWS], out: &mut [u8]) {
        for (i, blk) in src.iter().enumerate() {
            out[2 * i..][..2].copy_from_slice(&blk[..2]);
            out[2 * ROWS + 2 * i..][..2].copy_from_slice(&blk[2..4]);
        }
        for g in 0..8 {
            let part = &mut out[Self::HEADER + g * Self::PART..][..Self::PART];
            for (i, blk) in src.iter().enumerate() {
                // Groups 2k, 2k + 1: the low, then high nibbles of qs[32k..].
                let qs: &[u8; 32] = blk[16 + 32 * (g / 2)..][..32].try_into().expect("32 bytes");
                pack_nibbles(part, i, &qs.map(|q| q >> (4 * (g % 2))));
                let scales: &[u8; 12] = blk[4..16].try_into().expect("12 scale bytes");
                let (sc, m) = kiln_quant::block::scale_min_k4(g, scales);
                part[256 + i] = sc;
                part[256 + ROWS + i] = m;
            }
        }
    }

    #[inline(always)]
    unsafe fn head(h: *const u8) -> (__m512, __m512) {
        // SAFETY: the trait contract.
        unsafe {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(h.cast())),
                _mm512_cvtph_ps(_mm256_loadu_si256(h.add(2 * ROWS).cast())),
            )
        }
    }

    #[inline(always)]
    unsafe fn decode(part: *const u8, head: &(__m512, __m512)) -> Dec {
        // SAFETY: the trait contract.
        unsafe {
            let low = _mm512_set1_epi8(0x0F);
            let mut u = [_mm512_setzero_si512(); 8];
            for (j, uj) in u.iter_mut().enumerate() {
                *uj = _mm512_and_si512(nibbles(part, j), low);
            }
            // w = d·sc·u − dmin·m (both products exact in f32).
            let s = _mm512_mul_ps(head.0, bytes16(part.add(256)));
            let m = bytes16(part.add(256 + ROWS));
            let o = _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), head.1), m);
            Dec {
                u,
                s: [s, s],
                o: [o, o],
            }
        }
    }
}

/// Group `g` (0..8) of a Q6_K block: its 32 codes `q + 32` (0..64) and
/// the indices of its two scales (one per 16 weights). ggml's
/// `block_q6_K`: two halves of 128 weights, each with 64 `ql` bytes, 32
/// `qh` bytes and 8 scales; group `g` is quarter `g % 4` of half `g / 4`.
fn q6k_group(blk: &[u8], g: usize) -> ([u8; 32], [usize; 2]) {
    let (n, quarter) = (g / 4, g % 4);
    let ql: &[u8; 32] = blk[64 * n + 32 * (quarter % 2)..][..32]
        .try_into()
        .expect("32 bytes");
    let qh: &[u8; 32] = blk[128 + 32 * n..][..32].try_into().expect("32 bytes");
    let mut codes = [0u8; 32];
    for (l, c) in codes.iter_mut().enumerate() {
        let lo = (ql[l] >> (4 * (quarter / 2))) & 0xF;
        *c = lo | ((qh[l] >> (2 * quarter)) & 3) << 4;
    }
    let sc = 8 * n + 2 * quarter;
    (codes, [sc, sc + 1])
}

struct Q6K;
impl Format for Q6K {
    const SRC: usize = 210;
    const GROUPS: usize = 8;
    const HALVES: usize = 2;
    const HEADER: usize = 2 * ROWS;
    /// Nibbles, two registers of the codes' top two bits (register `j /
    /// 4`, bits `2·(j % 4)..` of lane `i`'s byte `c`: weight `4j + c`), then
    /// the 16 rows' two int8 scales.
    const PART: usize = 6 * 64 + 2 * ROWS;
    /// The rows' `d`.
    type Head = __m512;

    fn pack(src: [&[u8]; ROWS], out: &mut [u8]) {
        for (i, blk) in src.iter().enumerate() {
            out[2 * i..][..2].copy_from_slice(&blk[208..210]);
        }
        for g in 0..8 {
            let part = &mut out[Self::HEADER + g * Self::PART..][..Self::PART];
            for (i, blk) in src.iter().enumerate() {
                let (codes, scales) = q6k_group(blk, g);
                pack_nibbles(part, i, &codes);
                for j in 0..8 {
                    for c in 0..4 {
                        let top = codes[4 * j + c] >> 4;
                        part[256 + 64 * (j / 4) + 4 * i + c] |= top << (2 * (j % 4));
                    }
                }
                for (h, sc) in scales.into_iter().enumerate() {
                    part[384 + ROWS * h + i] = blk[192 + sc];
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn head(h: *const u8) -> __m512 {
        // SAFETY: the trait contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(h.cast())) }
    }

    #[inline(always)]
    unsafe fn decode(part: *const u8, d: &__m512) -> Dec {
        // SAFETY: the trait contract.
        unsafe {
            let low = _mm512_set1_epi8(0x0F);
            let top = _mm512_set1_epi8(0x30);
            let mut u = [_mm512_setzero_si512(); 8];
            for (j, uj) in u.iter_mut().enumerate() {
                let t = _mm512_loadu_si512(part.add(256 + 64 * (j / 4)).cast());
                // Bits 2·(j % 4).. of each byte to bits 4..6 (16-bit
                // shifts: bits from the neighbour byte land outside them).
                let t = match j % 4 {
                    0 => _mm512_slli_epi16::<4>(t),
                    1 => _mm512_slli_epi16::<2>(t),
                    2 => t,
                    _ => _mm512_srli_epi16::<2>(t),
                };
                // (q & 0x0F) | (t & 0x30)
                *uj = _mm512_ternarylogic_epi32::<0xEA>(
                    nibbles(part, j),
                    low,
                    _mm512_and_si512(t, top),
                );
            }
            // w = d·sc·(u − 32), a scale per 16 weights.
            let sc = |h: usize| part.add(384 + ROWS * h);
            let s = [
                _mm512_mul_ps(*d, sbytes16(sc(0))),
                _mm512_mul_ps(*d, sbytes16(sc(1))),
            ];
            let m32 = _mm512_set1_ps(-32.0);
            Dec {
                u,
                s,
                o: [_mm512_mul_ps(s[0], m32), _mm512_mul_ps(s[1], m32)],
            }
        }
    }
}

/// A matrix's whole tiles of 16 rows (the last `rows % 16` rows are not
/// held), of a type [`Tiles::pack`] takes.
pub(crate) struct Tiles {
    ty: GgmlType,
    /// Source blocks per row.
    nsb: usize,
    pub(crate) tiles: usize,
    bytes: Vec<u8>,
}

impl Tiles {
    /// The tiles of `rows` rows of `k` values of type `ty` at `w` (stride
    /// `row_bytes`), packed on `pool` where given; `None` for other types
    /// or when the memory is not available.
    pub(crate) fn pack(
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        rows: usize,
        k: usize,
        pool: Option<&crate::pool::Pool>,
    ) -> Option<Tiles> {
        match ty {
            GgmlType::Q5_0 => Self::pack_as::<Q50>(ty, w, row_bytes, rows, k, pool),
            GgmlType::Q4K => Self::pack_as::<Q4K>(ty, w, row_bytes, rows, k, pool),
            GgmlType::Q6K => Self::pack_as::<Q6K>(ty, w, row_bytes, rows, k, pool),
            _ => None,
        }
    }

    fn pack_as<F: Format>(
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        rows: usize,
        k: usize,
        pool: Option<&crate::pool::Pool>,
    ) -> Option<Tiles> {
        // Tiles per task: packing is ~1 GB/s a thread, on the first use
        // of every weight (the first request's latency).
        const TASK_TILES: usize = 8;
        let nsb = k / (32 * F::GROUPS);
        let per = F::HEADER + F::GROUPS * F::PART;
        let tiles = rows / ROWS;
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(tiles * nsb * per).ok()?;
        bytes.resize(tiles * nsb * per, 0);
        let pack_tiles = |t0: usize, out: &mut [u8]| {
            for (dt, tile) in out.chunks_exact_mut(nsb * per).enumerate() {
                let t = t0 + dt;
                for (b, out) in tile.chunks_exact_mut(per).enumerate() {
                    let src = core::array::from_fn(|i| {
                        &w[(t * ROWS + i) * row_bytes + b * F::SRC..][..F::SRC]
                    });
                    F::pack(src, out);
                }
            }
        };
        let chunks = bytes.chunks_mut(TASK_TILES * nsb * per);
        crate::pool::run_parts(pool, chunks, |c, out| pack_tiles(c * TASK_TILES, out));
        Some(Tiles {
            ty,
            nsb,
            tiles,
            bytes,
        })
    }
}

/// `y[t * ldy + r]` for rows `r` of tiles `t0 .. t0 + tiles` of `p`
/// (counted from the first row of tile `t0`) and activation `t` of `qxs`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C present; every `qxs[t]` holds the rows'
/// length.
pub(crate) unsafe fn gemv(
    p: &Tiles,
    t0: usize,
    tiles: usize,
    qxs: &[QuantX],
    y: &mut [f32],
    ldy: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match p.ty {
            GgmlType::Q5_0 => gemv_as::<Q50>(p, t0, tiles, qxs, y, ldy),
            GgmlType::Q4K => gemv_as::<Q4K>(p, t0, tiles, qxs, y, ldy),
            GgmlType::Q6K => gemv_as::<Q6K>(p, t0, tiles, qxs, y, ldy),
            _ => unreachable!("tiles of {} are never packed", p.ty),
        }
    }
}

/// [`gemv`] for format `F`.
///
/// # Safety
/// As [`gemv`]; `p` holds tiles of `F`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemv_as<F: Format>(
    p: &Tiles,
    t0: usize,
    tiles: usize,
    qxs: &[QuantX],
    y: &mut [f32],
    ldy: usize,
) {
    let n = qxs.len();
    let k = p.nsb * F::GROUPS * 32;
    assert!(
        t0 + tiles <= p.tiles
            && ldy >= tiles * ROWS
            && (n == 0 || y.len() >= (n - 1) * ldy + tiles * ROWS)
            && qxs.iter().all(|q| q.k == k)
    );
    let per = p.nsb * (F::HEADER + F::GROUPS * F::PART);
    let mut g0 = 0;
    while g0 < n {
        let m = GROUP.min(n - g0);
        let xs = &qxs[g0..g0 + m];
        for tile in 0..tiles {
            let base = p.bytes[(t0 + tile) * per..].as_ptr();
            // SAFETY: the tile's bytes lie in `p.bytes`; the activations
            // hold its blocks (asserted).
            let acc = unsafe {
                match m {
                    1 => tile_dots::<F, 1>(base, p.nsb, xs),
                    2 => tile_dots::<F, 2>(base, p.nsb, xs),
                    3 => tile_dots::<F, 3>(base, p.nsb, xs),
                    4 => tile_dots::<F, 4>(base, p.nsb, xs),
                    5 => tile_dots::<F, 5>(base, p.nsb, xs),
                    6 => tile_dots::<F, 6>(base, p.nsb, xs),
                    7 => tile_dots::<F, 7>(base, p.nsb, xs),
                    _ => tile_dots::<F, 8>(base, p.nsb, xs),
                }
            };
            for (j, a) in acc[..m].iter().enumerate() {
                // SAFETY: `y` holds these 16 outputs of activation `g0 +
                // j` (asserted).
                unsafe {
                    let at = y.as_mut_ptr().add((g0 + j) * ldy + tile * ROWS);
                    _mm512_storeu_ps(at, *a);
                }
            }
        }
        g0 += m;
    }
}

/// Activation rows per pass over a tile: their sums stay in registers
/// while each block's decoded codes are reused.
const GROUP: usize = 8;
/// How far ahead, in bytes (four Q5_0 tile blocks), the kernel
/// prefetches. The tiles are one sequential stream, but the hardware
/// prefetcher alone left the kernel waiting on DRAM: Zen 4, real 270M, 2
/// threads, the Q5_0 2048 x 640 products of a decode step took 1.28-1.41
/// ms (1 token) and 5.5-6.5 ms (8) without, 1.15-1.32 and 3.6-4.5 with 4
/// blocks ahead (2 and 6 blocks: no better).
const PREFETCH_BYTES: usize = 4 * Q50::PART;

/// The tile at `base` (`nsb` source blocks) against the `M` activations
/// `xs`.
///
/// # Safety
/// As [`gemv_as`]; `base` points at a tile of `F`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile_dots<F: Format, const M: usize>(
    base: *const u8,
    nsb: usize,
    xs: &[QuantX],
) -> [__m512; GROUP] {
    let mut acc = [_mm512_setzero_ps(); GROUP];
    let per = F::HEADER + F::GROUPS * F::PART;
    for sb in 0..nsb {
        // SAFETY: the caller's contract: block `sb` of the tile, and every
        // activation's groups `sb * GROUPS ..`.
        unsafe {
            let blk = base.add(sb * per);
            let head = F::head(blk);
            for g in 0..F::GROUPS {
                let part = blk.add(F::HEADER + g * F::PART);
                // Past the tiles' end too: a prefetch never faults.
                let ahead = part.wrapping_add(PREFETCH_BYTES);
                for l in (0..F::PART).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l).cast());
                }
                let dec = F::decode(part, &head);
                let gi = sb * F::GROUPS + g;
                if F::HALVES == 2 {
                    group_dots::<M, 2>(&dec, gi, xs, &mut acc);
                } else {
                    group_dots::<M, 1>(&dec, gi, xs, &mut acc);
                }
            }
        }
    }
    acc
}

/// One group of 32 weights, decoded, against the `M` activations `xs`,
/// into their `acc`: `H` sums (one per half of [`Dec`]) per activation.
///
/// # Safety
/// AVX-512 F/BW/VNNI enabled; every `xs[t]` holds group `gi`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn group_dots<const M: usize, const H: usize>(
    dec: &Dec,
    gi: usize,
    xs: &[QuantX],
    acc: &mut [__m512; GROUP],
) {
    // SAFETY: the caller's contract: 32 values of every plane at `32 * gi`.
    unsafe {
        let sv = _mm512_set1_epi32(S as i32);
        let e = 32 * gi;
        let steps = 8 / H;
        for (a, x) in acc[..M].iter_mut().zip(xs) {
            let plane = |v: &[i8], j: usize| {
                _mm512_set1_epi32(v.as_ptr().add(e + 4 * j).cast::<i32>().read_unaligned())
            };
            let dx = _mm512_set1_ps(*x.lane_d.get_unchecked(e / 4));
            for half in 0..H {
                let (mut h, mut m, mut l) = (
                    _mm512_setzero_si512(),
                    _mm512_setzero_si512(),
                    _mm512_setzero_si512(),
                );
                for j in half * steps..(half + 1) * steps {
                    let uj = dec.u[j];
                    h = _mm512_dpbusd_epi32(h, uj, plane(&x.h, j));
                    m = _mm512_dpbusd_epi32(m, uj, plane(&x.m, j));
                    l = _mm512_dpbusd_epi32(l, uj, plane(&x.l, j));
                }
                let hm = _mm512_add_epi32(_mm512_mullo_epi32(h, sv), m);
                let v = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(hm),
                    _mm512_set1_ps(S),
                    _mm512_cvtepi32_ps(l),
                );
                let sum = if H == 1 {
                    *x.group_sum.get_unchecked(gi)
                } else {
                    *x.half_sum.get_unchecked(2 * gi + half)
                };
                let sum = _mm512_set1_ps(sum);
                let o = _mm512_fmadd_ps(dec.o[half], sum, *a);
                *a = _mm512_fmadd_ps(dec.s[half], _mm512_mul_ps(v, dx), o);
            }
        }
    }
}
