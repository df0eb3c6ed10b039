//! The packed-weight ops of the CUDA backend (matmul: GEMV, the tiled
//! batched-decode GEMM with and without its split along k, dequant +
//! SGEMM prefill, the tensor-core GEMM; embed; the greedy argmax head, one
//! and several rows) held to their CPU twin for every weight type: random
//! weights packed by kiln-quant, dequantized by kiln-quant, dotted in f64.
//!
//! By default the tensor-core GEMM takes every product of 8 or more rows
//! (all 13 types, every CTA shape, splits along k, prefill sizes); run the
//! binary again with `KILN_CUDA_MMA=0` for the f32 kernels (tiled GEMM,
//! SGEMM) that it replaces there. bench/gpu-check does.
//!
//! Needs a GPU; without one each test prints `skipped: no CUDA device
//! (...)` and passes. Outputs are poisoned with NaN before every run.

mod common;

use std::sync::Arc;

use common::{backend, dev, host, poisoned, Rng};

use kiln_cuda::{CudaBackend, CudaWeight};
use kiln_gguf::write::GgufWriter;
use kiln_gguf::Gguf;
use kiln_model::{Backend, ModelError, StepInput};
use kiln_quant::GgmlType;

/// Every type the CUDA kernels read.
const TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Error bound of a dot, relative to `Σ |w_i x_i|`: f32 accumulation of a
/// few thousand products in a different order than the f64 reference.
const REL: f64 = 1e-5;

/// A packed matrix, on the host and on the device.
struct Packed {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
    dev: CudaWeight,
}

impl Packed {
    fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_elems() * self.ty.block_bytes()
    }

    /// Row `r` dequantized by kiln-quant (the reference).
    fn row(&self, r: usize) -> Vec<f32> {
        let rb = self.row_bytes();
        let mut out = vec![0.0f32; self.cols];
        kiln_quant::dequantize(self.ty, &self.bytes[r * rb..(r + 1) * rb], &mut out)
            .expect("whole blocks");
        out
    }
}

/// Row length used for `ty`: whole blocks; more than a warp's 64 units
/// per pass for the K-quants (96), a partial pass for the rest, and an odd
/// number of 8-value units (21) for the plain types (the GEMV decodes
/// units in pairs).
fn cols_for(ty: GgmlType) -> usize {
    match ty.block_elems() {
        256 => 768,
        1 => 168,
        _ => 160,
    }
}

/// Packs `rows x cols` values of `ty`: kiln-quant's quantizer, or random
/// blocks with a small f16 scale for Q3_K (kiln-quant has no quantizer).
fn pack(ty: GgmlType, values: &[f32], rng: &mut Rng) -> Vec<u8> {
    let n_bytes = values.len() / ty.block_elems() * ty.block_bytes();
    if kiln_quant::can_quantize(ty) {
        let mut out = vec![0u8; n_bytes];
        kiln_quant::quantize(ty, values, &mut out).expect("whole blocks");
        return out;
    }
    assert_eq!(ty, GgmlType::Q3K, "only Q3_K lacks a quantizer");
    let mut out: Vec<u8> = (0..n_bytes).map(|_| rng.next() as u8).collect();
    for block in out.chunks_exact_mut(ty.block_bytes()) {
        let d = 0.002 + 0.01 * rng.float().abs();
        block[108..110].copy_from_slice(&kiln_quant::block::f32_to_f16(d));
    }
    out
}

/// Offset of a float that poisons a whole row's dots with NaN: the f16
/// scale `d` of the row's first block, or its first value for plain types.
fn nan_field(ty: GgmlType) -> (usize, Vec<u8>) {
    let f16_nan = vec![0x00, 0x7e];
    match ty {
        GgmlType::F32 => (0, f32::NAN.to_le_bytes().to_vec()),
        GgmlType::BF16 => (0, vec![0xc0, 0x7f]),
        GgmlType::Q2K => (80, f16_nan),
        GgmlType::Q3K => (108, f16_nan),
        GgmlType::Q6K => (208, f16_nan),
        _ => (0, f16_nan),
    }
}

