//! Every elementwise and attention op of the CUDA backend against the CPU
//! backend's (its twin) on random inputs. Each scenario is one generic
//! function run on both backends; outputs start as NaN, so whatever an op
//! fails to write shows up. Needs a GPU, else one skip line.

mod common;

use common::*;
use kiln_model::{AttnParams, Backend, PastKv, RopeConfig, StepInput};

/// add, scale, gelu_mul, softcap and copy_strided over the first `n` of
/// `x` (`y` the second operand); the tail past `n` is NaN and must stay so.
fn pointwise<B: Backend>(b: &B, x: &[f32], y: &[f32], n: usize) -> Vec<Vec<f32>> {
    let mut tailed = x[..n].to_vec();
    tailed.extend([f32::NAN; 5]);
    let yb = b.upload(y).unwrap();
    let mut outs = Vec::new();
    let mut run = |f: &dyn Fn(&mut B::Buf)| {
        let mut xb = b.upload(&tailed).unwrap();
        f(&mut xb);
        outs.push(read(b, &xb));
    };
    run(&|xb| b.add(xb, &yb, n).unwrap());
    run(&|xb| b.scale(xb, -0.37, n).unwrap());
    run(&|xb| b.gelu_mul(xb, &yb, n).unwrap());
    run(&|xb| b.softcap(xb, 3.5, n).unwrap());
    // Rows of 33 from a stride of 50 into a stride of 40, then accumulated
    // with a weight.
    let rows = n / 50;
    run(&|xb| {
        b.copy_strided(&yb, 7, 50, xb, 3, 40, rows, 33, 1.0, false)
            .unwrap()
    });
    run(&|xb| {
        b.copy_strided(&yb, 7, 50, xb, 3, 40, rows, 33, 0.25, false)
            .unwrap()
    });
    run(&|xb| {
        b.copy_strided(&yb, 0, 50, xb, 1, 40, rows, 33, -1.5, true)
            .unwrap()
    });
    outs
}

#[test]
fn pointwise_ops_match_cpu() {
    let Some(c) = backend() else { return };
    let mut r = Rng(1);
    let n = 10_007;
    let (x, y) = (r.floats(n, 6.0), r.floats(n, 6.0));
    let got = pointwise(&c, &x, &y, n);
    let want = pointwise(&cpu(), &x, &y, n);
    // The CPU's SIMD tanh is within ~1e-7 absolute, which 1 + tanh(z)
    // amplifies for z near -4: gelu_mul of |x|, |y| <= 6 differs by up to
    // ~2e-6 absolute between two faithful implementations.
    let ops = [
        ("add", 0.0),
        ("scale", 0.0),
        ("gelu_mul", 1e-5),
        ("softcap", 1e-6),
        ("copy", 0.0),
        ("copy*a", 0.0),
        // a + alpha * b fused (one rounding) on the GPU, two on the CPU.
        ("copy+=", 1e-6),
    ];
    for (((name, tol), g), w) in ops.iter().zip(&got).zip(&want) {
        assert!(g[n..].iter().all(|v| v.is_nan()), "{name} wrote past n");
        assert_close(name, &g[..n], &w[..n], *tol);
    }
}

fn rms_norm<B: Backend>(b: &B, x: &[f32], w: &[f32], groups: usize, dim: usize) -> [Vec<f32>; 2] {
    let wb = b.upload(w).unwrap();
    let mut a = b.upload(x).unwrap();
    b.rms_norm(&mut a, groups, dim, Some(&wb), 1e-6).unwrap();
    let mut c = b.upload(x).unwrap();
    b.rms_norm(&mut c, groups, dim, None, 1e-6).unwrap();
    [read(b, &a), read(b, &c)]
}

#[test]
fn rms_norm_matches_cpu() {
    let Some(c) = backend() else { return };
    let mut r = Rng(2);
    // Per-head groups (a warp each) and model-width rows (a block each).
    for (groups, dim) in [(37, 32), (12, 256), (5, 640), (3, 1152), (2, 5376)] {
        // Residual-like magnitudes, where f64 sums matter.
        let x = r.floats(groups * dim, 3000.0);
        let w = r.floats(dim, 2.0);
        let got = rms_norm(&c, &x, &w, groups, dim);
        let want = rms_norm(&cpu(), &x, &w, groups, dim);
        assert_close(
            &format!("rms_norm {groups}x{dim} w"),
            &got[0],
            &want[0],
            1e-6,
        );
        assert_close(&format!("rms_norm {groups}x{dim}"), &got[1], &want[1], 1e-6);
    }
}

/// A step of two sequences: 3 rows at position 5, then `n_tok` rows at `p0`.
fn two_seq_step(n_tok: usize, p0: usize) -> StepInput {
    let mut s = StepInput::default();
    s.push_seq(&[1, 2, 3], 5);
    s.push_seq(&vec![7; n_tok], p0);
    s
}

fn rope<B: Backend>(
    b: &B,
    x: &[f32],
    input: &StepInput,
    heads: usize,
    hd: usize,
    cfg: &RopeConfig,
) -> Vec<f32> {
    let mut step = b.new_step(input.rows()).unwrap();
    b.load_step(input, &mut step).unwrap();
    let mut xb = b.upload(x).unwrap();
    b.rope(&mut xb, input.rows(), heads, hd, &step, cfg)
        .unwrap();
    read(b, &xb)
}

