//! Achieved memory bandwidth of the packed-weight kernels on a GPU: every
//! weight type at the Gemma 3 270M / 1B / 4B matrix shapes (FFN up, FFN
//! down, the 262,144-row LM head), for the decode GEMV (1 token), the
//! batched-decode GEMM (2 to 64 tokens: `KILN_CUDA_SKINNY=0` times the
//! older per-warp and SGEMM paths instead), prefill-sized products (128
//! and 512 tokens; the tensor-core GEMM from 8 rows on, `KILN_CUDA_MMA=0`
//! the f32 kernels) and the greedy argmax head (`KILN_CUDA_STREAM=0` times
//! the register-only GEMV and one-row head instead of the shared-memory
//! streaming ones).
//!
//! ```sh
//! cargo run --release -p kiln-cuda --example matmul_bench            # every type
//! cargo run --release -p kiln-cuda --example matmul_bench -- Q4_K Q6_K
//! cargo run --release -p kiln-cuda --example matmul_bench -- --no-head Q4_K  # FFN shapes only
//! ```
//!
//! Per call: microseconds, and GB/s of weight bytes (`tN`), or for several
//! tokens also GFLOP/s of f32 FMAs (2 per weight and token: from ~4
//! tokens on the tiled GEMM is bound by those, not by bytes).
//!
//! Each measurement enqueues `REPS` back-to-back calls inside one
//! `run_step` (captured as a CUDA graph, then replayed, as the decode step
//! is), times each replay on the host up to a 4-byte readback, and prints
//! the median over `SAMPLES` replays divided by `REPS`: the device time of
//! one call including the gap between kernels, which is what a decode step
//! pays. GB/s counts the weight bytes read once per call.

use std::sync::Arc;
use std::time::Instant;

use kiln_cuda::{CudaBackend, CudaWeight};
use kiln_gguf::write::GgufWriter;
use kiln_gguf::Gguf;
use kiln_model::{Backend, GraphKey, StepInput};
use kiln_quant::GgmlType;

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

/// `(model, matrix, rows, cols)`: Gemma 3 hidden 640 / 1152 / 2560 and FFN
/// 2048 / 6912 / 10240.
const SHAPES: [(&str, &str, usize, usize); 9] = [
    ("270M", "ffn_up", 2048, 640),
    ("270M", "ffn_down", 640, 2048),
    ("270M", "lm_head", 262_144, 640),
    ("1B", "ffn_up", 6912, 1152),
    ("1B", "ffn_down", 1152, 6912),
    ("1B", "lm_head", 262_144, 1152),
    ("4B", "ffn_up", 10_240, 2560),
    ("4B", "ffn_down", 2560, 10_240),
    ("4B", "lm_head", 262_144, 2560),
];

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Token rows of the matmul lines (1: the decode GEMV; up to 64: a batched
/// decode step's GEMM; 128 and 512: prefill chunks) and of the argmax-head
/// lines.
const TOKENS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 512];
const ARGMAX_ROWS: [usize; 6] = [1, 2, 4, 8, 32, 64];

const REPS: usize = 50;
const SAMPLES: usize = 15;

