//! Request parsing and validation: JSON bodies of the OpenAI endpoints into
//! checked values, every bad field a 400 naming it. Pure functions of the
//! bytes and [`Limits`] (no model, no I/O), so they are fuzzed directly.
//!
//! Unknown fields are ignored (clients send `user`, `metadata` and
//! others); a known field of the wrong type or out of range is an
//! error, `null` counts as absent.

use std::collections::BTreeMap;

use kiln_runtime::constrain::ConstraintSpec;
use kiln_runtime::engine::Pooling;
use kiln_runtime::tools::{ToolChoice, ToolDef};
use kiln_runtime::{ChatMessage, SamplingParams};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::structured;

/// What requests may ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Token ids must be below this.
    pub n_vocab: usize,
    /// Positions per sequence: `max_tokens` may not exceed it.
    pub max_context: usize,
    /// Most choices per request.
    pub max_n: usize,
    /// Most alternatives per token in logprobs.
    pub max_top_logprobs: usize,
    /// Most stop strings.
    pub max_stop: usize,
    /// Most inputs per embeddings request.
    pub max_inputs: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            n_vocab: 262_144,
            max_context: 8192,
            max_n: 16,
            max_top_logprobs: 20,
            max_stop: 16,
            max_inputs: 256,
        }
    }
}

/// A prompt as sent.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    Chat(Vec<ChatMessage>),
}

/// A checked completion or chat request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    /// `max_tokens` is None here when the request left it out.
    pub params: SamplingParams,
    pub max_tokens: Option<usize>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// Alternatives per token when logprobs were asked for.
    pub logprobs: Option<usize>,
    pub echo: bool,
    /// Whether the request set `seed` (else the server picks one).
    pub seeded: bool,
    /// `response_format` (chat): what the output must match.
    pub response_format: Option<ConstraintSpec>,
    /// Functions the model may call (chat).
    pub tools: Vec<ToolDef>,
    pub tool_choice: ToolChoice,
    /// Gemma 4 thinking (`reasoning_effort`, `think`).
    pub thinking: bool,
}

/// A checked embeddings request.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingsRequest {
    pub model: Option<String>,
    pub inputs: Vec<PromptInput>,
    pub pooling: Pooling,
    pub base64: bool,
}

/// The JSON object of a body.
fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid UTF-8: {e}")))?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::invalid("the request body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// Typed access to a request object's fields.
struct Fields(Map<String, Value>);

impl Fields {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn f64_in(&self, name: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let x = v
            .as_f64()
            .ok_or_else(|| ApiError::param(name, format!("'{name}' must be a number")))?;
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::param(
                name,
                format!("'{name}' is {x}; it must be between {lo} and {hi}"),
            ));
        }
        Ok(Some(x))
    }

    fn int_in(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        // Integral floats (`2.0`) are accepted, as Python clients may send them.
        let x = v
            .as_i64()
            .or_else(|| {
                v.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                    .map(|f| f as i64)
            })
            .ok_or_else(|| ApiError::param(name, format!("'{name}' must be an integer")))?;
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::param(
                name,
                format!("'{name}' is {x}; it must be between {lo} and {hi}"),
            ));
        }
        Ok(Some(x))
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::param(
                name,
                format!("'{name}' must be true or false"),
            )),
        }
    }

    fn str(&self, name: &str) -> Result<Option<&str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::param(name, format!("'{name}' must be a string"))),
        }
    }
}

/// `POST /v1/completions`.
pub fn parse_completion(body: &[u8], limits: &Limits) -> Result<GenerateRequest, ApiError> {
    let f = Fields(object(body)?);
    let prompt = match f.get("prompt") {
        None => return Err(ApiError::param("prompt", "'prompt' is required")),
        Some(v) => prompt_input(v, "prompt", limits)?,
    };
    if f.get("suffix").is_some() {
        return Err(ApiError::param(
            "suffix",
            "'suffix' (insertion) is not supported",
        ));
    }
    let logprobs = f.int_in("logprobs", 0, limits.max_top_logprobs as i64)?;
    let mut req = common(&f, prompt, limits, &["max_tokens"])?;
    req.logprobs = logprobs.map(|k| k as usize);
    req.echo = f.bool("echo")?.unwrap_or(false);
    Ok(req)
}

