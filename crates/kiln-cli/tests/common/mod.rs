//! Runs the built `kiln` binary.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

/// Runs kiln and returns stdout, failing the test with stderr on a non-zero exit.
pub fn kiln_ok(args: &[&str]) -> String {
    let out = kiln(args);
    assert!(
        out.status.success(),
        "kiln {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

pub fn kiln_json(args: &[&str]) -> serde_json::Value {
    let out = kiln_ok(args);
    assert_eq!(out.lines().count(), 1, "one JSON line expected:\n{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("kiln {args:?}: {e}\n{out}"))
}

/// A fresh folder under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("kiln-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Asserts that a JSON object's text starts with `keys`, in this order
/// (serde_json's `Value` does not keep key order).
pub fn assert_leading_keys(raw: &str, keys: &[&str]) {
    let mut at = 0;
    for (i, k) in keys.iter().enumerate() {
        let needle = format!("{}\"{k}\":", if i == 0 { "{" } else { "," });
        let found = raw[at..]
            .find(&needle)
            .unwrap_or_else(|| panic!("key {k:?} not in order in {raw}"));
        if i == 0 {
            assert_eq!(found, 0, "{raw} does not start with {k:?}");
        }
        at += found + needle.len();
    }
}
