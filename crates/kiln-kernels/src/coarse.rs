//! The greedy head's one-row screen over fewer bytes: a Q8_0 matrix's
//! codes split into their top six bits, which the screen reads, and their
//! low two, read back only for the rows it cannot rule out.
//!
//! A Q8_0 code `q ∈ [−128, 127]` is `4·(u − 32) + l` with `u = (q >> 2) +
//! 32 ∈ [0, 63]` and `l = q & 3`. The screen scores row `r` with `w' =
//! 4·(u − 32) + 1.5`, which is off `q` by at most 1.5, so against
//! [`ScreenX`]'s `x̂` (`x` as a Q8_0 row, error `e`)
//!
//! `Σ q·x − Σ w'·x̂ = Σ q·e + Σ (q − w')·x̂`, bounded per block by
//! `128·√32·‖e_b‖₂ + 1.5·‖x̂_b‖₁`,
//!
//! plus the f32 rounding slack of both sums (`crate::screen`'s `γ`, scaled
//! for `w'`'s integer form). So the screen's bounds hold for the exact
//! kernels' logits as the Q8_0 screen's do; they are looser, and on the
//! real Gemma 3 270M head a decode step re-scores ~150 of 262,144 rows on
//! average (the Q8_0 screen: ~10), while it reads 26 bytes per block of 32
//! instead of 34.
//!
//! Layout, per row (`26 · nb` bytes, `nb` blocks): the blocks' f16 scales
//! (`2 · nb`), then per block the 32 `u` as a 192-bit little-endian
//! stream, value `v` at bits `6v` (24 bytes; `vpermb` + `vpmultishiftqb`
//! unpack it in three ops, on AVX2 a `vpshufb` and two masks as words).
//! The low bits live apart (`8 · nb` bytes per row: byte `j` holds
//! `l_{j+8k}` at bits `2k`), so the screen's pass reads only the rows'
//! first part. Together the parts hold the matrix
//! exactly: [`CoarseRows::q8_0_row`] gives back its bytes.
//!
//! The SIMD screens (`crate::x86::coarse`) run from AVX2 up, the two
//! forms bit for bit alike: with AVX-512 VBMI (Zen 4, Ice Lake and later)
//! one, elsewhere (AVX2, FMA, F16C) the other. The portable screen is
//! only their spec. The backend takes the coarse screen by default
//! wherever one of them runs ([`coarse_screen_runs`]).

use kiln_quant::GgmlType;

use crate::screen::{fold_lo, ScreenX, ABS_SLACK, GAMMA};
use crate::{Isa, KernelError};

/// Bytes per block the screen reads: scale and codes.
pub(crate) const SCREEN_BLOCK: usize = 26;
/// Zero bytes after the last row: the SIMD unpack loads 32 bytes for a
/// block's 24.
const TAIL: usize = 8;
/// Bytes per block of low bits.
pub(crate) const LOW_BLOCK: usize = 8;

/// A Q8_0 matrix in the screen's split (see the module doc).
pub struct CoarseRows {
    rows: usize,
    nb: usize,
    /// Per row scales and codes, then [`TAIL`].
    screen: Vec<u8>,
    /// Per row: the low bits' crumbs.
    low: Vec<u8>,
}

/// `c'_b` for a block of `x` (see the module doc) from the Q8_0 screen's
/// Cauchy–Schwarz term `ce` and the block's `‖x‖₁`, `‖x̂‖₁`: the f32
/// rounding of `w'`'s sums (terms up to `(252 + 126.5)·|x̂|` per value)
/// is covered with `512·γ·‖x̂‖₁`. Rounded up.
pub(crate) fn bound_term(ce: f64, l1x: f64, l1h: f64) -> f32 {
    let c = ce + 1.5 * l1h * (1.0 + 1e-6) + GAMMA * (128.0 * l1x + 512.0 * l1h);
    c as f32 * (1.0 + 1e-6)
}

