//! Weight binding by GGUF tensor name and the forward pass, written once
//! against [`Backend`].

use std::sync::Arc;

use kiln_gguf::{GgmlType, Gguf};

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

/// Reads a small 1-D tensor (norm, scale) as f32 on the host.
fn read_vector(g: &Gguf, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = g.tensor(name).ok_or_else(|| ModelError::MissingTensor {
        name: name.to_string(),
    })?;
    if t.info.n_elements as usize != len {
        return Err(ModelError::BadTensor {
            name: name.to_string(),
            reason: format!("shape {:?}, expected {len} elements", t.info.dims),
        });
    }
    let v: Vec<f32> = match t.ty() {
        GgmlType::F32 => t
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        GgmlType::F16 => t
            .data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        GgmlType::BF16 => t
            .data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!("type {other} not supported for a vector (F32/F16/BF16)"),
            })
        }
    };
    if v.iter().any(|x| !x.is_finite()) {
        return Err(ModelError::BadTensor {
            name: name.to_string(),
            reason: "contains NaN or infinity".into(),
        });
    }
    Ok(v)
}

/// q, k and v as the backend runs them: q's matrix followed by k's rows
/// (and v's, when `with_v`) where [`Backend::concat_rows`] fuses them, and
/// how many of k, v it took.
#[allow(clippy::type_complexity)]
fn fuse_qkv<B: Backend>(
    b: &B,
    q: B::Weight,
    k: Option<B::Weight>,
    v: Option<B::Weight>,
    with_v: bool,
) -> Result<(B::Weight, Option<B::Weight>, Option<B::Weight>, usize)> {
    let Some(kw) = k else {
        return Ok((q, None, v, 0));
    };
    if let (Some(vw), true) = (&v, with_v) {
        if let Some(qkv) = b.concat_rows(&[&q, &kw, vw])? {
            return Ok((qkv, None, None, 2));
        }
    }
    Ok(match b.concat_rows(&[&q, &kw])? {
        Some(qk) => (qk, None, v, 1),
        None => (q, Some(kw), v, 0),
    })
}

struct Binder<'a, B: Backend> {
    b: &'a B,
    g: &'a Arc<Gguf>,
}

impl<B: Backend> Binder<'_, B> {
    fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<B::Weight> {
        if self.g.tensor_info(name).is_none() {
            return Err(ModelError::MissingTensor {
                name: name.to_string(),
            });
        }
        let w = self.b.load_weight(self.g, name)?;
        let shape = self.b.weight_shape(&w);
        if shape != (cols, rows) {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!(
                    "shape {:?}, expected row length {cols} and {rows} rows",
                    self.g
                        .tensor_info(name)
                        .map(|i| i.dims.clone())
                        .unwrap_or_default()
                ),
            });
        }
        Ok(w)
    }
    fn vector(&self, name: &str, len: usize) -> Result<B::Buf> {
        self.b.upload(&read_vector(self.g, name, len)?)
    }
}

