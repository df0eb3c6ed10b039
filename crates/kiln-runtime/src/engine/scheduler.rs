//! The engine thread: admission within the KV budget, step planning
//! (decode rows plus chunked prefill), the batched forward, and retiring
//! finished sequences into the prefix cache.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use kiln_model::{Backend, BatchSeq, Model, ModelConfig, Scratch};
use kiln_tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::EngineMetrics;
use super::prefix::{kv_bytes, PrefixCache};
use super::sequence::{Embedding, Generating, Outcome, Seq, Work};
use super::{Command, EngineConfig, EngineError, EngineState, Event, Job, Pooling, Shared};
use crate::constrain::Constraint;
use crate::device_sample;
use crate::sampling::{Sampler, SamplingParams};
use crate::stop::StopMatcher;
use kiln_model::sample::state_words;

/// Most finished caches the prefix cache keeps (besides the byte budget).
const PREFIX_ENTRIES: usize = 64;

/// [`EngineConfig`] with its defaults resolved against the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub parallel: usize,
    pub max_context: usize,
    pub kv_budget_bytes: usize,
    pub max_queue: usize,
    pub step_tokens: usize,
}

impl Limits {
    /// `device_free`: bytes free on the device that holds the KV
    /// ([`Backend::device_memory_free`]; `None` on the CPU).
    pub fn resolve(cfg: &EngineConfig, model: &ModelConfig, device_free: Option<usize>) -> Limits {
        let ctx = model.context_length;
        let max_context = match cfg.max_context {
            0 => ctx.min(8192),
            n => n.min(ctx),
        };
        // On a device, half of what is free once the weights are there:
        // the rest is left to step buffers, graphs and other processes.
        // Caches grow as sequences do, so a large budget costs nothing
        // until it is used.
        let kv_budget_bytes = match (cfg.kv_budget_bytes, device_free) {
            (0, Some(free)) => (free / 2).max(1 << 30),
            (0, None) => 1 << 30,
            (n, _) => n,
        };
        // A GPU step takes 64 rows for about the time of one (one weight
        // read); a CPU step's cost grows with its rows.
        let most = if device_free.is_some() { 64 } else { 16 };
        let parallel = match cfg.parallel {
            0 => (kv_budget_bytes / kv_bytes(model, max_context).max(1)).clamp(1, most),
            n => n,
        };
        Limits {
            parallel,
            max_context,
            kv_budget_bytes,
            max_queue: match cfg.max_queue {
                0 => (4 * parallel).max(64),
                n => n,
            },
            step_tokens: match cfg.step_tokens {
                0 => default_step_tokens(model, device_free.is_some()),
                n => n,
            },
        }
    }
}

/// Prompt tokens per step when not given. On the CPU a step's cost grows
/// with its rows, so 256 keeps running streams smooth. On a GPU a step of
/// 64 decode rows plus 960 prompt rows (one 1,024-row split-x GEMM per
/// product) took less time per token than 256 (H100, 64 streams,
/// bench/RESULTS.md 2026-12-06: 270M 17,344 -> 19,040 tok/s, 1B 7,854 ->
/// 8,431, median first token 0.02 -> 0.04 s and 0.03 -> 0.08 s); from the
/// 4B's width (2,560) such a step is long enough to hold the median first
/// token past 0.25 s (0.10 -> 0.27 s for +5%), so wide models keep 256.
fn default_step_tokens(model: &ModelConfig, on_device: bool) -> usize {
    if on_device && model.n_embd < 2048 {
        960
    } else {
        256
    }
}

/// A sequence waiting for admission.
struct Pending {
    events: UnboundedSender<Event>,
    index: usize,
    arrived: Instant,
    prompt: Vec<u32>,
    kind: PendingKind,
}

enum PendingKind {
    Generate {
        params: SamplingParams,
        logprobs: Option<usize>,
        constraint: Option<Constraint>,
    },
    Embed(Pooling),
}

impl Pending {
    fn fail(self, error: EngineError) {
        let _ = self.events.send(Event::Failed {
            index: self.index,
            error,
        });
    }

