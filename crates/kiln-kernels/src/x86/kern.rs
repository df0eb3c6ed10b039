//! ISA-generic kernels: block decoders, the GEMV row dot and the GEMM
//! tile + micro-kernel. Everything here is `#[inline(always)]` so it is
//! compiled inside the `#[target_feature]` entry points of `avx2` and
//! `avx512`; the [`Simd`] token proves the features are present.

use kiln_quant::block::scale_min_k4;
use kiln_quant::GgmlType;

/// The vector operations the kernels need, implemented per ISA. Holding a
/// value of an implementing type proves the CPU supports that ISA.
pub(super) trait Simd: Copy {
    const LANES: usize;
    type F: Copy;
    type I: Copy;

    fn zero(self) -> Self::F;
    fn splat(self, v: f32) -> Self::F;
    /// # Safety
    /// `p` must be valid for `LANES` f32 reads.
    unsafe fn load_ptr(self, p: *const f32) -> Self::F;
    /// # Safety
    /// `p` must be valid for `LANES` f32 writes.
    unsafe fn store_ptr(self, p: *mut f32, v: Self::F);
    /// `a * b + c`, one rounding.
    fn fma(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    fn add(self, a: Self::F, b: Self::F) -> Self::F;
    fn mul(self, a: Self::F, b: Self::F) -> Self::F;
    fn div(self, a: Self::F, b: Self::F) -> Self::F;
    /// Lane-wise min / max (the second operand where either is NaN).
    fn min(self, a: Self::F, b: Self::F) -> Self::F;
    fn max(self, a: Self::F, b: Self::F) -> Self::F;
    /// Round to nearest integer (ties to even).
    fn round(self, a: Self::F) -> Self::F;
    /// `2^n` for integral `n` in `-126..=127`.
    fn pow2i(self, n: Self::F) -> Self::F;
    fn hsum(self, v: Self::F) -> f32;
    /// `[hsum(v[0]), .., hsum(v[3])]`, sharing the shuffles.
    fn hsum4(self, v: [Self::F; 4]) -> [f32; 4];

    /// The first `LANES` bytes of `b`, zero-extended to i32 lanes.
    fn u8s(self, b: &[u8]) -> Self::I;
    /// The first `LANES` bytes of `b`, sign-extended.
    fn i8s(self, b: &[u8]) -> Self::I;
    /// `LANES` little-endian f16 / bf16 / f32 values from `b`.
    fn f16s(self, b: &[u8]) -> Self::F;
    fn bf16s(self, b: &[u8]) -> Self::F;
    fn f32s(self, b: &[u8]) -> Self::F;
    fn and(self, v: Self::I, m: i32) -> Self::I;
    fn or(self, a: Self::I, b: Self::I) -> Self::I;
    fn srl(self, v: Self::I, n: u32) -> Self::I;
    fn sll(self, v: Self::I, n: u32) -> Self::I;
    fn cvt(self, v: Self::I) -> Self::F;
    /// Lane `j` of `v` or-ed with `val` where bit `j` of `bits` is set.
    fn or_bits(self, v: Self::I, bits: u32, val: i32) -> Self::I;
    /// Lane `j` of `v` or-ed with `val` where `t[j] & bit != 0`.
    fn or_test(self, v: Self::I, t: Self::I, bit: i32, val: i32) -> Self::I;
    /// One f16 to f32 (F16C).
    fn f16(self, h: [u8; 2]) -> f32;
    /// One f16 to f32 in every lane. Not `splat(f16(h))`: LLVM lowers the
    /// scalar conversion to a `vpinsrw` that merges into a live register,
    /// which chained each Q8_0 block's decode to the previous one's
    /// (~15 cycles per 32 values); a broadcast load depends on nothing.
    fn splat_f16(self, h: [u8; 2]) -> Self::F;
    /// Hints that the cache line at `p` will be read soon. Never faults,
    /// so any address is fine.
    fn prefetch(self, p: *const u8);

    #[inline(always)]
    fn load(self, x: &[f32]) -> Self::F {
        assert!(x.len() >= Self::LANES);
        // SAFETY: just checked that `x` holds `LANES` values.
        unsafe { self.load_ptr(x.as_ptr()) }
    }

    #[inline(always)]
    fn store(self, out: &mut [f32], v: Self::F) {
        assert!(out.len() >= Self::LANES);
        // SAFETY: just checked that `out` holds `LANES` values.
        unsafe { self.store_ptr(out.as_mut_ptr(), v) }
    }
}

/// A packed block format with a SIMD decoder.
pub(super) trait Block {
    const BYTES: usize;
    const ELEMS: usize;
    /// bf16 parts that hold every decoded value exactly (see `amx`):
    /// 3 for the full f32 mantissa; 2 where values have at most 16
    /// significant bits (f16 scale × 5-bit code, f16); 1 for bf16.
    const BF16_PARTS: usize = 3;
    /// Decodes the block in `b` (exactly `BYTES`): `sink.put(i, v)` gets
    /// elements `i * LANES .. (i + 1) * LANES`, in any order.
    fn decode<S: Simd>(s: S, b: &[u8], sink: &mut impl Sink<S>);
}

/// Consumer of decoded vectors. A trait with `#[inline(always)]` methods
/// rather than a closure: a closure that failed to inline would be
/// compiled without the entry point's target features.
pub(super) trait Sink<S: Simd> {
    fn put(&mut self, i: usize, v: S::F);
}

/// Accumulates `v * x[i * LANES..]` into four accumulators.
struct DotSink<'a, S: Simd> {
    s: S,
    acc: [S::F; 4],
    x: &'a [f32],
}

