//! Every fixture model on the GPU: logits against the HF float32
//! references (the bound of crates/kiln-cpu/tests/fixtures.rs) and against
//! the CPU backend, for prefill and for cached greedy decode, through the
//! logits and through the device argmax (graph-replayed). Needs a GPU, else
//! one skip line.

mod common;

use common::*;
use kiln_cpu::CpuBackend;
use kiln_cuda::CudaBackend;
use kiln_testdata::{fixture, fixture_models};

const SEQS: [usize; 3] = [5, 24, 64];

/// Another backend on the GPU `backend()` found (each model owns one).
fn cuda() -> CudaBackend {
    CudaBackend::new(0).expect("GPU 0 opened before")
}

#[test]
fn f32_prefill_logits_match_reference_and_cpu() {
    if backend().is_none() {
        return;
    }
    for model in fixture_models() {
        let path = fixture(&format!("{model}/model-f32.gguf"));
        let m = load(cuda(), &path);
        let cpu = load(CpuBackend::with_threads(2), &path);
        for n in SEQS {
            let meta = json(&fixture(&format!("{model}/logits_seq{n}.json")));
            let tokens = ids(&meta["input_ids"]);
            let want = read_f32(&fixture(&format!("{model}/logits_seq{n}.bin")));
            let got = all_logits(&m, &tokens);
            let (d, mx) = max_diff(&got, &want);
            let (dc, _) = max_diff(&got, &all_logits(&cpu, &tokens));
            println!("{model} seq{n}: vs HF max|d| {d:.3e} (max|logit| {mx:.2}); vs CPU {dc:.3e}");
            assert!(d <= 1e-4 * mx, "{model} seq{n}: max|d| {d} > 1e-4 * {mx}");
            assert!(dc <= 1e-4 * mx, "{model} seq{n}: vs CPU max|d| {dc}");
        }
    }
}

/// The reference's 16 greedy tokens (a step whose reference margin is
/// < 1e-3 may differ, ending the comparison) with each step's logits;
/// the argmax-only path gives the same tokens.
#[test]
fn f32_cached_greedy_matches_reference() {
    if backend().is_none() {
        return;
    }
    for model in fixture_models() {
        let m = load(cuda(), &fixture(&format!("{model}/model-f32.gguf")));
        let reference = json(&fixture(&format!("{model}/reference.json")));
        let vocab = m.config.n_vocab;
        for n in SEQS {
            let meta = json(&fixture(&format!("{model}/gen_logits_seq{n}.json")));
            let prompt = ids(&meta["prompt_ids"]);
            let want_ids = ids(&meta["generated_ids"]);
            let margins = &reference["reference"]["sequences"][n.to_string()]
                ["greedy_top1_minus_top2_per_step"];
            let want_logits = read_f32(&fixture(&format!("{model}/gen_logits_seq{n}.bin")));
            let (got_ids, got_logits) = greedy(&m, &prompt, want_ids.len(), false);
            let mut matched = 0;
            for (step, (&id, logits)) in got_ids.iter().zip(&got_logits).enumerate() {
                let (d, mx) = max_diff(logits, &want_logits[step * vocab..(step + 1) * vocab]);
                assert!(d <= 1e-4 * mx, "{model} seq{n} step {step}: max|d| {d}");
                if id != want_ids[step] {
                    let margin = margins[step].as_f64().unwrap();
                    assert!(
                        margin < 1e-3,
                        "{model} seq{n} step {step}: {id} vs {} (margin {margin})",
                        want_ids[step]
                    );
                    break;
                }
                matched += 1;
            }
            let (argmax_ids, _) = greedy(&m, &prompt, matched.max(1), true);
            assert_eq!(
                argmax_ids[..],
                got_ids[..matched.max(1)],
                "{model} seq{n}: argmax path"
            );
            println!("{model} seq{n}: {matched} greedy tokens match, argmax path equal");
        }
    }
}

