//! `kiln chat`: a multi-turn conversation on stdin.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{bail, Context, Result};
use kiln_runtime::ChatMessage;

use super::common::{check_params, encode, generate_streaming, ModelArgs, SamplingArgs, ENV_HELP};

/// Chat with the model: one user message per stdin line.
///
/// Each line of stdin is a user turn; the reply streams to stdout, followed
/// by a newline. The conversation is rendered with the model's chat
/// template (the GGUF's `tokenizer.chat_template`, else the built-in Gemma
/// format) and kept as history; the session reuses the KV cache of the
/// previous turns. When the history outgrows the context, the oldest turns
/// are dropped. Commands: `/exit` (or end of input) quits, `/reset` clears
/// the history. On a terminal, `> ` on stderr prompts for input. Works with
/// piped stdin: `printf 'Hi\nAnd you?\n' | kiln chat -n 32`.
#[derive(clap::Args)]
#[command(after_long_help = ENV_HELP)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt (Gemma 2/3 fold it into the first user turn).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Maximum number of tokens per reply (at least 1).
    #[arg(
        short = 'n',
        long = "n-predict",
        value_name = "N",
        default_value_t = 512
    )]
    pub n_predict: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// End a reply when it contains STR (not printed); repeatable.
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,
    /// Print each reply's prompt and generation speed to stderr.
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

pub fn run(a: Args) -> Result<()> {
    if a.n_predict == 0 {
        bail!("-n must be at least 1");
    }
    let (mut session, _path, _load) = a.model.load(false)?;
    let mut params = a.sampling.params(a.n_predict);
    params.stop = a.stop.clone();
    check_params(&params, &session)?;
    let max_ctx = session.options().max_context;
    // Room kept for the reply when old turns must go.
    let room = a.n_predict.min(max_ctx / 2);

    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    let mut input = stdin.lock();
    let mut out = std::io::stdout().lock();
    let system: Vec<ChatMessage> = a.system.iter().map(ChatMessage::system).collect();
    let mut history = system.clone();
    let mut line = String::new();
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush()?;
        }
        line.clear();
        if input.read_line(&mut line).context("reading stdin")? == 0 {
            if interactive {
                eprintln!();
            }
            break;
        }
        let msg = line.trim_end_matches(['\n', '\r']);
        match msg.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history.clone_from(&system);
                session.reset();
                if interactive {
                    eprintln!("(history cleared)");
                }
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::user(msg));
        let ids = loop {
            let ids = encode(&session, &session.render_chat(&history)?, true);
            // Drop the oldest exchange while the reply would not fit.
            if ids.len() + room <= max_ctx || history.len() <= system.len() + 1 {
                break ids;
            }
            let drop = (history.len() - 1 - system.len()).min(2);
            history.drain(system.len()..system.len() + drop);
            eprintln!("note: the oldest turn was dropped to fit the context of {max_ctx} tokens");
        };
        if ids.len() >= max_ctx {
            history.pop();
            eprintln!(
                "error: this message needs {} tokens but the context holds {max_ctx}; not sent",
                ids.len()
            );
            continue;
        }
        let gen = generate_streaming(&mut session, &ids, &params, None, Some(&mut out))?;
        writeln!(out)?;
        out.flush()?;
        if a.verbose {
            let st = &gen.stats;
            eprintln!(
                "[prompt {} tokens ({} reused), {:.1} tok/s | reply {} tokens, {:.1} tok/s]",
                st.prompt_tokens,
                st.reused_tokens,
                st.prefill_tokens_per_s(),
                gen.tokens.len(),
                st.decode_tokens_per_s()
            );
        }
        history.push(ChatMessage::assistant(gen.text));
    }
    Ok(())
}
