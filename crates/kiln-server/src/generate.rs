//! `POST /v1/completions` and `POST /v1/chat/completions`: parse, render
//! and tokenize the prompt, submit one job of `n` choices, then stream its
//! events or gather them into one response.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use kiln_runtime::constrain::ConstraintSpec;
use kiln_runtime::engine::{Event, GenerateJob, Job, TokenLogprob};
use kiln_runtime::tools::{grammar, ToolChoice, ToolSyntax};
use kiln_runtime::ChatOptions;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::request::{parse_chat, parse_completion, GenerateRequest, PromptInput};
use crate::response::{
    call_id, choice_json, finish_reason, logprobs_json, Endpoint, Header, ReplyShape, SplitReply,
    Usage,
};
use crate::stream::{sse_response, StreamSpec};
use crate::{read_body, AppState, UsageLog};

/// Completions' default `max_tokens`, as OpenAI's.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

pub async fn completions(State(st): State<Arc<AppState>>, body: Body) -> Response {
    respond(st, body, Endpoint::Completions).await
}

pub async fn chat_completions(State(st): State<Arc<AppState>>, body: Body) -> Response {
    respond(st, body, Endpoint::Chat).await
}

async fn respond(st: Arc<AppState>, body: Body, endpoint: Endpoint) -> Response {
    match generate(st, body, endpoint).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn generate(st: Arc<AppState>, body: Body, endpoint: Endpoint) -> Result<Response, ApiError> {
    let bytes = read_body(&st, body).await?;
    let limits = st.limits();
    let mut req = match endpoint {
        Endpoint::Completions => parse_completion(&bytes, &limits)?,
        Endpoint::Chat => parse_chat(&bytes, &limits)?,
    };
    st.check_model(req.model.as_deref())?;
    let (prompt, echo) = prompt_ids(&st, &req)?;
    let room = limits.max_context.saturating_sub(prompt.len());
    if room == 0 {
        let param = if endpoint == Endpoint::Chat {
            "messages"
        } else {
            "prompt"
        };
        return Err(ApiError::param(
            param,
            format!(
                "the prompt has {} tokens but the context holds {} (it must leave room for at least 1 new token)",
                prompt.len(),
                limits.max_context
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let default_max = match endpoint {
        Endpoint::Completions => COMPLETIONS_DEFAULT_MAX_TOKENS,
        Endpoint::Chat => room,
    };
    req.params.max_tokens = req.max_tokens.unwrap_or(default_max).min(room);
    if !req.seeded {
        req.params.seed = random_seed();
    }
    let constraint = match constraint_spec(&st, &req)? {
        Some((spec, param)) => {
            let grammars = st.grammars().await?;
            let c = tokio::task::spawn_blocking(move || grammars.compile(&spec))
                .await
                .map_err(|e| ApiError::internal(format!("compiling the constraint: {e}")))?;
            Some(c.map_err(|e| ApiError::param(param, e.to_string()))?)
        }
        None => None,
    };
    let shape = reply_shape(&st, &req, endpoint);
    let job = GenerateJob {
        prompt,
        params: req.params.clone(),
        n: req.n,
        logprobs: req.logprobs,
        constraint,
    };
    let rx = st.engine.submit(Job::Generate(job))?;
    let header = Header::new(endpoint, &st.model_id);
    let echo = req.echo.then_some(echo);
    if req.stream {
        let spec = StreamSpec {
            header,
            tok: st.tokenizer.clone(),
            n: req.n,
            include_usage: req.include_usage,
            echo,
            shape,
        };
        return Ok(sse_response(spec, rx));
    }
    let (body, usage) = gather(&st, header, req.n, echo, shape, rx).await?;
    let mut r = axum::Json(body).into_response();
    r.extensions_mut().insert(UsageLog(usage));
    Ok(r)
}

/// The prompt's token ids and its text (for `echo`). Chat messages are
/// rendered with the model's template as `kiln chat` does; text is
/// tokenized with BOS and special-token parsing, as `kiln run` does.
fn prompt_ids(st: &AppState, req: &GenerateRequest) -> Result<(Vec<u32>, String), ApiError> {
    let tok = &st.tokenizer;
    let text = match &req.prompt {
        PromptInput::Tokens(ids) => {
            let text = tok
                .decode_lossy(ids, kiln_tokenizer::DecodeOptions::default())
                .map_err(|e| ApiError::param("prompt", e.to_string()))?;
            return Ok((ids.clone(), text));
        }
        PromptInput::Text(t) => t.clone(),
        PromptInput::Chat(messages) => {
            let template = st.chat.as_ref().map_err(|e| {
                ApiError::invalid(format!("this model's chat template failed to load: {e}"))
            })?;
            let opts = ChatOptions {
                tokenizer_adds_bos: tok.add_bos(),
                enable_thinking: req.thinking,
                tools: req.tools.clone(),
                ..Default::default()
            };
            template
                .render(messages, &opts)
                .map_err(|e| ApiError::param("messages", e.to_string()))?
        }
    };
    Ok((tok.encode(&text, true, true), text))
}

/// The constraint a chat request asks for, and the field to blame when it
/// does not compile: the tool-call grammar (tools with a choice other than
/// none), else `response_format` (with Gemma 4's optional thought block).
fn constraint_spec(
    st: &AppState,
    req: &GenerateRequest,
) -> Result<Option<(ConstraintSpec, &'static str)>, ApiError> {
    let syntax = st.chat.as_ref().map(|t| t.tool_syntax()).ok();
    if !req.tools.is_empty() && req.tool_choice != ToolChoice::None {
        let syntax = syntax.ok_or_else(|| {
            ApiError::invalid("this model's chat template failed to load: tools are unavailable")
        })?;
        return grammar::tool_calls(syntax, &req.tools, &req.tool_choice, req.thinking)
            .map(|spec| spec.map(|s| (s, "tools")))
            .map_err(|e| ApiError::param("tools", e.to_string()));
    }
    Ok(req.response_format.clone().map(|spec| {
        let spec = match syntax {
            Some(ToolSyntax::Gemma4) => grammar::with_gemma4_thought(spec, req.thinking),
            _ => spec,
        };
        (spec, "response_format")
    }))
}

/// How chat replies split: calls when tools may be called, thoughts on
/// Gemma 4 (never inside `content`).
fn reply_shape(st: &AppState, req: &GenerateRequest, endpoint: Endpoint) -> ReplyShape {
    let syntax = st.chat.as_ref().map(|t| t.tool_syntax()).ok();
    if endpoint != Endpoint::Chat {
        return ReplyShape::default();
    }
    ReplyShape {
        calls: syntax.filter(|_| !req.tools.is_empty() && req.tool_choice != ToolChoice::None),
        thoughts: syntax == Some(ToolSyntax::Gemma4),
    }
}

/// A seed for a request that set none: different per request.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// One choice as it accumulates.
#[derive(Default)]
struct Gathered {
    text: String,
    logprobs: Vec<TokenLogprob>,
    finish: Option<&'static str>,
}

/// Waits for every event of the job and builds the whole response.
async fn gather(
    st: &AppState,
    header: Header,
    n: usize,
    echo: Option<String>,
    shape: ReplyShape,
    mut rx: UnboundedReceiver<Event>,
) -> Result<(serde_json::Value, Usage), ApiError> {
    let mut choices: Vec<Gathered> = (0..n).map(|_| Gathered::default()).collect();
    let mut usage = Usage::default();
    let mut want_logprobs = false;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token(t) => {
                let c = &mut choices[t.choice];
                c.text.push_str(&t.text);
                if let Some(lp) = t.logprob {
                    want_logprobs = true;
                    c.logprobs.push(lp);
                }
            }
            Event::Done(d) => {
                usage.add(&d);
                choices[d.choice].finish = Some(finish_reason(d.finish));
            }
            // The receiver's drop cancels the job's other choices.
            Event::Failed { error, .. } => return Err(error.into()),
            Event::Embedding { .. } => {}
        }
    }
    let echo = echo.unwrap_or_default();
    let out: Vec<serde_json::Value> = choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = want_logprobs.then(|| {
                logprobs_json(
                    header.endpoint,
                    &st.tokenizer,
                    &c.logprobs,
                    echo.chars().count(),
                )
                .0
            });
            let text = format!("{echo}{}", c.text);
            let finish = c.finish.or(Some("stop"));
            match shape.parser() {
                Some(mut p) => {
                    let mut reply = SplitReply::default();
                    for ev in p.push(&text).into_iter().chain(p.finish()) {
                        reply.add(ev, |k| call_id(&header.id, i, k));
                    }
                    let finish = if reply.calls.is_empty() { finish } else { Some("tool_calls") };
                    serde_json::json!({
                        "index": i, "message": reply.message_json(), "logprobs": lp, "finish_reason": finish,
                    })
                }
                None => choice_json(header.endpoint, i, &text, lp, finish, false, false),
            }
        })
        .collect();
    Ok((header.body(out, Some(usage.json()), false), usage))
}
