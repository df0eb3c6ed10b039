//! The serving engine: one thread owns the model and runs many sequences
//! at once with continuous batching (`kiln serve` drives it).
//!
//! - **Jobs** ([`Job`]) arrive through [`Engine::submit`] and wait in a
//!   bounded queue ([`SubmitError::Busy`] when it is full); a job of `n`
//!   choices becomes `n` independent sequences sharing its prompt.
//! - **Steps**: between two steps new sequences are admitted while fewer
//!   than `parallel` run and their KV caches fit the byte budget. One step
//!   runs every decoding sequence's next token plus prompt chunks of
//!   prefilling ones (at most `step_tokens` prompt tokens per step, oldest
//!   first), all in one [`Model::forward_batch`] call, so a long prompt
//!   never stalls the streams already running.
//! - **Prefix caching**: a finished (or cancelled) sequence's cache is kept,
//!   keyed by its tokens, in an LRU ([`prefix::PrefixCache`]) inside the
//!   budget; a new prompt sharing a prefix takes the best one and rewinds it
//!   ([`kiln_model::KvCache::truncate`]; refused when a sliding ring overwrote
//!   rows still needed, then the prompt is recomputed in the same buffers).
//! - **Per sequence**: its own [`Sampler`](crate::Sampler) and seed stream
//!   (a request's tokens do not depend on its batch mates), stop strings,
//!   end-of-generation ids, logprobs of the distribution it sampled from.
//!   A sequence whose events receiver is dropped is cancelled before the
//!   next step; one whose step fails (a bad logit, or a panic caught around
//!   the step) fails alone, or with its step mates, never the engine.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kiln_runtime::engine::{Engine, EngineConfig, Event, GenerateJob, Job};
//! let gguf = Arc::new(kiln_gguf::Gguf::open("gemma-3-270m-q4_k_m.gguf")?);
//! let tok = Arc::new(kiln_tokenizer::Tokenizer::from_gguf(&gguf)?);
//! let g = gguf.clone();
//! let engine = Engine::start(
//!     move || Ok(kiln_model::Model::load(kiln_cpu::CpuBackend::new(), g)?),
//!     tok.clone(),
//!     EngineConfig::default(),
//! );
//! engine.wait_ready()?;
//! let job = GenerateJob::new(tok.encode("The capital of France is", true, true),
//!                            kiln_runtime::SamplingParams::greedy());
//! let mut rx = engine.submit(Job::Generate(job))?;
//! while let Some(ev) = rx.blocking_recv() {
//!     if let Event::Token(t) = ev { print!("{}", t.text) }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod metrics;
mod prefix;
mod scheduler;
mod sequence;
#[cfg(test)]
mod tests;

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use kiln_model::{Backend, Model};
use kiln_tokenizer::Tokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::constrain::Constraint;
use crate::sampling::SamplingParams;
use crate::session::FinishReason;

pub use metrics::{EngineMetrics, Histogram};
pub use prefix::kv_bytes;
#[cfg(test)]
pub(crate) use sequence::token_logprob as token_logprob_for_tests;

/// How the engine runs; zeros pick the defaults described per field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most sequences in flight; 0 = as many caches of `max_context`
    /// positions as fit the budget, between 1 and 16 (64 on a GPU).
    pub parallel: usize,
    /// Positions per sequence (prompt + generated); 0 = the model's
    /// context length capped at 8,192; larger values are capped by the
    /// model's.
    pub max_context: usize,
    /// Bytes of KV cache for running sequences and the prefix cache
    /// together; 0 = half the device memory free after loading on a GPU
    /// (at least 1 GiB), 1 GiB on the CPU.
    pub kv_budget_bytes: usize,
    /// Most sequences waiting for admission before [`SubmitError::Busy`];
    /// 0 = `max(64, 4 * parallel)`.
    pub max_queue: usize,
    /// Prompt tokens prefilled per step across all sequences; 0 = 256.
    pub step_tokens: usize,
}

