//! Where a decode step's time goes on the real model (Gemma 3 270M
//! Q4_K_M): `cargo run --release -p kiln-cpu --example profile_decode
//! [-- THREADS [STEPS [PREFILL]]]` (default 1 thread, 64 steps; `KILN_ISA`
//! picks the kernels). With PREFILL (tokens), a prefill of that length is
//! profiled instead, the same table per prefill.
//!
//! Prints per op class (matmuls by type and shape) the calls and time
//! per token and the weight GB/s, then the step's bytes read per token,
//! the machine's read-loop bandwidth over the same mapped file, and the
//! fraction of it decode reaches (`bytes/token × tok/s ÷ read GB/s`), and
//! the cost of one empty fork/join. Greedy steps (`Output::Argmax`),
//! after a 16-token prompt. The process CPU time is printed next to the
//! wall time: on a shared machine compare variants by it, one thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_cpu::{profile, CpuBackend, CpuConfig};
use kiln_gguf::Gguf;
use kiln_kernels::pool::Pool;
use kiln_model::{Model, Output};

/// User + system CPU seconds of this process (`/proc/self/stat`, in
/// clock ticks of 10 ms), or NaN where that file is missing.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // After the parenthesised command name come fields 3.. of the line;
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    match (tick(11), tick(12)) {
        (Some(u), Some(s)) => (u + s) / 100.0,
        _ => f64::NAN,
    }
}

/// GB/s of `threads` threads summing the bytes of `data` (u64 loads,
/// each thread a contiguous part), best of `reps` passes.
fn read_loop_gbs(pool: &Pool, data: &[u8], reps: usize) -> f64 {
    let words: Vec<&[u8]> = data.chunks(data.len().div_ceil(pool.threads())).collect();
    let sink = std::sync::atomic::AtomicU64::new(0);
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        pool.run(words.len(), |i| {
            let s = words[i].chunks_exact(8).fold(0u64, |a, w| {
                a.wrapping_add(u64::from_le_bytes(w.try_into().unwrap()))
            });
            sink.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink.into_inner());
    data.len() as f64 / best / 1e9
}

/// Seconds of one empty fork/join over `threads` threads.
fn fork_join_secs(pool: &Pool) -> f64 {
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        pool.run(pool.threads(), |i| {
            std::hint::black_box(i);
        });
    }
    t.elapsed().as_secs_f64() / f64::from(n)
}

/// Prints the per-op table over `per` units (tokens or prefills);
/// returns the total wall and CPU microseconds per unit.
fn print_table(stats: &[(String, profile::OpStat)], per: f64) -> (f64, f64) {
    let us = |d: Duration| d.as_secs_f64() * 1e6 / per;
    let total: f64 = stats.iter().map(|(_, s)| us(s.time)).sum();
    let total_cpu: f64 = stats.iter().map(|(_, s)| us(s.cpu)).sum();
    println!("| op | calls/unit | us/unit | CPU us/unit | share | weight GB/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut rows: Vec<_> = stats.iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.time));
    for (name, st) in rows {
        let t = us(st.time);
        let gbs = if st.weight_bytes > 0 {
            format!(
                "{:.1}",
                st.weight_bytes as f64 / st.time.as_secs_f64() / 1e9
            )
        } else {
            String::new()
        };
        println!(
            "| {name} | {:.0} | {t:.0} | {:.0} | {:.1}% | {gbs} |",
            st.calls as f64 / per,
            us(st.cpu),
            100.0 * t / total
        );
    }
    (total, total_cpu)
}

/// Profiles `reps` prefills of `n` tokens (after one unprofiled warm-up).
fn profile_prefill(
    m: &Model<CpuBackend>,
    n: usize,
    reps: usize,
    threads: usize,
    isa: impl std::fmt::Display,
) {
    let prompt: Vec<u32> = (0..n as u32).map(|i| 2 + i * 7919 % 200_000).collect();
    let mut s = m.new_scratch(n).expect("scratch");
    let mut out = Vec::new();
    let mut run = || {
        let mut cache = m.new_cache().expect("cache");
        m.forward(&prompt, &mut cache, &mut s, Output::Argmax, &mut out)
            .expect("prefill");
    };
    run();
    let t0 = Instant::now();
    run();
    let plain = t0.elapsed().as_secs_f64();
    profile::start();
    for _ in 0..reps {
        run();
    }
    let stats = profile::take();
    println!("isa {isa}, {threads} thread(s), {reps} prefills of {n} tokens");
    let (total, _) = print_table(&stats, reps as f64);
    println!(
        "ops {:.1} ms/prefill; unprofiled: {:.1} ms = {:.0} tok/s",
        total / 1e3,
        plain * 1e3,
        n as f64 / plain
    );
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let threads = args.first().copied().unwrap_or(1);
    let steps = args.get(1).copied().unwrap_or(64);
    let path = kiln_testdata::real_model();
    let gguf = Arc::new(Gguf::open(&path).expect("the real model (scripts/fetch-test-data)"));
    let backend = CpuBackend::with_config(CpuConfig { threads, isa: None });
    let isa = backend.isa();
    let m = Model::load(backend, gguf.clone()).expect("model loads");

    if let Some(&n) = args.get(2) {
        return profile_prefill(&m, n, steps.max(1), threads, isa);
    }
    let prompt: Vec<u32> = (0..16).map(|i| 2 + i * 7919 % 200_000).collect();
    let mut cache = m.new_cache().expect("cache");
    let mut s = m.new_scratch(prompt.len()).expect("scratch");
    let mut out = Vec::new();
    let mut tok = m
        .forward(&prompt, &mut cache, &mut s, Output::Argmax, &mut out)
        .expect("prefill")
        .expect("greedy id");
    let mut step = |tok: u32| {
        m.forward(&[tok], &mut cache, &mut s, Output::Argmax, &mut out)
            .expect("decode step")
            .expect("greedy id")
    };
    for _ in 0..8 {
        tok = step(tok);
    }

    // Plain steps first (no timers), then the same count profiled.
    let (c0, t0) = (cpu_seconds(), Instant::now());
    for _ in 0..steps {
        tok = step(tok);
    }
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
    profile::start();
    for _ in 0..steps {
        tok = step(tok);
    }
    let stats = profile::take();

    println!("isa {isa}, {threads} thread(s), {steps} greedy steps after 16 tokens");
    let total = print_table(&stats, steps as f64);
    let (total, total_cpu) = total;
    let bytes_tok = stats.iter().map(|(_, s)| s.weight_bytes).sum::<u64>() as f64 / steps as f64;
    let tok_s = steps as f64 / wall;
    println!(
        "ops {total:.0} us/token ({total_cpu:.0} CPU); unprofiled: {tok_s:.1} tok/s wall, {:.2} ms CPU/token",
        cpu * 1e3 / steps as f64
    );

    let pool = Pool::new(threads);
    let file = std::fs::read(&path).expect("read the model file");
    let gbs = read_loop_gbs(&pool, &file, 5);
    let decode_gbs = bytes_tok * tok_s / 1e9;
    println!(
        "weights read per token {:.1} MB; decode {decode_gbs:.1} GB/s = {:.0}% of the \
         read loop's {gbs:.1} GB/s ({threads} thread(s))",
        bytes_tok / 1e6,
        100.0 * decode_gbs / gbs
    );
    println!(
        "empty fork/join over {threads} thread(s): {:.2} us",
        fork_join_secs(&pool) * 1e6
    );
}
