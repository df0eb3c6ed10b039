//! The model side of a session: prefill with reuse and buckets, decode
//! steps along the ladder.

use std::time::Instant;

use kiln_model::{Backend, KvCache, Model, Output, Scratch};

use super::{Stats, PLAN_CACHE_SIZE};
use crate::bucket::{prefill_bucket, DecodeLadder, PlanCache};
use crate::error::{Result, RuntimeError};

/// What the cache's last token produced, kept for reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Last {
    None,
    /// `Session::logits_buf` holds the last position's logits.
    Logits,
    Argmax(u32),
    /// `Session::hidden_buf` holds the last position's hidden state.
    Hidden,
}

/// What a prefill has to produce for its last token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
    Logits,
    /// Greedy's pick only: the argmax head, no logits row (on the CPU
    /// that also spares re-reading the LM head's file rows once its
    /// coarse screen copy exists).
    Argmax,
    Hidden,
}

/// The model side of a session: weights, cache, buffers. Kept apart from
/// the tokenizer so that a streaming decoder can borrow the tokenizer while
/// decode steps mutate this.
pub(super) struct Runner<B: Backend> {
    pub(super) model: Model<B>,
    pub(super) cache: KvCache<B>,
    /// The tokens whose K/V the cache holds, in order.
    pub(super) cached: Vec<u32>,
    pub(super) last: Last,
    pub(super) logits_buf: Vec<f32>,
    pub(super) hidden_buf: Vec<f32>,
    pub(super) plans: PlanCache<Scratch<B>>,
    pub(super) decode_scratch: Scratch<B>,
    pub(super) ladder: DecodeLadder,
    /// KV positions the cache has room for.
    pub(super) reserved: usize,
    pub(super) max_prefill: usize,
    pub(super) max_context: usize,
    pub(super) pool: rayon::ThreadPool,
    /// `KILN_TRACE_TIMING`: print a timing line per prefill chunk.
    pub(super) trace_timing: bool,
    /// Threads of the session (the CPU fallback's kernels use as many).
    pub(super) threads: usize,
    /// Why the session left its device for the CPU, once it has.
    pub(super) fell_back: Option<String>,
}

impl<B: Backend> Runner<B> {
    /// Forgets the KV cache.
    pub(super) fn reset(&mut self) {
        self.cache.clear();
        self.cached.clear();
        self.last = Last::None;
    }

    /// [`Runner::prefill_once`], redone on the CPU when the device
    /// produced a non-finite value ([`Runner::fall_back_to_cpu`]).
    pub(super) fn prefill(&mut self, ids: &[u32], need: Need, stats: &mut Stats) -> Result<()> {
        match self.prefill_once(ids, need, stats) {
            // The prompt is recomputed whole there.
            Err(e) if self.fall_back_to_cpu(&e, "in the prompt", false)? => {
                self.prefill_once(ids, need, stats)
            }
            r => r,
        }
    }

    /// [`Runner::step_once`], redone on the CPU when the device produced
    /// a non-finite value.
    pub(super) fn step(&mut self, id: u32, output: Output) -> Result<()> {
        let Err(e) = self.step_once(id, output) else {
            return Ok(());
        };
        if self.fall_back_to_cpu(&e, &format!("in the step of token {id}"), true)? {
            return self.step_once(id, output);
        }
        // The cache may hold this step's row, which `cached` does not
        // list, or fewer rows than it lists (a failed forward).
        if self.cache.len() < self.cached.len() {
            self.cached.truncate(self.cache.len());
        } else if self.cache.len() > self.cached.len()
            && self.cache.truncate(self.cached.len()).is_err()
        {
            self.reset();
        }
        Err(e)
    }