/// Uploads `bytes` (rows of `ty`) as a weight through a one-tensor GGUF.
fn upload(be: &CudaBackend, ty: GgmlType, rows: usize, cols: usize, bytes: Vec<u8>) -> Packed {
    let mut w = GgufWriter::new();
    w.tensor("w", &[cols as u64, rows as u64], ty, bytes.clone())
        .expect("valid tensor");
    let gguf = Arc::new(Gguf::from_bytes(w.to_bytes().expect("writes")).expect("parses"));
    let dev = be.load_weight(&gguf, "w").expect("uploads");
    Packed {
        ty,
        rows,
        cols,
        bytes,
        dev,
    }
}

/// A random `rows x cols` weight of `ty`.
fn random_weight(be: &CudaBackend, ty: GgmlType, rows: usize, rng: &mut Rng) -> Packed {
    let cols = cols_for(ty);
    let bytes = pack(ty, &rng.floats(rows * cols, 1.0), rng);
    upload(be, ty, rows, cols, bytes)
}

/// `(Σ w x, Σ |w x|)` in f64.
fn dot64(w: &[f32], x: &[f32]) -> (f64, f64) {
    w.iter().zip(x).fold((0.0, 0.0), |(s, a), (&w, &x)| {
        let p = f64::from(w) * f64::from(x);
        (s + p, a + p.abs())
    })
}

/// Runs `matmul(w, row0, n_rows, x, n_tok)` into a NaN-poisoned buffer one
/// row longer than needed and compares with the reference; returns the
/// failures (an untouched tail must stay NaN).
fn check_matmul(
    be: &CudaBackend,
    w: &Packed,
    row0: usize,
    n_rows: usize,
    n_tok: usize,
    rng: &mut Rng,
) -> Vec<String> {
    let x = rng.floats(n_tok * w.cols, 1.0);
    let xb = dev(be, &x);
    let len = n_tok * n_rows + 1;
    let mut out = poisoned(be, len);
    let what = format!(
        "{} {}x{} rows {row0}+{n_rows} tokens {n_tok}",
        w.ty, w.rows, w.cols
    );
    if let Err(e) = be.matmul(&w.dev, row0, n_rows, &xb, n_tok, &mut out) {
        return vec![format!("{what}: {e}")];
    }
    let got = host(be, &out);
    let mut fails = Vec::new();
    let mut worst = 0.0f64;
    for r in 0..n_rows {
        let wr = w.row(row0 + r);
        for t in 0..n_tok {
            let (want, scale) = dot64(&wr, &x[t * w.cols..(t + 1) * w.cols]);
            let g = got[t * n_rows + r];
            let err = (f64::from(g) - want).abs() / scale.max(1e-30);
            if err.is_nan() || err > REL {
                if fails.len() < 4 {
                    fails.push(format!("{what}: out[{t}, {r}] = {g}, want {want} (error {err:.2e} of Σ|wx| = {scale})"));
                }
                worst = worst.max(if err.is_nan() { f64::INFINITY } else { err });
            }
        }
    }
    if !got[len - 1].is_nan() {
        fails.push(format!("{what}: wrote past its output ({})", got[len - 1]));
    }
    if worst > 0.0 {
        fails.push(format!("{what}: worst relative error {worst:.2e}"));
    }
    fails
}

fn report(fails: Vec<String>) {
    for f in &fails {
        println!("FAIL {f}");
    }
    assert!(fails.is_empty(), "{} failures (listed above)", fails.len());
}

#[test]
fn matmul_matches_cpu_for_every_type_and_token_count() {
    let Some(be) = backend() else { return };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut fails = Vec::new();
    for ty in TYPES {
        // 300 rows: not a multiple of the rows per CTA.
        let w = random_weight(&be, ty, 300, &mut rng);
        // GEMV, every token tile of the tiled GEMM (full and padded; 300
        // rows of the K-quants' 96 units split along k), and SGEMM prefill.
        for n_tok in [1, 2, 3, 5, 8, 9, 16, 17, 32, 33, 63, 64, 65] {
            fails.extend(check_matmul(&be, &w, 0, w.rows, n_tok, &mut rng));
        }
        // A slice of the rows (row0 > 0: rows at unaligned offsets).
        for n_tok in [1, 4, 17, 70] {
            fails.extend(check_matmul(&be, &w, 7, 250, n_tok, &mut rng));
        }
        // Enough rows for the two-rows-per-warp GEMV, with an odd tail.
        let tall = random_weight(&be, ty, 4099, &mut rng);
        fails.extend(check_matmul(&be, &tall, 0, tall.rows, 1, &mut rng));
        fails.extend(check_matmul(&be, &tall, 1, 4097, 1, &mut rng));
    }
    report(fails);
}

