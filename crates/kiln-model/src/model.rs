//! The forward pass, written once against [`Backend`]: the model's bound
//! weights, a step over one or many sequences, and its outputs. Binding
//! the weights by GGUF tensor name is in `load`, one layer's ops in
//! `layer`.

mod layer;
mod load;

use std::sync::Arc;

use kiln_gguf::Gguf;

use crate::backend::{AttnParams, Backend, GraphKey, HeadsPart, KvStore, StepInput};
use crate::config::{LayerConfig, ModelConfig};
use crate::error::{ModelError, Result};
use crate::kv::KvCache;
pub use crate::scratch::Scratch;

/// One sequence's part of a [`Model::forward_batch`] step.
pub struct BatchSeq<'a, B: Backend> {
    /// Its new tokens (a decode row is one).
    pub tokens: &'a [u32],
    /// Its cache: the tokens run at positions `cache.len()..`.
    pub cache: &'a mut KvCache<B>,
    pub output: Output,
    /// Logits or hidden states, resized (untouched for [`Output::Argmax`];
    /// for [`Output::Sample`], the sampled token's output words when
    /// logprobs are asked: [`crate::sample::Sampled::parse`]).
    pub out: &'a mut Vec<f32>,
    /// Its sampler state for [`Output::Sample`] (a buffer of
    /// [`crate::sample::state_words`], advanced by the step).
    pub sampler: Option<&'a mut B::Buf>,
}

/// Where a step's output rows for one sequence lie: `rows` rows from
/// `row` of the residual stream, gathered to row `dst` of `s.h` in
/// `group` (0: logits to the host, 1: the argmax or sampling head, 2:
/// hidden states).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OutRows {
    row: usize,
    rows: usize,
    group: usize,
    dst: usize,
}

/// Checks a sequence's logits rows (the first at position `pos`) and, for
/// [`Output::Argmax`], takes their argmax: the first maximum, so ties go to
/// the lowest id like the argmax head.
fn take_logits(output: Output, mine: &[f32], pos: usize, v: usize) -> Result<Option<u32>> {
    if let Some(i) = mine.iter().position(|x| !x.is_finite()) {
        return Err(ModelError::NonFiniteLogit {
            pos: pos + i / v,
            token: (i % v) as u32,
            value: mine[i],
        });
    }
    if output != Output::Argmax {
        return Ok(None);
    }
    let (mut best, mut at) = (f32::NEG_INFINITY, 0);
    for (i, &x) in mine.iter().enumerate() {
        if x > best {
            (best, at) = (x, i);
        }
    }
    Ok(Some(at as u32))
}

/// The output words of a sampled sequence that asked for logprobs, into
/// its `out` (one small download of its state).
fn sampled_out<B: Backend>(b: &B, q: &mut BatchSeq<'_, B>) -> Result<()> {
    if let (Output::Sample { logprobs }, Some(st)) = (q.output, q.sampler.as_deref()) {
        if logprobs > 0 {
            let k = logprobs.min(crate::sample::LOGPROBS_MAX);
            q.out.resize(2 + 2 * k, 0.0);
            b.download(st, crate::sample::OUT, q.out)?;
        }
    }
    Ok(())
}

/// What a forward call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Logits of the last position, `[n_vocab]`.
    LastLogits,
    /// Logits of every position, `[n_tok, n_vocab]`.
    AllLogits,
    /// Logits of batch rows `start..n_tok`, `[n_tok - start, n_vocab]`:
    /// scores part of a batch (perplexity, teacher forcing) without paying
    /// the LM head for the rest.
    LogitsFrom(usize),
    /// Post-final-norm hidden state of the last position, `[n_embd]`.
    LastHidden,
    /// Post-final-norm hidden states of every position, `[n_tok, n_embd]`.
    AllHidden,
    /// Only the greedy token of the last position (no logits materialised).
    Argmax,
    /// Only a token of the last position drawn by the sequence's sampler
    /// ([`BatchSeq::sampler`], [`Backend::sample_head`]): the logits stay
    /// on the backend; with `logprobs > 0` (at most
    /// [`crate::sample::LOGPROBS_MAX`]) the token's logprob and that many
    /// alternatives come back in `out`.
    Sample { logprobs: usize },
}