    /// When `err` is a non-finite value and the backend has a CPU
    /// fallback: says so on stderr, moves the session to the CPU (the
    /// same weights; the cached tokens recomputed there when `keep`, else
    /// dropped) and returns true, for the caller to redo its work there.
    /// The CPU stays: a device that produced NaN once is not trusted with
    /// the rest of the session.
    fn fall_back_to_cpu(&mut self, err: &RuntimeError, what: &str, keep: bool) -> Result<bool> {
        let non_finite = matches!(
            err,
            RuntimeError::NonFiniteLogit { .. }
                | RuntimeError::NonFiniteHidden
                | RuntimeError::Model(kiln_model::ModelError::NonFiniteLogit { .. })
        );
        if !non_finite {
            return Ok(false);
        }
        let Some(cpu) = self.model.backend().cpu_fallback(self.threads) else {
            return Ok(false);
        };
        let why = format!(
            "{} produced a non-finite value {what} at position {}: {err}",
            self.model.backend().name(),
            self.cached.len()
        );
        eprintln!("warning: {why}; redoing it on the CPU, which runs the rest of this session");
        let model = Model::load(cpu, self.model.gguf().clone())?;
        self.decode_scratch = model.new_scratch(1)?;
        self.cache = model.new_cache()?;
        self.plans = PlanCache::new(PLAN_CACHE_SIZE).with_max_rows(2 * self.max_prefill);
        self.model = model;
        self.reserved = 0;
        self.last = Last::None;
        self.fell_back = Some(why);
        let tokens = std::mem::take(&mut self.cached);
        if keep && !tokens.is_empty() {
            self.reserve_exact(tokens.len())?;
            let mut hidden = std::mem::take(&mut self.hidden_buf);
            let r = tokens.chunks(self.max_prefill).try_for_each(|chunk| {
                self.run_prefill_chunk(chunk, Output::LastHidden, &mut hidden)
                    .map(|_| ())
            });
            self.hidden_buf = hidden;
            r?;
        }
        Ok(true)
    }

    /// Brings the cache to exactly `ids` with the last token's `need`ed
    /// output in `logits_buf` / `hidden_buf`, reusing what it can.
    fn prefill_once(&mut self, ids: &[u32], need: Need, stats: &mut Stats) -> Result<()> {
        let have = matches!(
            (self.last, need),
            // Logits serve a greedy pick too.
            (Last::Logits, Need::Logits | Need::Argmax)
                | (Last::Argmax(_), Need::Argmax)
                | (Last::Hidden, Need::Hidden)
        );
        if self.cached == ids && have {
            stats.reused_tokens = ids.len();
            return Ok(());
        }
        self.reserve_exact(ids.len())?;
        let keep = self.reusable_prefix(ids);
        if keep < self.cached.len() {
            // Rewind to the common prefix. The cache refuses when a sliding
            // ring overwrote a row the suffix needs: then recompute all.
            if self.cache.truncate(keep).is_ok() {
                self.cached.truncate(keep);
            } else {
                self.reset();
            }
        }
        let start = self.cached.len();
        stats.reused_tokens = start;
        stats.prefill_tokens = ids.len() - start;
        let t0 = Instant::now();
        self.last = Last::None;
        let output = match need {
            Need::Logits => Output::LastLogits,
            Need::Argmax => Output::Argmax,
            Need::Hidden => Output::LastHidden,
        };
        let chunks: Vec<&[u32]> = ids[start..].chunks(self.max_prefill).collect();
        let n_chunks = chunks.len();
        let mut buf = std::mem::take(match need {
            Need::Logits | Need::Argmax => &mut self.logits_buf,
            Need::Hidden => &mut self.hidden_buf,
        });
        let mut result = Ok(None);
        for (i, chunk) in chunks.into_iter().enumerate() {
            // Earlier chunks only fill the cache: ask for the cheapest output.
            let out = if i + 1 == n_chunks {
                output
            } else {
                Output::LastHidden
            };
            result = self.run_prefill_chunk(chunk, out, &mut buf);
            if result.is_err() {
                break;
            }
        }
        match need {
            Need::Logits | Need::Argmax => self.logits_buf = buf,
            Need::Hidden => self.hidden_buf = buf,
        }
        let pick = result?;
        match need {
            Need::Logits => {
                if let Some(index) = self.logits_buf.iter().position(|l| !l.is_finite()) {
                    let value = self.logits_buf[index];
                    return Err(RuntimeError::NonFiniteLogit {
                        step: 0,
                        index,
                        value,
                    });
                }
                self.last = Last::Logits;
            }
            Need::Argmax => match pick {
                Some(t) if (t as usize) < self.model.config.n_vocab => self.last = Last::Argmax(t),
                _ => return Err(RuntimeError::NonFiniteHidden),
            },
            Need::Hidden => {
                check_hidden(&self.hidden_buf)?;
                self.last = Last::Hidden;
            }
        }
        stats.prefill_time = t0.elapsed();
        Ok(())
    }

    /// How many cached tokens the prompt `ids` could keep: the common
    /// prefix, leaving at least the last prompt token to compute (its output
    /// is needed). Whether the sliding rings allow rewinding that far is
    /// [`KvCache::truncate`]'s call.
    fn reusable_prefix(&self, ids: &[u32]) -> usize {
        let lcp = self
            .cached
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count();
        lcp.min(ids.len().saturating_sub(1))
    }

