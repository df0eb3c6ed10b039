//! Real Gemma shapes on the GPU: a synthetic (random-weight) Gemma 3 270M
//! Q4_K_M file (`KILN_CUDA_SYNTH_SIZES=270m,1b` for more sizes), written
//! by kiln-synth on first use under `$KILN_CACHE_DIR/synth/`. CUDA logits
//! within 1e-3 (absolute) of the CPU backend's at every position of a
//! 512-token prompt and for 256 teacher-forced decode steps; greedy ids
//! equal wherever the CPU's top-2 margin is at least 1e-3. Needs a GPU,
//! else one skip line.

mod common;

use common::*;
use kiln_cpu::CpuBackend;
use kiln_model::{Model, Output};

const PROMPT: usize = 512;
const DECODE: usize = 256;
const BOUND: f32 = 1e-3;

/// Top-1 minus top-2 of a logits row.
fn margin(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > a {
            (a, b) = (v, a);
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// Prefill logits at every position, then `DECODE` steps fed the tokens
/// `feed` (teacher forcing), each step's logits.
fn run<B: kiln_model::Backend>(
    m: &Model<B>,
    prompt: &[u32],
    feed: &[u32],
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut cache = m.new_cache().unwrap();
    cache
        .reserve(m.backend(), prompt.len() + feed.len())
        .unwrap();
    let mut s = m.new_scratch(prompt.len()).unwrap();
    let mut all = Vec::new();
    m.forward(prompt, &mut cache, &mut s, Output::AllLogits, &mut all)
        .unwrap();
    let steps = feed
        .iter()
        .map(|&t| {
            let mut out = Vec::new();
            m.forward(&[t], &mut cache, &mut s, Output::LastLogits, &mut out)
                .unwrap();
            out
        })
        .collect();
    (all, steps)
}

#[test]
fn synthetic_q4_k_m_matches_cpu() {
    if backend().is_none() {
        return;
    }
    let sizes = std::env::var("KILN_CUDA_SYNTH_SIZES").unwrap_or_else(|_| "270m".into());
    for size in sizes.split(',').map(str::trim) {
        let path = synth_file(size);
        let gpu = load(kiln_cuda::CudaBackend::new(0).unwrap(), &path);
        let cpu = load(CpuBackend::new(), &path);
        let vocab = cpu.config.n_vocab;
        let mut r = Rng(9);
        let prompt: Vec<u32> = (0..PROMPT).map(|_| r.below(vocab) as u32).collect();
        let feed: Vec<u32> = (0..DECODE).map(|_| r.below(vocab) as u32).collect();
        let (want_all, want_steps) = run(&cpu, &prompt, &feed);
        let (got_all, got_steps) = run(&gpu, &prompt, &feed);
        let (d, mx) = max_diff(&got_all, &want_all);
        println!("gemma3-{size} Q4_K_M prefill {PROMPT}: max|d| {d:.3e} (max|logit| {mx:.2})");
        assert!(d <= BOUND, "gemma3-{size} prefill: max|d| {d}");
        let (mut worst, mut greedy_checked) = (0.0f32, 0);
        for (i, (g, w)) in got_steps.iter().zip(&want_steps).enumerate() {
            let (d, _) = max_diff(g, w);
            assert!(d <= BOUND, "gemma3-{size} decode step {i}: max|d| {d}");
            worst = worst.max(d);
            if margin(w) >= 1e-3 {
                assert_eq!(
                    argmax(g),
                    argmax(w),
                    "gemma3-{size} decode step {i}: greedy id"
                );
                greedy_checked += 1;
            }
        }
        // Positions of the prompt with a clear winner agree too.
        for p in 0..PROMPT {
            let w = &want_all[p * vocab..(p + 1) * vocab];
            if margin(w) >= 1e-3 {
                assert_eq!(
                    argmax(&got_all[p * vocab..(p + 1) * vocab]),
                    argmax(w),
                    "prompt {p}"
                );
            }
        }
        println!(
            "gemma3-{size} Q4_K_M decode {DECODE}: max|d| {worst:.3e}; {greedy_checked} greedy ids equal"
        );
    }
}

/// Decode steps of 6 sequences at once on the real shapes (ragged
/// prompts, one past the 512-row sliding window): each row's logits
/// within 1e-3 of the CPU's for that sequence alone, and through the
/// greedy head (the graph-replayed path, padded to 8 rows) the CPU's
/// ids wherever its margin is at least 1e-3. Tokens fed are the CPU's
/// (teacher forcing), so one close call does not fork the rest.
#[test]
fn synthetic_batched_decode_matches_cpu_alone() {
    if backend().is_none() {
        return;
    }
    const STEPS: usize = 8;
    let path = synth_file("270m");
    let gpu = load(kiln_cuda::CudaBackend::new(0).unwrap(), &path);
    let cpu = load(CpuBackend::new(), &path);
    let vocab = cpu.config.n_vocab;
    let mut r = Rng(21);
    let lens = [5, 40, 130, 600, 1, 77];
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| (0..n).map(|_| r.below(vocab) as u32).collect())
        .collect();
    // The CPU alone: greedy ids and each step's logits.
    let alone: Vec<(Vec<u32>, Vec<Vec<f32>>)> = prompts
        .iter()
        .map(|p| {
            let mut cache = cpu.new_cache().unwrap();
            let mut s = cpu.new_scratch(p.len()).unwrap();
            let (mut ids, mut rows) = (Vec::new(), Vec::new());
            let mut next = p.clone();
            for _ in 0..=STEPS {
                let mut out = Vec::new();
                cpu.forward(&next, &mut cache, &mut s, Output::LastLogits, &mut out)
                    .unwrap();
                ids.push(argmax(&out) as u32);
                next = vec![ids[ids.len() - 1]];
                rows.push(out);
            }
            (ids, rows)
        })
        .collect();
    for output in [Output::LastLogits, Output::Argmax] {
        let mut caches: Vec<_> = prompts.iter().map(|_| gpu.new_cache().unwrap()).collect();
        let mut s = gpu.new_scratch(600).unwrap();
        for (cache, p) in caches.iter_mut().zip(&prompts) {
            gpu.forward(p, cache, &mut s, Output::Argmax, &mut Vec::new())
                .unwrap();
        }
        let (mut worst, mut checked) = (0.0f32, 0);
        for step in 0..STEPS {
            let toks: Vec<[u32; 1]> = alone.iter().map(|(ids, _)| [ids[step]]).collect();
            let mut outs: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
            let mut batch: Vec<kiln_model::BatchSeq<'_, _>> = caches
                .iter_mut()
                .zip(&toks)
                .zip(outs.iter_mut())
                .map(|((cache, tok), out)| kiln_model::BatchSeq {
                    tokens: tok,
                    cache,
                    output,
                    out,
                    sampler: None,
                })
                .collect();
            let results = gpu.forward_batch(&mut batch, &mut s).unwrap();
            drop(batch);
            for (i, (res, (ids, rows))) in results.into_iter().zip(&alone).enumerate() {
                let want = &rows[step + 1];
                if output == Output::LastLogits {
                    let (d, _) = max_diff(&outs[i], want);
                    assert!(d <= BOUND, "sequence {i} step {step}: max|d| {d}");
                    worst = worst.max(d);
                } else if margin(want) >= 1e-3 {
                    let id = res.unwrap().unwrap();
                    assert_eq!(id, ids[step + 1], "sequence {i} step {step}: greedy id");
                    checked += 1;
                }
            }
        }
        println!(
            "gemma3-270m batched decode of {} sequences ({output:?}): max|d| vs CPU alone {worst:.3e}; {checked} greedy ids equal",
            prompts.len()
        );
    }
}
