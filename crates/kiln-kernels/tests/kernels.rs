//! Every kernel on every ISA this CPU runs, against the scalar reference:
//! `kiln_quant::dequantize` then an f64 dot. Tolerance is relative to
//! `sum |w_i x_i|`, the scale of the rounding error of any f32 summation.

use kiln_kernels::{
    argmax_rows, gemm, gemm_shared, gemm_uses_amx, gemv, gemv_q, gemv_q_tiles, has_gemv_q, Isa,
    KernelError, QTiles, QuantX,
};
use kiln_quant::GgmlType;

const TOL: f64 = 1e-5;

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Every type `kiln_quant` dequantizes.
fn types() -> Vec<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .filter(|&t| kiln_quant::is_supported(t))
        .collect()
}

fn ks(ty: GgmlType) -> impl Iterator<Item = usize> {
    [32, 256, 640, 2048]
        .into_iter()
        .filter(move |k| k % ty.block_elems() == 0)
}

/// `rows` packed rows of `k` elements with `pad` spare bytes after each.
fn random_rows(rng: &mut Rng, ty: GgmlType, rows: usize, k: usize, pad: usize) -> Vec<u8> {
    let packed = k / ty.block_elems() * ty.block_bytes();
    let mut w = vec![0u8; rows * (packed + pad)];
    for row in w.chunks_mut(packed + pad) {
        let row = &mut row[..packed];
        if kiln_quant::can_quantize(ty) {
            // Rows of different magnitude, values of either sign.
            let scale = 0.1 + 2.0 * rng.f().abs();
            let v: Vec<f32> = (0..k).map(|_| scale * rng.f()).collect();
            kiln_quant::quantize(ty, &v, row).unwrap();
        } else {
            // No quantizer: random bytes with a sane f16 super-scale.
            row.iter_mut().for_each(|b| *b = rng.next() as u8);
            let d_at = match ty {
                GgmlType::Q3K => 108,
                GgmlType::IQ4NL | GgmlType::IQ4XS => 0,
                other => panic!("no scale layout for {other}"),
            };
            for blk in row.chunks_mut(ty.block_bytes()) {
                let d = half::f16::from_f32(0.001 + 0.01 * rng.f().abs());
                blk[d_at..d_at + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
    }
    w
}

fn random_x(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| 3.0 * rng.f()).collect()
}

/// Reference dot and `sum |terms|` of one packed row.
fn reference(ty: GgmlType, row: &[u8], x: &[f32]) -> (f64, f64) {
    let mut w = vec![0.0f32; x.len()];
    kiln_quant::dequantize(ty, row, &mut w).unwrap();
    let terms = w.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b));
    terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()))
}

fn assert_close(got: f32, want: (f64, f64), what: &str) {
    assert_within(TOL, got, want, what);
}

fn assert_within(tol: f64, got: f32, (want, mag): (f64, f64), what: &str) {
    let err = (f64::from(got) - want).abs();
    assert!(
        err <= tol * mag + 1e-30,
        "{what}: got {got}, want {want}, err {err:e}, sum|terms| {mag:e}"
    );
}

#[test]
fn gemv_matches_reference_on_every_isa() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for isa in Isa::available() {
        for ty in types() {
            for k in ks(ty) {
                for (rows, pad) in [(1, 0), (3, 0), (13, 0), (5, 7)] {
                    let packed = k / ty.block_elems() * ty.block_bytes();
                    let rb = packed + pad;
                    let w = random_rows(&mut rng, ty, rows, k, pad);
                    let x = random_x(&mut rng, k);
                    let mut y = vec![f32::NAN; rows];
                    gemv(isa, ty, &w, rb, k, &x, &mut y).unwrap();
                    for (r, &got) in y.iter().enumerate() {
                        let want = reference(ty, &w[r * rb..][..packed], &x);
                        assert_close(got, want, &format!("{isa} {ty} k={k} row {r}/{rows}"));
                    }
                }
            }
        }
    }
}

