//! The CUDA backend's fused ops (one kernel each) against the CPU
//! backend's `Backend` defaults, which compose the same ops from the
//! unfused ones: add + sandwich norms, the split of a fused q/k/v
//! projection with per-head norms and RoPE, the GELU gate of a fused
//! gate/up projection, and matmuls over concatenated weights. Outputs
//! start as NaN. Needs a GPU, else one skip line.

mod common;

use std::sync::Arc;

use common::*;
use kiln_gguf::write::GgufWriter;
use kiln_gguf::Gguf;
use kiln_model::{Backend, HeadsPart, RopeConfig, StepInput};
use kiln_quant::GgmlType;

/// `add_rms_norm` of `n` rows into rows `row0..` of a residual of
/// `row0 + n + 1` rows (the last one must stay as it was): `[y, x]`.
fn add_rms_norm<B: Backend>(
    b: &B,
    data: &[Vec<f32>; 4],
    row0: usize,
    n: usize,
    d: usize,
    with_pre: bool,
) -> [Vec<f32>; 2] {
    let [y, x, post, pre] = data;
    let (mut yb, mut xb) = (b.upload(y).unwrap(), b.upload(x).unwrap());
    let (post, pre) = (b.upload(post).unwrap(), b.upload(pre).unwrap());
    let pre = with_pre.then_some(&pre);
    b.add_rms_norm(&mut yb, &post, &mut xb, row0, n, d, pre, 1e-6)
        .unwrap();
    [read(b, &yb), read(b, &xb)]
}

#[test]
fn add_rms_norm_matches_cpu() {
    let Some(c) = backend() else { return };
    let mut r = Rng(11);
    // Model widths (float4 rows, one or two passes of a 1024-thread
    // block) and an odd one (scalar loads).
    for (n, d, row0) in [(1, 640, 0), (3, 1152, 2), (2, 5376, 1), (4, 37, 3)] {
        let data = [
            r.floats(n * d, 40.0),
            // Residual-like magnitudes, where f64 sums matter.
            r.floats((row0 + n + 1) * d, 3000.0),
            r.floats(d, 2.0),
            r.floats(d, 2.0),
        ];
        for with_pre in [true, false] {
            let got = add_rms_norm(&c, &data, row0, n, d, with_pre);
            let want = add_rms_norm(&cpu(), &data, row0, n, d, with_pre);
            let what = format!("add_rms_norm {n}x{d} at row {row0} pre {with_pre}");
            assert_close(&format!("{what}: y"), &got[0], &want[0], 1e-6);
            assert_close(&format!("{what}: x"), &got[1], &want[1], 1e-6);
            let untouched = |v: &[f32]| v[..row0 * d] == data[1][..row0 * d];
            assert!(untouched(&got[1]), "{what}: rows before row0 changed");
            assert_eq!(got[1][(row0 + n) * d..], data[1][(row0 + n) * d..]);
        }
    }
}

/// A projection split: `src [n_tok, (q + k + v heads) * hd]` into q and k
/// (normed when `norms`, roped) and v, each `[n_tok, heads * hd]` plus a
/// NaN tail. The step: 3 rows at position 5, then `n_tok - 3` at `p0`.
#[allow(clippy::too_many_arguments)]
fn split<B: Backend>(
    b: &B,
    src: &[f32],
    heads: [usize; 3],
    hd: usize,
    n_tok: usize,
    p0: usize,
    norms: Option<&[Vec<f32>; 2]>,
    rope: &RopeConfig,
) -> Vec<Vec<f32>> {
    let mut input = StepInput::default();
    input.push_seq(&[1, 2, 3], 5);
    input.push_seq(&vec![7; n_tok - 3], p0);
    let mut step = b.new_step(n_tok).unwrap();
    b.load_step(&input, &mut step).unwrap();
    let srcb = b.upload(src).unwrap();
    let mut dst = heads.map(|h| b.upload(&vec![f32::NAN; n_tok * h * hd + 7]).unwrap());
    let nb = norms.map(|[q, k]| [b.upload(q).unwrap(), b.upload(k).unwrap()]);
    let [dq, dk, dv] = &mut dst;
    let mut parts = [
        HeadsPart {
            dst: dq,
            heads: heads[0],
            norm: nb.as_ref().map(|n| &n[0]),
            rope: true,
        },
        HeadsPart {
            dst: dk,
            heads: heads[1],
            norm: nb.as_ref().map(|n| &n[1]),
            rope: true,
        },
        HeadsPart {
            dst: dv,
            heads: heads[2],
            norm: None,
            rope: false,
        },
    ];
    b.split_heads(&srcb, n_tok, hd, &mut parts, rope, 1e-6, &step)
        .unwrap();
    dst.iter().map(|d| read(b, d)).collect()
}