/// Row length of the split test: long enough for many splits of 32 units
/// and not a multiple of the 64-value tile, in whole blocks of `ty`.
fn long_cols_for(ty: GgmlType) -> usize {
    4096 + ty.block_elems().max(8)
}

#[test]
fn batched_gemm_splits_along_k_for_every_type() {
    let Some(be) = backend() else { return };
    let mut rng = Rng(0x5eed);
    let mut fails = Vec::new();
    for ty in TYPES {
        // 70 rows: two row tiles, far too few CTAs, so k is split (the last
        // split shorter than the others).
        let (rows, cols) = (70, long_cols_for(ty));
        let bytes = pack(ty, &rng.floats(rows * cols, 1.0), &mut rng);
        let w = upload(&be, ty, rows, cols, bytes);
        for n_tok in [2, 8, 24, 64] {
            fails.extend(check_matmul(&be, &w, 0, rows, n_tok, &mut rng));
        }
        fails.extend(check_matmul(&be, &w, 3, 60, 11, &mut rng));
    }
    report(fails);
}

#[test]
fn prefill_crosses_dequant_workspace_chunks() {
    let Some(be) = backend() else { return };
    let mut rng = Rng(7);
    let mut fails = Vec::new();
    // 2100 rows of 4096: more than the 32 MiB workspace's 2048 rows.
    for ty in [GgmlType::Q8_0, GgmlType::F16] {
        let (rows, cols) = (2100, 4096);
        let bytes = pack(ty, &rng.floats(rows * cols, 1.0), &mut rng);
        let w = upload(&be, ty, rows, cols, bytes);
        fails.extend(check_matmul(&be, &w, 0, rows, 80, &mut rng));
        fails.extend(check_matmul(&be, &w, 30, 2060, 65, &mut rng));
    }
    report(fails);
}

/// The types real models use at model-sized shapes: batched-decode
/// products of a matrix of over 4Mi weights (also the slice from row 3),
/// and prefill-sized ones (the tensor-core GEMM's largest CTAs, 128 weight
/// rows x 64 or 128 tokens, taken when their tiles fill the GPU; SGEMM with
/// `KILN_CUDA_MMA=0`). 256 columns (one K-quant block) keep the prefill reference quick.
#[test]
fn model_types_match_cpu_at_large_shapes() {
    let Some(be) = backend() else { return };
    let mut rng = Rng(41);
    let mut fails = Vec::new();
    let types = [
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ];
    for ty in types {
        // (row0, n_rows, tokens) of each product.
        let decode: &[(usize, usize, usize)] = &[(0, 4100, 16), (0, 4100, 21), (3, 4097, 32)];
        // 1,024 tokens: a GPU server's step of 64 decode and 960 prompt
        // rows, the split-x GEMM's most (`KILN_CUDA_MMA2_ROWS`).
        let prefill: &[(usize, usize, usize)] = &[(0, 4224, 512), (5, 4124, 300), (0, 4224, 1024)];
        for (rows, cols, runs) in [(4100, 1024, decode), (4224, 256, prefill)] {
            let bytes = pack(ty, &rng.floats(rows * cols, 1.0), &mut rng);
            let w = upload(&be, ty, rows, cols, bytes);
            for &(row0, n_rows, n_tok) in runs {
                fails.extend(check_matmul(&be, &w, row0, n_rows, n_tok, &mut rng));
            }
        }
    }
    report(fails);
}

