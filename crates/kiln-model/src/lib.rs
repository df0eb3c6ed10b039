//! Gemma 2/3/4 model description and the device-agnostic forward pass.
//!
//! [`ModelConfig`] resolves GGUF metadata into a per-layer description;
//! [`Model`] binds weights by GGUF tensor name and runs the forward pass,
//! written once against the [`Backend`] trait (prefill of N tokens or a
//! decode step of 1, over a [`KvCache`], into caller-owned [`Scratch`]).

mod backend;
mod config;
mod error;
mod kv;
mod model;
pub mod rng;
pub mod sample;
mod scratch;
mod step_input;

pub use backend::{
    AttnParams, Backend, GraphKey, HeadsPart, KvBinding, KvDst, KvStore, PastKv, SeqSpan, StepInput,
};
pub use config::{Arch, LayerConfig, ModelConfig, MoeConfig, RopeConfig};
pub use error::{nonfinite_name, ModelError, Result};
pub use kv::KvCache;
pub use model::{env_flag, BatchSeq, Model, Output, Scratch, TapStats};
pub use rng::Rng;
