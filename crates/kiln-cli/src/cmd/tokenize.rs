//! `kiln tokenize`: text (or a file's exact bytes) to token ids.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use kiln_tokenizer::Tokenizer;

use crate::model_path;

/// Print the token ids of a text.
///
/// By default BOS comes first and special-token text such as
/// `<start_of_turn>` is tokenized as plain text (--special parses it).
#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("input").required(true))]
pub struct Args {
    /// GGUF model whose tokenizer to use (default: see `kiln --help`).
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub hf: crate::model_path::HfArg,
    /// Do not prepend BOS.
    #[arg(long)]
    pub no_bos: bool,
    /// Parse special-token text (`<bos>`, `<start_of_turn>`, ...) as the
    /// special tokens instead of as plain text.
    #[arg(long)]
    pub special: bool,
    /// Print `{"ids":[...],"pieces":[...]}` (pieces with specials rendered;
    /// invalid UTF-8 replaced by U+FFFD).
    #[arg(long)]
    pub json: bool,
    /// The text to tokenize.
    #[arg(group = "input", value_name = "TEXT")]
    pub text: Option<std::ffi::OsString>,
    /// Tokenize this file's bytes exactly (no newline stripped; may be
    /// invalid UTF-8); `-` reads stdin.
    #[arg(long, group = "input", value_name = "PATH")]
    pub file: Option<PathBuf>,
}

/// The input's bytes: a file read exactly, or the argument's bytes.
fn input(a: &Args) -> Result<Vec<u8>> {
    if let Some(path) = &a.file {
        if path.as_os_str() == "-" {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("reading stdin")?;
            return Ok(buf);
        }
        return std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    }
    let text = a.text.clone().unwrap_or_default();
    Ok(os_bytes(text))
}

#[cfg(unix)]
fn os_bytes(s: std::ffi::OsString) -> Vec<u8> {
    use std::os::unix::ffi::OsStringExt;
    s.into_vec()
}

#[cfg(not(unix))]
fn os_bytes(s: std::ffi::OsString) -> Vec<u8> {
    s.to_string_lossy().into_owned().into_bytes()
}

/// Builds the tokenizer of the resolved model.
pub fn load(model: Option<PathBuf>, hf: &crate::model_path::HfArg) -> Result<Tokenizer> {
    let (path, g) = model_path::open(model, hf)?;
    Tokenizer::from_gguf(&g).with_context(|| format!("{}: tokenizer", path.display()))
}

pub fn run(a: Args) -> Result<()> {
    let text = input(&a)?;
    let tok = load(a.model.clone(), &a.hf)?;
    let ids = tok.encode(&text, !a.no_bos, a.special);
    let mut out = std::io::stdout().lock();
    if a.json {
        let pieces = ids
            .iter()
            .map(|&id| Ok(String::from_utf8_lossy(&tok.token_to_piece(id, true)?).into_owned()))
            .collect::<Result<Vec<String>>>()?;
        serde_json::to_writer(
            &mut out,
            &serde_json::json!({ "ids": ids, "pieces": pieces }),
        )?;
        writeln!(out)?;
    } else {
        let line: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "{}", line.join(" "))?;
    }
    out.flush()?;
    Ok(())
}
