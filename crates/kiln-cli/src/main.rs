//! `kiln`: the command line. `main` parses the flags and dispatches to one
//! module per subcommand under `cmd/`; every failure becomes one
//! `error: ...` line on stderr and exit code 1 (clap's usage errors: 2).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod download;
mod model_path;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Kiln: Gemma 2/3/4 inference on GGUF models",
    long_about = "Kiln: Gemma 2/3/4 inference on GGUF models.\n\n\
        MODEL arguments default to $KILN_MODEL, else \
        $KILN_CACHE_DIR/gemma-3-270m-q4_k_m.gguf (cache default ~/.cache/kiln), \
        which scripts/fetch-model downloads. -hf REPO[:QUANT] (also --hf) runs \
        a model of the Hugging Face Hub instead: downloaded into the cache on \
        first use (see `kiln pull --help`), offline after.",
    after_long_help = cmd::common::ENV_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Inspect(cmd::inspect::Args),
    Tokenize(cmd::tokenize::Args),
    Detokenize(cmd::detokenize::Args),
    Run(cmd::run::Args),
    Chat(cmd::chat::Args),
    Logits(cmd::logits::Args),
    Perplexity(cmd::perplexity::Args),
    Bench(cmd::bench::Args),
    Serve(cmd::serve::Args),
    Synth(cmd::synth::Args),
    Pull(cmd::models::PullArgs),
    List(cmd::models::ListArgs),
    Rm(cmd::models::RmArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(model_path::normalize_args(std::env::args_os()));
    let result = match cli.command {
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Detokenize(a) => cmd::detokenize::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Logits(a) => cmd::logits::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Pull(a) => cmd::models::pull(a),
        Command::List(a) => cmd::models::list(a),
        Command::Rm(a) => cmd::models::rm(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `kiln ... | head` is not a failure.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": ", skipping a cause whose text the
/// message before it already includes (errors that print their source).
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !msg.contains(&text) {
            if !msg.is_empty() {
                msg.push_str(": ");
            }
            msg.push_str(&text);
        }
    }
    msg.replace('\n', " ")
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
