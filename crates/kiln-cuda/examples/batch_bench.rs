//! Aggregate greedy decode speed of S sequences stepped together on the
//! GPU (`Model::forward_batch`, one new token per sequence per step), the
//! engine without a server: the figure llama.cpp's `llama-batched-bench`
//! reports.
//!
//! ```sh
//! cargo run --release -p kiln-cuda --example batch_bench -- MODEL.gguf [-b 1,8,32,64] [-p 128] [-n 128] [-r 3]
//! ```
//!
//! Each sequence first takes a `-p`-token prompt (its own tokens, one
//! prefill each), then all decode `-n` steps together; tok/s = S x n /
//! the steps' wall time (each step ends with its ids on the host), the
//! median of `-r` runs after a warm-up. Also printed, per step (last
//! run): microseconds, kernels launched outside graphs, graph launches,
//! and host microseconds (wall time minus the time spent waiting in the
//! ids' download for the device).

use std::sync::Arc;
use std::time::Instant;

use kiln_cuda::CudaBackend;
use kiln_gguf::Gguf;
use kiln_model::{BatchSeq, Model, Output};

fn arg<'a>(args: &'a [String], flag: &str, default: &'a str) -> &'a str {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.as_str())
}

fn num(s: &str) -> usize {
    s.parse().unwrap_or_else(|_| {
        eprintln!("error: {s:?} is not a number");
        std::process::exit(2)
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1).filter(|a| !a.starts_with('-')) else {
        eprintln!("usage: batch_bench MODEL.gguf [-b 1,8,32,64] [-p 128] [-n 128] [-r 3]");
        std::process::exit(2);
    };
    let batches: Vec<usize> = arg(&args, "-b", "1,8,32,64").split(',').map(num).collect();
    let (prompt, steps) = (num(arg(&args, "-p", "128")), num(arg(&args, "-n", "128")));
    let reps = num(arg(&args, "-r", "3")).max(1);
    let backend = CudaBackend::new(0).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1)
    });
    let gpu = backend.device_name();
    let gguf = Arc::new(Gguf::open(path).expect("GGUF opens"));
    let m = Model::load(backend, gguf).expect("model loads");
    let b = m.backend();
    let vocab = m.config.n_vocab as u32;
    let max_batch = batches.iter().copied().max().unwrap_or(1);
    let mut s = m.new_scratch(prompt.max(max_batch).max(1)).unwrap();
    for &n_seq in &batches {
        let mut runs = Vec::new();
        let (mut last, mut per_step_ms) = ([0.0; 3], Vec::new());
        for rep in 0..=reps {
            let mut caches: Vec<_> = (0..n_seq).map(|_| m.new_cache().unwrap()).collect();
            let mut ids = Vec::with_capacity(n_seq);
            for (i, cache) in caches.iter_mut().enumerate() {
                cache.reserve(b, prompt + steps + 1).unwrap();
                let toks: Vec<u32> = (0..prompt.max(1) as u32)
                    .map(|t| (t * 7919 + 13 + 101 * i as u32) % vocab)
                    .collect();
                let out = m.forward(&toks, cache, &mut s, Output::Argmax, &mut Vec::new());
                ids.push(out.unwrap().expect("id"));
            }
            let mut outs: Vec<Vec<f32>> = vec![Vec::new(); n_seq];
            let before = b.stats();
            let t = Instant::now();
            for _ in 0..steps {
                let tokens: Vec<[u32; 1]> = ids.iter().map(|&id| [id]).collect();
                let mut seqs: Vec<BatchSeq<'_, CudaBackend>> = caches
                    .iter_mut()
                    .zip(&tokens)
                    .zip(outs.iter_mut())
                    .map(|((cache, tok), out)| BatchSeq {
                        tokens: tok,
                        cache,
                        output: Output::Argmax,
                        out,
                        sampler: None,
                    })
                    .collect();
                let results = m.forward_batch(&mut seqs, &mut s).unwrap();
                for (id, r) in ids.iter_mut().zip(results) {
                    *id = r.unwrap().expect("id");
                }
            }
            let secs = t.elapsed().as_secs_f64();
            if rep > 0 {
                runs.push((n_seq * steps) as f64 / secs);
                per_step_ms.push(secs * 1e3 / steps as f64);
                let after = b.stats();
                let per = |x: u64| x as f64 / steps as f64;
                let wait_us = per(after.download_ns - before.download_ns) / 1e3;
                last = [
                    per(after.kernel_launches - before.kernel_launches),
                    per(after.graph_launches - before.graph_launches),
                    secs * 1e6 / steps as f64 - wait_us,
                ];
            }
        }
        runs.sort_by(f64::total_cmp);
        per_step_ms.sort_by(f64::total_cmp);
        println!(
            "{{\"model\":\"{path}\",\"gpu\":\"{gpu}\",\"batch\":{n_seq},\"prompt\":{prompt},\
             \"steps\":{steps},\"tok_s\":{:.1},\"us_per_step\":{:.1},\"kernels_per_step\":{:.1},\
             \"graphs_per_step\":{:.2},\"host_us_per_step\":{:.1}}}",
            runs[runs.len() / 2],
            per_step_ms[per_step_ms.len() / 2] * 1e3,
            last[0],
            last[1],
            last[2]
        );
    }
}
