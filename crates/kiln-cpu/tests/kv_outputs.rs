//! KvCache rewind, the partial/all-position outputs and NaN reporting, on
//! the tiny Gemma 3 fixture (sliding window 16, tied embeddings).

mod common;

use std::sync::Arc;

use common::*;
use kiln_cpu::CpuBackend;
use kiln_gguf::{write::GgufWriter, Gguf};
use kiln_model::{BatchSeq, Model, ModelError, Output};

fn tiny() -> Model<CpuBackend> {
    load(&kiln_testdata::fixture("gemma3-tiny/model-f32.gguf"))
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 2 + (i * 37 + salt * 11) % 700)
        .collect()
}

fn last_logits(m: &Model<CpuBackend>, toks: &[u32]) -> Vec<f32> {
    let all = all_logits(m, toks);
    all[all.len() - m.config.n_vocab..].to_vec()
}

#[test]
fn truncate_then_extend_equals_a_fresh_run() {
    let m = tiny();
    let a = tokens(12, 0);
    let mut b = a[..8].to_vec();
    b.extend(tokens(4, 5));
    let mut cache = m.new_cache().unwrap();
    let mut s = m.new_scratch(16).unwrap();
    let mut out = Vec::new();
    m.forward(&a, &mut cache, &mut s, Output::LastLogits, &mut out)
        .unwrap();
    cache.truncate(8).unwrap();
    assert_eq!(cache.len(), 8);
    m.forward(&b[8..], &mut cache, &mut s, Output::LastLogits, &mut out)
        .unwrap();
    let (d, _) = max_diff(&out, &last_logits(&m, &b));
    assert!(d < 1e-5, "rewound run differs by {d}");
}

#[test]
fn truncate_refuses_when_the_ring_overwrote_needed_rows() {
    let m = tiny();
    let a = tokens(40, 1);
    let mut cache = m.new_cache().unwrap();
    let mut s = m.new_scratch(40).unwrap();
    let mut out = Vec::new();
    m.forward(&a, &mut cache, &mut s, Output::LastHidden, &mut out)
        .unwrap();
    // Position 30 needs keys back to 15, overwritten by 31 in a 16-row ring.
    let e = cache.truncate(30).unwrap_err();
    assert!(e.to_string().contains("overwrote"), "{e}");
    assert_eq!(
        cache.len(),
        40,
        "a refused rewind leaves the cache as it was"
    );
    assert!(cache.truncate(41).is_err());
    // Dropping one position is always sound, and equals a fresh run.
    cache.truncate(39).unwrap();
    let mut b = a[..39].to_vec();
    b.push(9);
    m.forward(&[9], &mut cache, &mut s, Output::LastLogits, &mut out)
        .unwrap();
    let (d, _) = max_diff(&out, &last_logits(&m, &b));
    assert!(d < 1e-5, "{d}");
    cache.truncate(0).unwrap();
    assert!(cache.is_empty());
}

#[test]
fn partial_and_all_position_outputs_agree_with_full_ones() {
    let m = tiny();
    let (v, d) = (m.config.n_vocab, m.config.n_embd);
    let t = tokens(10, 2);
    let all = all_logits(&m, &t);
    let mut s = m.new_scratch(10).unwrap();
    let mut out = Vec::new();
    let mut cache = m.new_cache().unwrap();
    m.forward(&t, &mut cache, &mut s, Output::LogitsFrom(6), &mut out)
        .unwrap();
    assert_eq!(out.len(), 4 * v);
    assert_eq!(max_diff(&out, &all[6 * v..]).0, 0.0);

    let mut cache = m.new_cache().unwrap();
    let mut hidden = Vec::new();
    m.forward(&t, &mut cache, &mut s, Output::AllHidden, &mut hidden)
        .unwrap();
    assert_eq!(hidden.len(), 10 * d);
    let mut cache = m.new_cache().unwrap();
    m.forward(&t, &mut cache, &mut s, Output::LastHidden, &mut out)
        .unwrap();
    assert_eq!(max_diff(&out, &hidden[9 * d..]).0, 0.0);

    let mut cache = m.new_cache().unwrap();
    assert!(matches!(
        m.forward(&t, &mut cache, &mut s, Output::LogitsFrom(10), &mut out),
        Err(ModelError::Invalid(_))
    ));
    assert!(cache.is_empty());
}

/// The fixture with row `row` of the (tied) token embedding set to NaN.
pub fn poisoned(row: usize) -> Arc<Gguf> {
    let g = Gguf::open(kiln_testdata::fixture("gemma3-tiny/model-f32.gguf")).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.metadata(k.clone(), v.clone());
    }
    for t in g.tensor_infos() {
        let mut data = g.tensor(&t.name).unwrap().data.to_vec();
        if t.name == "token_embd.weight" {
            let cols = t.dims[0] as usize;
            for c in 0..cols {
                let at = (row * cols + c) * 4;
                data[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
            }
        }
        w.tensor(t.name.clone(), &t.dims, t.ty, data).unwrap();
    }
    Arc::new(Gguf::from_bytes(w.to_bytes().unwrap()).unwrap())
}