/// The part of `Σ w'·x̂` (per unit of the block's weight scale) that does
/// not depend on `u`: `Σ (−126.5)·d·q = −126.5 · d · Σ q`.
pub(crate) fn offset_term(d: f32, sum_q: i32) -> f32 {
    -126.5 * d * sum_q as f32
}

impl CoarseRows {
    /// `rows` rows of `k` Q8_0 values at `w` (stride `row_bytes`), split,
    /// on `pool` where given (once, at the first greedy step); `None` for
    /// other types, a bad shape, or memory not available. `done` gets
    /// each range of `w` as its last read ends (to hand those pages back
    /// while the rest is packed).
    pub fn pack(
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        rows: usize,
        k: usize,
        pool: Option<&crate::pool::Pool>,
        done: &(dyn Fn(std::ops::Range<usize>) + Sync),
    ) -> Option<CoarseRows> {
        /// Rows per task.
        const TASK_ROWS: usize = 4096;
        if ty != GgmlType::Q8_0 || k == 0 || crate::check_rows(ty, w, row_bytes, k, rows).is_err() {
            return None;
        }
        let nb = k / 32;
        // Zeroed allocations: pages are committed as packing writes them.
        let mut screen = zeroed(rows * nb * SCREEN_BLOCK + TAIL)?;
        let mut low = zeroed(rows * nb * LOW_BLOCK)?;
        let parts = screen[..rows * nb * SCREEN_BLOCK]
            .chunks_mut(TASK_ROWS * nb * SCREEN_BLOCK)
            .zip(low.chunks_mut(TASK_ROWS * nb * LOW_BLOCK));
        crate::pool::run_parts(pool, parts, |c, (s, l)| {
            let src = c * TASK_ROWS * row_bytes..((c + 1) * TASK_ROWS * row_bytes).min(w.len());
            pack_rows(&w[src.start..], row_bytes, nb, s, l);
            done(src);
        });
        Some(CoarseRows {
            rows,
            nb,
            screen,
            low,
        })
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Row length.
    pub fn cols(&self) -> usize {
        32 * self.nb
    }

    /// Bytes held (both parts).
    pub fn bytes(&self) -> usize {
        self.screen.len() + self.low.len()
    }

    /// Bytes one screen of every row reads (scales and codes; the low
    /// bits only for candidates).
    pub fn screen_bytes(&self) -> usize {
        self.rows * self.nb * SCREEN_BLOCK
    }

    /// Row `r`'s screen part and low bits.
    pub(crate) fn row(&self, r: usize) -> (&[u8], &[u8]) {
        let nb = self.nb;
        (
            &self.screen[r * nb * SCREEN_BLOCK..][..nb * SCREEN_BLOCK],
            &self.low[r * nb * LOW_BLOCK..][..nb * LOW_BLOCK],
        )
    }

    /// The screen parts of rows `r0..`, contiguous, and the zero tail.
    pub(crate) fn screen_from(&self, r0: usize) -> &[u8] {
        &self.screen[r0 * self.nb * SCREEN_BLOCK..]
    }

    pub(crate) fn blocks(&self) -> usize {
        self.nb
    }

    /// Row `r` as the Q8_0 bytes it was packed from (`34 · k / 32`).
    pub fn q8_0_row(&self, isa: Isa, r: usize, out: &mut [u8]) -> Result<(), KernelError> {
        if r >= self.rows || out.len() != self.nb * 34 {
            return Err(KernelError::Shape(format!(
                "row {r} of {} ({} bytes), into {} bytes",
                self.rows,
                self.nb * 34,
                out.len()
            )));
        }
        #[cfg(target_arch = "x86_64")]
        if crate::x86::coarse_q8_0_row(isa.min(Isa::cpu_max()), self, r, out) {
            return Ok(());
        }
        let _ = isa;
        q8_0_row(self, r, out);
        Ok(())
    }
}

/// `n` zero bytes, `None` when the memory is not available.
fn zeroed(n: usize) -> Option<Vec<u8>> {
    let layout = std::alloc::Layout::array::<u8>(n).ok()?;
    if n == 0 {
        return Some(Vec::new());
    }
    // SAFETY: `layout` has a non-zero size; a non-null result is `n`
    // zeroed bytes from the global allocator with `u8`'s alignment, which
    // is what `Vec::from_raw_parts` with capacity `n` takes over.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout);
        (!p.is_null()).then(|| Vec::from_raw_parts(p, n, n))
    }
}

