//! Flags and helpers shared by the commands that run the model (`run`,
//! `chat`, `logits`, `perplexity`, `bench`): loading a session, reading a
//! prompt, sampling flags, progress on stderr.

use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_runtime::constrain::Constraint;
use kiln_runtime::{
    Device, FinishReason, Generation, RuntimeError, SamplingParams, Session, SessionOptions,
    Truncation,
};

use crate::model_path;

/// The debug switches the runtime reads from the environment; appended to
/// the `--help` of every command that runs the model.
pub const ENV_HELP: &str = "\
Environment (debug aids, read when the model is loaded):
  KILN_MODEL=PATH        default model file when neither -m nor -hf is given
  HF_ENDPOINT, HF_TOKEN  the Hub -hf downloads from, and its token (see `kiln pull --help`)
  KILN_TRACE_TIMING=1    stderr lines with load time, every prefill chunk and a decode summary
  KILN_TOP5=1            stderr: top-5 (id, logit) of every generation step (greedy then computes full logits)
  KILN_DUMP_LAYER0=1     stderr: layer-0 stage statistics of every forward call";

/// Model, threads and context: every command that loads a session.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file (default: $KILN_MODEL, else the fetched
    /// gemma-3-270m-q4_k_m.gguf in $KILN_CACHE_DIR or ~/.cache/kiln).
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub hf: crate::model_path::HfArg,
    /// Worker threads for the CPU kernels (default: all cores).
    #[arg(short = 't', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub threads: Option<u32>,
    /// Maximum context in tokens (default: the model's own; capped by it).
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub ctx: Option<u32>,
    /// What runs the model: cpu, cuda (GPU 0), cuda:N, or auto (a CUDA GPU
    /// when a driver and a GPU are present, else the CPU). The choice is
    /// printed on stderr.
    #[arg(long, value_name = "DEVICE", default_value = "auto")]
    pub device: Device,
}

impl ModelArgs {
    /// The session options these flags give (prefill buckets default).
    pub fn options(&self, truncate: bool) -> SessionOptions {
        SessionOptions {
            threads: self.threads.map_or(0, |t| t as usize),
            max_context: self.ctx.map_or(0, |c| c as usize),
            truncation: if truncate {
                Truncation::KeepTail
            } else {
                Truncation::Error
            },
            device: self.device,
            ..SessionOptions::default()
        }
    }

    /// The number of threads the session will use.
    pub fn thread_count(&self) -> usize {
        match self.threads {
            Some(t) => t as usize,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    /// Resolves the model path and loads a session, with a spinner on a
    /// terminal. Returns the session, its path and the load time.
    pub fn load(&self, truncate: bool) -> Result<(Session, PathBuf, Duration)> {
        let path = model_path::resolve(self.model.clone(), &self.hf)?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let spinner = Progress::spinner(format!("loading {name}"));
        let t0 = Instant::now();
        let session = Session::load(&path, self.options(truncate));
        let elapsed = t0.elapsed();
        spinner.finish();
        let session = session.with_context(|| path.display().to_string())?;
        // A GPU, or a device asked for, is always named; the CPU that
        // `auto` fell back to only on a terminal, so scripts on machines
        // without a GPU see the stderr they always did.
        if session.backend().kind() != "CPU"
            || self.device != Device::Auto
            || std::io::stderr().is_terminal()
        {
            eprintln!("{}", session.device());
        }
        Ok((session, path, elapsed))
    }
}

/// A prompt given as text, a file or token ids.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PromptArgs {
    /// Prompt text. Control-token text such as `<start_of_turn>` is parsed
    /// as the special token.
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", conflicts_with_all = ["prompt_file", "ids"])]
    pub prompt: Option<String>,
    /// Read the prompt text from a file (`-` reads stdin); one trailing
    /// newline is dropped.
    #[arg(long, value_name = "FILE", conflicts_with = "ids")]
    pub prompt_file: Option<PathBuf>,
    /// The prompt as comma-separated token ids, used as given (no BOS is
    /// added), e.g. `--ids 2,818,5279`.
    #[arg(long, value_name = "ID,...", value_delimiter = ',', num_args = 1..)]
    pub ids: Option<Vec<u32>>,
    /// Do not prepend BOS to a text prompt.
    #[arg(long)]
    pub no_bos: bool,
}

impl PromptArgs {
    /// The prompt text (`-p` or `--prompt-file`), else `default`; None
    /// when the prompt is given as `--ids` or not at all without a default.
    pub fn text(&self, default: Option<&str>) -> Result<Option<String>> {
        let text = match (&self.prompt, &self.prompt_file) {
            (Some(p), _) => p.clone(),
            (None, Some(f)) => read_text(f)?,
            (None, None) if self.ids.is_some() => return Ok(None),
            (None, None) => match default {
                Some(d) => d.to_string(),
                None => return Ok(None),
            },
        };
        if text.is_empty() {
            bail!("the prompt is empty");
        }
        Ok(Some(text))
    }