/// Work for the engine.
#[derive(Clone, Debug)]
pub enum Job {
    Generate(GenerateJob),
    Embed(EmbedJob),
}

/// Text generation from a tokenized prompt.
#[derive(Clone, Debug)]
pub struct GenerateJob {
    /// Prompt ids (BOS included by the caller).
    pub prompt: Vec<u32>,
    /// Sampling, stop strings, `max_tokens`, `ignore_eos`, the seed
    /// (choice `i` uses `seed + i`).
    pub params: SamplingParams,
    /// Independent completions of the prompt (choices `0..n`).
    pub n: usize,
    /// Report each token's logprob and this many alternatives (None: no
    /// logprobs, which lets greedy rows skip materialising logits).
    pub logprobs: Option<usize>,
    /// An output constraint every choice must satisfy (each choice gets its
    /// own copy); a choice ends with [`FinishReason::Constraint`] once it is
    /// complete.
    pub constraint: Option<Constraint>,
}

impl GenerateJob {
    /// One choice, no logprobs.
    pub fn new(prompt: Vec<u32>, params: SamplingParams) -> Self {
        GenerateJob {
            prompt,
            params,
            n: 1,
            logprobs: None,
            constraint: None,
        }
    }
}

/// How an embedding pools the hidden states of a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Mean of every token's post-norm hidden state.
    Mean,
    /// The last token's.
    Last,
}

/// Embeddings of one or more tokenized inputs (index `i` for input `i`).
#[derive(Clone, Debug)]
pub struct EmbedJob {
    pub inputs: Vec<Vec<u32>>,
    pub pooling: Pooling,
}

/// A token's log-probability under the distribution it was sampled from
/// (log-softmax of the logits after bias and penalties, before
/// temperature), with the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The top alternatives, descending (ties: lowest id first).
    pub top: Vec<(u32, f32)>,
}

/// One generated token of one choice.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOut {
    pub choice: usize,
    /// None for the final flush of text held back (a possible stop-string
    /// prefix or an incomplete UTF-8 character).
    pub id: Option<u32>,
    /// Text that became final with this token (maybe empty; never splits a
    /// UTF-8 character).
    pub text: String,
    pub logprob: Option<TokenLogprob>,
}

/// A choice ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Done {
    pub choice: usize,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// Generated tokens (an end-of-generation or stop token excluded).
    pub completion_tokens: usize,
    /// Prompt tokens whose K/V came from the prefix cache.
    pub cached_tokens: usize,
}

/// What a job's receiver gets, in order per choice.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Token(TokenOut),
    Done(Done),
    Embedding {
        index: usize,
        vector: Vec<f32>,
        prompt_tokens: usize,
    },
    /// This choice (or embedding input) failed; the others go on.
    Failed {
        index: usize,
        error: EngineError,
    },
}

/// Why a sequence failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The request can never run (empty prompt, longer than the context,
    /// more KV than the whole budget, bad sampling parameters).
    #[error("{0}")]
    Invalid(String),
    /// The step it ran in failed (a bad logit, a backend error, a panic).
    #[error("inference failed: {0}")]
    Step(String),
    /// The engine stopped before the sequence finished.
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// Why [`Engine::submit`] refused a job.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The wait queue is full: retry later.
    #[error("the server is busy: {waiting} sequences are already waiting (limit {limit})")]
    Busy { waiting: usize, limit: usize },
    /// The model is still loading.
    #[error("the model is still loading")]
    Loading,
    /// The engine is not running (load failed, or shutting down).
    #[error("the engine is not running: {0}")]
    Stopped(String),
    /// The job itself is malformed (no choices, no inputs).
    #[error("{0}")]
    Invalid(String),
}

/// Where the engine thread is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineState {
    Loading,
    Ready,
    /// Load failed, or the engine has stopped; the reason.
    Stopped(String),
}

pub(crate) enum Command {
    Submit {
        job: Box<Job>,
        events: UnboundedSender<Event>,
        arrived: Instant,
    },
    /// Finish the running sequences, refuse the waiting ones, then exit.
    Drain,
    /// Fail every sequence now, then exit.
    Abort,
}

