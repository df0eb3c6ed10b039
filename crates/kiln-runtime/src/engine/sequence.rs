//! One sequence in flight: its prompt, KV cache and the per-token work after
//! each step (sampling, logprobs, stop checks, UTF-8-safe text, events).

use std::time::Instant;

use kiln_model::sample::Sampled;
use kiln_model::{Backend, KvCache, Output};
use kiln_tokenizer::StreamDecoder;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::EngineMetrics;
use super::{Done, EngineError, Event, Pooling, TokenLogprob, TokenOut};
use crate::constrain::Constraint;
use crate::sampling::Sampler;
use crate::session::FinishReason;
use crate::stop::{StopMatcher, StopStatus};

/// Generation state of a sequence.
pub(crate) struct Generating<'t> {
    pub sampler: Sampler,
    pub stop: StopMatcher,
    pub decoder: StreamDecoder<'t>,
    /// Alternatives to report per token (None: no logprobs).
    pub logprobs: Option<usize>,
    /// Greedy without logprobs or constraint: the step returns the argmax
    /// only.
    pub argmax_head: bool,
    /// The output constraint: masks the logits before sampling.
    pub constraint: Option<Constraint>,
    /// End-of-generation ids, ascending.
    pub eog: &'t [u32],
    pub generated: usize,
    pub last_token_at: Option<Instant>,
}

/// Embedding state: the running sum of hidden rows for mean pooling.
pub(crate) struct Embedding {
    pub pooling: Pooling,
    pub sum: Vec<f64>,
}

pub(crate) enum Work<'t> {
    Generate(Box<Generating<'t>>),
    Embed(Embedding),
}

pub(crate) struct Seq<'t, B: Backend> {
    pub events: UnboundedSender<Event>,
    /// Choice (generation) or input (embedding) index within its job.
    pub index: usize,
    pub arrived: Instant,
    pub prompt: Vec<u32>,
    pub cache: KvCache<B>,
    /// The tokens whose K/V the cache holds, in order.
    pub fed: Vec<u32>,
    /// The sampled token a decode row feeds next.
    pub next: [u32; 1],
    /// This sequence's logits or hidden rows from the last step.
    pub out: Vec<f32>,
    /// Positions the cache was reserved for: decode stops there.
    pub max_positions: usize,
    /// Prompt tokens reused from the prefix cache.
    pub cached_tokens: usize,
    /// Its sampler state on the backend when the model's sampling head
    /// picks its tokens ([`Output::Sample`]; None: argmax head or host).
    pub head_state: Option<B::Buf>,
    pub work: Work<'t>,
}

/// What became of a sequence after a step.
pub(crate) enum Outcome {
    Running,
    Finished,
    Failed(EngineError),
}

impl<'t, B: Backend> Seq<'t, B> {
    /// Prompt tokens still to prefill.
    pub fn prefill_left(&self) -> usize {
        self.prompt.len().saturating_sub(self.fed.len())
    }

    /// The output this sequence needs from a step that feeds `n` tokens.
    pub fn output_for(&self, n: usize) -> Output {
        let last_prompt_chunk = self.prefill_left() == n;
        match &self.work {
            Work::Embed(e) if e.pooling == Pooling::Mean => Output::AllHidden,
            Work::Embed(_) => Output::LastHidden,
            // Earlier prompt chunks only fill the cache: the cheapest output.
            Work::Generate(_) if self.prefill_left() > 0 && !last_prompt_chunk => {
                Output::LastHidden
            }
            Work::Generate(g) if g.argmax_head => Output::Argmax,
            Work::Generate(g) if self.head_state.is_some() => Output::Sample {
                logprobs: g.logprobs.unwrap_or(0),
            },
            Work::Generate(_) => Output::LastLogits,
        }
    }