/// Packs the rows of `w` (stride `row_bytes`, `nb` blocks) that `screen`
/// and `low` have room for.
fn pack_rows(w: &[u8], row_bytes: usize, nb: usize, screen: &mut [u8], low: &mut [u8]) {
    let rows = screen
        .chunks_exact_mut(nb * SCREEN_BLOCK)
        .zip(low.chunks_exact_mut(nb * LOW_BLOCK));
    for (r, (dst, low)) in rows.enumerate() {
        let src = &w[r * row_bytes..][..nb * 34];
        let (scales, codes) = dst.split_at_mut(2 * nb);
        for (b, blk) in src.chunks_exact(34).enumerate() {
            scales[2 * b..2 * b + 2].copy_from_slice(&blk[..2]);
            let mut groups = [0u64; 4];
            let mut lows = [0u8; 8];
            for (v, &byte) in blk[2..].iter().enumerate() {
                let q = byte as i8;
                let u = ((q >> 2) + 32) as u8;
                groups[v / 8] |= u64::from(u) << (6 * (v % 8));
                lows[v % 8] |= ((q & 3) as u8) << (2 * (v / 8));
            }
            let stream = &mut codes[24 * b..24 * b + 24];
            for (g, bits) in stream.chunks_exact_mut(6).zip(groups) {
                g.copy_from_slice(&bits.to_le_bytes()[..6]);
            }
            low[8 * b..8 * b + 8].copy_from_slice(&lows);
        }
    }
}

/// Value `v` of a block's 24-byte stream: bits `6v ..` (group `v / 8` is
/// bytes `6·(v / 8) ..` and holds the value at bit `6·(v % 8)`).
fn get6(stream: &[u8], v: usize) -> u8 {
    let mut g = [0u8; 8];
    g[..6].copy_from_slice(&stream[6 * (v / 8)..][..6]);
    (u64::from_le_bytes(g) >> (6 * (v % 8))) as u8 & 63
}

/// Portable [`CoarseRows::q8_0_row`] (shape checked by the caller).
pub(crate) fn q8_0_row(c: &CoarseRows, r: usize, out: &mut [u8]) {
    let nb = c.nb;
    let (row, low) = c.row(r);
    for (b, blk) in out.chunks_exact_mut(34).enumerate() {
        blk[..2].copy_from_slice(&row[2 * b..2 * b + 2]);
        let u = unpack_u(row, nb, b);
        for (i, q) in blk[2..].iter_mut().enumerate() {
            let l = (low[8 * b + i % 8] >> (2 * (i / 8))) & 3;
            *q = ((i32::from(u[i]) - 32) * 4 + i32::from(l)) as i8 as u8;
        }
    }
}

/// Block `b`'s `u` values from a row's screen part.
fn unpack_u(row: &[u8], nb: usize, b: usize) -> [u8; 32] {
    let codes = &row[2 * nb + 24 * b..][..24];
    core::array::from_fn(|v| get6(codes, v))
}

