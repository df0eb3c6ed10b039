//! `AnyBackend` must forward every `Backend` method, the defaulted ones
//! included: a method left to its trait default runs the unfused,
//! per-sequence composition on the GPU too, silently (the fused decode ops
//! were once lost that way). Checked on the sources, so a method added to
//! the trait fails here until `any.rs` forwards it.

/// The names of the `fn`s declared between `start` and the end of its
/// block (the first line that is exactly `}`).
fn fns_in(src: &str, start: &str) -> Vec<String> {
    let body = src
        .split_once(start)
        .unwrap_or_else(|| panic!("`{start}` not found"))
        .1;
    let body = body.split("\n}\n").next().unwrap_or("");
    let mut names: Vec<String> = body
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("fn "))
        .map(|l| l.split(['(', '<']).next().unwrap_or("").to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn any_backend_forwards_every_backend_method() {
    let trait_src = include_str!("../../kiln-model/src/backend.rs");
    let any_src = include_str!("../src/any.rs");
    let declared = fns_in(trait_src, "pub trait Backend: Send + Sync {");
    let forwarded = fns_in(any_src, "impl Backend for AnyBackend {");
    assert!(declared.len() > 20, "{declared:?}");
    let missing: Vec<_> = declared.iter().filter(|f| !forwarded.contains(f)).collect();
    assert!(
        missing.is_empty(),
        "AnyBackend does not forward {missing:?}"
    );
}
