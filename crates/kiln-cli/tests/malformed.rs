//! `kiln inspect` on every malformed variant of a real fixture exits 1 with
//! a one-line `error: ...` naming the problem, and never panics.

mod common;

use common::{kiln, TempDir};
use kiln_gguf::malformed;

#[test]
fn inspect_rejects_every_malformed_variant() {
    let base = std::fs::read(kiln_testdata::fixture("gemma3-tiny/model-q8_0.gguf")).unwrap();
    let variants = malformed::variants(&base).unwrap();
    assert!(variants.len() >= 30, "{} variants", variants.len());
    let dir = TempDir::new("malformed");
    let mut wrong = Vec::new();
    for v in &variants {
        let path = dir.0.join(format!("{}.gguf", v.name));
        std::fs::write(&path, &v.bytes).unwrap();
        let out = kiln(&["inspect", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let ok = out.status.code() == Some(1)
            && stderr.starts_with("error: ")
            && stderr.lines().count() == 1
            && stderr.contains(path.to_str().unwrap())
            && !stderr.contains("panicked");
        if !ok {
            wrong.push(format!(
                "{} ({}): {:?} {stderr}",
                v.name,
                v.expect_name,
                out.status.code()
            ));
        }
        std::fs::remove_file(&path).unwrap();
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn inspect_names_the_problem() {
    let base = std::fs::read(kiln_testdata::fixture("gemma3-tiny/model-f32.gguf")).unwrap();
    let dir = TempDir::new("named");
    let cases = [
        (
            "truncated_mid_last_tensor",
            "lies outside the file's data section",
        ),
        ("version_0x4", "unsupported GGUF version 4 at offset 4"),
        (
            "tensor0_offset_misaligned",
            "is not a multiple of the alignment 32",
        ),
        (
            "duplicate_key",
            "duplicate metadata key \"general.architecture\"",
        ),
        ("alignment_0", "general.alignment 0 at offset"),
    ];
    let variants = malformed::variants(&base).unwrap();
    for (name, needle) in cases {
        let v = variants
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no {name}"));
        let path = dir.0.join("f.gguf");
        std::fs::write(&path, &v.bytes).unwrap();
        let out = kiln(&["inspect", "--json", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: no partial JSON");
        assert!(stderr.contains(needle), "{name}: {stderr}");
    }
}

#[test]
fn missing_files_and_models_are_errors() {
    let out = kiln(&["inspect", "/nonexistent/model.gguf"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: cannot open /nonexistent/model.gguf: No such file or directory (os error 2)\n"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["tokenize", "hi"])
        .env("KILN_MODEL", "/nonexistent/default.gguf")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("/nonexistent/default.gguf is missing: run scripts/fetch-model"),
        "{stderr}"
    );
    let empty = TempDir::new("cache");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["inspect"])
        .env_remove("KILN_MODEL")
        .env("KILN_CACHE_DIR", &empty.0)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("gemma-3-270m-q4_k_m.gguf is missing: run scripts/fetch-model"),
        "{stderr}"
    );
}
