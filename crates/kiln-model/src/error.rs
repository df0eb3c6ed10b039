use kiln_gguf::GgufError;

/// Everything that can go wrong building or running a model. Messages name
/// the metadata key or tensor involved.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture {0:?} (supported: gemma2, gemma3, gemma4)")]
    UnsupportedArch(String),
    #[error("metadata key {key}: {reason}")]
    BadKey { key: String, reason: String },
    #[error("tensor {name} is missing")]
    MissingTensor { name: String },
    #[error("tensor {name}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("backend: {0}")]
    Backend(String),
    /// A logit is NaN or infinite: a kernel bug or an overflow. `pos` is the
    /// sequence position whose logits hold it; `token` is `u32::MAX` where
    /// a batched greedy head only knows that one of the row's logits is
    /// not finite (then `value` is NaN).
    #[error("{} in logits at position {pos}{}", nonfinite_name(*.value), token_note(*.token))]
    NonFiniteLogit { pos: usize, token: u32, value: f32 },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

fn token_note(token: u32) -> String {
    if token == u32::MAX {
        String::new()
    } else {
        format!(" (token {token})")
    }
}

/// "NaN", "inf" or "-inf", for error messages.
pub fn nonfinite_name(v: f32) -> &'static str {
    if v.is_nan() {
        "NaN"
    } else if v > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}
