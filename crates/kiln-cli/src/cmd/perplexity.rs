//! `kiln perplexity`: llama-perplexity's chunked perplexity of a text file.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::common::{ModelArgs, ENV_HELP};

/// Perplexity of a text file, computed as llama.cpp's llama-perplexity does.
///
/// The file is tokenized whole (BOS first, control-token text not parsed,
/// one trailing newline dropped) and cut into chunks of CTX tokens (the
/// tail that does not fill a chunk is dropped; as in llama.cpp the text
/// must fill at least 2 chunks, even with `--chunks 1`). Each chunk starts
/// with BOS in an empty cache and only its second half is scored. The
/// running PPL after each chunk (`[1]x,[2]y,...,`) goes to stderr as each
/// chunk is done (on a terminal, under a progress bar) and the final
/// `PPL = x +/- stderr` to stdout.
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
    /// Score only the first N chunks (at least 1; the text must still fill
    /// 2 chunks, as in llama.cpp).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
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
    let tokens = session.tokenize_for_perplexity(&text);
    let n_ctx = a.n_ctx;
    if n_ctx < 4 {
        bail!("-c {n_ctx}: the chunk size must be at least 4 tokens");
    }
    let max = session.options().max_context;
    if n_ctx > max {
        bail!("-c {n_ctx}: the chunk size exceeds the context of {max} tokens");
    }
    let n_tokens = tokens.len();
    // llama.cpp's rule: the text must fill 2 chunks, whatever --chunks says.
    if n_tokens < 2 * n_ctx {
        bail!(
            "{}: {n_tokens} tokens are too few for -c {n_ctx}: at least {} (2 chunks) are needed",
            a.file.display(),
            2 * n_ctx
        );
    }
    let max_chunks = a.chunks.map(|c| usize::try_from(c).unwrap_or(usize::MAX));
    let n_chunks = (n_tokens / n_ctx).min(max_chunks.unwrap_or(usize::MAX));
    eprintln!(
        "perplexity: {n_tokens} tokens, {n_chunks} chunks of {n_ctx}, scoring {} tokens per chunk",
        n_ctx / 2 - 1
    );
    let t0 = Instant::now();
    let result = {
        let mut line = RunningLine::new(n_chunks as u64);
        session.perplexity_with(&tokens, n_ctx, max_chunks, |k, _, ppl| line.push(k, ppl))?
    };
    let seconds = t0.elapsed().as_secs_f64();
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

/// llama.cpp's running line on stderr, `[1]x,[2]y,...,` then a newline,
/// one entry written as each chunk is scored. On a terminal a progress bar
/// shows the newest entries instead, and the whole line is written when
/// the bar goes.
struct RunningLine {
    bar: Option<ProgressBar>,
    /// The entries so far (terminal only).
    text: String,
}

impl RunningLine {
    /// How much of the line's end the bar shows.
    const TAIL: usize = 64;

    fn new(n_chunks: u64) -> RunningLine {
        let bar = std::io::stderr().is_terminal().then(|| {
            let pb = ProgressBar::new(n_chunks);
            if let Ok(style) = ProgressStyle::with_template(
                "{msg}\n{spinner} [{bar:30}] {pos}/{len} chunks ({elapsed}, ETA {eta})",
            ) {
                pb.set_style(style.progress_chars("=> "));
            }
            pb.enable_steady_tick(Duration::from_millis(120));
            pb
        });
        RunningLine {
            bar,
            text: String::new(),
        }
    }

    /// Chunk `k` (from 0) is scored with `ppl` the running perplexity.
    fn push(&mut self, k: usize, ppl: f64) {
        let entry = format!("[{}]{ppl:.4},", k + 1);
        match &self.bar {
            Some(pb) => {
                self.text.push_str(&entry);
                let tail = match self.text.len().checked_sub(Self::TAIL) {
                    // Cut at an entry's start.
                    Some(cut) => self.text[cut..]
                        .find('[')
                        .map_or("", |i| &self.text[cut + i..]),
                    None => &self.text,
                };
                pb.set_message(tail.to_string());
                pb.inc(1);
            }
            None => {
                let mut err = std::io::stderr().lock();
                // stderr is only for diagnostics: a closed one is no error.
                let _ = err.write_all(entry.as_bytes());
                let _ = err.flush();
            }
        }
    }
}

impl Drop for RunningLine {
    fn drop(&mut self) {
        if let Some(pb) = &self.bar {
            pb.finish_and_clear();
        }
        eprintln!("{}", self.text);
    }
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
