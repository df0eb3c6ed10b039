//! The packed Gemma session: a loaded model, its tokenizer, one KV cache and
//! the buffers prefill and decode run in.
//!
//! - **Prefill** runs at a [`prefill_bucket`] size; each bucket has its own
//!   scratch, kept in an LRU [`PlanCache`] of 16 (and at most twice
//!   `max_prefill` rows in all), so buffers are sized once per bucket. The
//!   CPU computes only the real rows of a padded bucket ("active extent").
//!   Prompts longer than `max_prefill` run in chunks.
//! - **Decode** runs in one 1-token scratch, its KV-length buckets a
//!   [`DecodeLadder`] of power-of-two capacities. The cache itself is
//!   allocated for the request's known length (prompt + `max_tokens`) up
//!   front, growing in small steps within the rung only if a call outruns
//!   it: no allocation per token, no doubled memory.
//!   Greedy requests use the model's argmax head (no logits materialised).
//! - **Reuse**: the session remembers which tokens its cache holds and the
//!   output of the last one. A prompt equal to the previous one (e.g.
//!   `generate` after `logits`) reuses that output; a prompt that extends
//!   the cached tokens computes only the new suffix; one that diverges
//!   rewinds the cache to the common prefix ([`KvCache::truncate`]), unless
//!   a sliding ring overwrote what the new suffix needs
//!   ([`ring_allows_rewind`]), in which case it is recomputed.
//!
//! Debug switches, read from the environment when the session is created
//! (off: one branch per call):
//! - `KILN_TRACE_TIMING=1`: stderr lines for load, every prefill chunk
//!   (tokens, bucket, time) and a decode summary per `generate`.
//! - `KILN_TOP5=1`: the top-5 (id, logit) of every generation step; greedy
//!   decode then computes full logits instead of the argmax head.
//! - `KILN_DUMP_LAYER0=1`: layer-0 stage statistics per forward call (read
//!   by [`Model`]).
//!
//! [`KvCache::truncate`]: kiln_model::KvCache::truncate
//! [`ring_allows_rewind`]: crate::bucket::ring_allows_rewind

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use kiln_device::AnyBackend;
use kiln_gguf::Gguf;
pub(crate) use kiln_model::sample::top_logits;
use kiln_model::{env_flag, Backend, Model, ModelConfig, Output};
use kiln_tokenizer::Tokenizer;

use crate::bucket::{DecodeLadder, PlanCache};
use crate::chat::{ChatMessage, ChatOptions, ChatTemplate};
use crate::constrain::{Constraint, ConstraintSpec, Grammars};
use crate::error::{Result, RuntimeError};
use crate::perplexity::{nll, NllAccumulator, PerplexityResult};

/// How many prefill plans (bucket scratches) stay cached.
const PLAN_CACHE_SIZE: usize = 16;

mod generate;
mod runner;
mod types;

use runner::{check_hidden, Last, Need, Runner};
pub use types::*;

/// A loaded model ready to generate.
///
/// ```no_run
/// use std::ops::ControlFlow;
/// use kiln_runtime::{Session, SessionOptions, SamplingParams, ChatMessage};
/// let mut s = Session::load("gemma-3-270m-q4_k_m.gguf", SessionOptions::default())?;
/// let prompt = s.render_chat(&[ChatMessage::user("Hi!")])?;
/// let out = s.generate(&prompt, &SamplingParams::greedy(), |ev| {
///     print!("{}", ev.text);
///     ControlFlow::Continue(())
/// })?;
/// println!("\n{:.1} tok/s", out.stats.decode_tokens_per_s());
/// # Ok::<(), kiln_runtime::RuntimeError>(())
/// ```
pub struct Session<B: Backend = AnyBackend> {
    runner: Runner<B>,
    tokenizer: Arc<Tokenizer>,
    /// The constraint compiler, built on first use (a trie of the vocab).
    grammars: Option<Arc<Grammars>>,
    chat: std::result::Result<ChatTemplate, String>,
    eog: Vec<u32>,
    opts: SessionOptions,
    /// `KILN_TOP5`: print the top-5 logits of every generation step.
    top5: bool,
    /// What runs the model, for the user (`device: ...`).
    device: String,
}