impl<S: Simd> Sink<S> for DotSink<'_, S> {
    #[inline(always)]
    fn put(&mut self, i: usize, v: S::F) {
        let s = self.s;
        self.acc[i % 4] = s.fma(v, s.load(&self.x[i * S::LANES..]), self.acc[i % 4]);
    }
}

/// Stores `v` at `out[i * LANES..]`.
struct StoreSink<'a, S: Simd> {
    s: S,
    out: &'a mut [f32],
}

impl<S: Simd> Sink<S> for StoreSink<'_, S> {
    #[inline(always)]
    fn put(&mut self, i: usize, v: S::F) {
        self.s.store(&mut self.out[i * S::LANES..], v);
    }
}

fn f16(b: &[u8]) -> [u8; 2] {
    [b[0], b[1]]
}

pub(super) struct Q80;
impl Block for Q80 {
    const BYTES: usize = 34;
    const ELEMS: usize = 32;
    #[inline(always)]
    fn decode<S: Simd>(s: S, b: &[u8], sink: &mut impl Sink<S>) {
        let b: &[u8; 34] = b.try_into().expect("one block");
        let d = s.splat_f16(f16(b));
        for i in 0..32 / S::LANES {
            let q = s.cvt(s.i8s(&b[2 + i * S::LANES..]));
            sink.put(i, s.mul(q, d));
        }
    }
}

pub(super) struct Q40;
impl Block for Q40 {
    const BYTES: usize = 18;
    const ELEMS: usize = 32;
    const BF16_PARTS: usize = 2;
    #[inline(always)]
    fn decode<S: Simd>(s: S, b: &[u8], sink: &mut impl Sink<S>) {
        let b: &[u8; 18] = b.try_into().expect("one block");
        // d * (q - 8) as one FMA: -8d is exact, so this rounds once, like
        // the reference's product.
        let dv = s.splat_f16(f16(b));
        let off = s.mul(dv, s.splat(-8.0));
        let h = 16 / S::LANES;
        for c in 0..h {
            let q = s.u8s(&b[2 + c * S::LANES..]);
            sink.put(c, s.fma(s.cvt(s.and(q, 0xF)), dv, off));
            sink.put(h + c, s.fma(s.cvt(s.srl(q, 4)), dv, off));
        }
    }
}

pub(super) struct Q50;
impl Block for Q50 {
    const BYTES: usize = 22;
    const ELEMS: usize = 32;
    const BF16_PARTS: usize = 2;
    #[inline(always)]
    fn decode<S: Simd>(s: S, b: &[u8], sink: &mut impl Sink<S>) {
        let b: &[u8; 22] = b.try_into().expect("one block");
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let dv = s.splat_f16(f16(b));
        let off = s.mul(dv, s.splat(-16.0));
        let h = 16 / S::LANES;
        for c in 0..h {
            let q = s.u8s(&b[6 + c * S::LANES..]);
            let lo = s.or_bits(s.and(q, 0xF), qh >> (c * S::LANES), 16);
            let hi = s.or_bits(s.srl(q, 4), qh >> (16 + c * S::LANES), 16);
            sink.put(c, s.fma(s.cvt(lo), dv, off));
            sink.put(h + c, s.fma(s.cvt(hi), dv, off));
        }
    }
}

