//! The runtime's error type.

/// Everything that can go wrong in sampling, chat rendering and sessions.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// A sampling parameter is outside its valid range.
    #[error("invalid sampling parameter {name} = {value}: expected {expected}")]
    InvalidSamplingParam {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A logit is NaN or +inf (a model or kernel bug, or an overflow).
    /// `step` counts the tokens generated before it (0: the prompt's
    /// logits); `index` is the token id.
    #[error("{} in logits at step {step} (token {index}); the forward pass produced a bad value", kiln_model::nonfinite_name(*.value))]
    NonFiniteLogit {
        step: usize,
        index: usize,
        value: f32,
    },
    /// Every token was excluded (all logits -inf after biases).
    #[error("no token can be sampled: every logit is -inf")]
    NoCandidate,
    /// A token id (in `logit_bias`, a stop id or a prompt) is not in the vocab.
    #[error("token id {id} is out of the vocabulary (size {vocab_size})")]
    TokenOutOfVocab { id: u32, vocab_size: usize },
    /// The chat template failed to parse or render.
    #[error("chat template: {0}")]
    Template(String),
    /// A chat message has a role the built-in format does not know.
    #[error("chat message {index} has role {role:?}; expected system, user or assistant")]
    UnknownRole { index: usize, role: String },
    /// The prompt does not fit the session's context.
    #[error("prompt of {prompt_len} tokens plus {reserve} to generate exceeds the context of {max_context} tokens (set SessionOptions::truncate to keep the tail)")]
    PromptTooLong {
        prompt_len: usize,
        reserve: usize,
        max_context: usize,
    },
    /// An empty prompt where at least one token is needed.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// An invalid session option.
    #[error("invalid session option {name}: {reason}")]
    InvalidOption { name: &'static str, reason: String },
    /// The GGUF file could not be read.
    #[error(transparent)]
    Gguf(#[from] kiln_gguf::GgufError),
    /// The model (config, weights or forward pass) failed.
    #[error("model: {0}")]
    Model(#[from] kiln_model::ModelError),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] kiln_tokenizer::TokenizerError),
    /// A JSON schema, grammar, regex or choice list that cannot be
    /// compiled into a constraint (or that no output can satisfy).
    #[error("invalid {kind} constraint: {reason}")]
    InvalidConstraint { kind: &'static str, reason: String },
    /// The output constraint failed while generating.
    #[error("constrained decoding failed: {0}")]
    ConstraintFailed(String),
    /// The greedy head found no finite logit (NaN in the hidden state).
    #[error("the greedy head returned no token: the hidden state holds NaN")]
    NonFiniteHidden,
}

impl RuntimeError {
    /// Attributes a bad logit (from sampling or from the model) to
    /// generation step `step`; other errors pass through.
    pub(crate) fn at_step(self, step: usize) -> Self {
        match self {
            RuntimeError::NonFiniteLogit { index, value, .. } => {
                RuntimeError::NonFiniteLogit { step, index, value }
            }
            RuntimeError::Model(kiln_model::ModelError::NonFiniteLogit {
                token, value, ..
            }) => RuntimeError::NonFiniteLogit {
                step,
                index: token as usize,
                value,
            },
            e => e,
        }
    }
}

/// `Result` with a [`RuntimeError`].
pub type Result<T> = std::result::Result<T, RuntimeError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_logits_are_attributed_to_their_step() {
        let e = RuntimeError::NonFiniteLogit {
            step: 0,
            index: 4,
            value: f32::NAN,
        }
        .at_step(7);
        assert_eq!(
            e.to_string(),
            "NaN in logits at step 7 (token 4); the forward pass produced a bad value"
        );
        let m = RuntimeError::Model(kiln_model::ModelError::NonFiniteLogit {
            pos: 30,
            token: 9,
            value: f32::INFINITY,
        })
        .at_step(3);
        assert!(matches!(
            m,
            RuntimeError::NonFiniteLogit {
                step: 3,
                index: 9,
                ..
            }
        ));
        assert!(m.to_string().starts_with("inf in logits at step 3"));
        assert!(matches!(
            RuntimeError::EmptyPrompt.at_step(2),
            RuntimeError::EmptyPrompt
        ));
    }
}