    /// The prompt's token ids (checked against the vocabulary); `default`
    /// is the text used when no prompt option was given (None: an error).
    pub fn token_ids(&self, session: &Session, default: Option<&str>) -> Result<Vec<u32>> {
        let ids = if let Some(ids) = &self.ids {
            if self.no_bos {
                bail!("--no-bos applies to text prompts; --ids are used exactly as given");
            }
            ids.clone()
        } else {
            match self.text(default)? {
                Some(text) => encode(session, &text, !self.no_bos),
                None => bail!("no prompt: give -p TEXT, --prompt-file FILE or --ids ID,..."),
            }
        };
        check_ids(session, &ids)?;
        Ok(ids)
    }
}

/// Tokenizes prompt text: BOS (when the model adds one and `bos`), control
/// tokens parsed.
pub fn encode(session: &Session, text: &str, bos: bool) -> Vec<u32> {
    session.tokenizer().encode(text, bos, true)
}

/// A prompt must have tokens, all in the vocabulary.
pub fn check_ids(session: &Session, ids: &[u32]) -> Result<()> {
    if ids.is_empty() {
        bail!("the prompt is empty (it has no tokens)");
    }
    let vocab = session.config().n_vocab;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        bail!("prompt token id {id} is out of the vocabulary (size {vocab})");
    }
    Ok(())
}

/// A text file's contents, one trailing newline dropped (`-`: stdin).
pub fn read_text(path: &Path) -> Result<String> {
    let mut text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading stdin")?
    } else {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        String::from_utf8(bytes)
            .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text ({e})", path.display()))?
    };
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

/// Sampling flags (llama.cpp spelling). Defaults are the Gemma model-card
/// settings: temperature 1.0, top-k 64, top-p 0.95, seed 0.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy (argmax, ties to the lowest id).
    #[arg(
        long = "temp",
        value_name = "T",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub temp: f32,
    /// Keep only the K most likely tokens; 0 disables.
    #[arg(long, value_name = "K", default_value_t = 64)]
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set with this much probability
    /// mass (0 < P <= 1; 1 disables).
    #[arg(long, value_name = "P", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens whose probability is below P x the top one's (0 disables).
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub min_p: f32,
    /// Locally typical sampling mass (0 < P <= 1; 1 disables).
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub typical_p: f32,
    /// Repetition penalty on recent tokens (> 0; 1 disables).
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every recent token (0 disables).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logits of recent tokens (0 disables).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// How many recent tokens (prompt included) the penalties look at; 0 disables them.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Seed of the sampler: the same seed and inputs give the same tokens.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Add BIAS to token ID's logit (`-inf` bans it); repeatable, e.g.
    /// `--logit-bias 106=-inf`.
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_bias)]
    pub logit_bias: Vec<(u32, f32)>,
}

fn parse_bias(s: &str) -> std::result::Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected ID=BIAS"))?;
    let id = id
        .trim()
        .parse::<u32>()
        .map_err(|e| format!("{id:?}: token id: {e}"))?;
    let bias = bias
        .trim()
        .parse::<f32>()
        .map_err(|e| format!("{bias:?}: bias: {e}"))?;
    Ok((id, bias))
}

impl SamplingArgs {
    /// The runtime parameters (stop strings and limits are set by the caller).
    pub fn params(&self, max_tokens: usize) -> SamplingParams {
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            logit_bias: self.logit_bias.iter().copied().collect(),
            seed: self.seed,
            max_tokens,
            ..SamplingParams::default()
        }
    }
}