/// Portable coarse screen of rows `r0..r0 + hi.len()`: as
/// `crate::screen::screen_q8_0` with `w'` for `q` and `c'` for `c`.
pub(crate) fn screen_coarse(sx: &ScreenX, c: &CoarseRows, r0: usize, hi: &mut [f32]) -> f32 {
    let nb = c.nb;
    let mut max_lo = f32::NEG_INFINITY;
    for (i, h) in hi.iter_mut().enumerate() {
        let (row, _) = c.row(r0 + i);
        let (mut a, mut off, mut beta) = (0.0f32, 0.0f32, 0.0f32);
        for b in 0..nb {
            let dw = half::f16::from_le_bytes([row[2 * b], row[2 * b + 1]]).to_f32();
            let u = unpack_u(row, nb, b);
            let qx = &sx.q[32 * b..][..32];
            let p: i32 = u
                .iter()
                .zip(qx)
                .map(|(&u, &x)| i32::from(u) * i32::from(x))
                .sum();
            a += p as f32 * (4.0 * dw * sx.d[b]);
            off += dw * sx.coarse_off[b];
            beta += dw.abs() * sx.coarse_c[b];
        }
        let a = a + off;
        let beta = beta + ABS_SLACK;
        *h = a + beta;
        max_lo = fold_lo(max_lo, a - beta, *h);
    }
    max_lo
}

