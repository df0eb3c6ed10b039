//! `kiln serve`: an OpenAI-compatible HTTP server (axum + tokio) over the
//! continuous-batching [`Engine`].
//!
//! Endpoints: `GET /v1/models`, `POST /v1/completions`,
//! `POST /v1/chat/completions` (streaming as Server-Sent Events, or not),
//! `POST /v1/embeddings`, `POST /tokenize`, `POST /detokenize`,
//! `GET /health` (503 while the model loads), `GET /metrics` (Prometheus).
//! Requests are parsed by [`request`] into checked values; every error is
//! an OpenAI-shaped JSON body built in [`error`]. One `tracing` line is
//! logged per request.
//!
//! ```no_run
//! # async fn demo(state: std::sync::Arc<kiln_server::AppState>) -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! kiln_server::serve(listener, state, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

pub mod error;
mod generate;
mod metrics;
pub mod request;
mod response;
mod routes;
mod stream;
pub mod structured;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use kiln_runtime::constrain::Grammars;
use kiln_runtime::engine::Engine;
use kiln_runtime::ChatTemplate;
use kiln_tokenizer::Tokenizer;

use crate::error::ApiError;
pub use crate::metrics::ServerMetrics;
use crate::request::Limits;
pub use crate::response::unix_time;
use crate::response::Usage;

/// Default limit on a request body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// Everything the handlers share.
pub struct AppState {
    pub engine: Engine,
    pub tokenizer: Arc<Tokenizer>,
    /// The model's chat template, or why it failed to load.
    pub chat: Result<ChatTemplate, String>,
    /// The name `/v1/models` lists and requests must use (or omit).
    pub model_id: String,
    /// When set, every endpoint but `/health` and `/metrics` needs
    /// `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// Request limits besides the context (which the engine sets).
    pub limits: Limits,
    pub metrics: ServerMetrics,
    /// When the server started (Unix seconds), for `/v1/models`.
    pub created: u64,
    /// The constraint compiler, built by the first request that needs one
    /// (a trie of the vocabulary: about a second for 262k tokens).
    pub grammars: std::sync::OnceLock<Result<Arc<Grammars>, String>>,
}

impl AppState {
    /// The request limits, with the context the engine resolved.
    pub fn limits(&self) -> Limits {
        let ctx = self.engine.metrics().max_context.load(Ordering::Relaxed);
        Limits {
            max_context: if ctx == 0 {
                self.limits.max_context
            } else {
                ctx
            },
            n_vocab: self.tokenizer.n_vocab(),
            ..self.limits.clone()
        }
    }

    /// The constraint compiler (built on first use, off the async threads).
    pub async fn grammars(self: &Arc<Self>) -> Result<Arc<Grammars>, ApiError> {
        if let Some(g) = self.grammars.get() {
            return g.clone().map_err(ApiError::internal);
        }
        let st = self.clone();
        let built = tokio::task::spawn_blocking(move || {
            st.grammars
                .get_or_init(|| {
                    Grammars::new(st.tokenizer.clone())
                        .map(Arc::new)
                        .map_err(|e| e.to_string())
                })
                .clone()
        })
        .await
        .map_err(|e| ApiError::internal(format!("building the grammar compiler: {e}")))?;
        built.map_err(ApiError::internal)
    }

    /// A request may name this server's model or none.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None => Ok(()),
            Some(m) if m == self.model_id => Ok(()),
            Some(m) => Err(ApiError::not_found(format!(
                "the model {m:?} does not exist; this server serves {:?}",
                self.model_id
            ))
            .with_code("model_not_found")),
        }
    }
}

/// The body's bytes, at most `max_body_bytes` (else 413).
pub(crate) async fn read_body(st: &AppState, body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, st.max_body_bytes)
        .await
        .map_err(|e| {
            let too_large =
                std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                    .any(|e| e.to_string().contains("length limit"));
            if too_large {
                ApiError::too_large(st.max_body_bytes)
            } else {
                ApiError::invalid(format!("reading the request body: {e}"))
            }
        })
}

/// Token counts a handler leaves on its response for the log line.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UsageLog(pub Usage);

/// The router with every endpoint and middleware.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(routes::models))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat_completions))
        .route("/v1/embeddings", post(routes::embeddings))
        .route("/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), check_api_key));
    Router::new()
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .merge(api)
        .fallback(|| async { ApiError::not_found("no such endpoint").into_response() })
        .method_not_allowed_fallback(|| async {
            ApiError::invalid("method not allowed for this endpoint")
                .with_status(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error")
                .into_response()
        })
        .layer(middleware::from_fn_with_state(state.clone(), log_request))
        .with_state(state)
}

async fn check_api_key(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// One log line per request, and the requests-by-status counter.
async fn log_request(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let t0 = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let r = next.run(req).await;
    let status = r.status().as_u16();
    st.metrics.count_request(&path, status);
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let streaming = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    match r.extensions().get::<UsageLog>() {
        Some(UsageLog(u)) => tracing::info!(
            %method, path, status, ms = format!("{ms:.1}"),
            prompt_tokens = u.prompt_tokens, completion_tokens = u.completion_tokens,
            cached_tokens = u.cached_tokens, "request"
        ),
        None => {
            tracing::info!(%method, path, status, ms = format!("{ms:.1}"), streaming, "request")
        }
    }
    r
}

/// Serves `state` on `listener` until `shutdown` resolves; then stops
/// accepting, lets in-flight requests finish (the caller may abort the
/// engine to cut them short) and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
