//! Server-Sent Events for streamed completions: one `data: {json}` event
//! per token that completes text (UTF-8 whole, stop-string prefixes held
//! back by the engine), a final chunk per choice with its
//! `finish_reason`, the `usage` chunk when asked for, then `data: [DONE]`.
//! The body owns the engine's receiver: a client that disconnects drops
//! it, which cancels the sequences before the next step.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use kiln_runtime::engine::Event;
use kiln_tokenizer::Tokenizer;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::response::{
    call_id, choice_json, delta_json, finish_reason, logprobs_json, Header, ReplyShape, Usage,
};
use kiln_runtime::tools::{ReplyEvent, ReplyParser};

/// Everything a stream needs besides its receiver.
pub struct StreamSpec {
    pub header: Header,
    pub tok: Arc<Tokenizer>,
    pub n: usize,
    pub include_usage: bool,
    /// Completions' `echo`: the prompt text, sent first for each choice.
    pub echo: Option<String>,
    /// Chat: how replies split into reasoning, content and tool calls.
    pub shape: ReplyShape,
}

struct State {
    spec: StreamSpec,
    rx: UnboundedReceiver<Event>,
    queue: VecDeque<Bytes>,
    usage: Usage,
    /// Per choice: characters sent so far (completions' `text_offset`).
    offsets: Vec<usize>,
    /// Per choice: its reply splitter (chat with tools or thoughts).
    parsers: Vec<Option<ReplyParser>>,
    /// Per choice: tool calls sent so far.
    calls: Vec<usize>,
    done: bool,
}

fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl State {
    fn chunk(
        &mut self,
        index: usize,
        text: &str,
        logprobs: Option<Value>,
        finish: Option<&str>,
        first: bool,
    ) {
        let h = &self.spec.header;
        let c = choice_json(h.endpoint, index, text, logprobs, finish, true, first);
        let body = h.body(vec![c], None, true);
        let body = if self.spec.include_usage {
            body
        } else {
            strip_usage(body)
        };
        self.queue.push_back(event(&body));
    }

    /// A chat chunk with this `delta` object.
    fn delta(&mut self, index: usize, delta: Value, logprobs: Option<Value>, finish: Option<&str>) {
        let c = serde_json::json!({
            "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
        });
        let body = self.spec.header.body(vec![c], None, true);
        let body = if self.spec.include_usage {
            body
        } else {
            strip_usage(body)
        };
        self.queue.push_back(event(&body));
    }

    /// Sends a choice's reply parts; `lp` goes with the first (or alone).
    fn reply_events(&mut self, choice: usize, evs: Vec<ReplyEvent>, mut lp: Option<Value>) {
        for mut ev in evs {
            let k = self.calls[choice];
            if let ReplyEvent::ToolCall(c) = &mut ev {
                c.id = call_id(&self.spec.header.id, choice, k);
                self.calls[choice] += 1;
            }
            self.delta(choice, delta_json(&ev, k), lp.take(), None);
        }
        if lp.is_some() {
            self.delta(choice, serde_json::json!({"content": ""}), lp, None);
        }
    }

    /// The chunks that open each choice: the role (chat) or the echoed
    /// prompt (completions with `echo`).
    fn open(&mut self) {
        for i in 0..self.spec.n {
            match (self.spec.header.endpoint, self.spec.echo.clone()) {
                (crate::response::Endpoint::Chat, _) => self.chunk(i, "", None, None, true),
                (_, Some(echo)) => {
                    self.offsets[i] = echo.chars().count();
                    self.chunk(i, &echo, None, None, false);
                }
                _ => {}
            }
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Token(t) => {
                if t.text.is_empty() && t.logprob.is_none() {
                    return;
                }
                let lp = t.logprob.map(|lp| {
                    let (v, _) = logprobs_json(
                        self.spec.header.endpoint,
                        &self.spec.tok,
                        std::slice::from_ref(&lp),
                        self.offsets[t.choice],
                    );
                    v
                });
                self.offsets[t.choice] += t.text.chars().count();
                match self.parsers[t.choice].as_mut() {
                    Some(p) => {
                        let evs = p.push(&t.text);
                        self.reply_events(t.choice, evs, lp);
                    }
                    None => self.chunk(t.choice, &t.text, lp, None, false),
                }
            }
            Event::Done(d) => {
                self.usage.add(&d);
                let mut finish = finish_reason(d.finish);
                if let Some(p) = self.parsers[d.choice].as_mut() {
                    let evs = p.finish();
                    self.reply_events(d.choice, evs, None);
                    if self.calls[d.choice] > 0 {
                        finish = "tool_calls";
                    }
                }
                self.chunk(d.choice, "", None, Some(finish), false);
            }
            Event::Failed { error, .. } => {
                let e = ApiError::from(error);
                self.queue.push_back(event(&e.body()));
            }
            Event::Embedding { .. } => {}
        }
    }

    fn close(&mut self) {
        if self.spec.include_usage {
            let body = self
                .spec
                .header
                .body(Vec::new(), Some(self.usage.json()), true);
            self.queue.push_back(event(&body));
        }
        self.queue
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.done = true;
    }
}

/// Chunks carry `usage` only when `stream_options.include_usage` asked.
fn strip_usage(mut v: Value) -> Value {
    if let Value::Object(o) = &mut v {
        o.remove("usage");
    }
    v
}

/// The streaming response for a submitted job.
pub fn sse_response(spec: StreamSpec, rx: UnboundedReceiver<Event>) -> Response {
    let n = spec.n;
    let mut state = State {
        rx,
        queue: VecDeque::new(),
        usage: Usage::default(),
        offsets: vec![0; n],
        parsers: (0..n).map(|_| spec.shape.parser()).collect(),
        calls: vec![0; n],
        spec,
        done: false,
    };
    state.open();
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(b) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(b), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(ev) => st.on_event(ev),
                None => st.close(),
            }
        }
    });
    let mut r = Body::from_stream(stream).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
