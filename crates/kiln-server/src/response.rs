//! The JSON of completion and chat responses: whole ones, streamed
//! chunks, logprobs in each endpoint's shape, and `usage`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use kiln_runtime::engine::{Done, TokenLogprob};
use kiln_runtime::tools::{ReplyEvent, ReplyParser, ToolCall, ToolSyntax};
use kiln_runtime::FinishReason;
use kiln_tokenizer::Tokenizer;
use serde_json::{json, Value};

/// Which endpoint a response is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// Identity of one response: its id, creation time and model name.
#[derive(Clone, Debug)]
pub struct Header {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Header {
    pub fn new(endpoint: Endpoint, model: &str) -> Header {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let created = unix_time();
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        Header {
            endpoint,
            id: format!("{prefix}-{created:x}{n:08x}"),
            created,
            model: model.to_owned(),
        }
    }

    /// A whole response or one streamed chunk with these choices.
    pub fn body(&self, choices: Vec<Value>, usage: Option<Value>, chunk: bool) -> Value {
        let object = match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
            "usage": usage,
        })
    }
}

pub fn unix_time() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// OpenAI's `finish_reason`: `stop` for an end-of-generation token or a
/// stop string or id, `length` for the token limit or a full context.
pub fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length | FinishReason::ContextFull => "length",
        _ => "stop",
    }
}

/// Token counts of a whole request (the prompt counted once, every
/// choice's completion tokens added).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

impl Usage {
    pub fn add(&mut self, d: &Done) {
        self.prompt_tokens = d.prompt_tokens;
        self.completion_tokens += d.completion_tokens;
        self.cached_tokens = self.cached_tokens.max(d.cached_tokens);
    }

    pub fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// A token's text for logprobs (its piece; invalid UTF-8 lossily).
fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok
        .token_to_piece(id, false)
        .map(|p| p.into_owned())
        .unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Logprobs of `tokens` in the endpoint's shape; `offset` is where the
/// first token's text starts in the choice's text (completions'
/// `text_offset`). Returns the JSON and the offset after the last token.
pub fn logprobs_json(
    endpoint: Endpoint,
    tok: &Tokenizer,
    tokens: &[TokenLogprob],
    mut offset: usize,
) -> (Value, usize) {
    match endpoint {
        Endpoint::Chat => {
            let content: Vec<Value> = tokens
                .iter()
                .map(|t| {
                    let (text, bytes) = piece(tok, t.id);
                    let top: Vec<Value> = t
                        .top
                        .iter()
                        .map(|&(id, lp)| {
                            let (text, bytes) = piece(tok, id);
                            json!({"token": text, "logprob": lp, "bytes": bytes})
                        })
                        .collect();
                    json!({"token": text, "logprob": t.logprob, "bytes": bytes, "top_logprobs": top})
                })
                .collect();
            (json!({ "content": content }), offset)
        }
        Endpoint::Completions => {
            let mut texts = Vec::with_capacity(tokens.len());
            let mut lps = Vec::with_capacity(tokens.len());
            let mut tops = Vec::with_capacity(tokens.len());
            let mut offsets = Vec::with_capacity(tokens.len());
            for t in tokens {
                let (text, _) = piece(tok, t.id);
                offsets.push(offset);
                offset += text.chars().count();
                texts.push(text);
                lps.push(t.logprob);
                let top: serde_json::Map<String, Value> = t
                    .top
                    .iter()
                    .map(|&(id, lp)| (piece(tok, id).0, json!(lp)))
                    .collect();
                tops.push(Value::Object(top));
            }
            let v = json!({
                "tokens": texts,
                "token_logprobs": lps,
                "top_logprobs": tops,
                "text_offset": offsets,
            });
            (v, offset)
        }
    }
}

/// One choice of a whole response, or one streamed choice delta.
pub fn choice_json(
    endpoint: Endpoint,
    index: usize,
    text: &str,
    logprobs: Option<Value>,
    finish: Option<&str>,
    chunk: bool,
    first_chunk: bool,
) -> Value {
    match (endpoint, chunk) {
        (Endpoint::Completions, _) => json!({
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish,
        }),
        (Endpoint::Chat, false) => json!({
            "index": index,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": finish,
        }),
        (Endpoint::Chat, true) => {
            let delta = if first_chunk {
                json!({"role": "assistant", "content": text})
            } else if finish.is_some() && text.is_empty() {
                json!({})
            } else {
                json!({ "content": text })
            };
            json!({
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
            })
        }
    }
}

/// How a chat reply's text is split (see [`ReplyParser`]): which tool
/// syntax to parse, and whether Gemma 4's thought channel is reasoning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyShape {
    pub calls: Option<ToolSyntax>,
    pub thoughts: bool,
}

impl ReplyShape {
    /// A parser for one choice, or None when the text is passed through.
    pub fn parser(&self) -> Option<ReplyParser> {
        (self.calls.is_some() || self.thoughts).then(|| ReplyParser::new(self.calls, self.thoughts))
    }
}

/// OpenAI's JSON of a parsed call: `arguments` as a JSON string.
pub fn tool_call_json(call: &ToolCall, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments.to_string()},
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

/// A whole chat reply split into its parts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitReply {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
}

impl SplitReply {
    pub fn add(&mut self, ev: ReplyEvent, id: impl FnOnce(usize) -> String) {
        match ev {
            ReplyEvent::Content(t) => self.content.push_str(&t),
            ReplyEvent::Reasoning(t) => self.reasoning.push_str(&t),
            ReplyEvent::ToolCall(mut c) => {
                c.id = id(self.calls.len());
                self.calls.push(c);
            }
        }
    }

    /// The `message` of a whole chat choice.
    pub fn message_json(&self) -> Value {
        let mut m = json!({"role": "assistant", "content": self.content});
        if !self.reasoning.is_empty() {
            m["reasoning_content"] = json!(self.reasoning);
        }
        if !self.calls.is_empty() {
            if self.content.is_empty() {
                m["content"] = Value::Null;
            }
            let calls: Vec<Value> = self.calls.iter().map(|c| tool_call_json(c, None)).collect();
            m["tool_calls"] = json!(calls);
        }
        m
    }
}

/// A streamed delta for one part of a reply (`index`: the call's index
/// within its choice).
pub fn delta_json(ev: &ReplyEvent, index: usize) -> Value {
    match ev {
        ReplyEvent::Content(t) => json!({ "content": t }),
        ReplyEvent::Reasoning(t) => json!({ "reasoning_content": t }),
        ReplyEvent::ToolCall(c) => json!({ "tool_calls": [tool_call_json(c, Some(index))] }),
    }
}

/// A tool call id, unique per response choice and call.
pub fn call_id(response_id: &str, choice: usize, k: usize) -> String {
    let tail = response_id.rsplit('-').next().unwrap_or(response_id);
    format!("call_{tail}_{choice}_{k}")
}