impl<B: Backend> Model<B> {
    /// Binds every tensor the config needs, checking shapes.
    pub fn load(backend: B, gguf: Arc<Gguf>) -> Result<Self> {
        let config = ModelConfig::from_gguf(&gguf)?;
        let d = config.n_embd;
        let bind = Binder {
            b: &backend,
            g: &gguf,
        };
        let token_embd = bind.matrix("token_embd.weight", d, config.n_vocab)?;
        let output = if config.tied_output {
            None
        } else {
            Some(bind.matrix("output.weight", d, config.n_vocab)?)
        };
        let output_norm = bind.vector("output_norm.weight", d)?;
        let ple = if config.ple_dim > 0 {
            let w = config.n_layer * config.ple_dim;
            Some(GlobalPle {
                token_embd: bind.matrix("per_layer_token_embd.weight", w, config.n_vocab)?,
                model_proj: bind.matrix("per_layer_model_proj.weight", d, w)?,
                proj_norm: bind.vector("per_layer_proj_norm.weight", config.ple_dim)?,
            })
        } else {
            None
        };
        let mut layers = Vec::with_capacity(config.n_layer);
        for l in &config.layers {
            let n = |s: &str| format!("blk.{}.{s}.weight", l.index);
            let hd = l.head_dim;
            let owns = l.owns_kv();
            let output_scale = if l.output_scale {
                read_vector(&gguf, &n("layer_output_scale"), 1)?[0]
            } else {
                1.0
            };
            let ple_layer = if config.ple_dim > 0 {
                Some(PleLayer {
                    inp_gate: bind.matrix(&n("inp_gate"), d, config.ple_dim)?,
                    proj: bind.matrix(&n("proj"), config.ple_dim, d)?,
                    post_norm: bind.vector(&n("post_norm"), d)?,
                })
            } else {
                None
            };
            let moe = match &l.moe {
                None => None,
                Some(m) => {
                    let i = l.index;
                    let e = m.n_expert;
                    let ff = m.expert_ffn;
                    let mut scale = read_vector(&gguf, &format!("blk.{i}.ffn_gate_inp.scale"), d)?;
                    let inv = 1.0 / (d as f32).sqrt();
                    scale.iter_mut().for_each(|x| *x *= inv);
                    let fused = gguf.tensor_info(&n("ffn_gate_up_exps")).is_some();
                    Some(MoeLayer {
                        router: bind.matrix(&n("ffn_gate_inp"), d, e)?,
                        router_norm: backend.upload(&scale)?,
                        gate_up: if fused {
                            Some(bind.matrix(&n("ffn_gate_up_exps"), d, 2 * ff * e)?)
                        } else {
                            None
                        },
                        gate: if fused {
                            None
                        } else {
                            Some(bind.matrix(&n("ffn_gate_exps"), d, ff * e)?)
                        },
                        up: if fused {
                            None
                        } else {
                            Some(bind.matrix(&n("ffn_up_exps"), d, ff * e)?)
                        },
                        down: bind.matrix(&n("ffn_down_exps"), ff, d * e)?,
                        expert_scale: match gguf
                            .tensor_info(&format!("blk.{i}.ffn_down_exps.scale"))
                        {
                            Some(_) => {
                                read_vector(&gguf, &format!("blk.{i}.ffn_down_exps.scale"), e)?
                            }
                            None => vec![1.0; e],
                        },
                        pre_norm_2: bind.vector(&n("pre_ffw_norm_2"), d)?,
                        post_norm_1: bind.vector(&n("post_ffw_norm_1"), d)?,
                        post_norm_2: bind.vector(&n("post_ffw_norm_2"), d)?,
                    })
                }
            };
            let q = bind.matrix(&n("attn_q"), d, l.q_dim())?;
            let k = if owns {
                Some(bind.matrix(&n("attn_k"), d, l.kv_dim())?)
            } else {
                None
            };
            let v = if owns && l.has_v {
                Some(bind.matrix(&n("attn_v"), d, l.kv_dim())?)
            } else {
                None
            };
            // V stays apart where it is normed before use (Gemma 4).
            let (q, k, v, fused_kv) = fuse_qkv(&backend, q, k, v, !l.v_norm)?;
            let (gate, up) = (
                bind.matrix(&n("ffn_gate"), d, l.ffn)?,
                bind.matrix(&n("ffn_up"), d, l.ffn)?,
            );
            let (gate, up) = match backend.concat_rows(&[&gate, &up])? {
                Some(gate_up) => (gate_up, None),
                None => (gate, Some(up)),
            };
            layers.push(LayerWeights {
                attn_norm: bind.vector(&n("attn_norm"), d)?,
                q,
                fused_kv,
                k,
                v,
                o: bind.matrix(&n("attn_output"), l.q_dim(), d)?,
                q_norm: if l.qk_norm {
                    Some(bind.vector(&n("attn_q_norm"), hd)?)
                } else {
                    None
                },
                k_norm: if l.qk_norm && owns {
                    Some(bind.vector(&n("attn_k_norm"), hd)?)
                } else {
                    None
                },
                post_attn_norm: bind.vector(&n("post_attention_norm"), d)?,
                ffn_norm: bind.vector(&n("ffn_norm"), d)?,
                gate,
                up,
                down: bind.matrix(&n("ffn_down"), l.ffn, d)?,
                post_ffw_norm: bind.vector(&n("post_ffw_norm"), d)?,
                output_scale,
                ple: ple_layer,
                moe,
            });
        }
        Ok(Model {
            config,
            backend,
            token_embd,
            output,
            output_norm,
            ple,
            layers,
            gguf,
            dump_layer0: env_flag("KILN_DUMP_LAYER0"),
        })
    }

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

