//! `kiln run`: generate a continuation of one prompt, streaming it.

use std::io::Write;

use anyhow::{bail, Context, Result};
use kiln_runtime::ChatMessage;
use serde::Serialize;

use super::common::{
    check_fits, check_ids, check_params, effective_prompt, encode, finish_name, generate_streaming,
    ModelArgs, PromptArgs, SamplingArgs, ENV_HELP,
};
use super::constraint::{mask_summary, ConstraintArgs};

/// The prompt used when none is given.
pub const DEFAULT_PROMPT: &str = "The capital of France is";

/// Generate text from a prompt, streaming it to stdout.
///
/// Prints the generated text (not the prompt) to stdout as tokens arrive,
/// then a newline; prompt and generation speed go to stderr. Without a
/// prompt option the prompt is "The capital of France is". Sampling
/// defaults to the Gemma settings (temperature 1, top-k 64, top-p 0.95,
/// seed 0: reproducible); `--temp 0` is greedy. Generation stops at an
/// end-of-generation token (unless --ignore-eos), a --stop string, -n
/// tokens or a full context. With --json-schema, --grammar or --regex
/// every token is drawn from those that keep the output valid, and
/// generation ends when the output is complete.
#[derive(clap::Args)]
#[command(after_long_help = ENV_HELP)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Maximum number of tokens to generate (at least 1).
    #[arg(
        short = 'n',
        long = "n-predict",
        value_name = "N",
        default_value_t = 256
    )]
    pub n_predict: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    /// Stop when the generated text contains STR (not printed); repeatable.
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Wrap the prompt text as one user turn in the model's chat template
    /// (the GGUF's, else the built-in Gemma format) and generate the reply.
    #[arg(long)]
    pub chat: bool,
    /// System prompt for --chat.
    #[arg(long, value_name = "TEXT", requires = "chat")]
    pub system: Option<String>,
    /// A prompt longer than the context keeps BOS and its most recent
    /// tokens instead of failing.
    #[arg(long)]
    pub truncate: bool,
    /// Print no streamed text; print one JSON object at the end:
    /// {"prompt_ids","ids","text","prefill_tok_s","decode_tok_s", then
    /// n_prompt, n_reused, n_gen, finish, prefill_ms, decode_ms, load_s}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    prompt_ids: &'a [u32],
    ids: &'a [u32],
    text: &'a str,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    n_prompt: usize,
    n_reused: usize,
    n_gen: usize,
    finish: &'static str,
    prefill_ms: f64,
    decode_ms: f64,
    load_s: f64,
}

pub fn run(a: Args) -> Result<()> {
    if a.n_predict == 0 {
        bail!("-n must be at least 1 (use `kiln logits` to only score a prompt)");
    }
    if a.chat && a.prompt.ids.is_some() {
        bail!("--chat needs a text prompt (-p or --prompt-file), not --ids");
    }
    // Read a prompt file before the (slow) load so a bad path fails fast.
    let text = a.prompt.text(Some(DEFAULT_PROMPT))?;
    let spec = a.constraint.spec()?;
    let (mut session, _path, load) = a.model.load(a.truncate)?;
    let mut params = a.sampling.params(a.n_predict);
    params.stop = a.stop.clone();
    params.ignore_eos = a.ignore_eos;
    check_params(&params, &session)?;

    let ids = match (&text, a.chat) {
        (Some(text), true) => {
            let mut messages = Vec::new();
            if let Some(s) = &a.system {
                messages.push(ChatMessage::system(s.clone()));
            }
            messages.push(ChatMessage::user(text.clone()));
            let rendered = session.render_chat(&messages)?;
            encode(&session, &rendered, !a.prompt.no_bos)
        }
        (Some(text), false) => encode(&session, text, !a.prompt.no_bos),
        (None, _) => a.prompt.token_ids(&session, None)?,
    };
    check_ids(&session, &ids)?;
    check_fits(&session, ids.len(), Some(a.truncate))?;
    let mut constraint = match &spec {
        Some((spec, source)) => Some(
            session
                .compile_constraint(spec)
                .with_context(|| source.clone())?,
        ),
        None => None,
    };

    let mut out = std::io::stdout().lock();
    let stream: Option<&mut dyn Write> = if a.json { None } else { Some(&mut out) };
    let gen = generate_streaming(&mut session, &ids, &params, constraint.as_mut(), stream)?;
    let st = &gen.stats;
    let prompt_ids = effective_prompt(&session, &ids, st.prompt_tokens);
    if a.json {
        let report = Report {
            prompt_ids: &prompt_ids,
            ids: &gen.tokens,
            text: &gen.text,
            prefill_tok_s: st.prefill_tokens_per_s(),
            decode_tok_s: st.decode_tokens_per_s(),
            n_prompt: st.prompt_tokens,
            n_reused: st.reused_tokens,
            n_gen: gen.tokens.len(),
            finish: finish_name(gen.finish),
            prefill_ms: st.prefill_time.as_secs_f64() * 1e3,
            decode_ms: st.decode_time.as_secs_f64() * 1e3,
            load_s: load.as_secs_f64(),
        };
        serde_json::to_writer(&mut out, &report)?;
    }
    writeln!(out)?;
    out.flush()?;
    drop(out);

    if prompt_ids.len() < ids.len() {
        eprintln!(
            "note: the prompt of {} tokens was truncated to its last {} to fit the context",
            ids.len(),
            prompt_ids.len()
        );
    }
    {
        eprintln!(
            "prompt: {} tokens, {:.1} ms, {:.1} tok/s | generation: {} tokens, {:.1} ms, {:.1} tok/s | load {:.2} s | stop: {}{}",
            st.prefill_tokens,
            st.prefill_time.as_secs_f64() * 1e3,
            st.prefill_tokens_per_s(),
            gen.tokens.len(),
            st.decode_time.as_secs_f64() * 1e3,
            st.decode_tokens_per_s(),
            load.as_secs_f64(),
            finish_name(gen.finish),
            mask_summary(constraint.as_ref()),
        );
    }
    Ok(())
}