/// The integer GEMV (activations as three int8 planes) holds the f32
/// kernels' tolerance, on every level and type it covers, for odd group
/// counts (the VNNI kernel pairs groups) and padded rows.
#[test]
fn gemv_q_matches_reference_on_every_isa() {
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    let mut qx = QuantX::new();
    let mut covered = 0;
    for isa in Isa::available() {
        for ty in types().into_iter().filter(|&t| has_gemv_q(isa, t)) {
            for k in [32, 96, 256, 640, 768, 2048] {
                if k % ty.block_elems() != 0 {
                    continue;
                }
                for (rows, pad) in [(1, 0), (3, 0), (13, 0), (5, 7)] {
                    let packed = k / ty.block_elems() * ty.block_bytes();
                    let rb = packed + pad;
                    let w = random_rows(&mut rng, ty, rows, k, pad);
                    let x = random_x(&mut rng, k);
                    assert!(qx.set(&x));
                    let mut y = vec![f32::NAN; rows];
                    assert!(gemv_q(isa, ty, &w, rb, &qx, &mut y).unwrap());
                    for (r, &got) in y.iter().enumerate() {
                        let want = reference(ty, &w[r * rb..][..packed], &x);
                        assert_close(got, want, &format!("q {isa} {ty} k={k} row {r}/{rows}"));
                    }
                    covered += 1;
                }
            }
        }
    }
    if Isa::cpu_max() >= Isa::Avx2 {
        assert!(covered > 0);
    }
    // Refusals: rows shorter than x, scalar level.
    let w = random_rows(&mut rng, GgmlType::Q8_0, 1, 64, 0);
    assert!(qx.set(&random_x(&mut rng, 128)));
    assert!(gemv_q(Isa::Avx2, GgmlType::Q8_0, &w, 68, &qx, &mut [0.0]).is_err());
    assert!(qx.set(&random_x(&mut rng, 64)));
    assert!(!gemv_q(Isa::Scalar, GgmlType::Q8_0, &w, 68, &qx, &mut [0.0]).unwrap());
}

/// The tiled integer GEMV holds the f32 kernels' tolerance against the
/// reference for every activation count (groups of 8 and a remainder),
/// tile range and output stride, writes nothing past its rows, and packs
/// only where it runs (Q5_0, Q4_K and Q6_K, AVX-512 VNNI); the rows past the
/// last whole tile are not held.
#[test]
fn gemv_q_tiles_match_reference() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let cases = [
        (GgmlType::Q5_0, 37, 640),
        (GgmlType::Q5_0, 48, 32),
        (GgmlType::Q5_0, 16, 2048),
        (GgmlType::Q4K, 37, 1024),
        (GgmlType::Q4K, 48, 256),
        (GgmlType::Q6K, 37, 1024),
        (GgmlType::Q6K, 16, 256),
    ];
    for isa in Isa::available() {
        for (ty, rows, k) in cases {
            let packed = k / ty.block_elems() * ty.block_bytes();
            let w = random_rows(&mut rng, ty, rows, k, 0);
            let Some(tiles) = QTiles::pack(isa, ty, &w, packed, rows, k, None) else {
                assert!(isa < Isa::Avx512Vnni, "{isa} packs no {ty} tiles");
                continue;
            };
            assert_eq!(tiles.rows(), rows / 16 * 16);
            assert!(QTiles::pack(isa, GgmlType::Q8_0, &w, packed, rows, k, None).is_none());
            for n in [1, 3, 8, 11] {
                let xs: Vec<Vec<f32>> = (0..n).map(|_| random_x(&mut rng, k)).collect();
                let qxs: Vec<QuantX> = xs
                    .iter()
                    .map(|x| {
                        let mut q = QuantX::new();
                        assert!(q.set(x));
                        q
                    })
                    .collect();
                let (r0, nr) = if tiles.rows() > 16 {
                    (16, 16)
                } else {
                    (0, tiles.rows())
                };
                let ldy = nr + 3;
                let mut y = vec![f32::NAN; n * ldy];
                gemv_q_tiles(isa, &tiles, r0, nr, &qxs, &mut y, ldy).unwrap();
                for (t, x) in xs.iter().enumerate() {
                    for i in 0..nr {
                        let want = reference(ty, &w[(r0 + i) * packed..][..packed], x);
                        let what = format!("tiles {isa} {ty} k={k} n={n} token {t} row {}", r0 + i);
                        assert_close(y[t * ldy + i], want, &what);
                    }
                    assert!(y[t * ldy + nr..][..3].iter().all(|v| v.is_nan()));
                }
                // Off a tile, past the tiles, a short stride: refused.
                let bad = [(8, 16, ldy), (tiles.rows(), 16, ldy), (0, 16, 15)];
                for (r0, nr, ldy) in bad {
                    let r = gemv_q_tiles(isa, &tiles, r0, nr, &qxs, &mut y, ldy);
                    assert!(r.is_err(), "{isa} rows {r0}..+{nr} ldy {ldy}");
                }
            }
        }
    }
}

