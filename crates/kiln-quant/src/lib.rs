//! GGML tensor types as stored in GGUF files: block layouts, scalar
//! dequantizers (the obviously-correct reference) and quantizers.

mod types;
pub use types::GgmlType;
