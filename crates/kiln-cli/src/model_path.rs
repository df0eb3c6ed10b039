//! Which model file a command uses: `-m FILE`, `-hf REPO[:QUANT]` (from
//! the cache, downloaded on first use), else the default model.

use std::path::PathBuf;

use anyhow::{bail, Result};
use kiln_gguf::{Gguf, GgufError};
use kiln_hub::{Hub, ModelSpec};

use crate::download::DownloadProgress;

/// `-hf REPO[:QUANT]`, beside `-m` on every command that takes a model.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct HfArg {
    /// A Hugging Face model instead of a file: REPO[:QUANT], e.g.
    /// ggml-org/gemma-3-1b-it-GGUF:Q4_K_M (also -hf). Downloaded into the
    /// cache on first use (see `kiln pull --help`), offline after.
    #[arg(
        long = "hf",
        alias = "hf-repo",
        value_name = "REPO[:QUANT]",
        conflicts_with = "model"
    )]
    pub hf: Option<ModelSpec>,
}

/// The file name scripts/fetch-test-data stores the real model under.
const DEFAULT_MODEL: &str = "gemma-3-270m-q4_k_m.gguf";

/// `given`, else the model `hf` names (pulled into the cache when it is
/// not there), else `$KILN_MODEL`, else
/// `$KILN_CACHE_DIR/gemma-3-270m-q4_k_m.gguf` (cache default
/// `~/.cache/kiln`). A missing default names the command that fetches it.
pub fn resolve(given: Option<PathBuf>, hf: &HfArg) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p);
    }
    if let Some(spec) = &hf.hf {
        let model = Hub::from_env().get(spec, &mut DownloadProgress::new())?;
        return Ok(model.path);
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
            "no model given (-m or -hf) and {origin} {} is missing: run scripts/fetch-model, or pass -m MODEL or -hf REPO[:QUANT]",
            path.display()
        );
    }
    Ok(path)
}

/// Resolves and opens a model file.
pub fn open(given: Option<PathBuf>, hf: &HfArg) -> Result<(PathBuf, Gguf)> {
    let path = resolve(given, hf)?;
    match Gguf::open(&path) {
        Ok(g) => Ok((path, g)),
        // Already names the file.
        Err(e @ GgufError::Io { .. }) => Err(e.into()),
        Err(e) => Err(anyhow::Error::new(e).context(path.display().to_string())),
    }
}

/// `-hf` as llama.cpp spells it (one dash, two letters, which clap would
/// read as `-h -f`) becomes `--hf`; so does llama.cpp's `-hfr`.
pub fn normalize_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut after_dashes = false;
    args.into_iter()
        .map(|a| {
            if after_dashes {
                return a;
            }
            after_dashes = a == "--";
            match a.to_str() {
                Some("-hf" | "-hfr") => "--hf".into(),
                Some(s) if s.starts_with("-hf=") => format!("-{s}").into(),
                _ => a,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_dash_hf_becomes_two() {
        let args = [
            "kiln",
            "run",
            "-hf",
            "a/b",
            "-hf=a/b:Q8_0",
            "-hfr",
            "x",
            "--",
            "-hf",
        ];
        let out: Vec<String> = normalize_args(args.map(Into::into))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            out,
            [
                "kiln",
                "run",
                "--hf",
                "a/b",
                "--hf=a/b:Q8_0",
                "--hf",
                "x",
                "--",
                "-hf"
            ]
        );
    }
}
