//! The endpoints besides generation: models, embeddings, tokenize,
//! detokenize, health and metrics.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kiln_runtime::engine::{EmbedJob, EngineState, Event, Job};
use kiln_tokenizer::DecodeOptions;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::request::{parse_detokenize, parse_embeddings, parse_tokenize, PromptInput};
use crate::response::Usage;
use crate::{read_body, AppState, UsageLog};

fn reply(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    match st.engine.state() {
        EngineState::Ready => Json(json!({"status": "ok"})).into_response(),
        EngineState::Loading => ApiError::unavailable("the model is loading")
            .with_code("model_loading")
            .into_response(),
        EngineState::Stopped(why) => ApiError::unavailable(why).into_response(),
    }
}

pub async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id,
            "object": "model",
            "created": st.created,
            "owned_by": "kiln",
        }],
    }))
}

pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let text = st.metrics.render(st.engine.metrics());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub async fn tokenize(State(st): State<Arc<AppState>>, body: Body) -> Response {
    reply(
        async {
            let (content, add_special, with_pieces) = parse_tokenize(&read_body(&st, body).await?)?;
            let ids = st.tokenizer.encode(&content, add_special, true);
            let tokens: Vec<Value> = if with_pieces {
                ids.iter()
                    .map(|&id| {
                        let piece = st
                            .tokenizer
                            .token_to_piece(id, true)
                            .map(|p| String::from_utf8_lossy(&p).into_owned())
                            .unwrap_or_default();
                        json!({"id": id, "piece": piece})
                    })
                    .collect()
            } else {
                ids.iter().map(|&id| json!(id)).collect()
            };
            Ok(Json(json!({ "tokens": tokens })).into_response())
        }
        .await,
    )
}

pub async fn detokenize(State(st): State<Arc<AppState>>, body: Body) -> Response {
    reply(
        async {
            let ids = parse_detokenize(&read_body(&st, body).await?, &st.limits())?;
            let content = st
                .tokenizer
                .decode_lossy(&ids, DecodeOptions::default())
                .map_err(|e| ApiError::param("tokens", e.to_string()))?;
            Ok(Json(json!({ "content": content })).into_response())
        }
        .await,
    )
}

/// Embeddings: post-norm hidden states pooled (mean, or the last token's)
/// and L2-normalised, as OpenAI's are, so a dot product is the cosine.
pub async fn embeddings(State(st): State<Arc<AppState>>, body: Body) -> Response {
    reply(embed(&st, body).await)
}

async fn embed(st: &AppState, body: Body) -> Result<Response, ApiError> {
    let limits = st.limits();
    let req = parse_embeddings(&read_body(st, body).await?, &limits)?;
    st.check_model(req.model.as_deref())?;
    let mut inputs = Vec::with_capacity(req.inputs.len());
    for input in &req.inputs {
        let ids = match input {
            PromptInput::Tokens(ids) => ids.clone(),
            PromptInput::Text(t) => st.tokenizer.encode(t, true, true),
            PromptInput::Chat(_) => return Err(ApiError::param("input", "chat input")),
        };
        if ids.len() > limits.max_context {
            return Err(ApiError::param(
                "input",
                format!(
                    "an input has {} tokens but the context holds {}",
                    ids.len(),
                    limits.max_context
                ),
            )
            .with_code("context_length_exceeded"));
        }
        inputs.push(ids);
    }
    let prompt_tokens: usize = inputs.iter().map(Vec::len).sum();
    let n = inputs.len();
    let mut rx = st.engine.submit(Job::Embed(EmbedJob {
        inputs,
        pooling: req.pooling,
    }))?;
    let mut data = vec![Value::Null; n];
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Embedding { index, vector, .. } => {
                let v = normalized(vector);
                let embedding = if req.base64 {
                    json!(base64_f32(&v))
                } else {
                    json!(v)
                };
                data[index] =
                    json!({"object": "embedding", "index": index, "embedding": embedding});
            }
            Event::Failed { error, .. } => return Err(error.into()),
            _ => {}
        }
    }
    if data.iter().any(Value::is_null) {
        return Err(ApiError::internal("an embedding was not computed"));
    }
    let mut r = Json(json!({
        "object": "list",
        "data": data,
        "model": st.model_id,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }))
    .into_response();
    r.extensions_mut().insert(UsageLog(Usage {
        prompt_tokens,
        ..Usage::default()
    }));
    Ok(r)
}

fn normalized(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        v.iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
    v
}

/// Little-endian f32 bytes in standard base64 (OpenAI's
/// `encoding_format: "base64"`, which the Python client asks for).
fn base64_f32(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(ABC[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        // 1.0f32 = 00 00 80 3f; [1.0, -2.0] = 00 00 80 3f 00 00 00 c0.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
        assert_eq!(base64_f32(&[]), "");
    }

    #[test]
    fn normalized_has_unit_length_and_keeps_zero() {
        assert_eq!(normalized(vec![3.0, 4.0]), vec![0.6, 0.8]);
        assert_eq!(normalized(vec![0.0, 0.0]), vec![0.0, 0.0]);
    }
}