    /// Gemma 4 PLE: `ple = (rms(proj·x0 / sqrt(d)) + E_ple[tok]·sqrt(P)) / sqrt(2)`.
    fn per_layer_inputs(&self, ple: &GlobalPle<B>, n: usize, s: &mut Scratch<B>) -> Result<()> {
        let b = &self.backend;
        let cfg = &self.config;
        let p = cfg.ple_dim;
        let w = cfg.n_layer * p;
        b.embed(
            &ple.token_embd,
            &s.step,
            n,
            (p as f32).sqrt(),
            &mut s.ple_tok,
        )?;
        b.matmul(&ple.model_proj, 0, w, &s.x, n, &mut s.ple)?;
        b.scale(&mut s.ple, 1.0 / (cfg.n_embd as f32).sqrt(), n * w)?;
        b.rms_norm(
            &mut s.ple,
            n * cfg.n_layer,
            p,
            Some(&ple.proj_norm),
            cfg.rms_eps,
        )?;
        b.add(&mut s.ple, &s.ple_tok, n * w)?;
        b.scale(&mut s.ple, std::f32::consts::FRAC_1_SQRT_2, n * w)?;
        Ok(())
    }

    /// One layer over the step's rows. On entry `s.h` holds its normed
    /// input when `h_ready` (else it norms `s.x` itself); returns whether on
    /// exit `s.h` holds `next_norm` of the residual stream (the next layer's
    /// input, or the final norm), folded into its last op where it can.
    fn layer(
        &self,
        l: &LayerConfig,
        w: &LayerWeights<B>,
        next_norm: Option<&B::Buf>,
        h_ready: bool,
        seqs: &mut [BatchSeq<'_, B>],
        s: &mut Scratch<B>,
    ) -> Result<bool> {
        let n = s.input.rows();
        let b = &self.backend;
        let cfg = &self.config;
        let d = cfg.n_embd;
        let eps = cfg.rms_eps;
        let (hd, il) = (l.head_dim, l.index);

        // --- attention ---
        if !h_ready {
            b.copy_strided(&s.x, 0, 0, &mut s.h, 0, 0, 1, n * d, 1.0, false)?;
            b.rms_norm(&mut s.h, n, d, Some(&w.attn_norm), eps)?;
        }
        let dump = self.dump_layer0 && il == 0;
        if dump {
            self.tap("attn_norm", &s.h, n * d)?;
        }
        // Layers whose K/V later layers read keep their own batch buffers;
        // the others share one pair and store it right after attention.
        let deferred = s.chunk_k[il].is_some();
        if w.fused_kv > 0 {
            self.fused_qkv(l, w, s)?;
        } else {
            b.matmul(&w.q, 0, l.q_dim(), &s.h, n, &mut s.q_up)?;
            if let Some(qn) = &w.q_norm {
                b.rms_norm(&mut s.q_up, n * l.n_head, hd, Some(qn), eps)?;
            }
            b.rope(&mut s.q_up, n, l.n_head, hd, &s.step, &l.rope)?;
        }
        if dump {
            self.tap("q_norm_rope", &s.q_up, n * l.q_dim())?;
        }
        if l.owns_kv() && w.fused_kv == 0 {
            let (ck, cv) = match (s.chunk_k[il].as_mut(), s.chunk_v[il].as_mut()) {
                (Some(k), Some(v)) => (k, v),
                _ => (&mut s.layer_k, &mut s.layer_v),
            };
            let wk = w.k.as_ref().ok_or_else(|| ModelError::MissingTensor {
                name: format!("blk.{il}.attn_k.weight"),
            })?;
            b.matmul(wk, 0, l.kv_dim(), &s.h, n, ck)?;
            match &w.v {
                Some(wv) => b.matmul(wv, 0, l.kv_dim(), &s.h, n, cv)?,
                // K=V: V is the raw K projection, before k_norm and RoPE.
                None => b.copy_strided(ck, 0, 0, cv, 0, 0, 1, n * l.kv_dim(), 1.0, false)?,
            }
            if l.v_norm {
                b.rms_norm(cv, n * l.n_kv_head, hd, None, eps)?;
            }
            if let Some(kn) = &w.k_norm {
                b.rms_norm(ck, n * l.n_kv_head, hd, Some(kn), eps)?;
            }
            b.rope(ck, n, l.n_kv_head, hd, &s.step, &l.rope)?;
        }
        if dump && l.owns_kv() {
            let ck = s.chunk_k[il].as_ref().unwrap_or(&s.layer_k);
            self.tap("k_norm_rope", ck, n * l.kv_dim())?;
        }
        let src = l.kv_source;
        let (ck, cv) = match (s.chunk_k[src].as_ref(), s.chunk_v[src].as_ref()) {
            (Some(k), Some(v)) => (k, v),
            _ if src == il => (&s.layer_k, &s.layer_v),
            _ => return Err(ModelError::Backend(format!("layer {src}: no K/V scratch"))),
        };
        // Attention of every sequence (padding ones too), each over its
        // own cache, in one call.
        s.params.clear();
        for (i, sp) in s.input.seqs.iter().enumerate() {
            s.params.push(AttnParams {
                n_tok: sp.n_rows,
                p0: sp.p0,
                row0: sp.row0,
                seq: i,
                n_head: l.n_head,
                n_kv_head: l.n_kv_head,
                head_dim: hd,
                scale: l.attn_scale,
                softcap: cfg.attn_softcap,
                window: l.window,
            });
        }
        let mut pasts =
            (0..s.input.seqs.len()).map(|i| seqs.get(i).and_then(|q| q.cache.past(src)));
        b.attention_batch(
            src,
            &s.q_up,
            ck,
            cv,
            &mut pasts,
            &s.params,
            &s.step,
            &mut s.attn_gate,
        )?;
        if l.owns_kv() && !deferred {
            store_batch(b, il, seqs, &s.layer_k, &s.layer_v, &s.input, &s.step)?;
        }
        if dump {
            self.tap("attn_out", &s.attn_gate, n * l.q_dim())?;
        }
        // The projections' input is dead: the output projection reuses it.
        b.matmul(&w.o, 0, d, &s.attn_gate, n, &mut s.h)?;
        // In one feed-forward chunk (every decode step) the add also norms
        // the feed-forward's input.
        let one_chunk = n <= s.ffn_rows && !dump;
        let ffn_norm = one_chunk.then_some(&w.ffn_norm);
        b.add_rms_norm(
            &mut s.h,
            &w.post_attn_norm,
            &mut s.x,
            0,
            n,
            d,
            ffn_norm,
            eps,
        )?;
        if dump {
            self.tap("attn_post_norm", &s.h, n * d)?;
        }

        // --- feed-forward, `s.ffn_rows` rows at a time (every step is per
        // row; MoE layers take the whole batch) ---
        // The next layer's input norm folds into the last add when nothing
        // else touches the residual stream in between.
        let fold_next = one_chunk && w.ple.is_none() && w.output_scale == 1.0;
        let mut h_next = false;
        let mut ffn_out = Vec::new();
        for r0 in (0..n).step_by(s.ffn_rows) {
            let m = s.ffn_rows.min(n - r0);
            if !one_chunk {
                b.copy_strided(&s.x, r0 * d, 0, &mut s.h, 0, 0, 1, m * d, 1.0, false)?;
                b.rms_norm(&mut s.h, m, d, Some(&w.ffn_norm), eps)?;
            }
            match &w.up {
                Some(up) => {
                    b.matmul(&w.gate, 0, l.ffn, &s.h, m, &mut s.attn_gate)?;
                    b.matmul(up, 0, l.ffn, &s.h, m, &mut s.q_up)?;
                    b.gelu_mul(&mut s.attn_gate, &s.q_up, m * l.ffn)?;
                }
                None => {
                    b.matmul(&w.gate, 0, 2 * l.ffn, &s.h, m, &mut s.q_up)?;
                    b.gelu_mul_halves(&s.q_up, m, l.ffn, &mut s.attn_gate)?;
                }
            }
            let Some(mw) = &w.moe else {
                // The block's input is dead: its output takes `s.h`.
                b.matmul(&w.down, 0, d, &s.attn_gate, m, &mut s.h)?;
                let pre = if fold_next { next_norm } else { None };
                b.add_rms_norm(&mut s.h, &w.post_ffw_norm, &mut s.x, r0, m, d, pre, eps)?;
                h_next = pre.is_some();
                if dump {
                    let at = ffn_out.len();
                    ffn_out.resize(at + m * d, 0.0);
                    b.download(&s.h, 0, &mut ffn_out[at..])?;
                }
                continue;
            };
            if m != n {
                return Err(ModelError::Backend(format!(
                    "layer {il}: MoE feed-forward on {m} of {n} rows"
                )));
            }
            b.matmul(&w.down, 0, d, &s.attn_gate, m, &mut s.o)?;
            b.rms_norm(&mut s.o, n, d, Some(&mw.post_norm_1), eps)?;
            self.moe(l, mw, n, s)?;
            b.rms_norm(&mut s.moe_out, n, d, Some(&mw.post_norm_2), eps)?;
            b.add(&mut s.o, &s.moe_out, n * d)?;
            b.rms_norm(&mut s.o, n, d, Some(&w.post_ffw_norm), eps)?;
            if dump {
                let at = ffn_out.len();
                ffn_out.resize(at + m * d, 0.0);
                b.download(&s.o, 0, &mut ffn_out[at..])?;
            }
            b.copy_strided(&s.o, 0, 0, &mut s.x, r0 * d, 0, 1, m * d, 1.0, true)?;
        }
        if dump {
            tap_host("ffn_out", &ffn_out);
        }

        // --- Gemma 4 per-layer input ---
        if let Some(pl) = &w.ple {
            let p = cfg.ple_dim;
            b.matmul(&pl.inp_gate, 0, p, &s.x, n, &mut s.ple_gate)?;
            b.copy_strided(
                &s.ple,
                il * p,
                cfg.n_layer * p,
                &mut s.ple_slice,
                0,
                p,
                n,
                p,
                1.0,
                false,
            )?;
            b.gelu_mul(&mut s.ple_gate, &s.ple_slice, n * p)?;
            b.matmul(&pl.proj, 0, d, &s.ple_gate, n, &mut s.h)?;
            b.rms_norm(&mut s.h, n, d, Some(&pl.post_norm), eps)?;
            b.add(&mut s.x, &s.h, n * d)?;
        }
        if w.output_scale != 1.0 {
            b.scale(&mut s.x, w.output_scale, n * d)?;
        }
        if dump {
            self.tap("layer_out", &s.x, n * d)?;
        }
        Ok(h_next)
    }

    /// q, k (and v) of a layer whose projections the backend fused: one
    /// matmul into `s.attn_gate` (free until attention writes it), split
    /// into `s.q_up` and the layer's K/V scratch with the per-head norms
    /// and RoPE on the way.
    fn fused_qkv(&self, l: &LayerConfig, w: &LayerWeights<B>, s: &mut Scratch<B>) -> Result<()> {
        let b = &self.backend;
        let n = s.input.rows();
        let (hd, il, kvd) = (l.head_dim, l.index, l.kv_dim());
        let width = l.q_dim() + w.fused_kv * kvd;
        b.matmul(&w.q, 0, width, &s.h, n, &mut s.attn_gate)?;
        let (ck, cv) = match (s.chunk_k[il].as_mut(), s.chunk_v[il].as_mut()) {
            (Some(k), Some(v)) => (k, v),
            _ => (&mut s.layer_k, &mut s.layer_v),
        };
        if w.fused_kv == 1 {
            match &w.v {
                Some(wv) => b.matmul(wv, 0, kvd, &s.h, n, cv)?,
                // K=V: V is the raw K projection, before k_norm and RoPE.
                None => b.copy_strided(
                    &s.attn_gate,
                    l.q_dim(),
                    width,
                    cv,
                    0,
                    kvd,
                    n,
                    kvd,
                    1.0,
                    false,
                )?,
            }
            if l.v_norm {
                b.rms_norm(cv, n * l.n_kv_head, hd, None, self.config.rms_eps)?;
            }
        }
        let mut parts = [
            HeadsPart {
                dst: &mut s.q_up,
                heads: l.n_head,
                norm: w.q_norm.as_ref(),
                rope: true,
            },
            HeadsPart {
                dst: ck,
                heads: l.n_kv_head,
                norm: w.k_norm.as_ref(),
                rope: true,
            },
            HeadsPart {
                dst: cv,
                heads: l.n_kv_head,
                norm: None,
                rope: false,
            },
        ];
        let eps = self.config.rms_eps;
        let parts = &mut parts[..1 + w.fused_kv];
        b.split_heads(&s.attn_gate, n, hd, parts, &l.rope, eps, &s.step)
    }

    /// Routed experts into `s.moe_out` (before `post_ffw_norm_2`). The router
    /// reads the raw residual `s.x`; experts read `pre_ffw_norm_2(x)`.
    fn moe(&self, l: &LayerConfig, m: &MoeLayer<B>, n: usize, s: &mut Scratch<B>) -> Result<()> {
        let b = &self.backend;
        let cfg = &self.config;
        let d = cfg.n_embd;
        let mc = l.moe.as_ref().expect("moe weights imply moe config");
        let (ne, k, ff) = (mc.n_expert, mc.n_expert_used, mc.expert_ffn);

        b.copy_strided(&s.x, 0, 0, &mut s.h, 0, 0, 1, n * d, 1.0, false)?;
        b.rms_norm(&mut s.h, n, d, Some(&m.router_norm), cfg.rms_eps)?;
        b.matmul(&m.router, 0, ne, &s.h, n, &mut s.router)?;
        s.router_host.resize(n * ne, 0.0);
        b.download(&s.router, 0, &mut s.router_host)?;

        // Per expert: (token, weight) pairs.
        for list in s.expert_tokens.iter_mut() {
            list.clear();
        }
        s.expert_tokens.resize_with(ne, Vec::new);
        for t in 0..n {
            let row = &s.router_host[t * ne..(t + 1) * ne];
            let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let probs = &mut s.router_probs;
            probs.clear();
            probs.extend(row.iter().map(|&z| (z - mx).exp()));
            let idx = &mut s.router_order;
            idx.clear();
            idx.extend(0..ne);
            // Stable sort: ties keep the lower expert id.
            idx.sort_by(|&a, &c| probs[c].total_cmp(&probs[a]));
            let top = &idx[..k.min(ne)];
            let sum: f32 = top.iter().map(|&e| probs[e]).sum();
            for &e in top {
                s.expert_tokens[e].push((t, probs[e] / sum * m.expert_scale[e]));
            }
        }

        b.copy_strided(&s.x, 0, 0, &mut s.h, 0, 0, 1, n * d, 1.0, false)?;
        b.rms_norm(&mut s.h, n, d, Some(&m.pre_norm_2), cfg.rms_eps)?;
        b.scale(&mut s.moe_out, 0.0, n * d)?;
        for e in 0..ne {
            let list = std::mem::take(&mut s.expert_tokens[e]);
            if list.is_empty() {
                s.expert_tokens[e] = list;
                continue;
            }
            let cnt = list.len();
            for (i, &(t, _)) in list.iter().enumerate() {
                b.copy_strided(&s.h, t * d, 0, &mut s.moe_x, i * d, 0, 1, d, 1.0, false)?;
            }
            match (&m.gate_up, &m.gate, &m.up) {
                (Some(gu), _, _) => {
                    b.matmul(gu, e * 2 * ff, ff, &s.moe_x, cnt, &mut s.moe_gate)?;
                    b.matmul(gu, e * 2 * ff + ff, ff, &s.moe_x, cnt, &mut s.moe_up)?;
                }
                (None, Some(g), Some(u)) => {
                    b.matmul(g, e * ff, ff, &s.moe_x, cnt, &mut s.moe_gate)?;
                    b.matmul(u, e * ff, ff, &s.moe_x, cnt, &mut s.moe_up)?;
                }
                _ => {
                    return Err(ModelError::MissingTensor {
                        name: format!("blk.{}.ffn_gate_up_exps.weight", l.index),
                    })
                }
            }
            b.gelu_mul(&mut s.moe_gate, &s.moe_up, cnt * ff)?;
            b.matmul(&m.down, e * d, d, &s.moe_gate, cnt, &mut s.moe_x)?;
            for (i, &(t, wgt)) in list.iter().enumerate() {
                b.copy_strided(
                    &s.moe_x,
                    i * d,
                    0,
                    &mut s.moe_out,
                    t * d,
                    0,
                    1,
                    d,
                    wgt,
                    true,
                )?;
            }
            s.expert_tokens[e] = list;
        }
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