/// `POST /v1/chat/completions`.
pub fn parse_chat(body: &[u8], limits: &Limits) -> Result<GenerateRequest, ApiError> {
    let f = Fields(object(body)?);
    let messages = match f.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .enumerate()
            .map(|(i, m)| chat_message(i, m))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::Array(_)) => return Err(ApiError::param("messages", "'messages' is empty")),
        Some(_) => return Err(ApiError::param("messages", "'messages' must be an array")),
        None => return Err(ApiError::param("messages", "'messages' is required")),
    };
    let top = f.int_in("top_logprobs", 0, limits.max_top_logprobs as i64)?;
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    if top.is_some() && !logprobs {
        return Err(ApiError::param(
            "top_logprobs",
            "'top_logprobs' needs 'logprobs': true",
        ));
    }
    let mut req = common(
        &f,
        PromptInput::Chat(messages),
        limits,
        &["max_completion_tokens", "max_tokens"],
    )?;
    req.logprobs = logprobs.then(|| top.unwrap_or(0) as usize);
    req.response_format = structured::response_format(f.get("response_format"))?;
    req.tools = structured::tools(f.get("tools"))?;
    req.tool_choice = structured::tool_choice(f.get("tool_choice"), &req.tools)?;
    req.thinking = structured::thinking(&f.0)?;
    if req.response_format.is_some() && !req.tools.is_empty() && req.tool_choice != ToolChoice::None
    {
        return Err(ApiError::param(
            "response_format",
            "'response_format' cannot be combined with 'tools' (unless tool_choice is none)",
        ));
    }
    Ok(req)
}

/// One chat message: a role and text content (a string or text parts).
fn chat_message(i: usize, m: &Value) -> Result<ChatMessage, ApiError> {
    let param = format!("messages[{i}]");
    let Value::Object(o) = m else {
        return Err(ApiError::param(
            &param,
            format!("'{param}' must be an object"),
        ));
    };
    let role = match o.get("role") {
        Some(Value::String(r)) => match r.as_str() {
            // OpenAI's newer name for the system role.
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            r => {
                return Err(ApiError::param(
                    format!("{param}.role"),
                    format!("role {r:?} is not supported; use system, user, assistant or tool"),
                ))
            }
        },
        _ => {
            return Err(ApiError::param(
                format!("{param}.role"),
                "a message needs a string 'role'",
            ))
        }
    };
    let content = match o.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => return Err(ApiError::param(
                        format!("{param}.content"),
                        "only text content parts ({\"type\":\"text\",\"text\":...}) are supported",
                    )),
                }
            }
            text
        }
        Some(_) => {
            return Err(ApiError::param(
                format!("{param}.content"),
                "'content' must be a string or an array of text parts",
            ))
        }
    };
    let mut msg = ChatMessage::new(role, content);
    if role == "assistant" {
        msg.tool_calls = structured::message_tool_calls(o.get("tool_calls"), &param)?;
    }
    if role == "tool" {
        msg.tool_call_id = o
            .get("tool_call_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        msg.name = o.get("name").and_then(Value::as_str).map(str::to_owned);
    }
    Ok(msg)
}

/// A prompt: a string, token ids, or a one-element list of either.
fn prompt_input(v: &Value, name: &str, limits: &Limits) -> Result<PromptInput, ApiError> {
    match v {
        Value::String(s) if s.is_empty() => {
            Err(ApiError::param(name, format!("'{name}' is empty")))
        }
        Value::String(s) => Ok(PromptInput::Text(s.clone())),
        Value::Array(a) if a.is_empty() => Err(ApiError::param(name, format!("'{name}' is empty"))),
        Value::Array(a) if a.iter().all(Value::is_number) => {
            Ok(PromptInput::Tokens(token_ids(a, name, limits)?))
        }
        Value::Array(a) if a.len() == 1 => prompt_input(&a[0], name, limits),
        Value::Array(_) => Err(ApiError::param(
            name,
            format!("'{name}' holds several prompts; send one per request"),
        )),
        _ => Err(ApiError::param(
            name,
            format!("'{name}' must be a string or an array of token ids"),
        )),
    }
}

