//! `REPO[:QUANT]`, as `kiln pull` and `-hf` take it.

use std::fmt;
use std::str::FromStr;

use crate::HubError;

/// A Hub repository and, optionally, which quantization of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// `OWNER/NAME` (or a legacy `NAME`).
    pub repo: String,
    /// A quant tag (`Q4_K_M`, case-insensitive) or a file name; None: the
    /// repository's Q4_K_M, else its smallest model.
    pub quant: Option<String>,
}

impl FromStr for ModelSpec {
    type Err = HubError;

    /// Parses `OWNER/NAME[:QUANT]`; an `hf.co/` or
    /// `https://huggingface.co/` prefix is dropped.
    fn from_str(s: &str) -> Result<ModelSpec, HubError> {
        let bad = |why: &str| HubError::BadSpec {
            spec: s.to_string(),
            why: why.to_string(),
        };
        let mut rest = s.trim();
        for prefix in ["https://", "http://"] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        for prefix in ["huggingface.co/", "hf.co/"] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        let (repo, quant) = match rest.split_once(':') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        if quant.is_some_and(|q| q.is_empty() || q.contains(['/', '\\'])) {
            return Err(bad(
                "QUANT after ':' must be a tag such as Q4_K_M or a file name",
            ));
        }
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() > 2 || !parts.iter().all(|p| valid_name(p)) {
            return Err(bad(
                "expected OWNER/NAME[:QUANT], e.g. ggml-org/gemma-3-1b-it-GGUF:Q4_K_M",
            ));
        }
        Ok(ModelSpec {
            repo: repo.to_string(),
            quant: quant.map(str::to_string),
        })
    }
}

impl fmt::Display for ModelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.quant {
            Some(q) => write!(f, "{}:{q}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

/// A Hub name segment: letters, digits, `-`, `_`, `.`; no `..` (it also
/// becomes a cache folder name).
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && !s.contains("..")
        && !s.starts_with(['.', '-'])
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<(String, Option<String>), String> {
        s.parse::<ModelSpec>()
            .map(|m| (m.repo, m.quant))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn repo_and_quant() {
        let some = |r: &str, q: Option<&str>| Ok((r.to_string(), q.map(str::to_string)));
        assert_eq!(
            parse("ggml-org/gemma-3-1b-it-GGUF"),
            some("ggml-org/gemma-3-1b-it-GGUF", None)
        );
        assert_eq!(parse("a/b:q4_k_m"), some("a/b", Some("q4_k_m")));
        assert_eq!(parse("hf.co/a/b:Q8_0"), some("a/b", Some("Q8_0")));
        assert_eq!(parse("https://huggingface.co/a/b"), some("a/b", None));
        assert_eq!(parse("gpt2"), some("gpt2", None));
        assert_eq!(
            "a/b:F16".parse::<ModelSpec>().unwrap().to_string(),
            "a/b:F16"
        );
    }

    #[test]
    fn bad_specs_say_what_is_expected() {
        for s in [
            "", "a/b/c", "a/", "/b", "a/..", "a/b:", "a/b:x/y", "a b/c", "../x",
        ] {
            let e = parse(s).unwrap_err();
            assert!(e.contains(&format!("{s:?}")), "{s}: {e}");
        }
    }
}