#[test]
fn rope_matches_cpu() {
    let Some(c) = backend() else { return };
    let mut r = Rng(3);
    let plain = RopeConfig {
        base: 10_000.0,
        freq_scale: 1.0,
        n_rot: 64,
        freq_factors: None,
    };
    let scaled = RopeConfig {
        base: 1_000_000.0,
        freq_scale: 0.125,
        n_rot: 256,
        freq_factors: None,
    };
    // Gemma 4 global layers: partial rotation through frequency factors.
    let factored = RopeConfig {
        base: 1_000_000.0,
        freq_scale: 1.0,
        n_rot: 128,
        freq_factors: Some((0..64).map(|i| if i < 16 { 1.0 } else { 1e30 }).collect()),
    };
    for (cfg, hd) in [(&plain, 64), (&plain, 96), (&scaled, 256), (&factored, 128)] {
        // Far positions: angles of 1e5 radians.
        for p0 in [0, 1000, 131_000] {
            let input = two_seq_step(9, p0);
            let x = r.floats(input.rows() * 3 * hd, 2.0);
            let got = rope(&c, &x, &input, 3, hd, cfg);
            let want = rope(&cpu(), &x, &input, 3, hd, cfg);
            assert_close(
                &format!("rope n_rot {} hd {hd} p0 {p0}", cfg.n_rot),
                &got,
                &want,
                2e-6,
            );
        }
    }
}

/// One attention case: the second sequence of a two-sequence step (rows
/// 3..3 + n_tok) at `p0`, over a cache of `rows` rows (`ring`: sliding,
/// holding the last `rows` positions before p0).
#[derive(Clone, Copy, Debug)]
struct Case {
    hd: usize,
    n_head: usize,
    n_kv: usize,
    n_tok: usize,
    p0: usize,
    rows: usize,
    window: Option<usize>,
    softcap: Option<f32>,
}

fn attention<B: Backend>(b: &B, case: &Case, data: &[Vec<f32>; 5]) -> Vec<f32> {
    let input = two_seq_step(case.n_tok, case.p0);
    let mut step = b.new_step(input.rows()).unwrap();
    b.load_step(&input, &mut step).unwrap();
    let [q, k, v, pk, pv] = data;
    let (q, k, v) = (
        b.upload(q).unwrap(),
        b.upload(k).unwrap(),
        b.upload(v).unwrap(),
    );
    let (pk, pv) = (b.upload(pk).unwrap(), b.upload(pv).unwrap());
    let mut out = b
        .upload(&vec![f32::NAN; input.rows() * case.n_head * case.hd])
        .unwrap();
    let past = (case.p0 > 0).then(|| PastKv {
        k: &pk,
        v: &pv,
        start: case.p0.saturating_sub(case.rows),
        rows: case.rows,
    });
    let p = AttnParams {
        n_tok: case.n_tok,
        p0: case.p0,
        row0: 3,
        seq: 1,
        n_head: case.n_head,
        n_kv_head: case.n_kv,
        head_dim: case.hd,
        scale: 1.0 / (case.hd as f32).sqrt(),
        softcap: case.softcap,
        window: case.window,
    };
    b.attention(&q, &k, &v, past, &p, &step, &mut out).unwrap();
    // Only the sequence's rows.
    read(b, &out)[3 * case.n_head * case.hd..].to_vec()
}

#[test]
fn attention_matches_cpu() {
    let Some(c) = backend() else { return };
    let mut r = Rng(5);
    let mut cases = Vec::new();
    // Decode (split-K) and prefill, global and sliding, every head dim,
    // group sizes 1..16, Gemma 2's softcap.
    for (hd, n_head, n_kv) in [
        (32, 4, 2),
        (64, 8, 1),
        (128, 16, 1),
        (256, 4, 1),
        (256, 8, 4),
        (512, 8, 1),
    ] {
        for (n_tok, p0) in [
            (1, 0),
            (1, 1),
            (1, 37),
            (1, 1500),
            (9, 0),
            (37, 20),
            (40, 700),
        ] {
            let global = Case {
                hd,
                n_head,
                n_kv,
                n_tok,
                p0,
                rows: p0 + n_tok,
                window: None,
                softcap: None,
            };
            // A ring of 64 rows with a 64-key window, and a softcap.
            let sliding = Case {
                rows: 64.min(p0.max(1)),
                window: Some(64),
                softcap: Some(50.0),
                ..global
            };
            cases.extend([global, sliding]);
        }
    }
    for case in cases {
        let rows = 3 + case.n_tok;
        let (qd, kvd) = (case.n_head * case.hd, case.n_kv * case.hd);
        let data = [
            r.floats(rows * qd, 2.0),
            r.floats(rows * kvd, 2.0),
            r.floats(rows * kvd, 2.0),
            r.floats(case.rows.max(1) * kvd, 2.0),
            r.floats(case.rows.max(1) * kvd, 2.0),
        ];
        let got = attention(&c, &case, &data);
        let want = attention(&cpu(), &case, &data);
        assert_close(&format!("{case:?}"), &got, &want, 2e-5);
    }
}
