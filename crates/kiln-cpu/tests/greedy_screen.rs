//! The greedy head (integer screen + exact re-score on Q8_0) picks the
//! same token as the argmax of the full logits, step by step, on every ISA.

mod common;

use std::sync::Arc;

use common::*;
use kiln_cpu::{CpuBackend, CpuConfig, Isa};
use kiln_gguf::Gguf;
use kiln_model::{Model, Output};
use kiln_testdata::{fixture, fixture_models};

#[test]
fn q8_0_greedy_tokens_match_logits_argmax_on_every_isa() {
    for model in fixture_models() {
        let meta = json(&fixture(&format!("{model}/logits_seq24.json")));
        let prompt = ids(&meta["input_ids"]);
        let g = Arc::new(Gguf::open(fixture(&format!("{model}/model-q8_0.gguf"))).unwrap());
        for isa in Isa::available() {
            let cfg = CpuConfig {
                threads: 2,
                isa: Some(isa),
            };
            let m = Model::load(CpuBackend::with_config(cfg), g.clone()).unwrap();
            // Same tokens into two caches: one for logits, one for Argmax.
            let (mut ca, mut cb) = (m.new_cache().unwrap(), m.new_cache().unwrap());
            let mut s = m.new_scratch(prompt.len()).unwrap();
            let (mut logits, mut input) = (Vec::new(), prompt.clone());
            for step in 0..8 {
                m.forward(&input, &mut ca, &mut s, Output::LastLogits, &mut logits)
                    .unwrap();
                let got = m
                    .forward(&input, &mut cb, &mut s, Output::Argmax, &mut Vec::new())
                    .unwrap();
                let want = argmax(&logits) as u32;
                assert_eq!(got, Some(want), "{model} {isa} step {step}");
                input = vec![want];
            }
        }
    }
}