/// Runs `gemm` on random rows and activations of shape `(n, rows, k)` into
/// a NaN-filled output with `ldy = rows + 2`, checks every value against
/// the reference within `tol` and that the columns past `rows` (someone
/// else's) are untouched; returns the weights, activations and output.
fn checked_gemm(
    rng: &mut Rng,
    isa: Isa,
    ty: GgmlType,
    (n, rows, k): (usize, usize, usize),
    tol: f64,
) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let ldy = rows + 2;
    let packed = k / ty.block_elems() * ty.block_bytes();
    let w = random_rows(rng, ty, rows, k, 0);
    let x = random_x(rng, n * k);
    let mut y = vec![f32::NAN; n * ldy];
    gemm(isa, ty, &w, packed, k, &x, n, &mut y, ldy).unwrap();
    for t in 0..n {
        for r in 0..rows {
            let want = reference(ty, &w[r * packed..][..packed], &x[t * k..][..k]);
            let what = format!("{isa} {ty} k={k} n={n} token {t} row {r}");
            assert_within(tol, y[t * ldy + r], want, &what);
        }
        assert!(
            y[t * ldy + rows..][..2].iter().all(|v| v.is_nan()),
            "{isa} {ty}: wrote past the rows"
        );
    }
    (w, x, y)
}

#[test]
fn gemm_matches_reference_on_every_isa() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for isa in Isa::available() {
        for ty in types() {
            for k in ks(ty) {
                for n in 1..=9 {
                    // Odd row counts leave a partial row tile; k = 2048
                    // spans two column tiles.
                    let rows = [1, 5, 11][n % 3];
                    checked_gemm(&mut rng, isa, ty, (n, rows, k), TOL);
                }
            }
        }
    }
}

