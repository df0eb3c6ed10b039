//! The public data types of a session: options, prompts, streamed events
//! and results.

use std::time::Duration;

use kiln_device::Device;

/// What to do with a prompt that does not fit the context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Truncation {
    /// Fail with [`RuntimeError::PromptTooLong`].
    #[default]
    Error,
    /// Keep a leading BOS and the most recent tokens, leaving room for
    /// `min(max_tokens, max_context / 2)` new tokens.
    KeepTail,
}

/// Options of [`Session::load`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Worker threads for the CPU kernels; 0 = one per core.
    pub threads: usize,
    /// Context length in tokens; 0 (the default) = the model's own
    /// `context_length`, larger values are capped by it. The KV cache of
    /// global layers grows on demand, so a large context costs memory only
    /// when it is used.
    pub max_context: usize,
    /// Largest prefill bucket (`max_seq`); longer prompts run in chunks.
    pub max_prefill: usize,
    /// Policy for prompts longer than the context.
    pub truncation: Truncation,
    /// What runs the model ([`Session::load`]; `with_backend` takes the
    /// backend given).
    ///
    /// [`Session::load`]: crate::Session::load
    pub device: Device,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            threads: 0,
            max_context: 0,
            max_prefill: 512,
            truncation: Truncation::Error,
            device: Device::Auto,
        }
    }
}

/// A prompt: text (tokenized with BOS and special-token parsing) or ids.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    /// Text; control tokens such as `<start_of_turn>` are recognised.
    Text(&'a str),
    /// Token ids, used as given (include BOS yourself).
    Tokens(&'a [u32]),
}

impl<'a> From<&'a str> for Prompt<'a> {
    fn from(s: &'a str) -> Self {
        Prompt::Text(s)
    }
}
impl<'a> From<&'a String> for Prompt<'a> {
    fn from(s: &'a String) -> Self {
        Prompt::Text(s)
    }
}
impl<'a> From<&'a [u32]> for Prompt<'a> {
    fn from(t: &'a [u32]) -> Self {
        Prompt::Tokens(t)
    }
}
impl<'a> From<&'a Vec<u32>> for Prompt<'a> {
    fn from(t: &'a Vec<u32>) -> Self {
        Prompt::Tokens(t)
    }
}

/// One streamed token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenEvent {
    /// The token id; None for the final flush of text held back by the stop
    /// matcher or the UTF-8 decoder.
    pub id: Option<u32>,
    /// Text that became final with this token (may be empty: a partial UTF-8
    /// character or a possible stop-string prefix is held back).
    pub text: String,
    /// Index of this token among the generated ones.
    pub index: usize,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token (not included in the output).
    Eog(u32),
    /// One of `stop_token_ids` (not included).
    StopToken(u32),
    /// One of the `stop` strings (not included); its index.
    StopString(usize),
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    ContextFull,
    /// The callback returned `ControlFlow::Break`.
    Cancelled,
    /// The output constraint (schema, grammar, regex, choice) is complete:
    /// no token can extend it.
    Constraint,
}

/// Timings of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// Prompt length after truncation.
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V were reused from the previous call.
    pub reused_tokens: usize,
    /// Prompt tokens computed by prefill.
    pub prefill_tokens: usize,
    /// Wall time of prefill.
    pub prefill_time: Duration,
    /// Tokens run through decode steps.
    pub decode_tokens: usize,
    /// Wall time of decode steps (forward + sampling).
    pub decode_time: Duration,
}

impl Stats {
    /// Prefill throughput (0 when nothing was computed).
    pub fn prefill_tokens_per_s(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_time)
    }
    /// Decode throughput (0 when nothing was computed).
    pub fn decode_tokens_per_s(&self) -> f64 {
        rate(self.decode_tokens, self.decode_time)
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    if n == 0 || t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

/// The result of [`Session::generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Generated ids (without a final EOG / stop token).
    pub tokens: Vec<u32>,
    /// Generated text (without a stop string).
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
    /// Timings.
    pub stats: Stats,
}

/// An embedding of a prompt (post-final-norm hidden states).
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    /// Hidden state of the last token, `[n_embd]`.
    pub last: Vec<f32>,
    /// Mean over all tokens, when requested.
    pub mean: Option<Vec<f32>>,
}
