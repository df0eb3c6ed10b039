//! Gemma tokenizers (SentencePiece and Gemma 4 BPE) built from GGUF metadata.