/// Prefill-sized batches: the AMX path (48+ tokens) pads tokens to tiles
/// of 16 and rows to groups of 32, and splits `k` into chunks of 256.
#[test]
fn gemm_batches_match_reference_on_every_isa() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for isa in Isa::available().filter(|&i| i != Isa::Scalar) {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::Q3K,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::F32,
        ] {
            for (n, rows, k) in [
                (16, 32, 256),
                (17, 45, 512),
                (48, 1, 768),
                (50, 70, 2048),
                (64, 33, 40),
                // Two AMX passes: 512 tokens, then 8.
                (520, 33, 64),
            ] {
                if k % ty.block_elems() != 0 {
                    continue;
                }
                // As tight as f32 summation: the AMX path's bf16 parts
                // must not lose precision.
                let (w, x, y) = checked_gemm(&mut rng, isa, ty, (n, rows, k), 2e-6);
                let (ldy, packed) = (rows + 2, k / ty.block_elems() * ty.block_bytes());
                // The same output filled by two calls on disjoint row
                // ranges through `gemm_shared` (as threads do).
                let mut z = vec![f32::NAN; n * ldy];
                let split = (rows / 2).next_multiple_of(32).min(rows);
                let mut shared = 0;
                for (r0, nr) in [(0, split), (split, rows - split)] {
                    let wr = &w[r0 * packed..(r0 + nr) * packed];
                    // SAFETY: `z` holds `n * ldy` values; each call writes
                    // only its rows' columns, one call at a time.
                    let took = unsafe {
                        gemm_shared(isa, ty, wr, packed, k, &x, n, z.as_mut_ptr().add(r0), ldy)
                    }
                    .unwrap();
                    shared += usize::from(took && nr > 0);
                    if !took {
                        gemm(isa, ty, wr, packed, k, &x, n, &mut z[r0..], ldy).unwrap();
                    }
                }
                let amx = gemm_uses_amx(isa, n);
                assert_eq!(
                    shared > 0,
                    amx,
                    "{isa} {ty} n={n}: gemm_shared vs gemm_uses_amx"
                );
                for t in 0..n {
                    for r in 0..rows {
                        let what = format!("{isa} {ty} n={n} token {t} row {r}");
                        assert_eq!(z[t * ldy + r], y[t * ldy + r], "{what}");
                    }
                    assert!(
                        z[t * ldy + rows].is_nan(),
                        "{isa} {ty}: wrote past the rows"
                    );
                }
            }
        }
    }
}

/// One-hot operands make every product a copy: `Y[t][r]` must be the
/// dequantized weight (one-hot activations) or the activation (one-hot
/// F32 weight rows) bit for bit, on every path, at prefill batch sizes.
/// This is what holds the AMX path's bf16 parts to the whole f32 value.
#[test]
fn gemm_copies_one_hot_operands_exactly() {
    let mut rng = Rng(0x0bad_5eed);
    let (rows, k, n) = (40, 256, 64);
    for isa in Isa::available() {
        for ty in types() {
            let packed = k / ty.block_elems() * ty.block_bytes();
            let w = random_rows(&mut rng, ty, rows, k, 0);
            let mut deq = vec![0.0f32; rows * k];
            for (row, out) in w.chunks(packed).zip(deq.chunks_mut(k)) {
                kiln_quant::dequantize(ty, row, out).unwrap();
            }
            let col = |t: usize| (t * 37 + 5) % k;
            let mut x = vec![0.0f32; n * k];
            for t in 0..n {
                x[t * k + col(t)] = 1.0;
            }
            let mut y = vec![f32::NAN; n * rows];
            gemm(isa, ty, &w, packed, k, &x, n, &mut y, rows).unwrap();
            for t in 0..n {
                for r in 0..rows {
                    let (got, want) = (y[t * rows + r], deq[r * k + col(t)]);
                    // `==`: a sum of zeros may turn -0 into +0.
                    assert!(got == want, "{isa} {ty} token {t} row {r}: {got} vs {want}");
                }
            }
        }
        // One-hot F32 weight rows pick activations.
        let mut w = vec![0.0f32; rows * k];
        for r in 0..rows {
            w[r * k + (r * 11 + 3) % k] = 1.0;
        }
        let w: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let x = random_x(&mut rng, n * k);
        let mut y = vec![f32::NAN; n * rows];
        gemm(isa, GgmlType::F32, &w, 4 * k, k, &x, n, &mut y, rows).unwrap();
        for t in 0..n {
            for r in 0..rows {
                let (got, want) = (y[t * rows + r], x[t * k + (r * 11 + 3) % k]);
                assert!(got == want, "{isa} F32 token {t} row {r}: {got} vs {want}");
            }
        }
    }
}

