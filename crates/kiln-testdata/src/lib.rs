//! Where tests find their data. Nothing here downloads: the data comes from
//! `scripts/fetch-test-data` (into `$KILN_CACHE_DIR`, default
//! `~/.cache/kiln`) and from the `shared/` folder beside the checkout.
//! A missing file is a test failure that says which command fetches it.

use std::path::PathBuf;

/// The workspace root (this crate lives in `crates/kiln-testdata`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// `$KILN_CACHE_DIR`, default `~/.cache/kiln`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KILN_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/kiln")
}

/// `shared/` beside the checkout (`$KILN_SHARED_DIR` overrides).
pub fn shared_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KILN_SHARED_DIR") {
        return PathBuf::from(d);
    }
    workspace_root().join("../shared")
}

fn must_exist(p: PathBuf, how: &str) -> PathBuf {
    assert!(p.exists(), "{} is missing: {how}", p.display());
    p
}

/// The real model, Gemma 3 270M Q4_K_M (`$KILN_MODEL` overrides).
pub fn real_model() -> PathBuf {
    let p = std::env::var_os("KILN_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("gemma-3-270m-q4_k_m.gguf"));
    must_exist(p, "run scripts/fetch-test-data")
}

/// A file under `shared/fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    must_exist(
        shared_dir().join("fixtures").join(rel),
        "shared/ must sit beside the checkout",
    )
}

/// A file under `shared/refdata/`.
pub fn refdata(rel: &str) -> PathBuf {
    must_exist(
        shared_dir().join("refdata").join(rel),
        "shared/ must sit beside the checkout",
    )
}

/// A llama.cpp tokenizer test file (`ggml-vocab-*.gguf[.inp|.out]`).
pub fn llama_vocab(name: &str) -> PathBuf {
    must_exist(
        cache_dir().join("llama-vocab").join(name),
        "run scripts/fetch-test-data",
    )
}

/// The fixture model folders (`gemma2-tiny`, …), sorted.
pub fn fixture_models() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(shared_dir().join("fixtures"))
        .expect("shared/fixtures")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("model-f32.gguf").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