impl Output {
    /// Whether the step's head picks this sequence's token.
    fn headed(self) -> bool {
        matches!(self, Output::Argmax | Output::Sample { .. })
    }
}

struct PleLayer<B: Backend> {
    inp_gate: B::Weight,
    proj: B::Weight,
    post_norm: B::Buf,
}

struct MoeLayer<B: Backend> {
    router: B::Weight,
    /// `ffn_gate_inp.scale / sqrt(n_embd)`, folded into the router norm.
    router_norm: B::Buf,
    /// Fused `[n_embd, 2*ff, E]` (gate rows first) or split gate/up.
    gate_up: Option<B::Weight>,
    gate: Option<B::Weight>,
    up: Option<B::Weight>,
    down: B::Weight,
    expert_scale: Vec<f32>,
    pre_norm_2: B::Buf,
    post_norm_1: B::Buf,
    post_norm_2: B::Buf,
}

struct LayerWeights<B: Backend> {
    attn_norm: B::Buf,
    /// q's rows, then those of the first `fused_kv` of k and v when the
    /// backend fused them ([`Backend::concat_rows`]; `k`/`v` are then None).
    q: B::Weight,
    fused_kv: usize,
    k: Option<B::Weight>,
    v: Option<B::Weight>,
    o: B::Weight,
    q_norm: Option<B::Buf>,
    k_norm: Option<B::Buf>,
    post_attn_norm: B::Buf,
    ffn_norm: B::Buf,
    /// gate's rows, then up's when `up` is None (fused by the backend).
    gate: B::Weight,
    up: Option<B::Weight>,
    down: B::Weight,
    post_ffw_norm: B::Buf,
    output_scale: f32,
    ple: Option<PleLayer<B>>,
    moe: Option<MoeLayer<B>>,
}

struct GlobalPle<B: Backend> {
    token_embd: B::Weight,
    model_proj: B::Weight,
    proj_norm: B::Buf,
}

/// A loaded model: config, bound weights and the backend that runs it.
pub struct Model<B: Backend> {
    pub config: ModelConfig,
    backend: B,
    token_embd: B::Weight,
    output: Option<B::Weight>,
    output_norm: B::Buf,
    ple: Option<GlobalPle<B>>,
    layers: Vec<LayerWeights<B>>,
    gguf: Arc<Gguf>,
    /// `KILN_DUMP_LAYER0`: print layer-0 stage statistics on every forward.
    dump_layer0: bool,
}

/// Whether the debug switch `name` is set to something other than `0`/empty.
pub fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Summary of one activation tensor, for debug taps: min/max/rms over the
/// finite values and how many are NaN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TapStats {
    pub min: f32,
    pub max: f32,
    pub rms: f32,
    pub nan: usize,
}

impl TapStats {
    pub fn of(v: &[f32]) -> TapStats {
        let (mut min, mut max, mut ss, mut n, mut nan) =
            (f32::INFINITY, f32::NEG_INFINITY, 0.0f64, 0usize, 0);
        for &x in v {
            if x.is_nan() {
                nan += 1;
                continue;
            }
            min = min.min(x);
            max = max.max(x);
            if x.is_finite() {
                ss += f64::from(x) * f64::from(x);
                n += 1;
            }
        }
        TapStats {
            min,
            max,
            rms: if n == 0 {
                0.0
            } else {
                (ss / n as f64).sqrt() as f32
            },
            nan,
        }
    }
}

/// Prints the [`TapStats`] line of a debug tap.
fn tap_host(name: &str, v: &[f32]) {
    let t = TapStats::of(v);
    eprintln!(
        "[kiln layer0] {name:<14} n {:<8} min {:>11.4} max {:>11.4} rms {:>10.4} nan {}",
        v.len(),
        t.min,
        t.max,
        t.rms,
        t.nan
    );
}

impl<B: Backend> Model<B> {
    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn gguf(&self) -> &Arc<Gguf> {
        &self.gguf
    }

    pub fn new_cache(&self) -> Result<KvCache<B>> {
        KvCache::new(&self.backend, &self.config)
    }