#[test]
fn argmax_picks_the_largest_dot_and_the_lowest_tied_index() {
    let mut rng = Rng(7);
    for isa in Isa::available() {
        for ty in [GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q3K, GgmlType::F16] {
            let k = 256;
            let rows = 150; // several scan chunks
            let packed = k / ty.block_elems() * ty.block_bytes();
            let mut w = random_rows(&mut rng, ty, rows, k, 0);
            // Rows 90 and 120 are copies of the row with the largest dot.
            let x = random_x(&mut rng, k);
            let dots: Vec<f64> = (0..rows)
                .map(|r| reference(ty, &w[r * packed..][..packed], &x).0)
                .collect();
            let best = (0..rows)
                .max_by(|&a, &b| dots[a].total_cmp(&dots[b]))
                .unwrap();
            let src = w[best * packed..][..packed].to_vec();
            for r in [90, 120] {
                w[r * packed..][..packed].copy_from_slice(&src);
            }
            let first = best.min(90);
            let (id, v) = argmax_rows(isa, ty, &w, packed, k, &x, 1000).unwrap();
            assert_eq!(id, 1000 + first, "{isa} {ty}");
            let mut y = vec![0.0f32; 1];
            gemv(isa, ty, &src, packed, k, &x, &mut y).unwrap();
            assert_eq!(v, y[0], "{isa} {ty}: value is the kernel's own dot");
        }
    }
}

#[test]
fn argmax_ignores_nan_rows() {
    // F32 rows: row 0 holds a NaN, row 1 is the real maximum.
    let k = 32;
    let mut rows = vec![f32::NAN; k];
    rows.extend(std::iter::repeat_n(1.0f32, k));
    rows.extend(std::iter::repeat_n(-1.0f32, k));
    let w: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    let x = vec![1.0f32; k];
    for isa in Isa::available() {
        let got = argmax_rows(isa, GgmlType::F32, &w, 4 * k, k, &x, 0).unwrap();
        assert_eq!(got, (1, 32.0), "{isa}");
    }
}

#[test]
fn plain_types_with_odd_k_fall_back_correctly() {
    let mut rng = Rng(11);
    for isa in Isa::available() {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for k in [1, 7, 45] {
                let rows = 3;
                let packed = k * ty.block_bytes();
                let w = random_rows(&mut rng, ty, rows, k, 0);
                let x = random_x(&mut rng, 2 * k);
                let mut y = vec![0.0f32; 2 * rows];
                gemm(isa, ty, &w, packed, k, &x, 2, &mut y, rows).unwrap();
                let mut yv = vec![0.0f32; rows];
                gemv(isa, ty, &w, packed, k, &x[..k], &mut yv).unwrap();
                for r in 0..rows {
                    let row = &w[r * packed..][..packed];
                    assert_close(yv[r], reference(ty, row, &x[..k]), "gemv");
                    for t in 0..2 {
                        let want = reference(ty, row, &x[t * k..][..k]);
                        assert_close(y[t * rows + r], want, &format!("{isa} {ty} k={k}"));
                    }
                }
            }
        }
    }
}

#[test]
fn bad_shapes_are_refused() {
    let isa = Isa::detect();
    let x = vec![0.0f32; 64];
    let mut y = vec![0.0f32; 2];
    let w = vec![0u8; 2 * 68];
    assert_eq!(
        gemv(isa, GgmlType::IQ2XXS, &w, 66, 256, &x, &mut y),
        Err(KernelError::Unsupported(GgmlType::IQ2XXS))
    );
    assert!(matches!(
        gemv(isa, GgmlType::Q8_0, &w, 34, 48, &x[..48], &mut y),
        Err(KernelError::PartialBlock { .. })
    ));
    // Stride below the packed size, too few bytes, wrong x length.
    assert!(gemv(isa, GgmlType::Q8_0, &w, 60, 64, &x, &mut y).is_err());
    assert!(gemv(isa, GgmlType::Q8_0, &w[..135], 68, 64, &x, &mut y).is_err());
    assert!(gemv(isa, GgmlType::Q8_0, &w, 68, 64, &x[..32], &mut y).is_err());
    // ldy smaller than the row count; output too short.
    assert!(gemm(isa, GgmlType::Q8_0, &w, 68, 64, &x, 1, &mut y, 1).is_err());
    assert!(gemm(isa, GgmlType::Q8_0, &w, 68, 64, &x[..0], 0, &mut y, 2).is_ok());
    assert!(argmax_rows(isa, GgmlType::Q8_0, &[], 68, 64, &x, 0).is_err());
    assert!(gemv(isa, GgmlType::Q8_0, &w, 68, 64, &x, &mut y).is_ok());
}

