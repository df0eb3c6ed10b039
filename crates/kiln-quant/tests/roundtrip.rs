//! quantize -> dequantize error bounds, for every type with a quantizer.
//! This is what holds the K-quant quantizers, which gguf-py cannot check.

use kiln_quant::{can_quantize, dequantize, quantize, vec_dot_f32, GgmlType};

/// Deterministic standard-normal samples (xorshift64* + Box-Muller), so the
/// bounds below are checked on the same data every run.
fn gaussian(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    let mut uniform = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        ((s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect()
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut packed = vec![0u8; x.len() / ty.block_elems() * ty.block_bytes()];
    quantize(ty, x, &mut packed).unwrap();
    let mut y = vec![0.0f32; x.len()];
    dequantize(ty, &packed, &mut y).unwrap();
    y
}

/// sqrt(sum (x - y)^2 / sum x^2).
fn relative_rmse(x: &[f32], y: &[f32]) -> f64 {
    let err: f64 = x
        .iter()
        .zip(y)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let norm: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
    (err / norm).sqrt()
}

/// Bounds on relative RMSE for Gaussian weights. Each format's error is
/// about step / sqrt(12) over the RMS, the step set by the block's range and
/// bit width: Q8_0 ~ 2.2 / 127 / sqrt(12) = 0.005, Q5_0 ~ 2.2 / 16 /
/// sqrt(12) = 0.040, Q4_0 ~ 0.079. The reference quantizers measure within
/// ~10% of those figures here (Q8_0 0.0054, Q8_K 0.0069, Q6_K 0.0178, Q5_0
/// 0.0428, Q5_1 0.0380, Q5_K 0.0363, Q4_0 0.0855, Q4_1 0.0795, Q4_K 0.0723,
/// Q2_K 0.296); bounds add ~15%, so a packing or rounding bug fails.
const BOUNDS: &[(GgmlType, f64)] = &[
    (GgmlType::F16, 2.5e-4),
    (GgmlType::BF16, 2.0e-3),
    (GgmlType::Q8_0, 6.2e-3),
    (GgmlType::Q8K, 8.0e-3),
    (GgmlType::Q6K, 2.05e-2),
    (GgmlType::Q5_0, 4.9e-2),
    (GgmlType::Q5_1, 4.4e-2),
    (GgmlType::Q5K, 4.2e-2),
    (GgmlType::Q4_0, 9.8e-2),
    (GgmlType::Q4_1, 9.1e-2),
    (GgmlType::Q4K, 8.3e-2),
    (GgmlType::Q2K, 3.4e-1),
];

#[test]
fn round_trip_error_is_within_format_bounds() {
    let x = gaussian(16 * 256, 42);
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for &(ty, bound) in BOUNDS {
        let e = relative_rmse(&x, &round_trip(ty, &x));
        report.push(format!("{ty}: {e:.5} (bound {bound})"));
        if e.is_nan() || e > bound {
            failures.push(format!("{ty}: relative RMSE {e:.5} > {bound}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\nall: {}",
        failures.join("\n"),
        report.join(", ")
    );
}

#[test]
fn every_quantizable_type_has_a_bound() {
    for ty in GgmlType::ALL {
        if can_quantize(ty) && ty != GgmlType::F32 {
            assert!(
                BOUNDS.iter().any(|(t, _)| *t == ty),
                "{ty} has no round-trip bound"
            );
        }
    }
}

#[test]
fn f32_round_trip_is_exact() {
    let x = gaussian(100, 7);
    assert_eq!(round_trip(GgmlType::F32, &x), x);
}

#[test]
fn round_trip_error_does_not_depend_on_magnitude() {
    // Scales live in f16: weights far from 1 must still quantize well, as
    // long as the block scale stays in f16's normal range.
    let base = gaussian(4 * 256, 9);
    for ty in [GgmlType::Q4K, GgmlType::Q5_0, GgmlType::Q6K, GgmlType::Q8_0] {
        for scale in [1e-3f32, 1e2] {
            let x: Vec<f32> = base.iter().map(|v| v * scale).collect();
            let e = relative_rmse(&x, &round_trip(ty, &x));
            let bound = BOUNDS.iter().find(|(t, _)| *t == ty).unwrap().1;
            assert!(e <= bound, "{ty} at scale {scale}: relative RMSE {e}");
        }
    }
}

#[test]
fn zero_blocks_stay_zero() {
    for &(ty, _) in BOUNDS {
        let x = vec![0.0f32; 256];
        let y = round_trip(ty, &x);
        assert!(y.iter().all(|&v| v == 0.0), "{ty}: {:?}", &y[..8]);
    }
}

#[test]
fn grid_values_survive_q8_0_exactly() {
    // Integers in blocks whose largest magnitude is 127 are Q8_0's own grid
    // (d = 1 exactly).
    let x: Vec<f32> = (0..64).map(|i| ((i % 32) * 8) as f32 - 127.0).collect();
    assert_eq!(round_trip(GgmlType::Q8_0, &x), x);
}

#[test]
fn q8_k_block_sums_match_its_quants() {
    let x = gaussian(512, 3);
    let mut packed = vec![0u8; 2 * 292];
    quantize(GgmlType::Q8K, &x, &mut packed).unwrap();
    for block in packed.chunks_exact(292) {
        let qs = &block[4..260];
        for (g, s) in block[260..].chunks_exact(2).enumerate() {
            let want: i32 = qs[16 * g..16 * (g + 1)]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            assert_eq!(i16::from_le_bytes([s[0], s[1]]) as i32, want);
        }
    }
}

#[test]
fn vec_dot_matches_a_f64_reference_on_model_sized_rows() {
    // Row lengths seen in Gemma: 640 (270M hidden, not a multiple of 256,
    // hence Q5_0 / Q8_0 there) up to 16384 (FFN).
    for (ty, n) in [
        (GgmlType::Q4K, 2048),
        (GgmlType::Q6K, 2048),
        (GgmlType::Q5_0, 640),
        (GgmlType::Q8_0, 640),
        (GgmlType::Q8_0, 16384),
        (GgmlType::F32, 1000),
    ] {
        let w = gaussian(n, n as u64);
        let x = gaussian(n, 1 + n as u64);
        let mut packed = vec![0u8; n / ty.block_elems() * ty.block_bytes()];
        quantize(ty, &w, &mut packed).unwrap();
        let mut wq = vec![0.0f32; n];
        dequantize(ty, &packed, &mut wq).unwrap();
        let want: f64 = wq.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        let scale: f64 = wq
            .iter()
            .zip(&x)
            .map(|(a, b)| (*a as f64 * *b as f64).abs())
            .sum();
        let got = vec_dot_f32(ty, &packed, &x).unwrap() as f64;
        // f32 accumulation over 256-element tiles: error ~ sqrt(256) ulp of
        // the tile's terms; 1e-6 of sum |terms| leaves a wide margin.
        assert!(
            (got - want).abs() <= 1e-6 * scale,
            "{ty} n={n}: {got} vs {want}"
        );
    }
}