/// State the handle and the engine thread share.
pub(crate) struct Shared {
    pub(crate) state: Mutex<EngineState>,
    pub(crate) state_changed: Condvar,
    pub(crate) metrics: EngineMetrics,
}

impl Shared {
    pub(crate) fn set_state(&self, s: EngineState) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        *g = s;
        self.state_changed.notify_all();
    }
}

/// The handle to a running engine thread. Dropping it drains the engine
/// (running sequences finish) and joins the thread.
pub struct Engine {
    commands: Mutex<mpsc::Sender<Command>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the engine thread: it calls `load` (the model, on whatever
    /// backend) and then serves jobs. Returns at once; [`Engine::state`]
    /// says when the model is ready.
    pub fn start<B, F>(load: F, tokenizer: Arc<Tokenizer>, cfg: EngineConfig) -> Engine
    where
        B: Backend + 'static,
        F: FnOnce() -> Result<Model<B>, Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(EngineState::Loading),
            state_changed: Condvar::new(),
            metrics: EngineMetrics::default(),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("kiln-engine".into())
            .spawn(move || scheduler::run(load, tokenizer, cfg, rx, thread_shared));
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                shared.set_state(EngineState::Stopped(format!(
                    "cannot start the engine thread: {e}"
                )));
                None
            }
        };
        Engine {
            commands: Mutex::new(tx),
            shared,
            thread,
        }
    }

    /// Loading, ready, or stopped (with why).
    pub fn state(&self) -> EngineState {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Blocks until the model is loaded; the load error otherwise.
    pub fn wait_ready(&self) -> Result<(), String> {
        let mut g = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match &*g {
                EngineState::Loading => {
                    g = self
                        .shared
                        .state_changed
                        .wait(g)
                        .unwrap_or_else(|p| p.into_inner());
                }
                EngineState::Ready => return Ok(()),
                EngineState::Stopped(why) => return Err(why.clone()),
            }
        }
    }

    /// Counters and gauges for `/metrics`.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.shared.metrics
    }

    /// Queues a job; its events arrive on the returned receiver. Dropping
    /// the receiver cancels the job's sequences before the next step.
    pub fn submit(&self, job: Job) -> Result<UnboundedReceiver<Event>, SubmitError> {
        let seqs = match &job {
            Job::Generate(g) => g.n,
            Job::Embed(e) => e.inputs.len(),
        };
        if seqs == 0 {
            return Err(SubmitError::Invalid(
                "a job needs at least one sequence".into(),
            ));
        }
        match self.state() {
            EngineState::Loading => return Err(SubmitError::Loading),
            EngineState::Stopped(why) => return Err(SubmitError::Stopped(why)),
            EngineState::Ready => {}
        }
        let m = &self.shared.metrics;
        let limit = m.max_queue.load(Ordering::Relaxed);
        // Reserve queue places before sending, so concurrent submits cannot
        // overshoot the limit.
        let waiting = m.waiting.fetch_add(seqs, Ordering::AcqRel);
        if waiting + seqs > limit {
            m.waiting.fetch_sub(seqs, Ordering::AcqRel);
            return Err(SubmitError::Busy { waiting, limit });
        }
        let (events, rx) = unbounded_channel();
        let cmd = Command::Submit {
            job: Box::new(job),
            events,
            arrived: Instant::now(),
        };
        let sent = self
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(cmd);
        if sent.is_err() {
            m.waiting.fetch_sub(seqs, Ordering::AcqRel);
            return Err(SubmitError::Stopped("the engine thread has exited".into()));
        }
        Ok(rx)
    }

    /// Stops taking jobs: waiting ones fail with
    /// [`EngineError::ShuttingDown`], running ones finish (or `abort`: fail
    /// now). Returns at once; drop the engine to join its thread.
    pub fn stop(&self, abort: bool) {
        let cmd = if abort {
            Command::Abort
        } else {
            Command::Drain
        };
        let _ = self
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(cmd);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop(false);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