#[test]
fn isa_names_round_trip_and_levels_are_clamped() {
    for isa in Isa::ALL {
        assert_eq!(Isa::from_name(isa.name()), Some(isa));
    }
    assert_eq!(Isa::from_name(" AVX2 "), Some(Isa::Avx2));
    assert_eq!(Isa::from_name("neon"), None);
    assert!(Isa::detect() <= Isa::cpu_max());
    assert_eq!(Isa::force(Isa::Scalar), Some(Isa::Scalar));
    assert_eq!(
        Isa::available().last(),
        Some(Isa::cpu_max()),
        "available() ends at the CPU's level"
    );
    for isa in Isa::ALL {
        assert_eq!(Isa::force(isa).is_some(), isa <= Isa::cpu_max());
    }
}

/// Strided-row attention kernels against f64 sums, every ISA, odd shapes
/// (row tails below one vector, several heads, padding between rows).
#[test]
fn dot_rows_and_axpy_rows_match_f64() {
    let mut rng = Rng(7);
    for isa in Isa::available() {
        for (g, d, n, pad) in [
            (1, 256, 37, 0),
            (4, 256, 5, 256),
            (3, 40, 9, 3),
            (2, 7, 1, 0),
        ] {
            let stride = d + pad;
            let q: Vec<f32> = (0..g * d).map(|_| rng.f()).collect();
            let m: Vec<f32> = (0..(n - 1) * stride + d).map(|_| rng.f()).collect();
            let mut out = vec![0.0f32; g * n];
            kiln_kernels::dot_rows(isa, &q, g, &m, stride, n, &mut out).unwrap();
            let mut acc0: Vec<f32> = (0..g * d).map(|_| rng.f()).collect();
            let mut acc = acc0.clone();
            kiln_kernels::axpy_rows(isa, &out, g, &m, stride, n, &mut acc).unwrap();
            for h in 0..g {
                for j in 0..n {
                    let row = &m[j * stride..][..d];
                    let (e, scale) = (0..d).fold((0.0f64, 0.0f64), |(e, s), i| {
                        let p = f64::from(q[h * d + i]) * f64::from(row[i]);
                        (e + p, s + p.abs())
                    });
                    let got = f64::from(out[h * n + j]);
                    assert!((got - e).abs() <= TOL * scale, "{isa} dot g{g} d{d} n{n}");
                }
                for i in 0..d {
                    let (e, scale) = (0..n).fold((f64::from(acc0[h * d + i]), 0.0), |(e, s), j| {
                        let p = f64::from(out[h * n + j]) * f64::from(m[j * stride + i]);
                        (e + p, s + p.abs())
                    });
                    let got = f64::from(acc[h * d + i]);
                    assert!(
                        (got - e).abs() <= TOL * (scale + e.abs()),
                        "{isa} axpy g{g} d{d} n{n}"
                    );
                }
            }
            acc0.clear();
        }
        // Shapes are checked before any work.
        let mut out = vec![0.0; 2];
        assert!(kiln_kernels::dot_rows(isa, &[0.0; 8], 3, &[0.0; 8], 8, 1, &mut out).is_err());
        assert!(kiln_kernels::dot_rows(isa, &[0.0; 8], 1, &[0.0; 8], 8, 2, &mut out).is_err());
    }
}

