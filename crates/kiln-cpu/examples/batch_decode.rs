//! Batched decode on the real model (Gemma 3 270M Q4_K_M): S sequences,
//! one new token each per step, through `Model::forward_batch` — the
//! server's decode step without HTTP or sampling.
//! `cargo run --release -p kiln-cpu --example batch_decode [-- S...]`
//! (default S = 1 2 4 8 16; `KILN_PROFILE=1` also prints where each
//! run's steps go, by op). Prints ms per step and aggregate tok/s, best
//! of three runs of 16 steps each after a 64-token prompt per sequence,
//! for the greedy head (`Output::Argmax`) and for full logits
//! (`BATCH_ARGMAX_ONLY=1`: the greedy head only).

use std::sync::Arc;
use std::time::Instant;

use kiln_cpu::CpuBackend;
use kiln_gguf::Gguf;
use kiln_model::{BatchSeq, KvCache, Model, Output};

const PROMPT: usize = 64;
const STEPS: usize = 16;

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1, 2, 4, 8, 16]
    } else {
        sizes
    };
    let path = kiln_testdata::real_model();
    let gguf = Arc::new(Gguf::open(&path).expect("the real model (scripts/fetch-test-data)"));
    let m = Model::load(CpuBackend::new(), gguf).expect("model loads");
    println!("| S | output | ms/step | tok/s |");
    println!("|---|---|---|---|");
    let only_argmax = std::env::var("BATCH_ARGMAX_ONLY").is_ok();
    for &s in &sizes {
        for output in [Output::Argmax, Output::LastLogits] {
            if only_argmax && output != Output::Argmax {
                continue;
            }
            let best = (0..3)
                .map(|_| run(&m, s, output))
                .fold(f64::INFINITY, f64::min);
            println!(
                "| {s} | {output:?} | {:.1} | {:.1} |",
                best * 1e3,
                s as f64 / best
            );
        }
    }
}

/// Seconds per step of `s` sequences decoding together.
fn run(m: &Model<CpuBackend>, s: usize, output: Output) -> f64 {
    let mut caches: Vec<KvCache<CpuBackend>> = (0..s).map(|_| m.new_cache().unwrap()).collect();
    let mut prefill = m.new_scratch(PROMPT).unwrap();
    let mut outs: Vec<Vec<f32>> = vec![Vec::new(); s];
    let mut next: Vec<[u32; 1]> = vec![[0]; s];
    for (i, c) in caches.iter_mut().enumerate() {
        c.reserve(m.backend(), PROMPT + STEPS + 1).unwrap();
        let prompt: Vec<u32> = (0..PROMPT)
            .map(|t| (2 + (t * 7919 + i * 104_729) % 200_000) as u32)
            .collect();
        let id = m
            .forward(&prompt, c, &mut prefill, Output::Argmax, &mut outs[i])
            .unwrap();
        next[i] = [id.unwrap_or(2)];
    }
    let mut scratch = m.new_scratch(s).unwrap();
    let profiling = std::env::var("KILN_PROFILE").is_ok_and(|v| v == "1");
    if profiling {
        kiln_cpu::profile::start();
    }
    let t0 = Instant::now();
    for _ in 0..STEPS {
        let mut batch: Vec<BatchSeq<'_, CpuBackend>> = caches
            .iter_mut()
            .zip(outs.iter_mut())
            .zip(&next)
            .map(|((cache, out), tok)| BatchSeq {
                tokens: tok,
                cache,
                output,
                out,
                sampler: None,
            })
            .collect();
        let results = m.forward_batch(&mut batch, &mut scratch).unwrap();
        drop(batch);
        for (i, r) in results.into_iter().enumerate() {
            let id = match r.unwrap() {
                Some(id) => id,
                None => argmax(&outs[i]),
            };
            next[i] = [id];
        }
    }
    let secs = t0.elapsed().as_secs_f64() / STEPS as f64;
    if profiling {
        // Per step: the op classes' wall and CPU time, largest first.
        let mut stats = kiln_cpu::profile::take();
        stats.sort_by_key(|s| std::cmp::Reverse(s.1.time));
        println!("S = {s}, {output:?}: ms per step (wall, CPU) by op");
        for (name, st) in stats.iter().take(12) {
            let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / STEPS as f64;
            println!("  {:8.2} {:8.2}  {name}", per(st.time), per(st.cpu));
        }
    }
    secs
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}