    /// Positions its cache must hold: the prompt and every generated token
    /// but the last (which is never fed back).
    fn positions(&self, max_context: usize) -> Result<usize, EngineError> {
        let n = self.prompt.len();
        if n == 0 {
            return Err(EngineError::Invalid("the prompt is empty".into()));
        }
        match &self.kind {
            PendingKind::Embed(_) if n > max_context => Err(EngineError::Invalid(format!(
                "the input has {n} tokens but the context holds {max_context}"
            ))),
            PendingKind::Embed(_) => Ok(n),
            PendingKind::Generate { .. } if n >= max_context => Err(EngineError::Invalid(format!(
                "the prompt has {n} tokens but the context holds {max_context} \
                     (the prompt must leave room for at least 1 new token)"
            ))),
            PendingKind::Generate { params, .. } => {
                Ok((n + params.max_tokens.max(1) - 1).min(max_context))
            }
        }
    }
}

/// Loads the model, then serves until told to stop.
pub(crate) fn run<B, F>(
    load: F,
    tok: Arc<Tokenizer>,
    cfg: EngineConfig,
    commands: Receiver<Command>,
    shared: Arc<Shared>,
) where
    B: Backend,
    F: FnOnce() -> Result<Model<B>, Box<dyn std::error::Error + Send + Sync>>,
{
    let model = match catch_unwind(AssertUnwindSafe(load)) {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => {
            return shared.set_state(EngineState::Stopped(format!("loading the model: {e}")))
        }
        Err(_) => {
            return shared.set_state(EngineState::Stopped("loading the model panicked".into()))
        }
    };
    let limits = Limits::resolve(&cfg, &model.config, model.backend().device_memory_free());
    let scratch = match model.new_scratch(limits.step_tokens + limits.parallel) {
        Ok(s) => s,
        Err(e) => return shared.set_state(EngineState::Stopped(format!("step buffers: {e}"))),
    };
    let m = &shared.metrics;
    m.max_queue.store(limits.max_queue, Ordering::Relaxed);
    m.parallel.store(limits.parallel, Ordering::Relaxed);
    m.kv_budget_bytes
        .store(limits.kv_budget_bytes, Ordering::Relaxed);
    m.max_context.store(limits.max_context, Ordering::Relaxed);
    let mut eog = tok.eog_ids();
    eog.sort_unstable();
    let mut s = Scheduler {
        model,
        tok: &tok,
        eog: &eog,
        limits,
        waiting: VecDeque::new(),
        running: Vec::new(),
        prefix: PrefixCache::new(PREFIX_ENTRIES),
        scratch,
        shared: &shared,
        draining: false,
    };
    shared.set_state(EngineState::Ready);
    s.serve(&commands);
    shared.set_state(EngineState::Stopped("the engine has stopped".into()));
    // Jobs sent after the last look at the queue.
    while let Ok(cmd) = commands.try_recv() {
        s.handle(cmd);
    }
    s.fail_waiting(EngineError::ShuttingDown);
}

pub(crate) struct Scheduler<'t, B: Backend> {
    pub model: Model<B>,
    tok: &'t Tokenizer,
    eog: &'t [u32],
    pub limits: Limits,
    waiting: VecDeque<Pending>,
    running: Vec<Seq<'t, B>>,
    prefix: PrefixCache<B>,
    scratch: Scratch<B>,
    shared: &'t Shared,
    /// No new jobs; exit once the running sequences finish.
    draining: bool,
}

/// What the loop should do after reading commands.
enum Flow {
    Continue,
    Abort,
}