/// Whether the backend should take [`screen_coarse_rows`] over the Q8_0
/// screen at `isa` (clamped to this CPU): wherever a SIMD form runs (VBMI,
/// or AVX2). The AVX2 form is faster as a kernel (Zen 4, one thread: 24.1
/// against 26.9 us for 1,024 rows in cache, 7.4 against 8.7 ms for the
/// 270M's head); in decode at 2 threads it ties the Q8_0 screen on the
/// Zen 4 VM (13 alternating pairs) and wins where memory is slower (a
/// Sapphire Rapids VM reading 22 GB/s: 270M `--isa avx2` tg128 58.5-62.8
/// -> 69.5-73.5 tok/s in three alternating pairs, its head reading 24%
/// fewer bytes; `bench/RESULTS.md`). `KILN_HEAD_SCREEN=q8_0` keeps the
/// Q8_0 screen.
pub fn coarse_screen_runs(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::x86::coarse_form(isa.min(Isa::cpu_max()), 2).is_some();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// [`crate::screen_rows`] over rows `r0 .. r0 + hi.len()` of a
/// [`CoarseRows`]: `hi[i]` bounds row `r0 + i`'s exact logit from above,
/// the return value the largest from below (`NaN`: a bound is not
/// finite, use the exact path). Looser than the Q8_0 screen's bounds;
/// re-score the rows that reach the floor from [`CoarseRows::q8_0_row`].
pub fn screen_coarse_rows(
    isa: Isa,
    c: &CoarseRows,
    r0: usize,
    sx: &ScreenX,
    hi: &mut [f32],
) -> Result<f32, KernelError> {
    if sx.len() != c.cols() || r0 + hi.len() > c.rows {
        return Err(KernelError::Shape(format!(
            "rows {r0}..+{} of {} rows of {}, screened against {} values",
            hi.len(),
            c.rows,
            c.cols(),
            sx.len()
        )));
    }
    if hi.is_empty() {
        return Ok(f32::NEG_INFINITY);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(m) = crate::x86::screen_coarse(isa.min(Isa::cpu_max()), sx, c, r0, hi) {
        return Ok(m);
    }
    let _ = isa;
    Ok(screen_coarse(sx, c, r0, hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::xorshift;

    /// Whether the screen of rows of `nb` blocks against `sx` has a SIMD
    /// form at `isa`.
    fn has_simd(isa: Isa, nb: usize, sx: &ScreenX) -> bool {
        #[cfg(target_arch = "x86_64")]
        return crate::x86::coarse_screen_form(isa, nb, sx).is_some();
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (isa, nb, sx);
            false
        }
    }

    /// Random Q8_0 rows, every code from −128 to 127 in the first 256
    /// values.
    fn random_q8_0(rows: usize, k: usize, rnd: &mut impl FnMut() -> u64) -> Vec<u8> {
        let mut w = crate::test_util::random_q8_0(rows, k, rnd);
        for (i, q) in w
            .chunks_exact_mut(34)
            .take(8)
            .flat_map(|b| &mut b[2..])
            .enumerate()
        {
            *q = i as u8;
        }
        w
    }

    /// The split gives back every row's bytes, on every level.
    #[test]
    fn rows_come_back_exactly() {
        let mut rnd = xorshift(0x51ce_5eed_0000_0001);
        for k in [32, 96, 256] {
            let rows = 9;
            let rb = k / 32 * 34;
            let w = random_q8_0(rows, k, &mut rnd);
            let c = CoarseRows::pack(GgmlType::Q8_0, &w, rb, rows, k, None, &|_| {}).unwrap();
            assert_eq!((c.rows(), c.cols()), (rows, k));
            for isa in Isa::available() {
                let mut out = vec![0u8; rb];
                for r in 0..rows {
                    c.q8_0_row(isa, r, &mut out).unwrap();
                    assert_eq!(out, &w[r * rb..][..rb], "{isa} k {k} row {r}");
                }
                assert!(c.q8_0_row(isa, rows, &mut out).is_err());
            }
        }
        assert!(CoarseRows::pack(GgmlType::Q4_0, &[0; 18], 18, 1, 32, None, &|_| {}).is_none());
    }

    /// Every bound holds against the exact dot, the floor is below the
    /// best one, the SIMD forms agree with the portable one up to
    /// summation order and with each other bit for bit, and a row's bits
    /// do not depend on the rows screened with it.
    #[test]
    fn bounds_hold_on_every_level() {
        let mut rnd = xorshift(0xc0a5_5e00_0000_0002);
        for (k, rows) in [(32, 5), (96, 11), (640, 13), (288, 7)] {
            let rb = k / 32 * 34;
            let w = random_q8_0(rows, k, &mut rnd);
            let mut deq = vec![0.0f32; rows * k];
            kiln_quant::dequantize(GgmlType::Q8_0, &w, &mut deq).unwrap();
            let c = CoarseRows::pack(GgmlType::Q8_0, &w, rb, rows, k, None, &|_| {}).unwrap();
            for scale in [1.0f32, 1e-3, 300.0, 1e-29] {
                let x: Vec<f32> = (0..k)
                    .map(|_| ((rnd() % 2001) as f32 * 1e-3 - 1.0) * scale)
                    .collect();
                let sx = ScreenX::new(&x).unwrap();
                let mut want = vec![0.0f32; rows];
                let want_m = screen_coarse(&sx, &c, 0, &mut want);
                let mut best = f64::NEG_INFINITY;
                for r in 0..rows {
                    let exact: f64 = deq[r * k..][..k]
                        .iter()
                        .zip(&x)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    best = best.max(exact);
                    assert!(f64::from(want[r]) >= exact, "k {k} r {r}");
                }
                assert!(f64::from(want_m) <= best, "k {k}");
                // The first SIMD level's bits, which every other one gives.
                let mut simd: Option<(Isa, Vec<f32>, f32)> = None;
                for isa in Isa::available() {
                    let mut hi = vec![0.0f32; rows];
                    let m = screen_coarse_rows(isa, &c, 0, &sx, &mut hi).unwrap();
                    if has_simd(isa, k / 32, &sx) {
                        let (first, h0, m0) = simd.get_or_insert_with(|| (isa, hi.clone(), m));
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&hi), bits(h0), "{isa} vs {first}, k {k}");
                        assert_eq!(m.to_bits(), m0.to_bits(), "{isa} vs {first}, k {k}");
                    }
                    let near = |a: f32, b: f32| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
                    assert!(near(m, want_m), "{isa} k {k}: {m} vs {want_m}");
                    for (r, (&h, &e)) in hi.iter().zip(&want).enumerate() {
                        assert!(near(h, e), "{isa} k {k} r {r}: {h} vs {e}");
                        let mut one = [0.0f32];
                        screen_coarse_rows(isa, &c, r, &sx, &mut one).unwrap();
                        assert_eq!(one[0].to_bits(), h.to_bits(), "{isa} k {k} r {r}");
                    }
                }
            }
            let sx = ScreenX::new(&vec![0.5; k]).unwrap();
            let mut hi = vec![0.0f32; 2];
            assert!(screen_coarse_rows(Isa::Scalar, &c, rows - 1, &sx, &mut hi).is_err());
        }
    }
}
