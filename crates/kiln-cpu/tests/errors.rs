//! Bad files and bad requests give errors naming the problem, not panics.

mod common;

use std::sync::Arc;

use common::*;
use kiln_cpu::CpuBackend;
use kiln_gguf::Gguf;
use kiln_model::{Model, Output};
use kiln_testdata::fixture;

/// The f32 gemma3-tiny file with every occurrence of `from` in its header
/// replaced by `to` (same length, so offsets stay valid).
fn patched(from: &str, to: &str) -> Arc<Gguf> {
    assert_eq!(from.len(), to.len());
    let mut b = std::fs::read(fixture("gemma3-tiny/model-f32.gguf")).unwrap();
    let pos = b
        .windows(from.len())
        .position(|w| w == from.as_bytes())
        .unwrap();
    b[pos..pos + to.len()].copy_from_slice(to.as_bytes());
    Arc::new(Gguf::from_bytes(b).unwrap())
}

fn load_err(g: Arc<Gguf>) -> String {
    match Model::load(CpuBackend::new(), g) {
        Ok(_) => panic!("load succeeded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_tensor_is_named() {
    let e = load_err(patched("blk.3.ffn_up.weight", "blk.3.ffn_uX.weight"));
    assert!(e.contains("blk.3.ffn_up.weight"), "{e}");
}

#[test]
fn missing_key_is_named() {
    let e = load_err(patched(
        "gemma3.embedding_length",
        "gemma3.embedding_lengtX",
    ));
    assert!(e.contains("gemma3.embedding_length"), "{e}");
}

#[test]
fn bad_requests_are_errors() {
    let m = load(&fixture("gemma3-tiny/model-f32.gguf"));
    let mut cache = m.new_cache().unwrap();
    let mut s = m.new_scratch(4).unwrap();
    let mut out = Vec::new();
    let e = m
        .forward(&[2, 9999], &mut cache, &mut s, Output::LastLogits, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("9999"), "{e}");
    let e = m
        .forward(&[2; 5], &mut cache, &mut s, Output::LastLogits, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("scratch"), "{e}");
    assert!(m
        .forward(&[], &mut cache, &mut s, Output::LastLogits, &mut out)
        .is_err());
    assert_eq!(cache.len(), 0, "failed calls must not advance the cache");
    // Past the context length (1024 for the fixtures).
    let mut s = m.new_scratch(1025).unwrap();
    let e = m
        .forward(&[2; 1025], &mut cache, &mut s, Output::Argmax, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("context length"), "{e}");
}
