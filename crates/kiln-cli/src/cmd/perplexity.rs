//! `kiln perplexity`: llama-perplexity's chunked perplexity of a text file.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::common::{ModelArgs, Progress, ENV_HELP};

/// Perplexity of a text file, computed as llama.cpp's llama-perplexity does.
///
/// The file is tokenized whole (BOS first, control-token text not parsed,
/// one trailing newline dropped) and cut into chunks of CTX tokens (the
/// tail that does not fill a chunk is dropped; at least 2 chunks are
/// needed). Each chunk starts with BOS in an empty cache and only its second
/// half is scored. The running PPL after each chunk (`[1]x,[2]y,...`) goes
/// to stderr and the final `PPL = x +/- stderr` to stdout.
#[derive(clap::Args)]
#[command(after_long_help = ENV_HELP)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score (UTF-8; `-` reads stdin).
    #[arg(short = 'f', long = "file", value_name = "TEXT_FILE")]
    pub file: PathBuf,
    /// Tokens per chunk.
    #[arg(
        short = 'c',
        long = "ctx-size",
        value_name = "CTX",
        default_value_t = 512
    )]
    pub n_ctx: usize,
    /// Score only the first N chunks (at least 2).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..))]
    pub chunks: Option<u64>,
    /// Print one JSON object: {"ppl","n_ctx","n_chunks","chunks":[running
    /// PPL after each chunk], then ppl_stderr, n_tokens, n_scored, nll_sum,
    /// seconds}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    ppl: f64,
    n_ctx: usize,
    n_chunks: usize,
    chunks: &'a [f64],
    ppl_stderr: f64,
    n_tokens: usize,
    n_scored: usize,
    nll_sum: f64,
    seconds: f64,
}

pub fn run(a: Args) -> Result<()> {
    let text = read_raw(&a.file)?;
    if text.is_empty() {
        bail!("{}: the file is empty", a.file.display());
    }
    let (mut session, _path, _load) = a.model.load(false)?;
    let mut tokens = session.tokenize_for_perplexity(&text);
    let n_ctx = a.n_ctx;
    if n_ctx < 4 {
        bail!("-c {n_ctx}: the chunk size must be at least 4 tokens");
    }
    let max = session.options().max_context;
    if n_ctx > max {
        bail!("-c {n_ctx}: the chunk size exceeds the context of {max} tokens");
    }
    let n_tokens = tokens.len();
    if n_tokens < 2 * n_ctx {
        bail!(
            "{}: {n_tokens} tokens are too few for -c {n_ctx}: at least {} (2 chunks) are needed",
            a.file.display(),
            2 * n_ctx
        );
    }
    if let Some(c) = a.chunks {
        let keep = (c as usize).saturating_mul(n_ctx);
        tokens.truncate(keep.min(n_tokens));
    }
    let n_chunks = tokens.len() / n_ctx;
    eprintln!(
        "perplexity: {n_tokens} tokens, {n_chunks} chunks of {n_ctx}, scoring {} tokens per chunk",
        n_ctx / 2 - 1
    );
    let t0 = Instant::now();
    let result = {
        let _spinner = Progress::spinner(format!(
            "perplexity over {n_chunks} chunks of {n_ctx} tokens"
        ));
        session.perplexity(&tokens, n_ctx)?
    };
    let seconds = t0.elapsed().as_secs_f64();
    let running: Vec<String> = result
        .running_ppl
        .iter()
        .enumerate()
        .map(|(i, p)| format!("[{}]{p:.4}", i + 1))
        .collect();
    eprintln!("{}", running.join(","));
    eprintln!(
        "{n_chunks} chunks in {seconds:.2} s ({:.1} tokens/s)",
        (n_chunks * n_ctx) as f64 / seconds.max(1e-9)
    );
    let mut out = std::io::stdout().lock();
    if a.json {
        let report = Report {
            ppl: result.ppl,
            n_ctx: result.n_ctx,
            n_chunks: result.n_chunks,
            chunks: &result.running_ppl,
            ppl_stderr: result.ppl_stderr,
            n_tokens,
            n_scored: result.n_scored,
            nll_sum: result.nll_sum,
            seconds,
        };
        serde_json::to_writer(&mut out, &report)?;
        writeln!(out)?;
    } else {
        writeln!(out, "PPL = {:.4} +/- {:.5}", result.ppl, result.ppl_stderr)?;
    }
    out.flush()?;
    Ok(())
}

/// The file's text as is (the runtime drops one trailing newline).
fn read_raw(path: &PathBuf) -> Result<String> {
    let bytes = if path.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b).context("reading stdin")?;
        b
    } else {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))?
    };
    String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text ({e})", path.display()))
}