/// Checks sampling parameters against the model before any work.
pub fn check_params(p: &SamplingParams, session: &Session) -> Result<()> {
    if let Err(e) = p.validate() {
        if let RuntimeError::InvalidSamplingParam {
            name,
            value,
            expected,
        } = &e
        {
            bail!("invalid {} {value}: expected {expected}", flag_name(name));
        }
        return Err(e.into());
    }
    let vocab = session.config().n_vocab;
    if let Some(&id) = p.logit_bias.keys().find(|&&id| id as usize >= vocab) {
        bail!("--logit-bias token id {id} is out of the vocabulary (size {vocab})");
    }
    Ok(())
}

/// Generates from `ids` (under `constraint`, when given), writing each
/// piece of text to `out` (when given)
/// and flushing it as it arrives. A failed write stops the generation and
/// is the error returned.
pub fn generate_streaming(
    session: &mut Session,
    ids: &[u32],
    params: &SamplingParams,
    constraint: Option<&mut Constraint>,
    mut out: Option<&mut dyn Write>,
) -> Result<Generation> {
    let mut write_err = None;
    let gen = session.generate_constrained(ids, params, constraint, |ev| {
        if let Some(out) = out.as_mut().filter(|_| !ev.text.is_empty()) {
            if let Err(e) = out.write_all(ev.text.as_bytes()).and_then(|()| out.flush()) {
                write_err = Some(e);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    match write_err {
        Some(e) => Err(e.into()),
        None => Ok(gen),
    }
}

/// The flag that sets a [`SamplingParams`] field.
fn flag_name(field: &str) -> String {
    match field {
        "temperature" => "--temp".into(),
        "repetition_penalty" => "--repeat-penalty".into(),
        "penalty_last_n" => "--repeat-last-n".into(),
        "max_tokens" => "-n".into(),
        f => format!("--{}", f.replace('_', "-")),
    }
}

/// A spinner on stderr while long work runs, only when stderr is a terminal.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    pub fn spinner(msg: impl Into<String>) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let pb = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            pb.set_style(style);
        }
        pb.set_message(msg.into());
        pb.enable_steady_tick(Duration::from_millis(120));
        Progress(Some(pb))
    }

    /// Removes the spinner line.
    pub fn finish(&self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Tokens per second, 0 when nothing was timed.
pub fn rate(n: usize, t: Duration) -> f64 {
    if n == 0 || t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

/// Checks that a prompt of `n` tokens leaves room for at least one more
/// token in the session's context. `truncate`: `Some(true)` lets the
/// session keep the tail, `Some(false)` suggests --truncate in the error,
/// `None` (commands without that flag) suggests only --ctx.
pub fn check_fits(session: &Session, n: usize, truncate: Option<bool>) -> Result<()> {
    let max = session.options().max_context;
    if n >= max && truncate != Some(true) {
        let hint = if truncate.is_some() {
            "pass --truncate to keep its tail, or a larger --ctx"
        } else {
            "pass a larger --ctx (the model's own is the limit)"
        };
        bail!("the prompt has {n} tokens but the context holds {max} (the prompt must leave room for at least 1 new token): {hint}");
    }
    Ok(())
}

/// A short name for why generation ended (`eog`, `length`, ...).
pub fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eog(_) => "eog",
        FinishReason::StopToken(_) => "stop_token",
        FinishReason::StopString(_) => "stop_string",
        FinishReason::Length => "length",
        FinishReason::ContextFull => "context_full",
        FinishReason::Cancelled => "cancelled",
        FinishReason::Constraint => "constraint",
    }
}

/// The ids the session actually used for a prompt of `ids` that it kept
/// `used` tokens of (`--truncate`: a leading BOS and the tail).
pub fn effective_prompt(session: &Session, ids: &[u32], used: usize) -> Vec<u32> {
    if used >= ids.len() {
        return ids.to_vec();
    }
    let bos = session
        .tokenizer()
        .bos_id()
        .filter(|&b| ids.first() == Some(&b));
    let mut out: Vec<u32> = bos.into_iter().collect();
    let tail = used.saturating_sub(out.len());
    out.extend_from_slice(&ids[ids.len() - tail..]);
    out
}