/// A step whose rows hold `tokens`.
fn step_with(be: &CudaBackend, tokens: &[u32]) -> <CudaBackend as Backend>::Step {
    let mut step = be.new_step(tokens.len()).expect("step");
    let mut input = StepInput::default();
    input.push_seq(tokens, 0);
    be.load_step(&input, &mut step).expect("load step");
    step
}

#[test]
fn embed_is_bit_exact_with_cpu_dequantization() {
    let Some(be) = backend() else { return };
    let mut rng = Rng(11);
    let mut fails = Vec::new();
    for ty in TYPES {
        let mut w = random_weight(&be, ty, 300, &mut rng);
        // One row's scale is NaN: it must come out NaN, not something else.
        let (at, nan) = nan_field(ty);
        let rb = w.row_bytes();
        w.bytes[5 * rb + at..5 * rb + at + nan.len()].copy_from_slice(&nan);
        let w = upload(&be, ty, w.rows, w.cols, w.bytes);
        let tokens = [0u32, 299, 17, 17, 5, 123];
        let step = step_with(&be, &tokens);
        let scale = 1.7f32;
        let n = tokens.len() * w.cols;
        let mut out = poisoned(&be, n + 1);
        if let Err(e) = be.embed(&w.dev, &step, tokens.len(), scale, &mut out) {
            fails.push(format!("{ty}: {e}"));
            continue;
        }
        let got = host(&be, &out);
        for (t, &id) in tokens.iter().enumerate() {
            let want: Vec<f32> = w.row(id as usize).iter().map(|v| v * scale).collect();
            let g = &got[t * w.cols..(t + 1) * w.cols];
            let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            if let Some(c) = (0..w.cols).find(|&c| !same(g[c], want[c])) {
                fails.push(format!(
                    "{ty}: token {t} (id {id}) value {c}: {} want {}",
                    g[c], want[c]
                ));
            }
        }
        if !got[n].is_nan() {
            fails.push(format!("{ty}: embed wrote past its output"));
        }
    }
    report(fails);
}

/// The greedy head's answer for row `row` of `h`: the id, or `u32::MAX`
/// for a non-finite dot (a backend may also report that as an error).
fn argmax_id(be: &CudaBackend, w: &Packed, h: &[f32], row: usize) -> Result<u32, ModelError> {
    let hb = be.upload(h)?;
    let mut step = step_with(be, &vec![0u32; row + 1]);
    be.argmax_head(&w.dev, &hb, row..row + 1, &mut step)?;
    let mut ids = vec![0u32; row + 1];
    be.read_ids(&step, &mut ids)?;
    Ok(ids[row])
}

#[test]
fn argmax_matches_cpu_with_ties_and_nan() {
    let Some(be) = backend() else { return };
    let mut rng = Rng(23);
    let mut fails = Vec::new();
    for ty in TYPES {
        for rows in [300, 20_000] {
            let mut w = random_weight(&be, ty, rows, &mut rng);
            let h = rng.floats(3 * w.cols, 1.0);
            let x = &h[2 * w.cols..];
            let dots: Vec<(f64, f64)> = (0..rows).map(|r| dot64(&w.row(r), x)).collect();
            let best = (0..rows).fold(0, |b, r| if dots[r].0 > dots[b].0 { r } else { b });
            // Tie: the winner's bytes again at a lower row (or a higher
            // one when it is row 0): identical rows give identical dots,
            // and the lowest row must win.
            let dup = if best > 0 { best / 2 } else { rows - 1 };
            let rb = w.row_bytes();
            let winner = w.bytes[best * rb..(best + 1) * rb].to_vec();
            w.bytes[dup * rb..(dup + 1) * rb].copy_from_slice(&winner);
            let want = best.min(dup) as u32;
            let runner_up = (0..rows)
                .filter(|&r| r != best && r != dup)
                .map(|r| dots[r].0)
                .fold(f64::NEG_INFINITY, f64::max);
            let margin = (dots[best].0 - runner_up) / dots[best].1;
            let w = upload(&be, ty, rows, w.cols, w.bytes);
            match argmax_id(&be, &w, &h, 2) {
                Ok(id) if id == want => {}
                // Within rounding of the runner-up the pick may differ.
                Ok(id) if margin <= 2.0 * REL && (id as usize) < rows => {
                    println!("{ty} {rows} rows: top-2 margin {margin:.1e}, got {id}, CPU {want}")
                }
                other => fails.push(format!(
                    "{ty} {rows} rows: argmax {other:?}, want {want} (margin {margin:.1e})"
                )),
            }
            // A NaN in one row must not be skipped over.
            let mut bytes = w.bytes.clone();
            let (at, nan) = nan_field(ty);
            let r = rows / 3;
            bytes[r * rb + at..r * rb + at + nan.len()].copy_from_slice(&nan);
            let w = upload(&be, ty, rows, w.cols, bytes);
            match argmax_id(&be, &w, &h, 2) {
                Ok(u32::MAX) | Err(ModelError::NonFiniteLogit { .. }) => {}
                other => fails.push(format!("{ty} {rows} rows with a NaN row: {other:?}")),
            }
        }
    }
    report(fails);
}

