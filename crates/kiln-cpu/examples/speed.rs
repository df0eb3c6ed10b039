//! Real-model throughput of the CPU backend (Gemma 3 270M Q4_K_M):
//! `cargo run --release -p kiln-cpu --example speed [-- quick]`.
//! Prints prefill tok/s (128 and 512 tokens), decode tok/s after a short
//! context and after 4096 tokens, and the time of all-position logits for
//! a 128-token chunk. Times are the best of a few runs (shared machine).

use std::sync::Arc;
use std::time::Instant;

use kiln_cpu::CpuBackend;
use kiln_gguf::Gguf;
use kiln_model::{Model, Output};

fn tokens(n: usize, seed: usize) -> Vec<u32> {
    (0..n)
        .map(|i| (2 + (i * 7919 + seed * 104_729) % 200_000) as u32)
        .collect()
}

/// Best seconds of `reps` runs of `f`.
fn best(reps: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..reps).map(|_| f()).fold(f64::INFINITY, f64::min)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "quick");
    // Sections to run: `prefill`, `logits`, `decode`, `deep` (default all).
    let only: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "quick")
        .collect();
    let want = |s: &str| only.is_empty() || only.contains(&s);
    let g = Arc::new(Gguf::open(kiln_testdata::real_model()).expect("real model"));
    let backend = match std::env::var("KILN_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(n) => CpuBackend::with_threads(n),
        None => CpuBackend::new(),
    };
    let m = Model::load(backend, g).expect("load");
    let reps = if quick { 2 } else { 3 };
    let mut out = Vec::new();

    let prefill = |n: usize, output: Output, out: &mut Vec<f32>| {
        let toks = tokens(n, 1);
        let mut cache = m.new_cache().unwrap();
        let mut s = m.new_scratch(n).unwrap();
        let t = Instant::now();
        m.forward(&toks, &mut cache, &mut s, output, out).unwrap();
        t.elapsed().as_secs_f64()
    };
    for n in [128, 512].into_iter().filter(|_| want("prefill")) {
        let t = best(reps, || prefill(n, Output::LastLogits, &mut out));
        println!("prefill {n:4}: {:8.1} tok/s ({:.3} s)", n as f64 / t, t);
    }
    if want("logits") {
        let hid = best(reps, || prefill(128, Output::AllHidden, &mut out));
        let all = best(reps, || prefill(128, Output::AllLogits, &mut out));
        println!(
            "all-position logits, 128 tokens: {:.3} s total, {:.3} s LM head",
            all,
            all - hid
        );
    }

    // Decode steps after a context of `depth` tokens (prefilled in chunks).
    let decode = |depth: usize, steps: usize, output: Output| {
        let chunk = 512;
        let mut cache = m.new_cache().unwrap();
        let mut s = m.new_scratch(chunk).unwrap();
        let mut out = Vec::new();
        let toks = tokens(depth, 2);
        for c in toks.chunks(chunk) {
            m.forward(c, &mut cache, &mut s, Output::Argmax, &mut out)
                .unwrap();
        }
        let mut tok = 1000u32;
        let mut best = f64::INFINITY;
        for _ in 0..steps {
            let t = Instant::now();
            let r = m
                .forward(&[tok], &mut cache, &mut s, output, &mut out)
                .unwrap();
            best = best.min(t.elapsed().as_secs_f64());
            tok = r.unwrap_or(tok + 1) % 200_000 + 2;
        }
        1.0 / best
    };
    let steps = if quick { 12 } else { 24 };
    if want("decode") || want("deep") {
        let d0 = decode(16, steps, Output::Argmax);
        println!("decode (argmax) @16:   {d0:8.1} tok/s");
        if want("decode") {
            let dl = decode(16, steps, Output::LastLogits);
            println!("decode (logits) @16:   {dl:8.1} tok/s");
            let dh = decode(16, steps, Output::LastHidden);
            println!("decode (no head) @16:  {dh:8.1} tok/s");
        }
        if want("deep") {
            let d4 = decode(4096, steps, Output::Argmax);
            println!(
                "decode (argmax) @4096: {d4:8.1} tok/s ({:.2}x of @16)",
                d4 / d0
            );
        }
    }
}