    /// One prefill chunk at its bucket's scratch; appends to the cache.
    /// Returns the argmax head's pick where `output` asks for it.
    pub(super) fn run_prefill_chunk(
        &mut self,
        chunk: &[u32],
        output: Output,
        out: &mut Vec<f32>,
    ) -> Result<Option<u32>> {
        let bucket = prefill_bucket(chunk.len(), self.max_prefill);
        self.reserve_kv(self.cache.len() + chunk.len())?;
        let model = &self.model;
        let scratch = self
            .plans
            .get_or_try_insert(bucket, || model.new_scratch(bucket))?;
        let cache = &mut self.cache;
        let t0 = self.trace_timing.then(Instant::now);
        let p0 = cache.len();
        let r = self
            .pool
            .install(|| model.forward(chunk, cache, scratch, output, out));
        let pick = match r {
            Ok(pick) => pick,
            Err(e) => {
                // A failed forward may have emptied the cache.
                self.cached.truncate(self.cache.len());
                return Err(e.into());
            }
        };
        if let Some(t0) = t0 {
            let secs = t0.elapsed().as_secs_f64();
            eprintln!(
                "[kiln timing] prefill {} tokens at position {p0}, bucket {bucket}: {:.1} ms ({:.1} tok/s)",
                chunk.len(),
                secs * 1e3,
                chunk.len() as f64 / secs
            );
        }
        self.cached.extend_from_slice(chunk);
        Ok(pick)
    }

    /// One decode step of token `id` in the 1-token scratch.
    fn step_once(&mut self, id: u32, output: Output) -> Result<()> {
        self.reserve_kv(self.cache.len() + 1)?;
        self.last = Last::None;
        let (model, cache, scratch) = (&self.model, &mut self.cache, &mut self.decode_scratch);
        let buf = match output {
            Output::LastHidden => &mut self.hidden_buf,
            _ => &mut self.logits_buf,
        };
        let r = self
            .pool
            .install(|| model.forward(&[id], cache, scratch, output, buf));
        // A failed forward may have emptied the cache; `cached` still
        // lists its tokens, for `step` to recompute them on the CPU or
        // to trim to what the cache kept.
        let r = r?;
        if output == Output::LastLogits {
            // Caught here, not by the sampler, so that the step can be
            // redone (on the CPU) before its logits are used.
            if let Some(index) = self.logits_buf.iter().position(|l| !l.is_finite()) {
                let value = self.logits_buf[index];
                return Err(RuntimeError::NonFiniteLogit {
                    step: 0,
                    index,
                    value,
                });
            }
        }
        let last = match (output, r) {
            (Output::Argmax, Some(t)) if (t as usize) < model.config.n_vocab => Last::Argmax(t),
            (Output::Argmax, _) => return Err(RuntimeError::NonFiniteHidden),
            (Output::LastHidden, _) => Last::Hidden,
            _ => Last::Logits,
        };
        self.cached.push(id);
        self.last = last;
        Ok(())
    }

    /// Reserves room for exactly `n_pos` positions (capped at the context),
    /// for a request whose final length is known: one allocation, no copy
    /// later, nothing unused.
    pub(super) fn reserve_exact(&mut self, n_pos: usize) -> Result<()> {
        let n_pos = n_pos.min(self.max_context);
        if n_pos > self.reserved {
            self.cache.reserve(self.model.backend(), n_pos)?;
            self.reserved = n_pos;
        }
        Ok(())
    }

    /// Makes room for `n_pos` positions when a forward call outruns what
    /// was reserved: [`KV_GROW_ROWS`] at a time, never past the ladder rung
    /// holding `n_pos` (the KV-length bucket a decode step runs in).
    /// Growth copies the cache, so requests reserve their length up front
    /// ([`Runner::reserve_exact`]) and this is the fallback.
    pub(super) fn reserve_kv(&mut self, n_pos: usize) -> Result<()> {
        if n_pos <= self.reserved {
            return Ok(());
        }
        let rung = self
            .ladder
            .rung_for(n_pos)
            .ok_or(RuntimeError::PromptTooLong {
                prompt_len: n_pos,
                reserve: 0,
                max_context: self.max_context,
            })?;
        let rows = n_pos.next_multiple_of(KV_GROW_ROWS).min(rung);
        self.cache.reserve(self.model.backend(), rows)?;
        self.reserved = rows;
        Ok(())
    }
}

/// Rows a cache grows by past its reservation: amortises the copy without
/// doubling memory.
const KV_GROW_ROWS: usize = 256;

pub(super) fn check_hidden(h: &[f32]) -> Result<()> {
    if h.iter().any(|x| !x.is_finite()) {
        return Err(RuntimeError::NonFiniteHidden);
    }
    Ok(())
}