/// SIMD tanh (softcap, GELU) against f64 over a wide range, plus NaN and
/// infinities; lengths with a scalar tail.
#[test]
fn softcap_and_gelu_match_f64() {
    let mut xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 * 1e-3).collect();
    xs.extend([
        1e-30,
        -1e-7,
        3e-4,
        50.0,
        -1e4,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    let u: Vec<f32> = xs.iter().map(|&x| 1.0 - 0.3 * x.sin()).collect();
    for isa in Isa::available() {
        for c in [30.0f32, 50.0, 1.5] {
            let mut y = xs.clone();
            kiln_kernels::softcap(isa, &mut y, c);
            for (&x, &v) in xs.iter().zip(&y) {
                let e = f64::from(c) * (f64::from(x) / f64::from(c)).tanh();
                let err = (f64::from(v) - e).abs();
                assert!(
                    err <= 2e-6 * e.abs().max(1e-30),
                    "{isa} softcap {c} at {x}: {v} vs {e}"
                );
            }
        }
        let mut g = xs.clone();
        kiln_kernels::gelu_mul(isa, &mut g, &u);
        for ((&x, &b), &v) in xs.iter().zip(&u).zip(&g) {
            let x64 = f64::from(x);
            if !x64.is_finite() {
                continue;
            }
            let inner = 0.797_884_560_802_865_4 * (x64 + 0.044_715 * x64 * x64 * x64);
            let e = 0.5 * x64 * (1.0 + inner.tanh()) * f64::from(b);
            // Absolute term: `1 + tanh` cancels for negative x, so a tanh
            // error of 4e-7 (a few ulp near -1) costs 0.5 |x u| 4e-7.
            let err = (f64::from(v) - e).abs();
            let bound = 2e-6 * e.abs() + 2e-7 * (x64 * f64::from(b)).abs();
            assert!(err <= bound, "{isa} gelu at {x}: {v} vs {e}");
        }
        let mut nan = vec![f32::NAN; 19];
        kiln_kernels::softcap(isa, &mut nan, 30.0);
        assert!(
            nan.iter().all(|v| v.is_nan()),
            "{isa}: NaN must survive softcap"
        );
        let mut nan = vec![f32::NAN; 19];
        kiln_kernels::gelu_mul(isa, &mut nan, &[1.0; 19]);
        assert!(
            nan.iter().all(|v| v.is_nan()),
            "{isa}: NaN must survive gelu"
        );
    }
}

/// The fused softmax step against f64, capped and not, with a running
/// max above and below the block's; NaN poisons the result.
#[test]
fn softmax_step_matches_f64() {
    let mut rng = Rng(11);
    for isa in Isa::available() {
        for (n, cap, m) in [
            (300, None, f32::NEG_INFINITY),
            (37, Some(50.0), 3.0),
            (5, None, 20.0),
        ] {
            let raw: Vec<f32> = (0..n).map(|_| 40.0 * rng.f()).collect();
            let mut x = raw.clone();
            let (mx, sum) = kiln_kernels::softmax_step(isa, &mut x, 0.125, cap, m);
            let z: Vec<f64> = raw
                .iter()
                .map(|&v| {
                    let v = f64::from(v) * 0.125;
                    cap.map_or(v, |c: f32| f64::from(c) * (v / f64::from(c)).tanh())
                })
                .collect();
            let want_mx = z.iter().copied().fold(f64::from(m), f64::max);
            assert!(
                (f64::from(mx) - want_mx).abs() <= 1e-5 * want_mx.abs().max(1.0),
                "{isa} max"
            );
            let mut want_sum = 0.0;
            for (&got, &zi) in x.iter().zip(&z) {
                let e = (zi - want_mx).exp();
                want_sum += e;
                assert!(
                    (f64::from(got) - e).abs() <= 1e-5 * e + 1e-30,
                    "{isa} exp {got} vs {e}"
                );
            }
            assert!(
                (f64::from(sum) - want_sum).abs() <= 1e-5 * want_sum,
                "{isa} sum"
            );
        }
        let mut x = vec![1.0f32; 40];
        x[33] = f32::NAN;
        let (mx, _) = kiln_kernels::softmax_step(isa, &mut x, 1.0, None, 0.0);
        assert!(mx.is_nan(), "{isa}: NaN must reach the max");
    }
}
