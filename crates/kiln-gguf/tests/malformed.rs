//! Every malformed variant of real fixture files gives the error variant it
//! must (and its byte offset where it has one), never a panic.

use kiln_gguf::{malformed, Gguf};

fn check(rel: &str) -> usize {
    let bytes = std::fs::read(kiln_testdata::fixture(rel)).unwrap();
    let variants = malformed::variants(&bytes).unwrap();
    let mut names: Vec<&str> = variants.iter().map(|v| v.name.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), variants.len(), "variant names must be unique");
    let mut wrong = Vec::new();
    for v in &variants {
        match Gguf::from_bytes(v.bytes.clone()) {
            Ok(_) => wrong.push(format!("{}: parsed, expected {}", v.name, v.expect_name)),
            Err(e) if !(v.expect)(&e) => {
                wrong.push(format!("{}: got {e:?}, expected {}", v.name, v.expect_name))
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    !msg.is_empty() && !msg.contains('\n'),
                    "{}: {msg:?}",
                    v.name
                );
            }
        }
    }
    assert!(wrong.is_empty(), "{rel}:\n{}", wrong.join("\n"));
    variants.len()
}

#[test]
fn gemma3_q8_0_variants() {
    let n = check("gemma3-tiny/model-q8_0.gguf");
    assert!(n >= 30, "{n} variants");
}

#[test]
fn gemma4_e2b_f32_variants() {
    let n = check("gemma4-e2b-tiny/model-f32.gguf");
    assert!(n >= 30, "{n} variants");
}

/// Every section boundary is covered: each KV and each tensor info.
#[test]
fn truncations_cover_every_section() {
    let bytes = std::fs::read(kiln_testdata::fixture("gemma2-tiny/model-f16.gguf")).unwrap();
    let g = Gguf::from_bytes(bytes.clone()).unwrap();
    let v = malformed::variants(&bytes).unwrap();
    let count = |prefix: &str| v.iter().filter(|m| m.name.starts_with(prefix)).count();
    assert_eq!(count("truncated_after_kv"), g.metadata().len());
    assert_eq!(
        count("truncated_after_tensor_info"),
        g.tensor_infos().len() - 1 + 1
    );
    for name in [
        "truncated_empty",
        "truncated_after_magic",
        "truncated_after_version",
        "truncated_after_counts",
        "truncated_at_data_start",
        "truncated_mid_last_tensor",
    ] {
        assert_eq!(count(name), 1, "{name}");
    }
}

#[test]
fn error_messages_name_the_offset() {
    let bytes = std::fs::read(kiln_testdata::fixture("gemma3-tiny/model-f32.gguf")).unwrap();
    let v = malformed::variants(&bytes).unwrap();
    let msg = |name: &str| {
        let m = v
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no variant {name}"));
        Gguf::from_bytes(m.bytes.clone()).unwrap_err().to_string()
    };
    assert_eq!(
        msg("truncated_after_version"),
        "file truncated at offset 8: needed 8 more bytes for tensor count"
    );
    assert_eq!(
        msg("version_0x1"),
        "unsupported GGUF version 1 at offset 4 (supported: 2, 3)"
    );
    assert!(msg("tensor0_type_1000").contains("unknown ggml type 1000 at offset"));
    assert!(msg("alignment_3").starts_with("general.alignment 3 at offset"));
}
