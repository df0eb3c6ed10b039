//! Prefill and decode speed of a model on the GPU, llama-bench style, and
//! what a decode step costs in launches.
//!
//! ```sh
//! cargo run --release -p kiln-cuda --example decode_bench -- MODEL.gguf [-p 512] [-n 128] [-d 0] [-r 3]
//! ```
//!
//! pp: a `-p`-token prompt in one forward (greedy head only), tok/s.
//! tg: `-n` greedy decode steps after `-d` positions of context (each a
//! graph replay within its KV bucket, as `kiln run` decodes), tok/s. Each
//! figure is the median of `-r` runs after one warm-up run; the step's
//! 4-byte readback ends each timed step, so host and device time are both
//! in it.

use std::sync::Arc;
use std::time::Instant;

use kiln_cuda::CudaBackend;
use kiln_gguf::Gguf;
use kiln_model::{Model, Output};

fn arg(args: &[String], flag: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1).filter(|a| !a.starts_with('-')) else {
        eprintln!("usage: decode_bench MODEL.gguf [-p 512] [-n 128] [-d 0] [-r 3]");
        std::process::exit(2);
    };
    let (pp, tg, depth, reps) = (
        arg(&args, "-p", 512),
        arg(&args, "-n", 128),
        arg(&args, "-d", 0),
        arg(&args, "-r", 3).max(1),
    );
    let backend = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let gpu = backend.device_name();
    let t = Instant::now();
    let gguf = Arc::new(Gguf::open(path).expect("GGUF opens"));
    let m = Model::load(backend, gguf).expect("model loads");
    let b = m.backend();
    b.synchronize().unwrap();
    let load_s = t.elapsed().as_secs_f64();
    let (free, total) = b.memory_info().unwrap();
    let vocab = m.config.n_vocab as u32;
    let tokens: Vec<u32> = (0..pp.max(depth).max(1) as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    let mut s = m.new_scratch(pp.max(depth).max(1)).unwrap();

    // pp: one prefill of `pp` tokens.
    let mut pp_runs = Vec::new();
    for rep in 0..=reps {
        let mut cache = m.new_cache().unwrap();
        cache.reserve(b, pp).unwrap();
        let t = Instant::now();
        m.forward(
            &tokens[..pp],
            &mut cache,
            &mut s,
            Output::Argmax,
            &mut Vec::new(),
        )
        .unwrap();
        if rep > 0 {
            pp_runs.push(pp as f64 / t.elapsed().as_secs_f64());
        }
    }

    // tg: `tg` steps after `depth` positions (one token when 0).
    let mut tg_runs = Vec::new();
    let mut per_step = None;
    for rep in 0..=reps {
        let mut cache = m.new_cache().unwrap();
        cache.reserve(b, depth.max(1) + tg + 1).unwrap();
        let ctx = &tokens[..depth.max(1)];
        let mut id = m
            .forward(ctx, &mut cache, &mut s, Output::Argmax, &mut Vec::new())
            .unwrap()
            .expect("id");
        let t = Instant::now();
        for i in 0..tg {
            let before = b.stats();
            id = m
                .forward(&[id], &mut cache, &mut s, Output::Argmax, &mut Vec::new())
                .unwrap()
                .expect("id");
            if rep == 0 && i == 0 {
                // A bucket's first step runs plainly: its launches are
                // what the graph replays.
                per_step = Some(b.stats().kernel_launches - before.kernel_launches);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        if rep > 0 {
            tg_runs.push(tg as f64 / secs);
        }
    }
    let (pp_s, tg_s) = (median(pp_runs), median(tg_runs));
    let launches = per_step.unwrap_or(0);
    let graphs = b.stats().graphs_held;
    println!(
        "{{\"model\":\"{path}\",\"device\":\"cuda\",\"gpu\":\"{gpu}\",\"load_s\":{load_s:.2},\
         \"vram_used_mib\":{},\"pp\":{pp},\"pp_tok_s\":{pp_s:.1},\"tg\":{tg},\"depth\":{depth},\
         \"tg_tok_s\":{tg_s:.1},\"kernels_per_step\":{launches},\"graphs_held\":{graphs}}}",
        (total - free) >> 20
    );
}