#[test]
fn nan_logits_are_errors_on_every_output_path() {
    let m = Model::load(CpuBackend::new(), poisoned(300)).unwrap();
    let t = [2u32, 10, 11];
    let mut s = m.new_scratch(4).unwrap();
    let mut out = Vec::new();
    for output in [Output::Argmax, Output::LastLogits, Output::AllLogits] {
        let mut cache = m.new_cache().unwrap();
        match m.forward(&t, &mut cache, &mut s, output, &mut out) {
            Err(ModelError::NonFiniteLogit {
                token: 300,
                value,
                pos,
            }) => {
                assert!(value.is_nan());
                assert!(pos < 3, "{output:?}: pos {pos}");
            }
            other => panic!("{output:?}: {other:?}"),
        }
        assert!(cache.is_empty(), "a failed forward commits nothing");
    }
    let mut cache = m.new_cache().unwrap();
    let e = m
        .forward(&t, &mut cache, &mut s, Output::Argmax, &mut out)
        .unwrap_err();
    assert_eq!(e.to_string(), "NaN in logits at position 2 (token 300)");
}

/// Layers store their K/V as they go, so a forward that fails after them
/// (here: NaN logits) keeps the cache's length while the 16-row rings had
/// room for the batch, leaving it as good as before, and empties it once
/// the batch had overwritten ring rows the cache still needed.
#[test]
fn failed_forward_leaves_a_consistent_cache() {
    let m = Model::load(CpuBackend::new(), poisoned(300)).unwrap();
    let (a, b, c) = (tokens(6, 2), tokens(4, 3), tokens(8, 4));
    let mut s = m.new_scratch(8).unwrap();
    let mut out = Vec::new();
    let mut cache = m.new_cache().unwrap();
    m.forward(&a, &mut cache, &mut s, Output::LastHidden, &mut out)
        .unwrap();
    assert!(m
        .forward(&b, &mut cache, &mut s, Output::LastLogits, &mut out)
        .is_err());
    assert_eq!(cache.len(), 6, "6 + 4 positions fit the rings");
    m.forward(&c, &mut cache, &mut s, Output::LastHidden, &mut out)
        .unwrap();
    let mut fresh = m.new_cache().unwrap();
    let mut want = Vec::new();
    let ac: Vec<u32> = a.iter().chain(&c).copied().collect();
    let mut s14 = m.new_scratch(14).unwrap();
    m.forward(&ac, &mut fresh, &mut s14, Output::LastHidden, &mut want)
        .unwrap();
    let (d, _) = max_diff(&out, &want);
    assert!(d < 1e-5, "continuing after the failure differs by {d}");
    // 14 + 4 > 16: the batch overwrote rows of positions 0 and 1.
    assert!(m
        .forward(&b, &mut cache, &mut s, Output::LastLogits, &mut out)
        .is_err());
    assert!(cache.is_empty());
}

/// In a batch, a sequence whose greedy head meets a NaN logit fails alone
/// (its cache rolled back) while a full-logits sequence of the same step
/// reports its own error and the step itself succeeds.
#[test]
fn nan_logits_fail_each_batched_sequence_alone() {
    let m = Model::load(CpuBackend::new(), poisoned(300)).unwrap();
    let mut s = m.new_scratch(8).unwrap();
    let (a, b) = ([2u32, 10], [2u32, 11, 12]);
    let (mut ca, mut cb, mut cc) = (
        m.new_cache().unwrap(),
        m.new_cache().unwrap(),
        m.new_cache().unwrap(),
    );
    let (mut oa, mut ob, mut oc) = (Vec::new(), Vec::new(), Vec::new());
    let mut seqs = [
        BatchSeq {
            tokens: &a,
            cache: &mut ca,
            output: Output::Argmax,
            out: &mut oa,
            sampler: None,
        },
        BatchSeq {
            tokens: &b,
            cache: &mut cb,
            output: Output::Argmax,
            out: &mut ob,
            sampler: None,
        },
        BatchSeq {
            tokens: &a,
            cache: &mut cc,
            output: Output::LastLogits,
            out: &mut oc,
            sampler: None,
        },
    ];
    let results = m.forward_batch(&mut seqs, &mut s).unwrap();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Err(e @ ModelError::NonFiniteLogit { .. }) => {
                let pos = if i == 1 { 2 } else { 1 };
                assert!(
                    e.to_string()
                        .starts_with(&format!("NaN in logits at position {pos}")),
                    "{e}"
                );
            }
            other => panic!("sequence {i}: {other:?}"),
        }
    }
    assert!(ca.is_empty() && cb.is_empty() && cc.is_empty());
}
