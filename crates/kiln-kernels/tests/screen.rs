//! The integer screen + exact re-score picks exactly what `argmax_rows`
//! picks, on every ISA, including near-ties and odd block counts.

use kiln_kernels::{argmax_rows_checked, gemv, screen_rows, Isa, ScreenX};
use kiln_quant::GgmlType;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

const RB: usize = 34;

fn q8_rows(rng: &mut Rng, rows: usize, k: usize) -> Vec<u8> {
    let mut w = Vec::with_capacity(rows * k / 32 * RB);
    for _ in 0..rows * k / 32 {
        let d = half::f16::from_f32(0.01 + 0.02 * rng.f().abs());
        w.extend_from_slice(&d.to_le_bytes());
        // Includes -128, which Q8_0 files may hold.
        w.extend((0..32).map(|_| (rng.next() >> 56) as u8));
    }
    w
}

/// Screen, then re-score the candidates as a caller does.
fn screened(isa: Isa, w: &[u8], k: usize, x: &[f32]) -> (usize, f32, usize) {
    let rb = k / 32 * RB;
    let rows = w.len() / rb;
    let sx = ScreenX::new(x).unwrap();
    let mut hi = vec![0.0; rows];
    let floor = screen_rows(isa, GgmlType::Q8_0, w, rb, &sx, &mut hi).unwrap();
    assert!(floor.is_finite());
    let mut best = (usize::MAX, f32::NEG_INFINITY);
    let mut n = 0;
    for r in (0..rows).filter(|&r| hi[r] >= floor) {
        n += 1;
        let mut y = [0.0];
        gemv(isa, GgmlType::Q8_0, &w[r * rb..][..rb], rb, k, x, &mut y).unwrap();
        if best.0 == usize::MAX || y[0] > best.1 {
            best = (r, y[0]);
        }
    }
    // Every bound holds against the exact dots.
    let mut y = vec![0.0; rows];
    gemv(isa, GgmlType::Q8_0, w, rb, k, x, &mut y).unwrap();
    for r in 0..rows {
        assert!(y[r] <= hi[r], "{isa} row {r}: {} > hi {}", y[r], hi[r]);
    }
    assert!(floor <= y.iter().cloned().fold(f32::NEG_INFINITY, f32::max));
    (best.0, best.1, n)
}

fn check(isa: Isa, w: &[u8], k: usize, x: &[f32]) -> usize {
    let rb = k / 32 * RB;
    let want = argmax_rows_checked(isa, GgmlType::Q8_0, w, rb, k, x, 0).unwrap();
    let (i, v, n) = screened(isa, w, k, x);
    assert_eq!((i, v), (want.index, want.value), "{isa} k {k}");
    n
}

#[test]
fn screened_argmax_equals_exact_on_random_rows() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for isa in Isa::available() {
        for k in [32, 64, 96, 640] {
            for case in 0..20 {
                let w = q8_rows(&mut rng, 300, k);
                let mut x: Vec<f32> = (0..k).map(|_| rng.f()).collect();
                if case % 4 == 1 {
                    x[case % k] = 40.0; // an outlier dimension
                }
                if case % 4 == 2 {
                    x.iter_mut().for_each(|v| *v *= 1e-3);
                }
                check(isa, &w, k, &x);
            }
        }
    }
}

#[test]
fn screened_argmax_resolves_near_ties_like_exact() {
    let mut rng = Rng(12345);
    for isa in Isa::available() {
        for k in [64, 640] {
            let rb = k / 32 * RB;
            let mut w = q8_rows(&mut rng, 200, k);
            let x: Vec<f32> = (0..k)
                .map(|i| if i == 5 { 1e-7 } else { rng.f() })
                .collect();
            // Make row 150 the clear winner, then copy it to rows 40 and
            // 170 (exact ties: the lowest id wins) and to row 10 with one
            // quant of element 5 changed (dot differs by ~1e-9).
            let mut y = vec![0.0; 200];
            gemv(isa, GgmlType::Q8_0, &w, rb, k, &x, &mut y).unwrap();
            let row: Vec<u8> = (0..rb)
                .map(|i| {
                    if i < 2 || i % RB < 2 {
                        w[150 * rb + i]
                    } else {
                        let xi = x[i / RB * 32 + i % RB - 2];
                        (if xi > 0.0 { 127i8 } else { -127 }) as u8
                    }
                })
                .collect();
            for r in [40, 150, 170, 10] {
                w[r * rb..(r + 1) * rb].copy_from_slice(&row);
            }
            w[10 * rb + 2 + 5] = w[10 * rb + 2 + 5].wrapping_sub(1);
            let n = check(isa, &w, k, &x);
            assert!(n >= 4, "{isa}: the tied rows are candidates");
        }
    }
}

#[test]
fn screen_declines_non_finite_inputs() {
    assert!(ScreenX::new(&[f32::NAN; 32]).is_none());
    assert!(ScreenX::new(&[0.0; 48]).is_none());
    let x = vec![1.0f32; 64];
    let sx = ScreenX::new(&x).unwrap();
    let mut w = vec![0u8; 2 * RB];
    w[..2].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
    for isa in Isa::available() {
        let mut hi = [0.0];
        let f = screen_rows(isa, GgmlType::Q8_0, &w, 2 * RB, &sx, &mut hi).unwrap();
        assert!(f.is_nan(), "{isa}");
    }
    assert!(screen_rows(Isa::Scalar, GgmlType::F32, &w, 256, &sx, &mut [0.0]).is_err());
}