/// Token ids, each in the vocabulary.
pub fn token_ids(a: &[Value], name: &str, limits: &Limits) -> Result<Vec<u32>, ApiError> {
    a.iter()
        .map(|v| match v.as_u64() {
            Some(id) if (id as usize) < limits.n_vocab => Ok(id as u32),
            _ => Err(ApiError::param(
                name,
                format!(
                    "token id {v} is not in the vocabulary (0..{})",
                    limits.n_vocab
                ),
            )),
        })
        .collect()
}

/// The parameters completions and chat share. `max_names`: the field
/// names of the token limit, in order of precedence.
fn common(
    f: &Fields,
    prompt: PromptInput,
    limits: &Limits,
    max_names: &[&str],
) -> Result<GenerateRequest, ApiError> {
    let mut max_tokens = None;
    for name in max_names {
        if let Some(m) = f.int_in(name, 1, limits.max_context as i64)? {
            max_tokens.get_or_insert(m as usize);
        }
    }
    let mut p = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        ..SamplingParams::default()
    };
    if let Some(t) = f.f64_in("temperature", 0.0, 2.0)? {
        p.temperature = t as f32;
    }
    // Compared after the cast: 1e-50 is above 0 as f64 but not as f32.
    if let Some(x) = f.f64_in("top_p", 0.0, 1.0)? {
        if x as f32 <= 0.0 {
            return Err(ApiError::param("top_p", "'top_p' must be above 0"));
        }
        p.top_p = x as f32;
    }
    // -1 means "off", as in llama.cpp and vLLM.
    if let Some(k) = f.int_in("top_k", -1, limits.n_vocab as i64)? {
        p.top_k = k.max(0) as usize;
    }
    if let Some(x) = f.f64_in("min_p", 0.0, 1.0)? {
        p.min_p = x as f32;
    }
    if let Some(x) = f.f64_in("presence_penalty", -2.0, 2.0)? {
        p.presence_penalty = x as f32;
    }
    if let Some(x) = f.f64_in("frequency_penalty", -2.0, 2.0)? {
        p.frequency_penalty = x as f32;
    }
    if let Some(x) = f.f64_in("repetition_penalty", 0.0, 10.0)? {
        if x as f32 <= 0.0 {
            return Err(ApiError::param(
                "repetition_penalty",
                "'repetition_penalty' must be above 0",
            ));
        }
        p.repetition_penalty = x as f32;
    }
    let seed = f.int_in("seed", i64::MIN, i64::MAX)?;
    p.seed = seed.unwrap_or(0) as u64;
    p.stop = stop_strings(f, limits)?;
    p.logit_bias = logit_bias(f, limits)?;
    p.ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let n = f.int_in("n", 1, limits.max_n as i64)?.unwrap_or(1) as usize;
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::param(
                    "stream_options.include_usage",
                    "'include_usage' must be true or false",
                ))
            }
        },
        Some(_) => {
            return Err(ApiError::param(
                "stream_options",
                "'stream_options' must be an object",
            ))
        }
    };
    Ok(GenerateRequest {
        model: f.str("model")?.map(str::to_owned),
        prompt,
        params: p,
        max_tokens,
        n,
        stream,
        include_usage,
        logprobs: None,
        echo: false,
        seeded: seed.is_some(),
        response_format: None,
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        thinking: false,
    })
}

fn stop_strings(f: &Fields, limits: &Limits) -> Result<Vec<String>, ApiError> {
    let stops: Vec<String> = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                ApiError::param("stop", "'stop' must be a string or an array of strings")
            })?,
        Some(_) => {
            return Err(ApiError::param(
                "stop",
                "'stop' must be a string or an array of strings",
            ))
        }
    };
    if stops.len() > limits.max_stop {
        return Err(ApiError::param(
            "stop",
            format!("at most {} stop strings are allowed", limits.max_stop),
        ));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::param("stop", "stop strings must not be empty"));
    }
    Ok(stops)
}