fn main() -> Result<()> {
    if let Some(reason) = kiln_cuda::unavailable_reason() {
        println!("skipped: no CUDA device ({reason})");
        return Ok(());
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let heads = !args.iter().any(|a| a == "--no-head");
    let wanted: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(|a| a.to_uppercase())
        .collect();
    let be = CudaBackend::new(0)?;
    println!(
        "{} — median of {SAMPLES} graph replays of {REPS} calls",
        be.device_name()
    );
    println!(
        "{:<6} {:<5} {:<9} {:>7} {:>6} {:>8} {:<7} {:>3} {:>9} {:>8} {:>9}",
        "type", "model", "matrix", "rows", "cols", "MB", "op", "S", "us", "GB/s", "GFLOP/s"
    );
    let mut key = 0u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for ty in TYPES {
        if !wanted.is_empty() && !wanted.iter().any(|w| w == ty.name()) {
            continue;
        }
        for (model, matrix, rows, cols) in SHAPES {
            if !heads && matrix == "lm_head" {
                continue;
            }
            let head = format!(
                "{:<6} {model:<5} {matrix:<9} {rows:>7} {cols:>6}",
                ty.name()
            );
            if cols % ty.block_elems() != 0 {
                println!("{head}  n/a: not whole {ty} blocks");
                continue;
            }
            // The kernels' speed does not depend on the values: random bytes.
            let n_bytes = rows * cols / ty.block_elems() * ty.block_bytes();
            let mut bytes = vec![0u8; n_bytes];
            for chunk in bytes.chunks_mut(8) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                chunk.copy_from_slice(&rng.to_le_bytes()[..chunk.len()]);
            }
            let w = upload(&be, ty, rows, cols, bytes)?;
            let line = |op: &str, n: usize, t: f64| {
                let flops = 2.0 * (rows * cols * n) as f64;
                println!(
                    "{head} {:>8.1} {op:<7} {n:>3} {:>9.2} {:>8.0} {:>9.0}",
                    n_bytes as f64 / 1e6,
                    t * 1e6,
                    n_bytes as f64 / t / 1e9,
                    flops / t / 1e9
                );
            };
            // The LM head's logits are only wanted one row at a time; a
            // batch takes the argmax head.
            let lm_head = matrix == "lm_head";
            let tokens: &[usize] = if lm_head { &[1] } else { &TOKENS };
            for &n_tok in tokens {
                key += 1;
                let x = be.upload(&vec![0.5f32; n_tok * cols])?;
                let mut out = be.alloc(n_tok * rows)?;
                let t = time(&be, key, &out_probe(&be)?, &mut || {
                    for _ in 0..REPS {
                        be.matmul(&w, 0, rows, &x, n_tok, &mut out)?;
                    }
                    Ok(())
                })?;
                line("matmul", n_tok, t);
            }
            if lm_head {
                for n in ARGMAX_ROWS {
                    key += 1;
                    let h = be.upload(&vec![0.5f32; n * cols])?;
                    let mut step = be.new_step(n)?;
                    let mut input = StepInput::default();
                    for _ in 0..n {
                        input.push_seq(&[0], 0);
                    }
                    be.load_step(&input, &mut step)?;
                    let t = time(&be, key, &out_probe(&be)?, &mut || {
                        for _ in 0..REPS {
                            be.argmax_head(&w, &h, 0..n, &mut step)?;
                        }
                        Ok(())
                    })?;
                    line("argmax", n, t);
                }
            }
        }
    }
    Ok(())
}

/// A one-value buffer whose download waits for the stream.
fn out_probe(be: &CudaBackend) -> kiln_model::Result<<CudaBackend as Backend>::Buf> {
    be.alloc(1)
}

/// Seconds per call of `f`'s `REPS` calls: warm-up and capture first,
/// then the median of `SAMPLES` timed replays.
fn time(
    be: &CudaBackend,
    key: u64,
    probe: &<CudaBackend as Backend>::Buf,
    f: &mut dyn FnMut() -> kiln_model::Result<()>,
) -> Result<f64> {
    let key = GraphKey {
        rows: 1,
        kv_bucket: 1,
        buffers: key,
        sampled: false,
    };
    let mut sync = [0.0f32];
    for _ in 0..2 {
        be.run_step(Some(key), f)?;
        be.download(probe, 0, &mut sync)?;
    }
    let mut samples: Vec<f64> = (0..SAMPLES)
        .map(|_| {
            let t0 = Instant::now();
            be.run_step(Some(key), f)?;
            be.download(probe, 0, &mut sync)?;
            Ok(t0.elapsed().as_secs_f64() / REPS as f64)
        })
        .collect::<Result<_>>()?;
    samples.sort_by(f64::total_cmp);
    Ok(samples[SAMPLES / 2])
}

fn upload(
    be: &CudaBackend,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
) -> Result<CudaWeight> {
    let mut w = GgufWriter::new();
    w.tensor("w", &[cols as u64, rows as u64], ty, bytes)?;
    let gguf = Arc::new(Gguf::from_bytes(w.to_bytes()?)?);
    Ok(be.load_weight(&gguf, "w")?)
}