#[test]
fn bad_shapes_are_errors_not_launches() {
    let Some(be) = backend() else { return };
    let mut rng = Rng(5);
    let w = random_weight(&be, GgmlType::Q4_0, 64, &mut rng);
    let x = be.upload(&rng.floats(2 * w.cols, 1.0)).expect("x");
    let mut out = be.alloc(128).expect("out");
    let e = be
        .matmul(&w.dev, 60, 8, &x, 1, &mut out)
        .expect_err("rows past the end");
    assert!(e.to_string().contains("rows 60..68 out of 64"), "{e}");
    let e = be
        .matmul(&w.dev, 0, 64, &x, 3, &mut out)
        .expect_err("x too short");
    assert!(e.to_string().contains("needs 480 elements"), "{e}");
    let e = be
        .matmul(&w.dev, 0, 64, &x, 2, &mut be.alloc(100).expect("out"))
        .expect_err("out too short");
    assert!(
        e.to_string().contains("needs 128 elements, buffer has 100"),
        "{e}"
    );
}

/// The greedy head's answers for hidden rows `rows` of `h`, computed in
/// one call: an id per row, or `u32::MAX` for a non-finite dot.
fn argmax_ids(
    be: &CudaBackend,
    w: &Packed,
    h: &[f32],
    rows: std::ops::Range<usize>,
) -> Result<Vec<u32>, ModelError> {
    let hb = be.upload(h)?;
    let mut step = step_with(be, &vec![0u32; rows.end]);
    be.argmax_head(&w.dev, &hb, rows.clone(), &mut step)?;
    let mut ids = vec![0u32; rows.end];
    be.read_ids(&step, &mut ids)?;
    Ok(ids[rows].to_vec())
}

/// Checks `got` (the head's id for x) against the f64 argmax over `w_rows`:
/// the lowest row of the largest dot, or within rounding of it.
fn check_argmax(what: &str, w_rows: &[Vec<f32>], x: &[f32], got: u32) -> Option<String> {
    let dots: Vec<(f64, f64)> = w_rows.iter().map(|r| dot64(r, x)).collect();
    let best = (0..dots.len()).fold(0, |b, r| if dots[r].0 > dots[b].0 { r } else { b });
    if got as usize == best {
        return None;
    }
    let near = (got as usize) < dots.len()
        && (dots[best].0 - dots[got as usize].0) / dots[best].1 <= 2.0 * REL
        && dots[got as usize].0 != dots[best].0;
    if near {
        println!("{what}: top-2 margin within rounding, got {got}, CPU {best}");
        return None;
    }
    Some(format!("{what}: argmax {got}, want {best}"))
}