pub(super) struct Q4K;
impl Block for Q4K {
    const BYTES: usize = 144;
    const ELEMS: usize = 256;
    #[inline(always)]
    fn decode<S: Simd>(s: S, b: &[u8], sink: &mut impl Sink<S>) {
        let b: &[u8; 144] = b.try_into().expect("one block");
        decode_k4(s, b, 16, None, sink);
    }
}

pub(super) struct Q5K;
impl Block for Q5K {
    const BYTES: usize = 176;
    const ELEMS: usize = 256;
    #[inline(always)]
    fn decode<S: Simd>(s: S, b: &[u8], sink: &mut impl Sink<S>) {
        let b: &[u8; 176] = b.try_into().expect("one block");
        decode_k4(s, b, 48, Some(16), sink);
    }
}

/// A Q4_K or Q5_K block `b`: d and dmin, then eight groups' 6-bit scales
/// and mins (bytes 4..16), low nibbles from `qs` and, for Q5_K, each
/// element's fifth bit from the 32 bytes at `qh` (bit g of `qh[l]` for
/// element l of group g).
#[inline(always)]
fn decode_k4<S: Simd>(s: S, b: &[u8], qs: usize, qh: Option<usize>, sink: &mut impl Sink<S>) {
    let (d, dmin) = (s.f16(f16(b)), s.f16(f16(&b[2..])));
    let scales: &[u8; 12] = b[4..16].try_into().expect("12 scale bytes");
    let per = 32 / S::LANES;
    // Groups 2j (low nibbles) and 2j+1 (high) share 32 bytes of qs.
    for j in 0..4 {
        let (sc0, m0) = scale_min_k4(2 * j, scales);
        let (sc1, m1) = scale_min_k4(2 * j + 1, scales);
        let (d0, n0) = (s.splat(d * sc0 as f32), s.splat(-(dmin * m0 as f32)));
        let (d1, n1) = (s.splat(d * sc1 as f32), s.splat(-(dmin * m1 as f32)));
        for c in 0..per {
            let q = s.u8s(&b[qs + 32 * j + c * S::LANES..]);
            let (mut lo, mut hi) = (s.and(q, 0xF), s.srl(q, 4));
            if let Some(qh) = qh {
                let h = s.u8s(&b[qh + c * S::LANES..]);
                lo = s.or_test(lo, h, 1 << (2 * j), 16);
                hi = s.or_test(hi, h, 2 << (2 * j), 16);
            }
            sink.put(2 * j * per + c, s.fma(s.cvt(lo), d0, n0));
            sink.put((2 * j + 1) * per + c, s.fma(s.cvt(hi), d1, n1));
        }
    }
}

pub(super) struct Q6K;
impl Block for Q6K {
    const BYTES: usize = 210;
    const ELEMS: usize = 256;
    #[inline(always)]
    fn decode<S: Simd>(s: S, b: &[u8], sink: &mut impl Sink<S>) {
        let b: &[u8; 210] = b.try_into().expect("one block");
        let d = s.f16(f16(&b[208..]));
        let per = 32 / S::LANES;
        // Element 128 * half + 32 * kq + l: nibble kq / 2 of
        // ql[64 * half + 32 * (kq % 2) + l], bits 2kq.. of qh[32 * half + l].
        for half in 0..2 {
            for kq in 0..4 {
                for c in 0..per {
                    let l = c * S::LANES;
                    let ql = s.u8s(&b[64 * half + 32 * (kq % 2) + l..]);
                    let lo = if kq < 2 { s.and(ql, 0xF) } else { s.srl(ql, 4) };
                    let qh = s.u8s(&b[128 + 32 * half + l..]);
                    let hi = s.sll(s.and(s.srl(qh, 2 * kq as u32), 3), 4);
                    let g = 8 * half + 2 * kq + l / 16;
                    // d * sc * (q - 32) as one FMA, as in Q4_0.
                    let dl = d * b[192 + g] as i8 as f32;
                    let w = s.fma(s.cvt(s.or(lo, hi)), s.splat(dl), s.splat(-32.0 * dl));
                    sink.put((4 * half + kq) * per + c, w);
                }
            }
        }
    }
}

