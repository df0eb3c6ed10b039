use kiln_gguf::GgufError;

/// Why a tokenizer could not be built or an id could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("unsupported tokenizer model '{0}' (expected 'llama' or 'gemma4')")]
    UnsupportedModel(String),
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
    #[error("token id {id} is out of range (vocabulary has {n_vocab} tokens)")]
    IdOutOfRange { id: u32, n_vocab: usize },
}
