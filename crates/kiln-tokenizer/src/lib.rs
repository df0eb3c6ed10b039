//! Gemma tokenizers (SentencePiece and Gemma 4 BPE) built from GGUF metadata.
//!
//! [`Tokenizer::from_gguf`] reads `tokenizer.ggml.*` and dispatches on
//! `tokenizer.ggml.model`:
//!
//! - `"llama"` (Gemma 2/3): SentencePiece BPE that merges the adjacent pair
//!   whose concatenation is the highest-scoring vocabulary token, with
//!   `<0xXX>` byte fallback.
//! - `"gemma4"`: BPE by merge rank over `tokenizer.ggml.merges`, spaces
//!   escaped to `▁`, text pre-split into newline runs and other runs.
//!
//! The reference is llama.cpp (commit 0c1e570, the one our reference data
//! comes from); where it and Hugging Face disagree we follow llama.cpp and
//! say so where it happens. Every entry point takes arbitrary bytes and
//! never panics; ids outside the vocabulary are an error.

mod bpe;
mod decode;
mod error;
mod merge;
mod pieces;
mod special;
mod spm;
mod vocab;

pub use decode::{DecodeOptions, StreamDecoder};
pub use error::TokenizerError;
pub use vocab::{TokenAttr, TokenType, Tokenizer, TokenizerKind};