/// A plain type decoded 32 elements at a time (used when `k % 32 == 0`):
/// `$elem` bytes an element, `$parts` bf16 parts (see
/// [`Block::BF16_PARTS`]), read `LANES` at a time by `Simd::$load`.
macro_rules! plain_block {
    ($name:ident, $elem:literal, $parts:literal, $load:ident) => {
        pub(super) struct $name;
        impl Block for $name {
            const BYTES: usize = 32 * $elem;
            const ELEMS: usize = 32;
            const BF16_PARTS: usize = $parts;
            #[inline(always)]
            fn decode<S: Simd>(s: S, b: &[u8], sink: &mut impl Sink<S>) {
                let b: &[u8; 32 * $elem] = b.try_into().expect("one block");
                for i in 0..32 / S::LANES {
                    sink.put(i, s.$load(&b[$elem * S::LANES * i..]));
                }
            }
        }
    };
}

plain_block!(F32x32, 4, 3, f32s);
plain_block!(F16x32, 2, 2, f16s);
plain_block!(Bf16x32, 2, 1, bf16s);

/// Whether a [`Block`] decoder covers `ty` at row length `k`.
pub(super) fn has_kernel(ty: GgmlType, k: usize) -> bool {
    crate::has_fast_path(ty) && (ty.block_elems() > 1 || k.is_multiple_of(32))
}

/// Runs `$body` with `$B` naming the decoder of `$ty`, else `$other`.
macro_rules! by_type {
    ($ty:expr, $B:ident => $body:expr, _ => $other:expr) => {
        by_decoder!($ty, $B => $body, _ => $other;
            Q4_0 => Q40, Q5_0 => Q50, Q8_0 => Q80, Q4K => Q4K, Q5K => Q5K, Q6K => Q6K,
            F32 => F32x32, F16 => F16x32, BF16 => Bf16x32)
    };
}

/// GEMV over `y.len()` rows; `false` when there is no decoder for `ty`.
#[inline(always)]
pub(super) fn gemv<S: Simd>(
    s: S,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    y: &mut [f32],
) -> bool {
    if !has_kernel(ty, k) {
        return false;
    }
    by_type!(ty, B => gemv_rows::<S, B>(s, w, row_bytes, k, x, y), _ => return false);
    true
}

#[inline(always)]
fn gemv_rows<S: Simd, B: Block>(
    s: S,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    y: &mut [f32],
) {
    let packed = k / B::ELEMS * B::BYTES;
    for (r, yr) in y.iter_mut().enumerate() {
        *yr = dot_row::<S, B>(s, &w[r * row_bytes..][..packed], x);
    }
}

/// Prefetch distance in bytes for the GEMV weight stream.
const PREFETCH: usize = 768;

/// One packed row against `x`. Two blocks per step into separate
/// accumulators: enough independent FMA chains to hide FMA latency behind
/// the decode.
#[inline(always)]
fn dot_row<S: Simd, B: Block>(s: S, row: &[u8], x: &[f32]) -> f32 {
    let mut a = DotSink {
        s,
        acc: [s.zero(); 4],
        x: &[],
    };
    let mut b = DotSink {
        s,
        acc: [s.zero(); 4],
        x: &[],
    };
    let mut rows = row.chunks_exact(2 * B::BYTES);
    let mut xs = x.chunks_exact(2 * B::ELEMS);
    for (blk, xx) in (&mut rows).zip(&mut xs) {
        // One core's demand misses alone do not saturate DRAM on long
        // rows (the LM head); ask for the weights a few lines ahead.
        for off in (0..2 * B::BYTES).step_by(64) {
            s.prefetch(blk.as_ptr().wrapping_add(PREFETCH + off));
        }
        (a.x, b.x) = xx.split_at(B::ELEMS);
        B::decode(s, &blk[..B::BYTES], &mut a);
        B::decode(s, &blk[B::BYTES..], &mut b);
    }
    if !rows.remainder().is_empty() {
        a.x = xs.remainder();
        B::decode(s, rows.remainder(), &mut a);
    }
    let (a, b) = (a.acc, b.acc);
    let a = s.add(s.add(a[0], a[1]), s.add(a[2], a[3]));
    let b = s.add(s.add(b[0], b[1]), s.add(b[2], b[3]));
    s.hsum(s.add(a, b))
}

