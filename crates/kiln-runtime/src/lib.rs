//! Sessions, KV cache, buckets, sampling and chat templates.
//!
//! - [`sampling`]: [`SamplingParams`] and the seeded [`Sampler`].
//! - [`stop`]: [`StopMatcher`], stop strings on streamed text.
//! - [`chat`]: rendering a conversation into a prompt.
//! - [`constrain`]: JSON schema / grammar / regex constraints as token masks.
//! - [`bucket`]: prefill buckets, the decode ladder, the plan LRU.
//! - [`session`]: [`Session`], load a GGUF and generate.
//! - [`engine`]: continuous batching of many sequences (`kiln serve`).
//! - [`perplexity`]: llama-perplexity's chunked PPL.
//! - [`tools`]: tool calls and thinking in replies (Gemma 4 syntax, parsing).
//!
//! ```
//! use kiln_runtime::{Sampler, SamplingParams};
//! let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
//! assert_eq!(sampler.sample(&mut [0.1, 2.0, -1.0]).unwrap(), 1);
//! ```

pub mod bucket;
pub mod chat;
pub mod constrain;
pub mod device_sample;
pub mod engine;
pub mod error;
pub mod perplexity;
pub mod rng;
pub mod sampling;
pub mod session;
pub mod stop;
pub mod tools;

pub use chat::{ChatFormat, ChatMessage, ChatOptions, ChatTemplate};
pub use error::{Result, RuntimeError};
pub use kiln_device::{AnyBackend, Device};
pub use perplexity::{perplexity, PerplexityResult};
pub use rng::Rng;
pub use sampling::{argmax, Candidate, Sampler, SamplingParams};
pub use session::{
    Embedding, FinishReason, Generation, Prompt, Session, SessionOptions, Stats, TokenEvent,
    Truncation,
};
pub use stop::{StopMatcher, StopStatus};
