#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use kiln_cpu::{CpuBackend, CpuConfig, Isa};
use kiln_gguf::Gguf;
use kiln_model::{BatchSeq, Model, Output};
use kiln_testdata::{fixture, fixture_models};

/// The SIMD levels this CPU runs (every path the exactness tests hold to
/// the budget; the scalar one is the kernels' reference).
pub fn simd_levels() -> Vec<Isa> {
    Isa::available().filter(|&i| i != Isa::Scalar).collect()
}

/// The model on kernels forced to `isa` (default threads).
pub fn load_isa(path: &Path, isa: Isa) -> Model<CpuBackend> {
    let g = Arc::new(Gguf::open(path).unwrap());
    let cfg = CpuConfig {
        threads: 0,
        isa: Some(isa),
    };
    let m = Model::load(CpuBackend::with_config(cfg), g).unwrap();
    assert_eq!(m.backend().isa(), isa);
    m
}

pub fn load(path: &Path) -> Model<CpuBackend> {
    let g = Arc::new(Gguf::open(path).unwrap());
    Model::load(CpuBackend::new(), g).unwrap()
}

pub fn read_f32(path: &Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap();
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Logits of every position of `tokens`, in one prefill.
pub fn all_logits(m: &Model<CpuBackend>, tokens: &[u32]) -> Vec<f32> {
    let mut cache = m.new_cache().unwrap();
    let mut s = m.new_scratch(tokens.len()).unwrap();
    let mut out = Vec::new();
    m.forward(tokens, &mut cache, &mut s, Output::AllLogits, &mut out)
        .unwrap();
    out
}

pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// max |a - b| and max |b|.
pub fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let d = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    let m = b.iter().map(|x| x.abs()).fold(0.0f32, f32::max);
    (d, m)
}

/// A batch's greedy heads (one screen pass over the head for all rows,
/// and the exact path for types the screen does not cover) pick what
/// each sequence's own logits give, on every ISA and head type.
pub fn check_batched_greedy_heads() {
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
                    sampler: None,
                })
                .collect();
            let got = m.forward_batch(&mut seqs, &mut s).unwrap();
            let got: Vec<u32> = got.into_iter().map(|r| r.unwrap().unwrap()).collect();
            assert_eq!(got, want, "{model} {isa}");
            // After a batch (where VNNI packs the head's screen tiles), a
            // lone sequence's head takes them too.
            for (p, &w) in prompts.iter().zip(&want) {
                let mut c = m.new_cache().unwrap();
                let mut out = Vec::new();
                let id = m.forward(p, &mut c, &mut s, Output::Argmax, &mut out);
                assert_eq!(id.unwrap(), Some(w), "{model} {isa} alone after a batch");
            }
        }
    }
}

/// Checks that one sequence's greedy head picks its logits' argmax for 8
/// steps, on every ISA, for every fixture family's Q8_0 file.
pub fn check_single_greedy_heads() {
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
            check_greedy_steps(&m, &prompt, 8, &format!("{model} {isa}"));
        }
    }
}

/// Checks that `m`'s greedy head picks its logits' argmax after `prompt`
/// and for `steps - 1` decode steps after it (`what` names the case).
pub fn check_greedy_steps(m: &Model<CpuBackend>, prompt: &[u32], steps: usize, what: &str) {
    // Same tokens into two caches: one for logits, one for Argmax.
    let (mut ca, mut cb) = (m.new_cache().unwrap(), m.new_cache().unwrap());
    let mut s = m.new_scratch(prompt.len()).unwrap();
    let (mut logits, mut input) = (Vec::new(), prompt.to_vec());
    for step in 0..steps {
        m.forward(&input, &mut ca, &mut s, Output::LastLogits, &mut logits)
            .unwrap();
        let got = m
            .forward(&input, &mut cb, &mut s, Output::Argmax, &mut Vec::new())
            .unwrap();
        let want = argmax(&logits) as u32;
        assert_eq!(got, Some(want), "{what} step {step}");
        input = vec![want];
    }
}
