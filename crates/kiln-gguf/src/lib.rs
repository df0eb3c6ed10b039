//! GGUF (v2 and v3) reader.
//!
//! The file is memory-mapped; tensor views borrow the mapped bytes. Every
//! count, length and offset read from the file is checked against the file
//! size before anything is allocated, so a malformed file gives a
//! [`GgufError`] naming the problem and its byte offset, never a panic.
//!
//! A split model (llama.cpp's gguf-split: `NAME-00001-of-0000N.gguf` and
//! its siblings) opens from its first part as one [`Gguf`].
//!
//! [`write::GgufWriter`] writes GGUF files (synthetic models, tests), and
//! [`malformed::variants`] corrupts a valid file in every way the reader
//! must reject, for tests and fuzz seeds.

mod error;
pub mod malformed;
mod reader;
mod split;
mod value;
pub mod write;

pub use error::{GgufError, Result};
pub use kiln_quant::GgmlType;
pub use reader::{Gguf, TensorInfo, TensorView};
pub use split::split_file_name;
pub use value::{Array, Elem, Scalars, StringArray, Value, ValueRef, ValueType};
