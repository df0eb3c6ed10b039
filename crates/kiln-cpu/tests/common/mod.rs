#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use kiln_cpu::CpuBackend;
use kiln_gguf::Gguf;
use kiln_model::{Model, Output};

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