impl Session<AnyBackend> {
    /// Opens a GGUF file and prepares a session on `opts.device` (by
    /// default a CUDA GPU when there is one, else the CPU; see
    /// [`Session::device`]).
    pub fn load(path: impl AsRef<Path>, opts: SessionOptions) -> Result<Self> {
        let t0 = Instant::now();
        let gguf = Arc::new(Gguf::open(path)?);
        let opened = opts.device.open(opts.threads)?;
        let mut s = Session::with_backend(opened.backend, gguf, opts)?;
        s.device = opened.description;
        if s.runner.trace_timing {
            eprintln!(
                "[kiln timing] load: {:.1} ms",
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(s)
    }
}

impl<B: Backend> Session<B> {
    /// A session on any backend.
    pub fn with_backend(backend: B, gguf: Arc<Gguf>, mut opts: SessionOptions) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads)
            .build()
            .map_err(|e| RuntimeError::InvalidOption {
                name: "threads",
                reason: e.to_string(),
            })?;
        // The architecture first: a non-Gemma file should say so, not fail
        // on some tokenizer or tensor detail.
        ModelConfig::from_gguf(&gguf)?;
        let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf)?);
        let chat = ChatTemplate::from_gguf(&gguf).map_err(|e| e.to_string());
        let device = format!("device: {}", backend.name());
        let model = Model::load(backend, gguf)?;
        let ctx = model.config.context_length;
        opts.max_context = if opts.max_context == 0 {
            ctx
        } else {
            opts.max_context.min(ctx)
        };
        if opts.max_prefill == 0 {
            return Err(RuntimeError::InvalidOption {
                name: "max_prefill",
                reason: "must be at least 1".into(),
            });
        }
        opts.max_prefill = opts.max_prefill.min(opts.max_context);
        // Room for the largest bucket and as many rows of smaller ones.
        let mut plans = PlanCache::new(PLAN_CACHE_SIZE).with_max_rows(2 * opts.max_prefill);
        // The smallest bucket is prepared up front (short prompts are common).
        plans.get_or_try_insert(1, || model.new_scratch(1))?;
        let decode_scratch = model.new_scratch(1)?;
        let cache = model.new_cache()?;
        let mut eog = tokenizer.eog_ids();
        eog.sort_unstable();
        let runner = Runner {
            ladder: DecodeLadder::new(opts.max_context),
            model,
            cache,
            cached: Vec::new(),
            last: Last::None,
            logits_buf: Vec::new(),
            hidden_buf: Vec::new(),
            plans,
            decode_scratch,
            reserved: 0,
            max_prefill: opts.max_prefill,
            max_context: opts.max_context,
            pool,
            trace_timing: env_flag("KILN_TRACE_TIMING"),
            threads: opts.threads,
            fell_back: None,
        };
        Ok(Session {
            runner,
            tokenizer,
            grammars: None,
            chat,
            eog,
            opts,
            top5: env_flag("KILN_TOP5"),
            device,
        })
    }

    /// What runs the model and why it was picked, one line for stderr
    /// (e.g. `device: CPU (cpu avx512vnni) — no CUDA GPU found`).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Why the session left its device for the CPU, when it has: a step
    /// on the device produced a non-finite value and was redone on the
    /// CPU, which then ran the rest (said on stderr as it happens).
    pub fn fell_back(&self) -> Option<&str> {
        self.runner.fell_back.as_deref()
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        self.runner.model.backend()
    }

    /// The constraint compiler for this model's tokenizer (built on the
    /// first call, then shared).
    pub fn grammars(&mut self) -> Result<Arc<Grammars>> {
        if let Some(g) = &self.grammars {
            return Ok(g.clone());
        }
        let g = Arc::new(Grammars::new(self.tokenizer.clone())?);
        self.grammars = Some(g.clone());
        Ok(g)
    }

    /// Compiles an output constraint for
    /// [`generate_constrained`](Self::generate_constrained); a bad schema,
    /// grammar or regex is [`RuntimeError::InvalidConstraint`].
    pub fn compile_constraint(&mut self, spec: &ConstraintSpec) -> Result<Constraint> {
        self.grammars()?.compile(spec)
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.runner.model.config
    }
    /// The parsed GGUF file the model's weights are mapped from (its
    /// metadata and tensor list, without opening the file again).
    pub fn gguf(&self) -> &Arc<Gguf> {
        self.runner.model.gguf()
    }
    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    /// The effective options (context capped by the model).
    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }
    /// End-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }
    /// Prefill buckets whose scratch is currently cached.
    pub fn prefill_buckets(&self) -> Vec<usize> {
        self.runner.plans.buckets()
    }
    /// The tokens the KV cache currently holds.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.runner.cached
    }

    /// Renders a conversation with the file's chat template (or the built-in
    /// Gemma format), ready for [`generate`](Self::generate): the leading
    /// BOS is left to the tokenizer.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        let opts = ChatOptions {
            tokenizer_adds_bos: self.tokenizer.add_bos(),
            ..Default::default()
        };
        self.render_chat_with(messages, &opts)
    }

    /// [`render_chat`](Self::render_chat) with explicit options.
    pub fn render_chat_with(&self, messages: &[ChatMessage], opts: &ChatOptions) -> Result<String> {
        match &self.chat {
            Ok(t) => t.render(messages, opts),
            Err(e) => Err(RuntimeError::Template(e.clone())),
        }
    }

    /// Tokenizes (text) or checks (ids) a prompt.
    pub fn tokenize(&self, prompt: Prompt<'_>) -> Result<Vec<u32>> {
        let ids = match prompt {
            Prompt::Text(t) => self.tokenizer.encode(t, true, true),
            Prompt::Tokens(t) => t.to_vec(),
        };
        if ids.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        let vocab_size = self.runner.model.config.n_vocab;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(RuntimeError::TokenOutOfVocab { id, vocab_size });
        }
        Ok(ids)
    }

    /// Forgets the KV cache (the next call recomputes its prompt).
    pub fn reset(&mut self) {
        self.runner.reset();
    }

    /// Logits of the prompt's last position, `[n_vocab]`. A following
    /// [`generate`](Self::generate) on the same prompt reuses this prefill.
    pub fn logits<'p>(&mut self, prompt: impl Into<Prompt<'p>>) -> Result<Vec<f32>> {
        let ids = self.fit_prompt(self.tokenize(prompt.into())?, 1)?;
        self.runner
            .prefill(&ids, Need::Logits, &mut Stats::default())
            .map_err(|e| e.at_step(0))?;
        Ok(self.runner.logits_buf.clone())
    }

    /// Logits of every prompt position, `[n_tokens * n_vocab]` row-major.
    /// Always recomputes the whole prompt (earlier rows are not cached).
    pub fn logits_all<'p>(&mut self, prompt: impl Into<Prompt<'p>>) -> Result<Vec<f32>> {
        let ids = self.fit_prompt(self.tokenize(prompt.into())?, 1)?;
        self.runner.reset();
        self.runner.reserve_exact(ids.len())?;
        let n_vocab = self.runner.model.config.n_vocab;
        let mut all = Vec::with_capacity(ids.len() * n_vocab);
        let mut rows = Vec::new();
        for chunk in ids.chunks(self.opts.max_prefill) {
            self.runner
                .run_prefill_chunk(chunk, Output::AllLogits, &mut rows)?;
            all.extend_from_slice(&rows);
        }
        // The last row is the usual reusable output.
        self.runner.logits_buf.clear();
        self.runner
            .logits_buf
            .extend_from_slice(&all[all.len() - n_vocab..]);
        self.runner.last = Last::Logits;
        Ok(all)
    }

    /// The post-final-norm hidden state of the prompt's last token and,
    /// with `mean = true`, its mean over all tokens (mean pooling, from one
    /// prefill with [`Output::AllHidden`]).
    pub fn embed<'p>(&mut self, prompt: impl Into<Prompt<'p>>, mean: bool) -> Result<Embedding> {
        let ids = self.fit_prompt(self.tokenize(prompt.into())?, 1)?;
        if !mean {
            self.runner
                .prefill(&ids, Need::Hidden, &mut Stats::default())?;
            return Ok(Embedding {
                last: self.runner.hidden_buf.clone(),
                mean: None,
            });
        }
        self.runner.reset();
        self.runner.reserve_exact(ids.len())?;
        let d = self.runner.model.config.n_embd;
        let mut sum = vec![0.0f64; d];
        let mut rows = Vec::new();
        for chunk in ids.chunks(self.opts.max_prefill) {
            self.runner
                .run_prefill_chunk(chunk, Output::AllHidden, &mut rows)?;
            check_hidden(&rows)?;
            for row in rows.chunks_exact(d) {
                sum.iter_mut()
                    .zip(row)
                    .for_each(|(s, &h)| *s += f64::from(h));
            }
        }
        self.runner.hidden_buf.clear();
        self.runner
            .hidden_buf
            .extend_from_slice(&rows[rows.len() - d..]);
        self.runner.last = Last::Hidden;
        let n = ids.len() as f64;
        Ok(Embedding {
            last: self.runner.hidden_buf.clone(),
            mean: Some(sum.iter().map(|&s| (s / n) as f32).collect()),
        })
    }

    /// Tokenizes a text file's contents as `llama-perplexity -f` does: one
    /// trailing newline dropped, BOS added, control tokens not parsed.
    pub fn tokenize_for_perplexity(&self, text: &str) -> Vec<u32> {
        let text = text.strip_suffix('\n').unwrap_or(text);
        self.tokenizer.encode(text, true, false)
    }

    /// Perplexity of `tokens` with chunks of `n_ctx` tokens, computed as
    /// llama.cpp's `llama-perplexity` does (see [`crate::perplexity`]).
    pub fn perplexity(&mut self, tokens: &[u32], n_ctx: usize) -> Result<PerplexityResult> {
        self.perplexity_with(tokens, n_ctx, None, |_, _, _| {})
    }

    /// [`Session::perplexity`] over at most `max_chunks` chunks (None: all,
    /// as llama-perplexity's `--chunks`), calling
    /// `on_chunk(chunk, n_chunks, running_ppl)` after each chunk is scored,
    /// with `chunk` counted from 0 and `running_ppl` the perplexity over
    /// chunks `0..=chunk` (llama.cpp's `[chunk+1]running_ppl`).
    ///
    /// As in llama.cpp, `tokens` must hold at least `2 * n_ctx` tokens
    /// whatever `max_chunks` is; `max_chunks` only stops the scoring early.
    pub fn perplexity_with(
        &mut self,
        tokens: &[u32],
        n_ctx: usize,
        max_chunks: Option<usize>,
        mut on_chunk: impl FnMut(usize, usize, f64),
    ) -> Result<PerplexityResult> {
        if max_chunks == Some(0) {
            return Err(RuntimeError::InvalidOption {
                name: "max_chunks",
                reason: "0: perplexity needs at least 1 chunk".into(),
            });
        }
        if n_ctx < 4 || n_ctx > self.opts.max_context {
            return Err(RuntimeError::InvalidOption {
                name: "n_ctx",
                reason: format!(
                    "{n_ctx}: perplexity needs 4 <= n_ctx <= {} (the session context)",
                    self.opts.max_context
                ),
            });
        }
        if tokens.len() < 2 * n_ctx {
            return Err(RuntimeError::InvalidOption {
                name: "n_ctx",
                reason: format!(
                    "{} tokens are too few: perplexity with a context of {n_ctx} needs at least {}",
                    tokens.len(),
                    2 * n_ctx
                ),
            });
        }
        let vocab_size = self.runner.model.config.n_vocab;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(RuntimeError::TokenOutOfVocab { id, vocab_size });
        }
        let bos = self.tokenizer.bos_id().filter(|_| self.tokenizer.add_bos());
        let first = n_ctx / 2;
        let mut acc = NllAccumulator::default();
        let mut chunk = Vec::with_capacity(n_ctx);
        let mut rows = Vec::new();
        let n_chunks = (tokens.len() / n_ctx).min(max_chunks.unwrap_or(usize::MAX));
        self.runner.reserve_exact(n_ctx)?;
        for k in 0..n_chunks {
            chunk.clear();
            chunk.extend_from_slice(&tokens[k * n_ctx..(k + 1) * n_ctx]);
            if let Some(b) = bos {
                chunk[0] = b;
            }
            self.runner.reset();
            // Sub-batches of at most max_prefill; logits only where scored.
            let mut a = 0;
            while a < n_ctx {
                let b = (a + self.opts.max_prefill).min(n_ctx);
                let out = if b <= first {
                    Output::LastHidden
                } else {
                    Output::LogitsFrom(first.max(a) - a)
                };
                self.runner
                    .run_prefill_chunk(&chunk[a..b], out, &mut rows)?;
                if b > first {
                    for (i, row) in rows.chunks_exact(vocab_size).enumerate() {
                        let j = first.max(a) + i;
                        if j + 1 < n_ctx {
                            acc.add(nll(row, chunk[j + 1]));
                        }
                    }
                }
                a = b;
            }
            on_chunk(k, n_chunks, acc.end_chunk());
        }
        Ok(acc.finish(n_ctx))
    }

    /// Applies the context limit: error, or keep BOS + tail (see
    /// [`Truncation`]). `reserve` is the room kept for new tokens.
    fn fit_prompt(&self, ids: Vec<u32>, reserve: usize) -> Result<Vec<u32>> {
        let max = self.opts.max_context;
        // Room for the prompt and at least one generated token.
        if ids.len() < max {
            return Ok(ids);
        }
        let keep = max.saturating_sub(reserve).max(1);
        match self.opts.truncation {
            Truncation::Error => Err(RuntimeError::PromptTooLong {
                prompt_len: ids.len(),
                reserve: 1,
                max_context: max,
            }),
            Truncation::KeepTail => {
                let bos = self.tokenizer.bos_id().filter(|&b| ids.first() == Some(&b));
                let mut out = Vec::with_capacity(keep);
                out.extend(bos);
                let tail = keep - out.len();
                out.extend_from_slice(&ids[ids.len() - tail..]);
                Ok(out)
            }
        }
    }
}
