//! Constrained decoding: a [`ConstraintSpec`] (JSON schema, Lark grammar,
//! regex or a list of choices) compiled by llguidance into a [`Constraint`]
//! that masks every step's logits, so only tokens that keep the output
//! valid can be drawn (greedy included).
//!
//! [`Grammars`] is built once per tokenizer: a token trie of every id's
//! bytes ([`vocab`]), shared by all requests. A [`Constraint`] is one
//! request's parser state; the generation loops call
//! [`mask`](Constraint::mask) before sampling, [`accept`](Constraint::accept)
//! after, and end the output when [`is_complete`](Constraint::is_complete)
//! says no token can extend it. End-of-generation tokens are allowed exactly
//! where the constraint may end.
//!
//! JSON schemas are generated compactly (`{"a": 1, "b": [2, 3]}`: one
//! space after `:` and `,`, no other whitespace) unless the schema sets its
//! own llguidance options under `x-guidance`; unbounded whitespace would let
//! a sampled model pad forever.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kiln_runtime::constrain::{ConstraintSpec, Grammars};
//! let gguf = kiln_gguf::Gguf::open("gemma-3-270m-q4_k_m.gguf")?;
//! let tok = Arc::new(kiln_tokenizer::Tokenizer::from_gguf(&gguf)?);
//! let grammars = Grammars::new(tok)?;
//! let mut c = grammars.compile(&ConstraintSpec::Regex("(yes|no)".into()))?;
//! let mut logits = vec![0.0f32; 262_144];
//! c.mask(&mut logits)?; // every id that cannot start "yes" or "no" is now -inf
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod vocab;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

use crate::error::{Result, RuntimeError};

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// JSON valid against this JSON schema.
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A grammar in llguidance's Lark dialect (`start: ...`).
    Lark(String),
    /// A regular expression the whole output must match.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

/// The compact JSON layout (see the module docs).
pub(crate) fn compact_json_options() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

impl ConstraintSpec {
    /// A short name for errors: `json_schema`, `lark`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonSchema(_) => "json_schema",
            ConstraintSpec::JsonObject => "json_object",
            ConstraintSpec::Lark(_) => "lark",
            ConstraintSpec::Regex(_) => "regex",
            ConstraintSpec::Choice(_) => "choice",
        }
    }

    fn invalid(&self, reason: impl Into<String>) -> RuntimeError {
        RuntimeError::InvalidConstraint {
            kind: self.kind(),
            reason: reason.into(),
        }
    }

    fn to_grammar(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            ConstraintSpec::JsonSchema(schema) => {
                let Value::Object(obj) = schema else {
                    return Err(self.invalid("a JSON schema must be an object"));
                };
                let mut obj = obj.clone();
                obj.entry("x-guidance").or_insert_with(compact_json_options);
                TopLevelGrammar::from_json_schema(Value::Object(obj))
            }
            ConstraintSpec::JsonObject => TopLevelGrammar::from_json_schema(
                json!({"type": "object", "x-guidance": compact_json_options()}),
            ),
            ConstraintSpec::Lark(src) if src.trim().is_empty() => {
                return Err(self.invalid("the grammar is empty"))
            }
            ConstraintSpec::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
            ConstraintSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            ConstraintSpec::Choice(items) if items.is_empty() => {
                return Err(self.invalid("the list of choices is empty"))
            }
            ConstraintSpec::Choice(items) => {
                // Lark string literals use JSON string syntax.
                let alts: Vec<String> = items
                    .iter()
                    .map(|s| Value::String(s.clone()).to_string())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
        })
    }
}

/// The grammar compiler for one tokenizer (build once, share).
pub struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab", &self.factory.tok_env().tok_trie().vocab_size())
            .finish()
    }
}

impl Grammars {
    /// The token trie of `tok` (every id's bytes; its end-of-generation ids
    /// end a constraint). Takes a fraction of a second for a 262k vocab.
    pub fn new(tok: Arc<Tokenizer>) -> Result<Grammars> {
        let eog = tok.eog_ids();
        let env = vocab::tok_env(tok, &eog)?;
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| RuntimeError::InvalidConstraint {
                kind: "vocabulary",
                reason: e.to_string(),
            })?;
        // Grammar warnings are not errors; nothing goes to stderr.
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// Compiles `spec`; a bad schema, grammar or regex is
    /// [`RuntimeError::InvalidConstraint`] naming the problem.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Constraint> {
        let grammar = spec.to_grammar()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| spec.invalid(first_line(&e.to_string())))?;
        let mut matcher = Matcher::new(Ok(parser));
        // An unsatisfiable grammar shows itself in the first mask.
        match matcher.compute_mask() {
            Ok(m) if m.is_zero() => Err(spec.invalid("no output can satisfy it")),
            Ok(_) => Ok(Constraint {
                matcher: Box::new(matcher),
                kind: spec.kind(),
                mask_times: Vec::new(),
            }),
            Err(e) => Err(spec.invalid(first_line(&e.to_string()))),
        }
    }
}

/// llguidance errors append the grammar and parser state after the first
/// line; the first line says what is wrong.
fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).trim().to_string()
}

/// One request's constraint state. Clone it for each choice of a request.
#[derive(Clone)]
pub struct Constraint {
    /// Boxed: the parser state is large, and jobs move it around.
    matcher: Box<Matcher>,
    kind: &'static str,
    /// Time of every [`mask`](Self::mask) call, in order.
    mask_times: Vec<Duration>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("kind", &self.kind)
            .field("complete", &self.is_complete())
            .finish()
    }
}

impl Constraint {
    /// Sets every logit the constraint forbids at this step to `-inf`
    /// (ids past the vocabulary too).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let t0 = Instant::now();
        let mask = self.matcher.compute_mask().map_err(|e| self.failed(e))?;
        apply_mask(mask.as_slice(), logits);
        self.mask_times.push(t0.elapsed());
        Ok(())
    }

    /// Advances past the sampled token (which the last mask allowed).
    pub fn accept(&mut self, id: u32) -> Result<()> {
        self.matcher.consume_token(id).map_err(|e| self.failed(e))
    }

    /// True when no token can extend the output: generation ends here.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// `json_schema`, `lark`, `regex`, `choice` or `json_object`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// How long each [`mask`](Self::mask) call took, in order.
    pub fn mask_times(&self) -> &[Duration] {
        &self.mask_times
    }

    fn failed(&self, e: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::ConstraintFailed(first_line(&e.to_string()))
    }
}

/// `-inf` where `bits` (bit `i % 32` of word `i / 32`: id `i` allowed) is
/// clear. Whole-zero words (most of the vocabulary under a JSON grammar)
/// are filled in one go.
pub(crate) fn apply_mask(bits: &[u32], logits: &mut [f32]) {
    for (i, chunk) in logits.chunks_mut(32).enumerate() {
        match bits.get(i).copied().unwrap_or(0) {
            0 => chunk.fill(f32::NEG_INFINITY),
            u32::MAX => {}
            w => {
                for (b, l) in chunk.iter_mut().enumerate() {
                    if w >> b & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}

/// Median and 99th percentile of `times` (None when empty).
pub fn percentiles(times: &[Duration]) -> Option<(Duration, Duration)> {
    if times.is_empty() {
        return None;
    }
    let mut t = times.to_vec();
    t.sort_unstable();
    let at = |q: f64| t[((t.len() - 1) as f64 * q).round() as usize];
    Some((at(0.5), at(0.99)))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