/// Fills a weight tile row from packed blocks.
pub(super) trait Fill {
    /// Block elements and bytes of the packed format.
    fn block(&self) -> (usize, usize);
    /// See [`Block::BF16_PARTS`].
    fn bf16_parts(&self) -> usize {
        3
    }
    /// Decodes whole blocks `src` into `dst`.
    fn fill(&self, src: &[u8], dst: &mut [f32]);
}

/// Decodes rows `r0..r0 + mr` of `w` over columns `k0..k0 + kc` into the
/// tile rows `tile[i * stride..]`; every tile row is `width >= kc` wide,
/// zero past `kc` and all zero for `i >= mr` (padding rows).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn fill_rows(
    fill: &impl Fill,
    w: &[u8],
    row_bytes: usize,
    (r0, mr): (usize, usize),
    (k0, kc): (usize, usize),
    tile: &mut [f32],
    stride: usize,
    width: usize,
) {
    let (elems, bytes) = fill.block();
    let (b0, nb) = (k0 / elems * bytes, kc / elems * bytes);
    for (i, dst) in tile.chunks_exact_mut(stride).enumerate() {
        let dst = &mut dst[..width];
        if i < mr {
            fill.fill(&w[(r0 + i) * row_bytes + b0..][..nb], &mut dst[..kc]);
            dst[kc..].fill(0.0);
        } else {
            dst.fill(0.0);
        }
    }
}

/// The SIMD decoder of `B`.
struct Decoded<S, B>(S, core::marker::PhantomData<B>);

impl<S: Simd, B: Block> Fill for Decoded<S, B> {
    #[inline(always)]
    fn block(&self) -> (usize, usize) {
        (B::ELEMS, B::BYTES)
    }
    #[inline(always)]
    fn bf16_parts(&self) -> usize {
        B::BF16_PARTS
    }
    #[inline(always)]
    fn fill(&self, src: &[u8], dst: &mut [f32]) {
        let s = self.0;
        for (b, out) in src
            .chunks_exact(B::BYTES)
            .zip(dst.chunks_exact_mut(B::ELEMS))
        {
            B::decode(s, b, &mut StoreSink { s, out });
        }
    }
}

/// `kiln_quant`'s scalar dequantizer, for types without a SIMD decoder.
struct Reference(GgmlType);

impl Fill for Reference {
    fn block(&self) -> (usize, usize) {
        (self.0.block_elems(), self.0.block_bytes())
    }
    fn fill(&self, src: &[u8], dst: &mut [f32]) {
        kiln_quant::dequantize(self.0, src, dst).expect("lengths checked by the caller");
    }
}

/// GEMM operand shapes (see `crate::gemm`).
pub(super) struct GemmShape {
    pub row_bytes: usize,
    pub rows: usize,
    pub k: usize,
    pub n: usize,
    pub ldy: usize,
}

/// Where a GEMM writes `Y[t][r]` (at `t * ldy + r`).
pub(crate) enum Out<'a> {
    /// An output the caller borrows whole.
    Slice(&'a mut [f32]),
    /// Columns of an output other threads write too: only the elements
    /// of this call's rows and tokens may be touched (AMX path only).
    Shared(*mut f32),
}

/// How a GEMM walks its tiles once the row decoder is chosen.
pub(super) trait Tiler: Copy {
    fn run<S: Simd>(self, s: S, sh: &GemmShape, w: &[u8], x: &[f32], y: Out<'_>, fill: &impl Fill);
}

/// GEMM by `tiler` with the SIMD decoder of `ty`, or the scalar
/// dequantizer for types without one; `false` when `ty` has no
/// dequantizer at all.
#[inline(always)]
pub(super) fn gemm<S: Simd>(
    s: S,
    ty: GgmlType,
    w: &[u8],
    x: &[f32],
    y: Out<'_>,
    sh: &GemmShape,
    tiler: impl Tiler,
) -> bool {
    if has_kernel(ty, sh.k) {
        by_type!(ty, B => tiler.run(
            s, sh, w, x, y, &Decoded::<S, B>(s, core::marker::PhantomData),
        ), _ => unreachable!("has_kernel"));
        return true;
    }
    if !kiln_quant::is_supported(ty) {
        return false;
    }
    tiler.run(s, sh, w, x, y, &Reference(ty));
    true
}
