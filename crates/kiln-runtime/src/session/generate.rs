//! [`Session::generate`]: prefill, then one decode step per token with
//! sampling (or the argmax head), an optional output [`Constraint`], stop
//! strings and UTF-8-safe streaming.

use std::ops::ControlFlow;
use std::time::Instant;

use kiln_model::{Backend, Output};
use kiln_tokenizer::StreamDecoder;

use super::runner::{Last, Need};
use super::{top_logits, FinishReason, Generation, Prompt, Session, Stats, TokenEvent};
use crate::constrain::Constraint;
use crate::error::{Result, RuntimeError};
use crate::sampling::{argmax, Sampler, SamplingParams};
use crate::stop::{StopMatcher, StopStatus};

impl<B: Backend> Session<B> {
    /// Generates from `prompt`, streaming each token to `on_token`, until an
    /// end-of-generation token (unless `ignore_eos`), a stop token or string,
    /// `max_tokens`, a full context, or `ControlFlow::Break` from the callback.
    pub fn generate<'p>(
        &mut self,
        prompt: impl Into<Prompt<'p>>,
        params: &SamplingParams,
        on_token: impl FnMut(TokenEvent) -> ControlFlow<()>,
    ) -> Result<Generation> {
        self.generate_constrained(prompt, params, None, on_token)
    }

    /// [`generate`](Self::generate) whose output must satisfy `constraint`
    /// (from [`compile_constraint`](Self::compile_constraint)): every step's
    /// logits are masked before sampling (greedy too, which then computes
    /// the logits row instead of using the argmax head), and generation
    /// ends with [`FinishReason::Constraint`] once no token can extend the
    /// output. The constraint keeps its per-step mask times.
    pub fn generate_constrained<'p>(
        &mut self,
        prompt: impl Into<Prompt<'p>>,
        params: &SamplingParams,
        mut constraint: Option<&mut Constraint>,
        mut on_token: impl FnMut(TokenEvent) -> ControlFlow<()>,
    ) -> Result<Generation> {
        if params.max_tokens == 0 {
            return Err(RuntimeError::InvalidSamplingParam {
                name: "max_tokens",
                value: "0".into(),
                expected: "at least 1 token to generate (use logits() to only score a prompt)",
            });
        }
        let mut sampler = Sampler::new(params.clone())?;
        let reserve = params.max_tokens.min(self.opts.max_context / 2).max(1);
        let ids = self.fit_prompt(self.tokenize(prompt.into())?, reserve)?;
        let mut stats = Stats {
            prompt_tokens: ids.len(),
            ..Default::default()
        };
        // Prompt tokens enter the penalty window, as in llama.cpp's server.
        sampler.accept_all(&ids);
        let greedy = params.is_greedy();
        // KILN_TOP5 and a constraint need the logits row every step, so
        // they disable the argmax head.
        let step_output = if greedy && !self.top5 && constraint.is_none() {
            Output::Argmax
        } else {
            Output::LastLogits
        };
        let (top5, trace) = (self.top5, self.runner.trace_timing);
        // (min, max) decode step time, only when tracing.
        let mut step_span = (f64::INFINITY, 0.0f64);

        let runner = &mut self.runner;
        // The prompt and every step but the last token's: the cache's final
        // length, reserved once (decode then never reallocates).
        runner
            .reserve_exact(ids.len().saturating_add(params.max_tokens - 1))
            .map_err(|e| e.at_step(0))?;
        let need = if step_output == Output::Argmax {
            Need::Argmax
        } else {
            Need::Logits
        };
        runner
            .prefill(&ids, need, &mut stats)
            .map_err(|e| e.at_step(0))?;
        let decode_start = Instant::now();
        let mut decoder = StreamDecoder::new(&self.tokenizer, false);
        let mut matcher = StopMatcher::new(params.stop.clone());
        let mut out = Generation {
            tokens: Vec::new(),
            text: String::new(),
            finish: FinishReason::Length,
            stats,
        };
        let finish = loop {
            if out.tokens.len() >= params.max_tokens {
                break FinishReason::Length;
            }
            let step = out.tokens.len();
            if top5 && runner.last == Last::Logits {
                print_top5(step, &runner.logits_buf);
            }
            let id = match runner.last {
                Last::Argmax(id) => id,
                _ => {
                    if let Some(c) = constraint.as_deref_mut() {
                        c.mask(&mut runner.logits_buf)?;
                    }
                    // Masking and sampling change the row in place: it no
                    // longer holds the model's logits for reuse.
                    if constraint.is_some() || !greedy {
                        runner.last = Last::None;
                    }
                    if greedy {
                        argmax(&runner.logits_buf)
                    } else {
                        sampler.sample(&mut runner.logits_buf)
                    }
                    .map_err(|e| e.at_step(step))?
                }
            };
            if !params.ignore_eos && self.eog.binary_search(&id).is_ok() {
                break FinishReason::Eog(id);
            }
            if params.stop_token_ids.contains(&id) {
                break FinishReason::StopToken(id);
            }
            if let Some(c) = constraint.as_deref_mut() {
                c.accept(id)?;
            }
            sampler.accept(id);
            let index = out.tokens.len();
            out.tokens.push(id);
            let piece = decoder.push(id)?;
            let (text, stopped) = match matcher.push(&piece) {
                StopStatus::Continue { emit } => (emit, None),
                StopStatus::Stopped { emit, stop_index } => (emit, Some(stop_index)),
            };
            out.text.push_str(&text);
            let flow = on_token(TokenEvent {
                id: Some(id),
                text,
                index,
            });
            if let Some(i) = stopped {
                break FinishReason::StopString(i);
            }
            if flow.is_break() {
                break FinishReason::Cancelled;
            }
            if constraint.as_deref().is_some_and(Constraint::is_complete) {
                break FinishReason::Constraint;
            }
            if out.tokens.len() >= params.max_tokens {
                break FinishReason::Length;
            }
            if runner.cache.len() + 1 > runner.max_context {
                break FinishReason::ContextFull;
            }
            let t_step = trace.then(Instant::now);
            runner
                .step(id, step_output)
                .map_err(|e| e.at_step(step + 1))?;
            if let Some(t) = t_step {
                let ms = t.elapsed().as_secs_f64() * 1e3;
                step_span = (step_span.0.min(ms), step_span.1.max(ms));
            }
            out.stats.decode_tokens += 1;
        };
        // Release text held back for a possible stop string or UTF-8 tail.
        if !matches!(finish, FinishReason::StopString(_)) {
            let mut tail = matcher.push(&decoder.finish());
            if let StopStatus::Continue { emit } = &mut tail {
                emit.push_str(&matcher.finish());
            }
            let (text, stop) = match tail {
                StopStatus::Continue { emit } => (emit, None),
                StopStatus::Stopped { emit, stop_index } => (emit, Some(stop_index)),
            };
            if !text.is_empty() {
                out.text.push_str(&text);
                let _ = on_token(TokenEvent {
                    id: None,
                    text,
                    index: out.tokens.len(),
                });
            }
            out.finish = stop.map_or(finish, FinishReason::StopString);
        } else {
            out.finish = finish;
        }
        out.stats.decode_time = decode_start.elapsed();
        if trace {
            let st = &out.stats;
            eprintln!(
                "[kiln timing] prompt {} tokens ({} reused), prefill {:.1} ms; decode {} steps in {:.1} ms ({:.1} tok/s, step min {:.1} ms, max {:.1} ms)",
                st.prompt_tokens,
                st.reused_tokens,
                st.prefill_time.as_secs_f64() * 1e3,
                st.decode_tokens,
                st.decode_time.as_secs_f64() * 1e3,
                st.decode_tokens_per_s(),
                if st.decode_tokens == 0 { 0.0 } else { step_span.0 },
                step_span.1
            );
        }
        Ok(out)
    }
}

/// The `KILN_TOP5` line: the five largest logits of a step, ties to the
/// lowest id.
fn print_top5(step: usize, logits: &[f32]) {
    let line: Vec<String> = top_logits(logits, 5)
        .iter()
        .map(|(id, z)| format!("{id} {z:.4}"))
        .collect();
    eprintln!("[kiln top5] step {step}: {}", line.join(", "));
}
