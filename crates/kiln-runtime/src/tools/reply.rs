//! Splitting a reply's text, as it streams, into reasoning (Gemma 4's
//! thought channel), content and tool calls. Markers may arrive split
//! across pieces (byte-spelled by small tokens), so text that could be the
//! start of a marker is held back until the next piece decides.

use super::{ToolCall, ToolSyntax};

const THOUGHT_OPEN: &str = "<|channel>";
const THOUGHT_CLOSE: &str = "<channel|>";
/// The channel name the model writes after `<|channel>`.
const THOUGHT_LABEL: &str = "thought\n";

/// A part of a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyEvent {
    /// Thought-channel text (OpenAI's `reasoning_content`).
    Reasoning(String),
    /// Answer text.
    Content(String),
    /// A well-formed call (its `id` empty).
    ToolCall(ToolCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Text,
    /// Inside a thought; `label` while the channel name may still follow.
    Thought {
        label: bool,
    },
    Call,
}

/// The reply splitter of one choice. A call that does not parse is given
/// back as content, markers and all; so is one cut short by the end.
#[derive(Debug)]
pub struct ReplyParser {
    calls: Option<ToolSyntax>,
    thoughts: bool,
    state: State,
    buf: String,
    n_calls: usize,
}

impl ReplyParser {
    /// `calls`: the tool syntax to recognise (None: calls are content);
    /// `thoughts`: split Gemma 4's thought channel into reasoning.
    pub fn new(calls: Option<ToolSyntax>, thoughts: bool) -> Self {
        ReplyParser {
            calls,
            thoughts,
            state: State::Text,
            buf: String::new(),
            n_calls: 0,
        }
    }

    /// Tool calls parsed so far.
    pub fn n_calls(&self) -> usize {
        self.n_calls
    }

    /// Feeds the next piece of text; returns what became final.
    pub fn push(&mut self, text: &str) -> Vec<ReplyEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// The end of the reply: everything held back is released.
    pub fn finish(&mut self) -> Vec<ReplyEvent> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        out
    }

    /// One transition; false when it needs more text (or, at the end,
    /// when the buffer is empty).
    fn step(&mut self, out: &mut Vec<ReplyEvent>, end: bool) -> bool {
        match self.state {
            State::Text => {
                let mut opens: Vec<&str> = Vec::new();
                if self.thoughts {
                    opens.push(THOUGHT_OPEN);
                }
                if let Some(s) = self.calls {
                    opens.push(s.markers().0);
                }
                let found = opens
                    .iter()
                    .filter_map(|m| self.buf.find(m).map(|i| (i, *m)))
                    .min();
                match found {
                    Some((i, marker)) => {
                        let before: String = self.buf.drain(..i + marker.len()).collect();
                        self.content(&before[..i], out);
                        self.state = if marker == THOUGHT_OPEN {
                            State::Thought { label: true }
                        } else {
                            State::Call
                        };
                        true
                    }
                    None => {
                        let keep = if end { 0 } else { held_back(&self.buf, &opens) };
                        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.content(&text, out);
                        false
                    }
                }
            }
            State::Thought { label } => {
                if label {
                    if self.buf.starts_with(THOUGHT_LABEL) {
                        self.buf.drain(..THOUGHT_LABEL.len());
                    } else if !end
                        && THOUGHT_LABEL.starts_with(self.buf.as_str())
                        && !self.buf.contains(THOUGHT_CLOSE)
                    {
                        return false;
                    }
                    self.state = State::Thought { label: false };
                }
                match self.buf.find(THOUGHT_CLOSE) {
                    Some(i) => {
                        let text: String = self.buf.drain(..i + THOUGHT_CLOSE.len()).collect();
                        push_text(out, ReplyEvent::Reasoning, &text[..i]);
                        self.state = State::Text;
                        true
                    }
                    None => {
                        let keep = if end {
                            0
                        } else {
                            held_back(&self.buf, &[THOUGHT_CLOSE])
                        };
                        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                        push_text(out, ReplyEvent::Reasoning, &text);
                        false
                    }
                }
            }
            State::Call => {
                let Some(syntax) = self.calls else {
                    self.state = State::Text;
                    return true;
                };
                let (open, close) = syntax.markers();
                match self.buf.find(close) {
                    Some(i) => {
                        let raw: String = self.buf.drain(..i + close.len()).collect();
                        match syntax.parse_call(&raw[..i]) {
                            Ok((name, arguments)) => {
                                self.n_calls += 1;
                                out.push(ReplyEvent::ToolCall(ToolCall {
                                    id: String::new(),
                                    name,
                                    arguments,
                                }));
                            }
                            Err(_) => self.content(&format!("{open}{raw}"), out),
                        }
                        self.state = State::Text;
                        true
                    }
                    None if end => {
                        let raw = std::mem::take(&mut self.buf);
                        self.content(&format!("{open}{raw}"), out);
                        self.state = State::Text;
                        false
                    }
                    None => false,
                }
            }
        }
    }

    /// Content text; whitespace between or after calls is dropped.
    fn content(&self, text: &str, out: &mut Vec<ReplyEvent>) {
        if self.n_calls > 0 && text.trim().is_empty() {
            return;
        }
        push_text(out, ReplyEvent::Content, text);
    }
}

/// Appends non-empty text, merged into the previous event of its kind.
fn push_text(out: &mut Vec<ReplyEvent>, kind: fn(String) -> ReplyEvent, text: &str) {
    if text.is_empty() {
        return;
    }
    match (out.last_mut(), kind(String::new())) {
        (Some(ReplyEvent::Content(s)), ReplyEvent::Content(_))
        | (Some(ReplyEvent::Reasoning(s)), ReplyEvent::Reasoning(_)) => s.push_str(text),
        _ => out.push(kind(text.to_string())),
    }
}

/// How many bytes at the end of `buf` could begin one of `markers`.
fn held_back(buf: &str, markers: &[&str]) -> usize {
    let mut keep = 0;
    for m in markers {
        for k in (1..m.len().min(buf.len() + 1)).rev() {
            if buf.is_char_boundary(buf.len() - k) && m.starts_with(&buf[buf.len() - k..]) {
                keep = keep.max(k);
                break;
            }
        }
    }
    keep
}

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;