    /// After a successful step that fed `tokens` and returned `argmax`.
    pub fn after_step(
        &mut self,
        fed: usize,
        argmax: Option<u32>,
        metrics: &EngineMetrics,
    ) -> Outcome {
        let was_prefill = self.prefill_left() > 0;
        let fed_tokens: Vec<u32> = if was_prefill {
            self.prompt[self.fed.len()..self.fed.len() + fed].to_vec()
        } else {
            self.next.to_vec()
        };
        self.fed.extend_from_slice(&fed_tokens);
        if self.prefill_left() > 0 && matches!(self.work, Work::Generate(_)) {
            return Outcome::Running;
        }
        match &mut self.work {
            Work::Embed(e) => {
                if e.pooling == Pooling::Mean {
                    let d = e.sum.len();
                    for row in self.out.chunks_exact(d) {
                        e.sum
                            .iter_mut()
                            .zip(row)
                            .for_each(|(s, &h)| *s += f64::from(h));
                    }
                }
                if self.fed.len() < self.prompt.len() {
                    return Outcome::Running;
                }
                let vector: Vec<f32> = match e.pooling {
                    Pooling::Mean => {
                        let n = self.prompt.len() as f64;
                        e.sum.iter().map(|&s| (s / n) as f32).collect()
                    }
                    Pooling::Last => self.out.clone(),
                };
                if vector.iter().any(|x| !x.is_finite()) {
                    return Outcome::Failed(EngineError::Step(
                        "the hidden state holds NaN or infinity".into(),
                    ));
                }
                let _ = self.events.send(Event::Embedding {
                    index: self.index,
                    vector,
                    prompt_tokens: self.prompt.len(),
                });
                Outcome::Finished
            }
            Work::Generate(g) => {
                let id = match argmax {
                    Some(id) => id,
                    None => {
                        let masked = match g.constraint.as_mut() {
                            Some(c) => c.mask(&mut self.out),
                            None => Ok(()),
                        };
                        match masked.and_then(|()| g.sampler.sample(&mut self.out)) {
                            Ok(id) => id,
                            Err(e) => return Outcome::Failed(EngineError::Step(e.to_string())),
                        }
                    }
                };
                let headed = self.head_state.is_some();
                let logprob = g.logprobs.map(|k| match headed {
                    true => {
                        let s = Sampled::parse(&self.out);
                        TokenLogprob {
                            id,
                            logprob: s.logprob,
                            top: s.top,
                        }
                    }
                    false => token_logprob(&self.out, id, k),
                });
                let now = Instant::now();
                match g.last_token_at {
                    None => metrics.time_to_first_token.observe(now - self.arrived),
                    Some(t) => metrics.inter_token_latency.observe(now - t),
                }
                g.last_token_at = Some(now);
                let finish = match g.push_token(id, logprob, self.index, &self.events) {
                    Ok(f) => f,
                    Err(e) => return Outcome::Failed(EngineError::Step(e.to_string())),
                };
                let finish = finish.or_else(|| {
                    (g.generated >= g.sampler.params().max_tokens).then_some(FinishReason::Length)
                });
                let finish = finish.or_else(|| {
                    (self.fed.len() + 1 > self.max_positions).then_some(FinishReason::ContextFull)
                });
                match finish {
                    Some(f) => {
                        let done = Done {
                            choice: self.index,
                            finish: f,
                            prompt_tokens: self.prompt.len(),
                            completion_tokens: 0,
                            cached_tokens: self.cached_tokens,
                        };
                        g.flush(done, &self.events, metrics);
                        Outcome::Finished
                    }
                    None => {
                        self.next = [id];
                        Outcome::Running
                    }
                }
            }
        }
    }
}

impl Generating<'_> {
    /// Handles a sampled token: an end-of-generation or stop id ends the
    /// choice unseen; otherwise the constraint advances and its text (held
    /// back while it may start a stop string or a UTF-8 character) is sent.
    /// Returns why it ended.
    fn push_token(
        &mut self,
        id: u32,
        logprob: Option<TokenLogprob>,
        choice: usize,
        events: &UnboundedSender<Event>,
    ) -> crate::Result<Option<FinishReason>> {
        let params = self.sampler.params();
        if !params.ignore_eos && self.eog.binary_search(&id).is_ok() {
            return Ok(Some(FinishReason::Eog(id)));
        }
        if params.stop_token_ids.contains(&id) {
            return Ok(Some(FinishReason::StopToken(id)));
        }
        if let Some(c) = self.constraint.as_mut() {
            c.accept(id)?;
        }
        self.sampler.accept(id);
        self.generated += 1;
        let piece = match self.decoder.push(id) {
            Ok(p) => p,
            // An id from this model's head is always in its vocabulary; a
            // piece that fails to decode is shown as U+FFFD, not fatal.
            Err(_) => char::REPLACEMENT_CHARACTER.to_string(),
        };
        let (text, stopped) = match self.stop.push(&piece) {
            StopStatus::Continue { emit } => (emit, None),
            StopStatus::Stopped { emit, stop_index } => (emit, Some(stop_index)),
        };
        let _ = events.send(Event::Token(TokenOut {
            choice,
            id: Some(id),
            text,
            logprob,
        }));
        let complete = self
            .constraint
            .as_ref()
            .is_some_and(Constraint::is_complete);
        Ok(stopped
            .map(FinishReason::StopString)
            .or(complete.then_some(FinishReason::Constraint)))
    }

    /// Sends the text still held back (unless a stop string ended the
    /// choice) and `done`, with its token count and final reason.
    fn flush(&mut self, mut done: Done, events: &UnboundedSender<Event>, m: &EngineMetrics) {
        if !matches!(done.finish, FinishReason::StopString(_)) {
            let mut tail = self.stop.push(&self.decoder.finish());
            if let StopStatus::Continue { emit } = &mut tail {
                emit.push_str(&self.stop.finish());
            }
            let text = match tail {
                StopStatus::Continue { emit } => emit,
                StopStatus::Stopped { emit, stop_index } => {
                    done.finish = FinishReason::StopString(stop_index);
                    emit
                }
            };
            if !text.is_empty() {
                let _ = events.send(Event::Token(TokenOut {
                    choice: done.choice,
                    id: None,
                    text,
                    logprob: None,
                }));
            }
        }
        EngineMetrics::add(&m.generated_tokens, self.generated);
        done.completion_tokens = self.generated;
        let _ = events.send(Event::Done(done));
    }
}

/// `id`'s log-probability and the `k` most likely tokens' under
/// log-softmax(`logits`), computed in f64.
pub(crate) fn token_logprob(logits: &[f32], id: u32, k: usize) -> TokenLogprob {
    let (logprob, top) = kiln_model::sample::logprobs(logits, id, k);
    TokenLogprob { id, logprob, top }
}