/// `{"token id": bias}` with ids in the vocabulary and biases in
/// [-100, 100], as OpenAI allows.
fn logit_bias(f: &Fields, limits: &Limits) -> Result<BTreeMap<u32, f32>, ApiError> {
    let Some(v) = f.get("logit_bias") else {
        return Ok(BTreeMap::new());
    };
    let Value::Object(o) = v else {
        return Err(ApiError::param(
            "logit_bias",
            "'logit_bias' must be an object of token id to bias",
        ));
    };
    let mut out = BTreeMap::new();
    for (k, v) in o {
        let id = k
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < limits.n_vocab)
            .ok_or_else(|| {
                ApiError::param(
                    "logit_bias",
                    format!(
                        "logit_bias key {k:?} is not a token id in the vocabulary (0..{})",
                        limits.n_vocab
                    ),
                )
            })?;
        let b = v
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                ApiError::param(
                    "logit_bias",
                    format!("logit_bias of token {id} must be a number in [-100, 100]"),
                )
            })?;
        out.insert(id, b as f32);
    }
    Ok(out)
}

/// `POST /v1/embeddings`: `input` a string, token ids, or a list of
/// either; `pooling` (extension) `mean` (default) or `last`.
pub fn parse_embeddings(body: &[u8], limits: &Limits) -> Result<EmbeddingsRequest, ApiError> {
    let f = Fields(object(body)?);
    let inputs = match f.get("input") {
        None => return Err(ApiError::param("input", "'input' is required")),
        Some(Value::Array(a)) if !a.is_empty() && !a.iter().all(Value::is_number) => {
            if a.len() > limits.max_inputs {
                return Err(ApiError::param(
                    "input",
                    format!("at most {} inputs per request", limits.max_inputs),
                ));
            }
            a.iter()
                .map(|v| match v {
                    Value::Array(_) | Value::String(_) => prompt_input(v, "input", limits),
                    _ => Err(ApiError::param(
                        "input",
                        "each input must be a string or token ids",
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => vec![prompt_input(v, "input", limits)?],
    };
    let pooling = match f.str("pooling")? {
        None | Some("mean") => Pooling::Mean,
        Some("last") => Pooling::Last,
        Some(p) => {
            return Err(ApiError::param(
                "pooling",
                format!("pooling {p:?}: use mean or last"),
            ))
        }
    };
    let base64 = match f.str("encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(e) => {
            return Err(ApiError::param(
                "encoding_format",
                format!("encoding_format {e:?}: use float or base64"),
            ))
        }
    };
    if f.get("dimensions").is_some() {
        return Err(ApiError::param(
            "dimensions",
            "'dimensions' is not supported",
        ));
    }
    Ok(EmbeddingsRequest {
        model: f.str("model")?.map(str::to_owned),
        inputs,
        pooling,
        base64,
    })
}

/// `POST /tokenize`: `{"content": text, "add_special": bool,
/// "with_pieces": bool}` (llama-server's shape).
pub fn parse_tokenize(body: &[u8]) -> Result<(String, bool, bool), ApiError> {
    let f = Fields(object(body)?);
    let content = f
        .str("content")?
        .ok_or_else(|| ApiError::param("content", "'content' is required"))?
        .to_owned();
    Ok((
        content,
        f.bool("add_special")?.unwrap_or(false),
        f.bool("with_pieces")?.unwrap_or(false),
    ))
}

/// `POST /detokenize`: `{"tokens": [ids]}`.
pub fn parse_detokenize(body: &[u8], limits: &Limits) -> Result<Vec<u32>, ApiError> {
    let f = Fields(object(body)?);
    match f.get("tokens") {
        Some(Value::Array(a)) => token_ids(a, "tokens", limits),
        Some(_) => Err(ApiError::param(
            "tokens",
            "'tokens' must be an array of token ids",
        )),
        None => Err(ApiError::param("tokens", "'tokens' is required")),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