    /// Scratch for batches of up to `max_tokens` tokens.
    pub fn new_scratch(&self, max_tokens: usize) -> Result<Scratch<B>> {
        let fused = self.layers.iter().any(|w| w.fused_kv > 0 || w.up.is_none());
        Scratch::sized(&self.backend, &self.config, max_tokens, fused)
    }

    /// Runs `tokens` at positions `cache.len()..`, appends their K/V to the
    /// cache and writes the requested output into `out` (resized; untouched
    /// for [`Output::Argmax`], whose token is returned). A NaN or infinite
    /// logit is an error ([`ModelError::NonFiniteLogit`]), never skipped.
    /// A one-sequence [`Model::forward_batch`].
    ///
    /// A failed call leaves the cache's length as it was, except when the
    /// batch had already overwritten sliding-window rows the cache still
    /// needed (layers store their K/V as they go, to share one scratch
    /// pair): then the cache is emptied. Either way `cache.len()` says what
    /// it holds.
    ///
    /// With `KILN_DUMP_LAYER0=1` in the environment (read at load), every
    /// call prints min/max/rms/NaN count of layer 0's stages to stderr:
    /// embed, attn_norm, q and k after norm+RoPE, attention out, post-attn
    /// norm, FFN out and layer out. Off, it costs one branch per layer.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<B>,
        s: &mut Scratch<B>,
        output: Output,
        out: &mut Vec<f32>,
    ) -> Result<Option<u32>> {
        let mut seqs = [BatchSeq {
            tokens,
            cache,
            output,
            out,
            sampler: None,
        }];
        self.step(&mut seqs, s)?;
        s.results.pop().unwrap_or(Ok(None))
    }

    /// Runs the new tokens of several sequences in one step: every matmul
    /// once over all their rows (each weight read once), attention per
    /// sequence over its own cache. Each row gets the same arithmetic as
    /// in a one-sequence call.
    ///
    /// The outer error fails the whole step (each cache as after a failed
    /// [`Model::forward`]); an inner one fails that sequence alone (a
    /// non-finite logit), whose cache is rolled back the same way while
    /// the others advance. `Ok(Some(id))` answers [`Output::Argmax`].
    pub fn forward_batch(
        &self,
        seqs: &mut [BatchSeq<'_, B>],
        s: &mut Scratch<B>,
    ) -> Result<Vec<Result<Option<u32>>>> {
        self.step(seqs, s)?;
        Ok(s.results.drain(..).collect())
    }

    /// [`Model::forward_batch`] with each sequence's result left in
    /// `s.results` (no allocation once the scratch has warmed up).
    fn step(&self, seqs: &mut [BatchSeq<'_, B>], s: &mut Scratch<B>) -> Result<()> {
        if seqs.is_empty() {
            return Err(ModelError::Invalid(
                "forward called with no sequences".into(),
            ));
        }
        let n: usize = seqs.iter().map(|q| q.tokens.len()).sum();
        if n > s.max_tokens {
            return Err(ModelError::Invalid(format!(
                "{n} tokens exceed the scratch capacity {} (make a larger scratch)",
                s.max_tokens
            )));
        }
        for q in seqs.iter() {
            let len = q.tokens.len();
            if len == 0 {
                return Err(ModelError::Invalid("forward called with no tokens".into()));
            }
            if let Some(&bad) = q
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.config.n_vocab)
            {
                return Err(ModelError::Invalid(format!(
                    "token id {bad} out of range (vocab {})",
                    self.config.n_vocab
                )));
            }
            if matches!(q.output, Output::Sample { .. }) && q.sampler.is_none() {
                return Err(ModelError::Invalid(
                    "Output::Sample without a sampler".into(),
                ));
            }
            if let Output::LogitsFrom(start) = q.output {
                if start >= len {
                    return Err(ModelError::Invalid(format!(
                        "logits from row {start} of a {len}-token batch"
                    )));
                }
            }
        }
        for q in seqs.iter_mut() {
            let end = q.cache.len() + q.tokens.len();
            q.cache.ensure(&self.backend, end)?;
        }
        s.input.clear();
        for q in seqs.iter() {
            s.input.push_seq(q.tokens, q.cache.len());
        }
        // A decode step a graph replays is padded to a power-of-two row
        // count: one-row sequences of token 0 at position 0 with no cache
        // (their K/V go nowhere, their ids are dropped).
        if self.graph_decode(seqs) {
            let padded = n.next_power_of_two().min(s.max_tokens);
            for _ in n..padded {
                s.input.push_seq(&[0], 0);
            }
        }
        let r = self
            .bind_caches(seqs, s)
            .and_then(|()| self.bind_samplers(seqs, s))
            .and_then(|()| self.backend.load_step(&s.input, &mut s.step))
            .and_then(|()| self.run(seqs, s));
        match &r {
            Ok(()) => {
                for (q, res) in seqs.iter_mut().zip(&s.results) {
                    match res {
                        Ok(_) => q.cache.advance(q.tokens.len()),
                        Err(_) => q.cache.abort(),
                    }
                }
            }
            Err(_) => seqs.iter_mut().for_each(|q| q.cache.abort()),
        }
        r
    }

    /// Whether `seqs` make a decode step the backend replays as a graph:
    /// one greedy row each, and no host work inside the step (debug taps,
    /// MoE routing).
    fn graph_decode(&self, seqs: &[BatchSeq<'_, B>]) -> bool {
        self.backend.replays_steps()
            && !self.dump_layer0
            && self.config.layers.iter().all(|l| l.moe.is_none())
            && seqs
                .iter()
                .all(|q| q.output.headed() && q.tokens.len() == 1)
    }

    /// Records the sampler of each head row (the `j`-th sequence whose
    /// token the head picks), when any row samples.
    fn bind_samplers(&self, seqs: &[BatchSeq<'_, B>], s: &mut Scratch<B>) -> Result<()> {
        let headed = seqs.iter().filter(|q| q.output.headed());
        for (j, q) in headed.enumerate() {
            if let Some(st) = q.sampler.as_deref() {
                self.backend.bind_sampler(&mut s.step, j, Some(st))?;
            }
        }
        Ok(())
    }

    /// Records every sequence's cache of every layer in the step (padding
    /// sequences have none).
    fn bind_caches(&self, seqs: &[BatchSeq<'_, B>], s: &mut Scratch<B>) -> Result<()> {
        for i in 0..s.input.seqs.len() {
            for il in 0..self.config.n_layer {
                let kv = seqs.get(i).and_then(|q| q.cache.binding(il));
                self.backend.bind_kv(&mut s.step, i, il, kv)?;
            }
        }
        Ok(())
    }

    /// [`Model::forward_batch`] after its checks: every layer, the K/V of
    /// layers other layers read (stored last), then each sequence's output
    /// into `s.results`.
    fn run(&self, seqs: &mut [BatchSeq<'_, B>], s: &mut Scratch<B>) -> Result<()> {
        let b = &self.backend;
        let cfg = &self.config;
        let d = cfg.n_embd;
        let n = s.input.rows();
        let head = self.output.as_ref().unwrap_or(&self.token_embd);

        // Output rows, gathered into `s.h` in three groups: rows whose
        // logits come to the host, then the argmax-head rows (one per
        // greedy sequence; a bad logit fails only its own sequence), then
        // hidden rows.
        let mut plan = std::mem::take(&mut s.plan);
        plan.clear();
        let mut n_logits = 0;
        for (q, sp) in seqs.iter().zip(&s.input.seqs) {
            let (first, rows) = match q.output {
                Output::AllLogits | Output::AllHidden => (0, sp.n_rows),
                Output::LogitsFrom(start) => (start, sp.n_rows - start),
                _ => (sp.n_rows - 1, 1),
            };
            let group = match q.output {
                Output::Argmax | Output::Sample { .. } => 1,
                Output::LastHidden | Output::AllHidden => 2,
                _ => 0,
            };
            n_logits += if group == 0 { rows } else { 0 };
            plan.push(OutRows {
                row: sp.row0 + first,
                rows,
                group,
                dst: 0,
            });
        }
        let n_argmax = plan.iter().filter(|o| o.group == 1).count();
        let mut at = [0, n_logits, n_logits + n_argmax];
        for o in plan.iter_mut() {
            o.dst = at[o.group];
            at[o.group] += o.rows;
        }
        // Padding rows (a graph-replayed decode step's, after the real
        // ones, all greedy rows in place) run the argmax head too, so
        // the step's launches depend only on its padded row count.
        let pad = s.input.seqs.len() - seqs.len();
        let n_argmax = n_argmax + pad;
        let n_out = at[2] + pad;
        // A head with a sampled row samples them all (the others take
        // the argmax in it), into logits kept on the backend.
        let sampled = seqs
            .iter()
            .any(|q| matches!(q.output, Output::Sample { .. }));
        if sampled {
            let need = n_argmax.next_power_of_two() * cfg.n_vocab;
            if s.sample_logits.as_ref().is_none_or(|l| b.buf_len(l) < need) {
                s.sample_logits = None;
                s.sample_logits = Some(b.alloc(need)?);
                s.id = crate::kv::buffer_id();
            }
        }

        // Caches are found through the step (`bind_caches`), so a key
        // names no cache: any sequences of a bucket replay its graph.
        let key = self.graph_decode(seqs).then(|| {
            let kv_end = s.input.seqs.iter().map(|sp| sp.p0 + 1).max().unwrap_or(1);
            GraphKey {
                rows: n,
                kv_bucket: kv_end.next_power_of_two(),
                buffers: s.id,
                sampled,
            }
        });
        let mut body = || -> Result<()> {
            b.embed(&self.token_embd, &s.step, n, cfg.embed_scale, &mut s.x)?;
            if self.dump_layer0 {
                eprintln!(
                    "[kiln layer0] forward of {n} tokens at position {}",
                    s.input.seqs[0].p0
                );
                self.tap("embed", &s.x, n * d)?;
            }
            if let Some(ple) = &self.ple {
                self.per_layer_inputs(ple, n, s)?;
            }
            // The final norm rides on the last layer's last op when the
            // output rows are the step's rows in place (decode steps).
            let identity = n_out == n && plan.iter().all(|o| o.row == o.dst);
            let mut h_ready = false;
            for (i, (l, w)) in cfg.layers.iter().zip(&self.layers).enumerate() {
                let next_norm = match self.layers.get(i + 1) {
                    Some(nw) => Some(&nw.attn_norm),
                    None => identity.then_some(&self.output_norm),
                };
                h_ready = self.layer(l, w, next_norm, h_ready, seqs, s)?;
            }
            // KV-shared layers have read their sources' batch rows by now.
            for (il, (k, v)) in s.chunk_k.iter().zip(&s.chunk_v).enumerate() {
                if let (Some(k), Some(v)) = (k, v) {
                    store_batch(b, il, seqs, k, v, &s.input, &s.step)?;
                }
            }
            // Final norm only on the rows the outputs need. Rows in place
            // (every decode step) are one copy of them all: a graph of a
            // padded step then serves whichever of its rows are real.
            if !h_ready && identity {
                b.copy_strided(&s.x, 0, 0, &mut s.h, 0, 0, 1, n * d, 1.0, false)?;
            }
            for o in plan.iter().filter(|_| !h_ready && !identity) {
                b.copy_strided(
                    &s.x,
                    o.row * d,
                    0,
                    &mut s.h,
                    o.dst * d,
                    0,
                    1,
                    o.rows * d,
                    1.0,
                    false,
                )?;
            }
            if !h_ready {
                b.rms_norm(&mut s.h, n_out, d, Some(&self.output_norm), cfg.rms_eps)?;
            }
            let head_rows = n_logits..n_logits + n_argmax;
            if let (true, Some(logits)) = (sampled, s.sample_logits.as_mut()) {
                let real = seqs.iter_mut().filter(|q| q.output.headed());
                let mut states = real
                    .map(|q| q.sampler.as_deref_mut())
                    .chain(std::iter::repeat_with(|| None).take(pad));
                b.sample_head(
                    head,
                    &s.h,
                    head_rows,
                    cfg.final_softcap,
                    &mut states,
                    logits,
                    &mut s.step,
                )?;
            } else if n_argmax > 0 {
                b.argmax_head(head, &s.h, head_rows, &mut s.step)?;
            }
            Ok(())
        };
        let r = b.run_step(key, &mut body).map_err(|e| match e {
            ModelError::NonFiniteLogit { token, value, .. } => ModelError::NonFiniteLogit {
                pos: s.input.seqs[0].p0 + n - 1,
                token,
                value,
            },
            e => e,
        });
        let r = r.and_then(|()| self.outputs(seqs, s, &plan, n_logits));
        s.plan = plan;
        r
    }

    /// Each sequence's output of a step whose rows `plan` placed in `s.h`.
    fn outputs(
        &self,
        seqs: &mut [BatchSeq<'_, B>],
        s: &mut Scratch<B>,
        plan: &[OutRows],
        n_logits: usize,
    ) -> Result<()> {
        let b = &self.backend;
        let cfg = &self.config;
        let (d, v) = (cfg.n_embd, cfg.n_vocab);
        let head = self.output.as_ref().unwrap_or(&self.token_embd);
        // One sequence's logits go straight to its output vector; a batch's
        // through one host buffer, split per sequence below.
        let direct = seqs.len() == 1 && plan[0].group == 0;
        if n_logits > 0 {
            let host = if direct {
                &mut *seqs[0].out
            } else {
                &mut s.logits_host
            };
            host.resize(n_logits * v, 0.0);
            b.lm_head_to_host(head, &s.h, n_logits, cfg.final_softcap, &mut s.logits, host)?;
        }
        let n_ids = plan
            .iter()
            .filter(|o| o.group == 1)
            .map(|o| o.dst + 1)
            .max();
        if let Some(n_ids) = n_ids {
            s.ids_host.resize(n_ids, 0);
            b.read_ids(&s.step, &mut s.ids_host)?;
        }
        s.results.clear();
        for (q, o) in seqs.iter_mut().zip(plan) {
            let p_first = s.input.positions[o.row] as usize;
            s.results.push(match o.group {
                1 => {
                    let id = s.ids_host[o.dst];
                    if id as usize >= v {
                        Err(ModelError::NonFiniteLogit {
                            pos: p_first,
                            token: id,
                            value: f32::NAN,
                        })
                    } else {
                        sampled_out(b, q).map(|()| Some(id))
                    }
                }
                2 => {
                    q.out.resize(o.rows * d, 0.0);
                    b.download(&s.h, o.dst * d, q.out).map(|()| None)
                }
                _ if direct => take_logits(q.output, q.out, p_first, v),
                _ => {
                    let mine = &s.logits_host[o.dst * v..(o.dst + o.rows) * v];
                    let r = take_logits(q.output, mine, p_first, v);
                    if r.is_ok() && q.output != Output::Argmax {
                        q.out.clear();
                        q.out.extend_from_slice(mine);
                    }
                    r
                }
            });
        }
        Ok(())
    }

    /// Prints [`TapStats`] of the first `len` values of `buf` (debug only).
    fn tap(&self, name: &str, buf: &B::Buf, len: usize) -> Result<()> {
        let mut host = vec![0.0; len];
        self.backend.download(buf, 0, &mut host)?;
        tap_host(name, &host);
        Ok(())
    }
}

/// Stores the step's K/V rows `k`/`v` of `layer` in every sequence's
/// cache, in one [`Backend::store_kv_batch`].
fn store_batch<B: Backend>(
    b: &B,
    layer: usize,
    seqs: &mut [BatchSeq<'_, B>],
    k: &B::Buf,
    v: &B::Buf,
    input: &StepInput,
    step: &B::Step,
) -> Result<()> {
    let mut stores = seqs
        .iter_mut()
        .zip(&input.seqs)
        .enumerate()
        .map(|(i, (q, sp))| {
            Ok(KvStore {
                dst: q.cache.store_dst(layer, sp.n_rows)?,
                src_row0: sp.row0,
                n: sp.n_rows,
                p0: sp.p0,
                seq: i,
            })
        });
    b.store_kv_batch(layer, k, v, &mut stores, step)
}

#[cfg(test)]
mod tests {
    use super::TapStats;

    #[test]
    fn tap_stats_skip_nan_and_count_it() {
        let t = TapStats::of(&[3.0, f32::NAN, -4.0, f32::NAN]);
        assert_eq!((t.min, t.max, t.nan), (-4.0, 3.0, 2));
        assert!((t.rms - 12.5f32.sqrt()).abs() < 1e-6);
        let e = TapStats::of(&[]);
        assert_eq!((e.rms, e.nan), (0.0, 0));
    }
}
