//! Which model file a command uses when none is given.

use std::path::PathBuf;

use anyhow::{bail, Result};
use kiln_gguf::{Gguf, GgufError};

/// The file name scripts/fetch-test-data stores the real model under.
const DEFAULT_MODEL: &str = "gemma-3-270m-q4_k_m.gguf";

/// `given`, else `$KILN_MODEL`, else `$KILN_CACHE_DIR/gemma-3-270m-q4_k_m.gguf`
/// (cache default `~/.cache/kiln`). A missing default names the command
/// that fetches it.
pub fn resolve(given: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p);
    }
    let (path, origin) = match std::env::var_os("KILN_MODEL") {
        Some(p) => (PathBuf::from(p), "$KILN_MODEL"),
        None => {
            let cache = match std::env::var_os("KILN_CACHE_DIR") {
                Some(d) => PathBuf::from(d),
                None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                    .join(".cache/kiln"),
            };
            (cache.join(DEFAULT_MODEL), "the default model")
        }
    };
    if !path.exists() {
        bail!(
            "no model given (-m) and {origin} {} is missing: run scripts/fetch-test-data or pass -m MODEL",
            path.display()
        );
    }
    Ok(path)
}

/// Resolves and opens a model file.
pub fn open(given: Option<PathBuf>) -> Result<(PathBuf, Gguf)> {
    let path = resolve(given)?;
    match Gguf::open(&path) {
        Ok(g) => Ok((path, g)),
        // Already names the file.
        Err(e @ GgufError::Io { .. }) => Err(e.into()),
        Err(e) => Err(anyhow::Error::new(e).context(path.display().to_string())),
    }
}
