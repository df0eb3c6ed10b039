//! Every kernel ISA this CPU runs gives the scalar path's logits (prefill
//! through `gemm`, decode through `gemv`, attention, softcaps) within 1e-5
//! of max|logit|, and the same greedy token.

mod common;

use std::sync::Arc;

use common::*;
use kiln_cpu::{CpuBackend, CpuConfig, Isa};
use kiln_gguf::Gguf;
use kiln_model::{Model, Output};
use kiln_testdata::{fixture, fixture_models};

/// All-position logits of `prompt`, then the logits and greedy token of
/// one cached decode step.
fn run(m: &Model<CpuBackend>, prompt: &[u32]) -> (Vec<f32>, Vec<f32>, u32) {
    let mut cache = m.new_cache().unwrap();
    let mut s = m.new_scratch(prompt.len()).unwrap();
    let mut all = Vec::new();
    m.forward(prompt, &mut cache, &mut s, Output::AllLogits, &mut all)
        .unwrap();
    let next = argmax(&all[all.len() - m.config.n_vocab..]) as u32;
    let mut step = Vec::new();
    m.forward(&[next], &mut cache, &mut s, Output::LastLogits, &mut step)
        .unwrap();
    cache.truncate(prompt.len()).unwrap();
    let tok = m
        .forward(&[next], &mut cache, &mut s, Output::Argmax, &mut Vec::new())
        .unwrap()
        .unwrap();
    (all, step, tok)
}

#[test]
fn every_isa_matches_scalar_logits() {
    let isas: Vec<Isa> = Isa::available().collect();
    println!("ISAs on this CPU: {isas:?}");
    for model in fixture_models() {
        let meta = json(&fixture(&format!("{model}/logits_seq24.json")));
        let prompt = ids(&meta["input_ids"]);
        for file in ["model-q8_0.gguf", "model-f16.gguf", "model-f32.gguf"] {
            let g = Arc::new(Gguf::open(fixture(&format!("{model}/{file}"))).unwrap());
            let load = |isa| {
                let cfg = CpuConfig {
                    threads: 2,
                    isa: Some(isa),
                };
                Model::load(CpuBackend::with_config(cfg), g.clone()).unwrap()
            };
            let want = run(&load(Isa::Scalar), &prompt);
            for &isa in &isas[1..] {
                let m = load(isa);
                assert_eq!(m.backend().isa(), isa);
                let got = run(&m, &prompt);
                for (what, a, b) in [("prefill", &got.0, &want.0), ("decode", &got.1, &want.1)] {
                    let (d, mx) = max_diff(a, b);
                    println!("{model}/{file} {isa} {what}: max|d| {d:.2e} (max|logit| {mx:.2})");
                    assert!(
                        d <= 1e-5 * mx,
                        "{model}/{file} {isa} {what}: {d} > 1e-5 * {mx}"
                    );
                }
                assert_eq!(got.2, want.2, "{model}/{file} {isa}: greedy token");
            }
        }
    }
}