/// F16 and Q8_0 files: the same logits as the CPU backend on the same file.
#[test]
fn quantized_prefill_matches_cpu() {
    if backend().is_none() {
        return;
    }
    for model in fixture_models() {
        for variant in ["f16", "q8_0"] {
            let path = fixture(&format!("{model}/model-{variant}.gguf"));
            let m = load(cuda(), &path);
            let cpu = load(CpuBackend::with_threads(2), &path);
            let tokens = ids(&json(&fixture(&format!("{model}/logits_seq64.json")))["input_ids"]);
            let (d, mx) = max_diff(&all_logits(&m, &tokens), &all_logits(&cpu, &tokens));
            println!("{model} {variant}: vs CPU max|d| {d:.3e} (max|logit| {mx:.2})");
            assert!(d <= 1e-4 * mx, "{model} {variant}: vs CPU max|d| {d}");
        }
    }
}

/// One step over several sequences (a prefill chunk, decode rows, a fresh
/// prompt) gives each the logits it gets alone, on every fixture: the
/// per-sequence positions, cache lengths and rows the kernels read from
/// the step.
#[test]
fn batched_step_matches_each_sequence_alone() {
    if backend().is_none() {
        return;
    }
    for model in fixture_models() {
        let m = load(cuda(), &fixture(&format!("{model}/model-f32.gguf")));
        batched_vs_alone(&m, &model);
    }
}

fn batched_vs_alone<B: kiln_model::Backend>(m: &kiln_model::Model<B>, model: &str) {
    use kiln_model::{BatchSeq, Output};
    let tokens = ids(&json(&fixture(&format!("{model}/logits_seq64.json")))["input_ids"]);
    // (tokens already cached, new tokens) per sequence; 20 cached
    // positions pass the 16-row sliding window.
    let plan: [(usize, usize); 4] = [(20, 1), (0, 7), (33, 5), (9, 1)];
    let mut s = m.new_scratch(64).unwrap();
    // Each sequence alone, and its prefix in a cache for the batched step
    // (a ring cannot be rewound, so one cache each).
    let mut alone = Vec::new();
    let mut caches = Vec::new();
    for &(p, n) in &plan {
        let (mut solo, mut batched) = (m.new_cache().unwrap(), m.new_cache().unwrap());
        let mut out = Vec::new();
        if p > 0 {
            m.forward(
                &tokens[..p],
                &mut solo,
                &mut s,
                Output::LastLogits,
                &mut out,
            )
            .unwrap();
            m.forward(
                &tokens[..p],
                &mut batched,
                &mut s,
                Output::LastLogits,
                &mut out,
            )
            .unwrap();
        }
        m.forward(
            &tokens[p..p + n],
            &mut solo,
            &mut s,
            Output::AllLogits,
            &mut out,
        )
        .unwrap();
        alone.push(out);
        caches.push(batched);
    }
    let mut outs: Vec<Vec<f32>> = plan.iter().map(|_| Vec::new()).collect();
    let mut seqs: Vec<BatchSeq<'_, B>> = caches
        .iter_mut()
        .zip(outs.iter_mut())
        .zip(&plan)
        .map(|((cache, out), &(p, n))| BatchSeq {
            tokens: &tokens[p..p + n],
            cache,
            output: Output::AllLogits,
            out,
            sampler: None,
        })
        .collect();
    let results = m.forward_batch(&mut seqs, &mut s).unwrap();
    drop(seqs);
    for (i, (r, (got, want))) in results.iter().zip(outs.iter().zip(&alone)).enumerate() {
        assert!(r.is_ok(), "{model} sequence {i}: {r:?}");
        let (d, mx) = max_diff(got, want);
        assert!(
            d <= 1e-5 * mx.max(1.0),
            "{model} sequence {i}: batched vs alone max|d| {d}"
        );
    }
    println!(
        "{model}: a step of {} sequences equals each alone",
        plan.len()
    );
}