#[test]
fn split_heads_matches_cpu() {
    let Some(c) = backend() else { return };
    let mut r = Rng(12);
    let rope = |base: f32, n_rot: usize| RopeConfig {
        base,
        freq_scale: 1.0,
        n_rot,
        freq_factors: None,
    };
    // (heads q/k/v, head dim, rope, per-head norms): Gemma 3 270M and 1B
    // shapes, Gemma 2 (no norms), a partial rotation, and a group of 4.
    let cases = [
        ([4, 1, 1], 256, rope(1e6, 256), true),
        ([8, 4, 4], 256, rope(1e4, 256), false),
        ([2, 1, 1], 512, rope(1e6, 128), true),
        ([4, 1, 1], 64, rope(1e4, 64), true),
    ];
    for (heads, hd, cfg, with_norms) in cases {
        for (n_tok, p0) in [(4, 0), (4, 131_000), (12, 700)] {
            let width: usize = heads.iter().sum::<usize>() * hd;
            let src = r.floats(n_tok * width, 3.0);
            let norms = [r.floats(hd, 2.0), r.floats(hd, 2.0)];
            let norms = with_norms.then_some(&norms);
            let got = split(&c, &src, heads, hd, n_tok, p0, norms, &cfg);
            let want = split(&cpu(), &src, heads, hd, n_tok, p0, norms, &cfg);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!(
                    "split_heads {heads:?} hd {hd} n_rot {} part {i} p0 {p0}",
                    cfg.n_rot
                );
                let end = n_tok * heads[i] * hd;
                assert!(
                    g[end..].iter().all(|v| v.is_nan()),
                    "{what}: wrote past its rows"
                );
                assert_close(&what, &g[..end], &w[..end], 2e-6);
            }
        }
    }
}

fn gelu_mul_halves<B: Backend>(b: &B, gu: &[f32], n_tok: usize, ff: usize) -> Vec<f32> {
    let gub = b.upload(gu).unwrap();
    let mut out = b.upload(&vec![f32::NAN; n_tok * ff + 5]).unwrap();
    b.gelu_mul_halves(&gub, n_tok, ff, &mut out).unwrap();
    read(b, &out)
}

#[test]
fn gelu_mul_halves_matches_cpu() {
    let Some(c) = backend() else { return };
    let mut r = Rng(13);
    for (n_tok, ff) in [(1, 2048), (3, 6912), (5, 33)] {
        let gu = r.floats(n_tok * 2 * ff, 6.0);
        let got = gelu_mul_halves(&c, &gu, n_tok, ff);
        let want = gelu_mul_halves(&cpu(), &gu, n_tok, ff);
        let n = n_tok * ff;
        assert!(got[n..].iter().all(|v| v.is_nan()), "wrote past n_tok * ff");
        // As gelu_mul in ops.rs: two faithful tanh differ by ~2e-6 here.
        assert_close(
            &format!("gelu_mul_halves {n_tok}x{ff}"),
            &got[..n],
            &want[..n],
            1e-5,
        );
    }
}

/// Weights `q` (Q4_K, 5 rows), `k` (Q4_K, 3 rows) and `v` (Q6_K, 3
/// rows) of 768 columns, through a GGUF.
fn weights(r: &mut Rng) -> Arc<Gguf> {
    let cols = 768;
    let mut w = GgufWriter::new();
    for (name, ty, rows) in [
        ("q", GgmlType::Q4K, 5),
        ("k", GgmlType::Q4K, 3),
        ("v", GgmlType::Q6K, 3),
    ] {
        let values = r.floats(rows * cols, 1.0);
        let mut bytes = vec![0u8; rows * cols / ty.block_elems() * ty.block_bytes()];
        kiln_quant::quantize(ty, &values, &mut bytes).expect("whole blocks");
        w.tensor(name, &[cols as u64, rows as u64], ty, bytes)
            .expect("valid tensor");
    }
    Arc::new(Gguf::from_bytes(w.to_bytes().expect("writes")).expect("parses"))
}

#[test]
fn concatenated_weights_multiply_as_their_parts() {
    let Some(c) = backend() else { return };
    let mut r = Rng(14);
    let g = weights(&mut r);
    let [q, k, v] = ["q", "k", "v"].map(|n| c.load_weight(&g, n).unwrap());
    assert!(c.concat_rows(&[&q, &v]).unwrap().is_none(), "Q4_K + Q6_K");
    assert!(c.concat_rows(&[&q]).unwrap().is_none(), "one part");
    let qk = c
        .concat_rows(&[&q, &k])
        .unwrap()
        .expect("same type and width");
    assert_eq!(c.weight_shape(&qk), (768, 8));
    // A GEMV, the skinny multi-token path and the SGEMM prefill.
    for n_tok in [1, 8, 40] {
        let x = dev(&c, &r.floats(n_tok * 768, 1.0));
        let mut whole = poisoned(&c, n_tok * 8);
        c.matmul(&qk, 0, 8, &x, n_tok, &mut whole).unwrap();
        let whole = host(&c, &whole);
        for (w, row0, rows) in [(&q, 0, 5), (&k, 5, 3)] {
            let mut part = poisoned(&c, n_tok * rows);
            c.matmul(w, 0, rows, &x, n_tok, &mut part).unwrap();
            let part = host(&c, &part);
            let from_whole: Vec<f32> = (0..n_tok)
                .flat_map(|t| whole[t * 8 + row0..t * 8 + row0 + rows].to_vec())
                .collect();
            assert_close(
                &format!("[q;k] rows {row0}.. of {n_tok} tokens"),
                &from_whole,
                &part,
                1e-6,
            );
        }
    }
}
