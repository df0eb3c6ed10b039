//! The greedy head (integer screen + exact re-score on Q8_0) picks the
//! same token as the argmax of the full logits, step by step, on every ISA.

mod common;

use std::sync::Arc;

use common::*;
use kiln_cpu::{CpuBackend, CpuConfig, Isa};
use kiln_gguf::Gguf;
use kiln_model::{BatchSeq, Model, Output};
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

/// A batch's greedy heads (one screen pass over the head for all rows,
/// and the exact path for types the screen does not cover) pick what
/// each sequence's own logits give, on every ISA and head type.
#[test]
fn batched_greedy_heads_match_each_sequences_logits() {
    for (model, file) in [
        ("gemma3-tiny", "model-q8_0.gguf"),
        ("gemma2-tiny", "model-f32.gguf"),
    ] {
        let g = Arc::new(Gguf::open(fixture(&format!("{model}/{file}"))).unwrap());
        for isa in Isa::available() {
            let cfg = CpuConfig {
                threads: 2,
                isa: Some(isa),
            };
            let m = Model::load(CpuBackend::with_config(cfg), g.clone()).unwrap();
            let prompts: Vec<Vec<u32>> = (0..5u32)
                .map(|i| (0..3 + i).map(|j| 2 + (i * 37 + j * 11) % 200).collect())
                .collect();
            let mut s = m.new_scratch(64).unwrap();
            let mut caches: Vec<_> = prompts.iter().map(|_| m.new_cache().unwrap()).collect();
            let mut outs = vec![Vec::new(); prompts.len()];
            let mut want = Vec::new();
            for (p, out) in prompts.iter().zip(&mut outs) {
                let mut c = m.new_cache().unwrap();
                m.forward(p, &mut c, &mut s, Output::LastLogits, out)
                    .unwrap();
                want.push(argmax(out) as u32);
            }
            let mut seqs: Vec<BatchSeq<'_, CpuBackend>> = prompts
                .iter()
                .zip(caches.iter_mut())
                .zip(outs.iter_mut())
                .map(|((p, cache), out)| BatchSeq {
                    tokens: p,
                    cache,
                    output: Output::Argmax,
                    out,
                })
                .collect();
            let got = m.forward_batch(&mut seqs, &mut s).unwrap();
            let got: Vec<u32> = got.into_iter().map(|r| r.unwrap().unwrap()).collect();
            assert_eq!(got, want, "{model} {isa}");
        }
    }
}
