//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;

use kiln_gguf::Gguf;
use kiln_tokenizer::Tokenizer;

pub fn load(path: &Path) -> Tokenizer {
    let g = Gguf::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn json(path: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).expect("valid json")
}

pub fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() & 1 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Cases of a llama.cpp `ggml-vocab-*.gguf.inp/.out` pair, split exactly as
/// tests/test-tokenizer-0.cpp does (separator "\n__ggml_vocab_test__\n";
/// later duplicates of an input replace earlier ones there, so they are
/// dropped here too).
pub fn llama_vocab_cases(inp: &Path, out: &Path) -> Vec<(Vec<u8>, Vec<u32>)> {
    let raw = std::fs::read(inp).expect("inp");
    let sep = b"\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].windows(sep.len()).position(|w| w == sep) {
            Some(p) => {
                inputs.push(raw[pos..pos + p].to_vec());
                pos += p + sep.len();
            }
            None => {
                inputs.push(raw[pos..].to_vec());
                break;
            }
        }
    }
    let outs: Vec<Vec<u32>> = std::fs::read_to_string(out)
        .expect("out")
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(inputs.len(), outs.len(), "inp/out case counts differ");
    let mut cases: Vec<(Vec<u8>, Vec<u32>)> = Vec::new();
    for (i, o) in inputs.into_iter().zip(outs) {
        if let Some(c) = cases.iter_mut().find(|c| c.0 == i) {
            c.1 = o;
        } else {
            cases.push((i, o));
        }
    }
    cases
}
