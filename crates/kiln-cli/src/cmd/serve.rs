//! `kiln serve`: the OpenAI-compatible server (kiln-server) on a model.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use kiln_gguf::Gguf;
use kiln_model::Model;
use kiln_runtime::engine::{Engine, EngineConfig};
use kiln_runtime::{AnyBackend, ChatTemplate};
use kiln_server::request::Limits;
use kiln_server::{AppState, ServerMetrics, DEFAULT_MAX_BODY_BYTES};
use kiln_tokenizer::Tokenizer;

use super::common::ModelArgs;
use crate::model_path;

/// How long in-flight requests may run after SIGINT/SIGTERM before they
/// are cancelled.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serve the model over an OpenAI-compatible HTTP API.
///
/// Endpoints: GET /v1/models, POST /v1/completions, POST
/// /v1/chat/completions (stream or not), POST /v1/embeddings, POST
/// /tokenize, POST /detokenize, GET /health (503 while loading), GET
/// /metrics (Prometheus). Requests run with continuous batching: up to
/// --parallel sequences share each forward step, long prompts are prefilled
/// in chunks between decode steps, and finished sequences' KV caches are
/// kept (within --kv-budget) to reuse shared prompt prefixes. When the
/// budget or the slots are taken, requests wait in a bounded queue; a full
/// queue answers 429 with Retry-After. Logs one line per request on stderr
/// (RUST_LOG sets the level, default info). SIGINT/SIGTERM stop accepting,
/// let running requests finish (at most 10 s) and exit 0.
#[derive(clap::Args)]
#[command(mut_arg("ctx", |a| a.help(
    "Positions per sequence, prompt plus generated tokens (default: the model's context, at most 8192; capped by the model's)"
)))]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (loopback by default: pass 0.0.0.0 to expose it).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at startup).
    #[arg(long, value_name = "PORT", default_value_t = 8080)]
    pub port: u16,
    /// Most sequences generating at once (default: as many full-context KV
    /// caches as fit --kv-budget, between 1 and 16; up to 64 on a GPU).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub parallel: Option<u32>,
    /// KV cache memory for running sequences and the prefix cache, e.g.
    /// 512M, 2G, 1GiB or a byte count (default 1G; on a GPU, half the
    /// device memory free once the weights are loaded).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub kv_budget: Option<usize>,
    /// Most sequences waiting for a slot before requests get 429 (default:
    /// 4 x --parallel, at least 64).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub queue: Option<u32>,
    /// Prompt tokens prefilled per step across all sequences (default 256;
    /// 960 on a GPU for models narrower than 2,048, where larger steps
    /// cost less per token): lower keeps running streams smoother while
    /// long prompts arrive.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub step_tokens: Option<u32>,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health
    /// and /metrics (default: $KILN_API_KEY, else no key).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body: usize,
}

/// `512M`, `2G`, `1GiB`, `64k`, or bytes; K/M/G are powers of 1024.
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a size such as 512M or 2G"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0f64.powi(4),
        u => return Err(format!("{s:?}: unknown unit {u:?} (use K, M, G or T)")),
    };
    let bytes = num * mult;
    if !(1.0..=usize::MAX as f64).contains(&bytes) {
        return Err(format!("{s:?}: the size must be at least 1 byte"));
    }
    Ok(bytes as usize)
}

/// The model's name in the API: its file name without `.gguf`.
fn model_id(path: &Path) -> String {
    path.file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
}

pub fn run(a: Args) -> Result<()> {
    let path = model_path::resolve(a.model.model.clone(), &a.model.hf)?;
    let gguf = Arc::new(Gguf::open(&path).with_context(|| path.display().to_string())?);
    let tokenizer =
        Arc::new(Tokenizer::from_gguf(&gguf).with_context(|| path.display().to_string())?);
    let chat = ChatTemplate::from_gguf(&gguf).map_err(|e| e.to_string());
    let threads = a.model.thread_count();
    let cfg = EngineConfig {
        parallel: a.parallel.map_or(0, |n| n as usize),
        max_context: a.model.ctx.map_or(0, |n| n as usize),
        kv_budget_bytes: a.kv_budget.unwrap_or(0),
        max_queue: a.queue.map_or(0, |n| n as usize),
        step_tokens: a.step_tokens.map_or(0, |n| n as usize),
    };
    let load_gguf = gguf.clone();
    let device = a.model.device;
    let load = move || -> std::result::Result<Model<AnyBackend>, Box<dyn std::error::Error + Send + Sync>> {
        let opened = device.open(threads)?;
        eprintln!("kiln serve: {}", opened.description);
        Ok(Model::load(opened.backend, load_gguf)?)
    };

    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("listening on {}:{}", a.host, a.port))?;
        let addr: SocketAddr = listener.local_addr()?;
        let state = Arc::new(AppState {
            engine: Engine::start(load, tokenizer.clone(), cfg),
            tokenizer,
            chat,
            model_id: model_id(&path),
            api_key: a
                .api_key
                .clone()
                .or_else(|| std::env::var("KILN_API_KEY").ok()),
            max_body_bytes: a.max_body,
            limits: Limits::default(),
            metrics: ServerMetrics::default(),
            created: kiln_server::unix_time(),
            grammars: Default::default(),
        });
        eprintln!(
            "kiln serve: listening on http://{addr} (model {})",
            state.model_id
        );
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<String>);
        tokio::spawn(watch_load(state.clone(), stop_tx.clone()));
        tokio::spawn(watch_signals(state.clone(), stop_tx));
        let mut wait_stop = stop_rx.clone();
        let shutdown = async move {
            let _ = wait_stop.wait_for(Option::is_some).await;
        };
        kiln_server::serve(listener, state.clone(), shutdown).await?;
        let why = stop_rx.borrow().clone();
        // Joins the engine thread once the last handle goes.
        let engine_state = tokio::task::spawn_blocking(move || drop(state)).await;
        engine_state.ok();
        match why.as_deref() {
            Some(e) if e.starts_with("error: ") => bail!("{}", &e[7..]),
            _ => Ok(()),
        }
    })
}

/// Stops the server if the model fails to load.
async fn watch_load(state: Arc<AppState>, stop: tokio::sync::watch::Sender<Option<String>>) {
    let st = state.clone();
    let ready = tokio::task::spawn_blocking(move || st.engine.wait_ready()).await;
    match ready {
        Ok(Ok(())) => tracing::info!("model loaded; ready"),
        Ok(Err(e)) => {
            let _ = stop.send(Some(format!("error: {e}")));
        }
        Err(e) => {
            let _ = stop.send(Some(format!("error: the load task failed: {e}")));
        }
    }
}

/// SIGINT/SIGTERM: stop accepting, drain the engine, and after
/// [`SHUTDOWN_GRACE`] cancel what still runs.
async fn watch_signals(state: Arc<AppState>, stop: tokio::sync::watch::Sender<Option<String>>) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("shutting down: finishing in-flight requests");
    state.engine.stop(false);
    let _ = stop.send(Some("signal".into()));
    tokio::time::sleep(SHUTDOWN_GRACE).await;
    tracing::info!("shutting down: cancelling what still runs");
    state.engine.stop(true);
}
