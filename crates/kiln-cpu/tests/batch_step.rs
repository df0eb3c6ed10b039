//! A batched step (`forward_batch`) gives every sequence the logits it
//! gets alone, on every fixture, with decode rows over short and long
//! caches: the batch runs its one-row sequences' attention side by side
//! (one per task), long caches split across keys as a lone call splits
//! them, and RoPE takes each row's own position from the step's table.

mod common;

use common::*;
use kiln_model::{BatchSeq, Output};
use kiln_testdata::{fixture, fixture_models};

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 2 + (i * 37 + salt * 11) % 700)
        .collect()
}

#[test]
fn batched_decode_rows_match_each_sequence_alone() {
    // (positions already cached, new tokens): decode rows past the
    // 16-row windows, over 600 and 1,000 keys (split across threads when
    // alone), a first token, and a prompt chunk sharing the step.
    let plan: [(usize, usize); 6] = [(40, 1), (600, 1), (0, 1), (1000, 1), (0, 9), (3, 1)];
    for model in fixture_models() {
        let m = load(&fixture(&format!("{model}/model-f32.gguf")));
        let mut s = m.new_scratch(64).unwrap();
        let mut prefill = m.new_scratch(1000).unwrap();
        let mut alone = Vec::new();
        let mut caches = Vec::new();
        for (i, &(p, n)) in plan.iter().enumerate() {
            let toks = tokens(p + n, i as u32);
            let mut out = Vec::new();
            let mut solo = m.new_cache().unwrap();
            let mut batched = m.new_cache().unwrap();
            if p > 0 {
                for c in [&mut solo, &mut batched] {
                    m.forward(&toks[..p], c, &mut prefill, Output::LastLogits, &mut out)
                        .unwrap();
                }
            }
            m.forward(&toks[p..], &mut solo, &mut s, Output::LastLogits, &mut out)
                .unwrap();
            alone.push(out);
            caches.push((batched, toks));
        }
        let mut outs: Vec<Vec<f32>> = plan.iter().map(|_| Vec::new()).collect();
        let mut seqs: Vec<BatchSeq<'_, _>> = caches
            .iter_mut()
            .zip(outs.iter_mut())
            .zip(&plan)
            .map(|(((cache, toks), out), &(p, _))| BatchSeq {
                tokens: &toks[p..],
                cache,
                output: Output::LastLogits,
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
                "{model} sequence {i} {:?}: batched vs alone max|d| {d}",
                plan[i]
            );
        }
    }
}