#[test]
fn argmax_of_several_rows_matches_cpu_with_ties_and_nan() {
    let Some(be) = backend() else { return };
    let mut rng = Rng(29);
    let mut fails = Vec::new();
    // 67 rows: two token tiles of 64; 9: one padded tile of 16 (with
    // by default both on the tensor cores); 16 over 60,000 rows:
    // more row tiles than the tensor-core head has resident CTAs, so CTAs
    // take several; 5: the tiled head's padded tile of 8; 2 and 3: the
    // streaming heads of 2 and 4 rows.
    for ty in TYPES {
        for (rows, n) in [
            (300, 67),
            (20_000, 9),
            (60_000, 16),
            (20_000, 5),
            (300, 2),
            (20_000, 3),
        ] {
            let mut w = random_weight(&be, ty, rows, &mut rng);
            let (cols, row0) = (w.cols, 2);
            let h = rng.floats((row0 + n) * cols, 1.0);
            // A tie: the first hidden row's winner copied to a lower row
            // (or to the last when it is row 0), so the rows' dots are
            // equal for every hidden row; the reference below is taken on
            // the final bytes and wants the lowest.
            let x0 = &h[row0 * cols..(row0 + 1) * cols];
            let best0 = (0..rows)
                .map(|r| dot64(&w.row(r), x0).0)
                .enumerate()
                .fold(
                    (0, f64::NEG_INFINITY),
                    |b, (r, d)| if d > b.1 { (r, d) } else { b },
                )
                .0;
            let dup = if best0 > 0 { best0 / 2 } else { rows - 1 };
            let rb = w.row_bytes();
            let winner = w.bytes[best0 * rb..(best0 + 1) * rb].to_vec();
            w.bytes[dup * rb..(dup + 1) * rb].copy_from_slice(&winner);
            let w = upload(&be, ty, rows, cols, w.bytes);
            let w_rows: Vec<Vec<f32>> = (0..rows).map(|r| w.row(r)).collect();
            match argmax_ids(&be, &w, &h, row0..row0 + n) {
                Err(e) => fails.push(format!("{ty} {rows} rows x {n}: {e}")),
                Ok(ids) => {
                    for (i, &id) in ids.iter().enumerate() {
                        let x = &h[(row0 + i) * cols..(row0 + i + 1) * cols];
                        let what = format!("{ty} {rows} rows, hidden row {i} of {n}");
                        fails.extend(check_argmax(&what, &w_rows, x, id));
                    }
                }
            }
            // A NaN in one head row makes every hidden row's answer MAX.
            let mut bytes = w.bytes.clone();
            let (at, nan) = nan_field(ty);
            let r = rows / 3;
            bytes[r * rb + at..r * rb + at + nan.len()].copy_from_slice(&nan);
            let w = upload(&be, ty, rows, cols, bytes);
            match argmax_ids(&be, &w, &h, row0..row0 + n) {
                Ok(ids) if ids.iter().all(|&id| id == u32::MAX) => {}
                other => fails.push(format!("{ty} {rows} rows x {n} with a NaN row: {other:?}")),
            }
        }
    }
    report(fails);
}

/// One-token products at the edges of the streaming kernels' plans (tile
/// sizes in src/matmul/stream.rs): rows so long that a tile holds 4 of
/// them, and 4500 rows make more tiles than an H200 holds CTAs at once
/// (CTAs then take two, the second copied while the first is computed);
/// rows longer than a 24 KiB stage, which take the register-only kernels.
#[test]
fn one_token_products_stream_many_tiles_or_fall_back() {
    let Some(be) = backend() else { return };
    let mut rng = Rng(31);
    let mut fails = Vec::new();
    for (ty, rows, cols) in [(GgmlType::Q4K, 4500, 8192), (GgmlType::F32, 70, 6400)] {
        let bytes = pack(ty, &rng.floats(rows * cols, 1.0), &mut rng);
        let w = upload(&be, ty, rows, cols, bytes);
        fails.extend(check_matmul(&be, &w, 0, rows, 1, &mut rng));
        fails.extend(check_matmul(&be, &w, 3, rows - 5, 1, &mut rng));
        let h = rng.floats(2 * cols, 1.0);
        let w_rows: Vec<Vec<f32>> = (0..rows).map(|r| w.row(r)).collect();
        match argmax_ids(&be, &w, &h, 1..2) {
            Ok(ids) => fails.extend(check_argmax(
                &format!("{ty} {rows}x{cols} head"),
                &w_rows,
                &h[cols..],
                ids[0],
            )),
            Err(e) => fails.push(format!("{ty} {rows}x{cols} head: {e}")),
        }
    }
    report(fails);
}