impl<'t, B: Backend> Scheduler<'t, B> {
    fn metrics(&self) -> &'t EngineMetrics {
        &self.shared.metrics
    }

    /// The loop: read commands (blocking when idle), drop cancelled
    /// sequences, admit, step.
    fn serve(&mut self, commands: &Receiver<Command>) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                if self.draining {
                    return;
                }
                match commands.recv() {
                    Ok(cmd) => {
                        if let Flow::Abort = self.handle(cmd) {
                            return self.abort();
                        }
                    }
                    Err(_) => return,
                }
            }
            let turn = Instant::now();
            loop {
                match commands.try_recv() {
                    Ok(cmd) => {
                        if let Flow::Abort = self.handle(cmd) {
                            return self.abort();
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.draining = true;
                        break;
                    }
                }
            }
            self.drop_cancelled();
            self.admit();
            if !self.running.is_empty() {
                self.step();
                EngineMetrics::add_time(&self.metrics().busy_us, turn.elapsed());
            }
            self.publish_gauges();
        }
    }

    fn handle(&mut self, cmd: Command) -> Flow {
        match cmd {
            Command::Submit {
                job,
                events,
                arrived,
            } => {
                for p in expand(*job, events, arrived) {
                    if self.draining {
                        self.metrics().waiting.fetch_sub(1, Ordering::AcqRel);
                        p.fail(EngineError::ShuttingDown);
                    } else {
                        self.waiting.push_back(p);
                    }
                }
            }
            Command::Drain => {
                self.draining = true;
                self.shared
                    .set_state(EngineState::Stopped("the server is shutting down".into()));
                self.fail_waiting(EngineError::ShuttingDown);
            }
            Command::Abort => return Flow::Abort,
        }
        Flow::Continue
    }

    fn fail_waiting(&mut self, error: EngineError) {
        for p in self.waiting.drain(..) {
            self.shared.metrics.waiting.fetch_sub(1, Ordering::AcqRel);
            p.fail(error.clone());
        }
    }

    fn abort(&mut self) {
        self.shared
            .set_state(EngineState::Stopped("the server is shutting down".into()));
        self.fail_waiting(EngineError::ShuttingDown);
        for seq in self.running.drain(..) {
            let _ = seq.events.send(Event::Failed {
                index: seq.index,
                error: EngineError::ShuttingDown,
            });
        }
        self.publish_gauges();
    }

    /// Sequences whose receiver is gone stop here, before the next step;
    /// their caches are still valid, so they go to the prefix cache.
    fn drop_cancelled(&mut self) {
        let m = self.metrics();
        let before = self.waiting.len();
        self.waiting.retain(|p| !p.events.is_closed());
        m.waiting
            .fetch_sub(before - self.waiting.len(), Ordering::AcqRel);
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].events.is_closed() {
                let seq = self.running.remove(i);
                EngineMetrics::add(&m.cancelled, 1);
                if let Work::Generate(g) = &seq.work {
                    EngineMetrics::add(&m.generated_tokens, g.generated);
                }
                self.prefix.insert(seq.fed, seq.cache);
            } else {
                i += 1;
            }
        }
    }

    /// KV bytes of the running sequences.
    fn running_bytes(&self) -> usize {
        self.running.iter().map(|s| s.cache.allocated_bytes()).sum()
    }

    /// Admits waiting sequences in order while a slot is free and their
    /// caches fit the budget (evicting prefix-cache entries, oldest first).
    /// One that could never fit fails instead of blocking the queue.
    fn admit(&mut self) {
        while self.running.len() < self.limits.parallel {
            let Some(p) = self.waiting.front() else {
                return;
            };
            let positions = match p.positions(self.limits.max_context) {
                Ok(n) => n,
                Err(e) => {
                    self.refuse_front(e);
                    continue;
                }
            };
            let need = kv_bytes(&self.model.config, positions);
            let budget = self.limits.kv_budget_bytes;
            // Mean pooling needs every prompt row's output: no reuse.
            let reusable = !matches!(p.kind, PendingKind::Embed(Pooling::Mean));
            let taken = if reusable {
                self.prefix.take_best(&p.prompt)
            } else {
                None
            };
            let taken_bytes = taken.as_ref().map_or(0, |(e, _)| e.cache.allocated_bytes());
            let running = self.running_bytes();
            let total = |prefix: &PrefixCache<B>| running + prefix.bytes() + need.max(taken_bytes);
            while total(&self.prefix) > budget && self.prefix.evict_oldest() {}
            if total(&self.prefix) > budget {
                if let Some((e, _)) = taken {
                    self.prefix.insert(e.tokens, e.cache);
                }
                if self.running.is_empty() {
                    let e = EngineError::Invalid(format!(
                        "the request needs {need} bytes of KV cache ({positions} positions) \
                         but the budget is {budget} bytes"
                    ));
                    self.refuse_front(e);
                    continue;
                }
                return;
            }
            let p = self
                .waiting
                .pop_front()
                .expect("the queue's front was just read");
            self.metrics().waiting.fetch_sub(1, Ordering::AcqRel);
            match self.start_seq(p, positions, taken) {
                Ok(seq) => self.running.push(seq),
                Err((p, e)) => p.fail(e),
            }
        }
    }

    fn refuse_front(&mut self, e: EngineError) {
        if let Some(p) = self.waiting.pop_front() {
            self.metrics().waiting.fetch_sub(1, Ordering::AcqRel);
            p.fail(e);
        }
    }

    /// A running sequence for `p`: its cache (a prefix-cache entry rewound
    /// to the shared prefix, else a new one) reserved for `positions`.
    #[allow(clippy::result_large_err)]
    fn start_seq(
        &mut self,
        mut p: Pending,
        positions: usize,
        taken: Option<(super::prefix::CachedPrefix<B>, usize)>,
    ) -> Result<Seq<'t, B>, (Pending, EngineError)> {
        let step_err = |e: kiln_model::ModelError| EngineError::Step(e.to_string());
        let (mut cache, mut fed) = match taken {
            Some((entry, lcp)) => (entry.cache, entry.tokens[..lcp].to_vec()),
            None => match self.model.new_cache() {
                Ok(c) => (c, Vec::new()),
                Err(e) => return Err((p, step_err(e))),
            },
        };
        // At least the last prompt token is computed: its output is needed.
        let keep = fed.len().min(p.prompt.len() - 1);
        if cache.truncate(keep).is_ok() {
            fed.truncate(keep);
        } else {
            // A sliding ring overwrote rows the new suffix needs.
            cache.clear();
            fed.clear();
        }
        if let Err(e) = cache.reserve(self.model.backend(), positions) {
            return Err((p, step_err(e)));
        }
        let m = self.metrics();
        EngineMetrics::add(&m.prompt_tokens, p.prompt.len());
        EngineMetrics::add(&m.prefix_hit_tokens, fed.len());
        let mut head_state = None;
        let work = match p.kind {
            PendingKind::Embed(pooling) => Work::Embed(Embedding {
                pooling,
                sum: vec![0.0; self.model.config.n_embd],
            }),
            PendingKind::Generate {
                ref params,
                logprobs,
                ref mut constraint,
            } => {
                let mut params = params.clone();
                params.seed = params.seed.wrapping_add(p.index as u64);
                let constraint = constraint.take();
                let argmax_head = params.is_greedy() && logprobs.is_none() && constraint.is_none();
                // Every other request the model's sampling head takes keeps
                // its logits on the backend; `head_spec` names those it
                // cannot take (sampled on the host from downloaded logits).
                if !argmax_head {
                    let n_vocab = self.model.config.n_vocab;
                    let b = self.model.backend();
                    head_state =
                        device_sample::head_spec(&params, logprobs, constraint.is_some(), n_vocab)
                            .ok()
                            .and_then(|spec| b.upload(&state_words(&spec, &p.prompt)).ok());
                }
                let stop = StopMatcher::new(params.stop.clone());
                let mut sampler = match Sampler::new(params) {
                    Ok(s) => s,
                    Err(e) => {
                        let e = EngineError::Invalid(e.to_string());
                        return Err((p, e));
                    }
                };
                // Prompt tokens enter the penalty window, as in `Session`.
                sampler.accept_all(&p.prompt);
                Work::Generate(Box::new(Generating {
                    sampler,
                    stop,
                    decoder: StreamDecoder::new(self.tok, false),
                    logprobs,
                    argmax_head,
                    constraint,
                    eog: self.eog,
                    generated: 0,
                    last_token_at: None,
                }))
            }
        };
        Ok(Seq {
            cached_tokens: fed.len(),
            events: p.events,
            index: p.index,
            arrived: p.arrived,
            prompt: p.prompt,
            cache,
            fed,
            next: [0],
            out: Vec::new(),
            max_positions: positions,
            head_state,
            work,
        })
    }

    /// One forward step over every running sequence: a decode row each,
    /// and prompt chunks within `step_tokens`, oldest sequence first.
    fn step(&mut self) {
        let mut budget = self.limits.step_tokens;
        let plan: Vec<usize> = self
            .running
            .iter()
            .map(|seq| match seq.prefill_left() {
                0 => 1,
                left => {
                    let n = left.min(budget);
                    budget -= n;
                    n
                }
            })
            .collect();
        let mut order = Vec::with_capacity(plan.len());
        let mut batch = Vec::with_capacity(plan.len());
        for (i, (seq, &n)) in self.running.iter_mut().zip(&plan).enumerate() {
            if n == 0 {
                continue;
            }
            let output = seq.output_for(n);
            let at = seq.fed.len();
            let tokens: &[u32] = if seq.prefill_left() > 0 {
                &seq.prompt[at..at + n]
            } else {
                &seq.next
            };
            batch.push(BatchSeq {
                tokens,
                cache: &mut seq.cache,
                output,
                out: &mut seq.out,
                sampler: seq.head_state.as_mut(),
            });
            order.push(i);
        }
        let (model, scratch) = (&self.model, &mut self.scratch);
        let forward = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| {
            model.forward_batch(&mut batch, scratch)
        }));
        drop(batch);
        let m = self.metrics();
        EngineMetrics::add_time(&m.forward_us, forward.elapsed());
        EngineMetrics::add(&m.steps, 1);
        let outcomes: Vec<Outcome> = match result {
            Ok(Ok(results)) => order
                .iter()
                .zip(results)
                .map(|(&i, r)| match r {
                    Ok(argmax) => self.running[i].after_step(plan[i], argmax, m),
                    Err(e) => Outcome::Failed(EngineError::Step(e.to_string())),
                })
                .collect(),
            Ok(Err(e)) => {
                EngineMetrics::add(&m.failed_steps, 1);
                order
                    .iter()
                    .map(|_| Outcome::Failed(EngineError::Step(e.to_string())))
                    .collect()
            }
            Err(_) => {
                EngineMetrics::add(&m.failed_steps, 1);
                // A panic may have left the step buffers half written.
                if let Ok(s) = self
                    .model
                    .new_scratch(self.limits.step_tokens + self.limits.parallel)
                {
                    self.scratch = s;
                }
                order
                    .iter()
                    .map(|_| {
                        Outcome::Failed(EngineError::Step("internal error in the step".into()))
                    })
                    .collect()
            }
        };
        self.retire(&order, outcomes);
    }

    /// Removes finished and failed sequences (finished caches go to the
    /// prefix cache; a failed one's state is unknown and is dropped).
    fn retire(&mut self, order: &[usize], outcomes: Vec<Outcome>) {
        let mut done: Vec<(usize, Outcome)> = order
            .iter()
            .copied()
            .zip(outcomes)
            .filter(|(_, o)| !matches!(o, Outcome::Running))
            .collect();
        // Highest index first, so removals do not shift the rest.
        done.sort_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, outcome) in done {
            let seq = self.running.remove(i);
            match outcome {
                Outcome::Failed(error) => {
                    if let Work::Generate(g) = &seq.work {
                        EngineMetrics::add(&self.metrics().generated_tokens, g.generated);
                    }
                    let _ = seq.events.send(Event::Failed {
                        index: seq.index,
                        error,
                    });
                }
                _ => self.prefix.insert(seq.fed, seq.cache),
            }
        }
    }

    fn publish_gauges(&self) {
        let m = self.metrics();
        m.running.store(self.running.len(), Ordering::Relaxed);
        m.kv_running_bytes
            .store(self.running_bytes(), Ordering::Relaxed);
        m.kv_prefix_bytes
            .store(self.prefix.bytes(), Ordering::Relaxed);
    }
}

/// A job's sequences: one per choice or embedding input.
fn expand(job: Job, events: UnboundedSender<Event>, arrived: Instant) -> Vec<Pending> {
    match job {
        Job::Generate(g) => (0..g.n)
            .map(|index| Pending {
                events: events.clone(),
                index,
                arrived,
                prompt: g.prompt.clone(),
                kind: PendingKind::Generate {
                    params: g.params.clone(),
                    logprobs: g.logprobs,
                    constraint: g.constraint.clone(),
                },
            })
            .collect(),
        Job::Embed(e) => e
            .inputs
            .into_iter()
            .enumerate()
            .map(|(index, prompt)| Pending {
                events: events.clone(),
                index,
                arrived,
                prompt,
                kind: PendingKind::Embed(e.pooling),
            })
            .collect(),
    }
}
