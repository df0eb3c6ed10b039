//! The caller-owned activations and step buffers of the forward pass
//! ([`Scratch`]), allocated once and reused by every call.

use crate::backend::{AttnParams, Backend, StepInput};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv::buffer_id;
use crate::model::OutRows;

/// Rows a dense feed-forward runs at a time. Its `[rows, ffn]` gate and up
/// projections would be the largest prefill buffers (4 MiB each for 512
/// tokens of the 270M); 256 rows, a multiple of the GEMM's token block,
/// still reuse each weight row across many tokens.
pub(crate) const FFN_ROWS: usize = 256;

/// Caller-owned activations for batches of up to `max_tokens` tokens:
/// allocated once, reused by every forward call (no per-token allocation).
pub struct Scratch<B: Backend> {
    pub(crate) max_tokens: usize,
    /// Rows the feed-forward runs at a time ([`FFN_ROWS`]; the whole batch
    /// when a layer is MoE).
    pub(crate) ffn_rows: usize,
    /// The residual stream, `[n, d]`.
    pub(crate) x: B::Buf,
    /// `[n, d]`: a layer's normed input, then its attention output
    /// projection; a feed-forward block's normed input; the final norm.
    pub(crate) h: B::Buf,
    /// The queries, then a feed-forward block's up projection (the two
    /// never live at once).
    pub(crate) q_up: B::Buf,
    /// The attention output, then a feed-forward block's gate projection.
    pub(crate) attn_gate: B::Buf,
    /// A feed-forward block's output, `[ffn_rows, d]`.
    pub(crate) o: B::Buf,
    /// This batch's K/V of each layer whose cache later layers read (Gemma 4
    /// KV sharing), stored after the last layer: a sharing layer reads the
    /// source's batch rows here and its older rows from the cache, which
    /// storing earlier would overwrite in a sliding ring.
    pub(crate) chunk_k: Vec<Option<B::Buf>>,
    pub(crate) chunk_v: Vec<Option<B::Buf>>,
    /// This batch's K/V of every other KV-owning layer, one pair for all:
    /// each stores it in the cache right after its attention.
    pub(crate) layer_k: B::Buf,
    pub(crate) layer_v: B::Buf,
    pub(crate) ple: B::Buf,
    pub(crate) ple_tok: B::Buf,
    pub(crate) ple_gate: B::Buf,
    pub(crate) ple_slice: B::Buf,
    pub(crate) router: B::Buf,
    pub(crate) router_host: Vec<f32>,
    pub(crate) router_probs: Vec<f32>,
    pub(crate) router_order: Vec<usize>,
    pub(crate) expert_tokens: Vec<Vec<(usize, f32)>>,
    pub(crate) moe_x: B::Buf,
    pub(crate) moe_gate: B::Buf,
    pub(crate) moe_up: B::Buf,
    pub(crate) moe_out: B::Buf,
    pub(crate) logits: Option<B::Buf>,
    /// Logits of the sampling head's rows, kept on the backend (grown by
    /// powers of two; a growth changes `id`).
    pub(crate) sample_logits: Option<B::Buf>,
    /// Logits of a step's output rows on the host, split per sequence.
    pub(crate) logits_host: Vec<f32>,
    /// The argmax head's ids of a step, read back at once.
    pub(crate) ids_host: Vec<u32>,
    /// The step's output rows per sequence, and each sequence's result.
    pub(crate) plan: Vec<OutRows>,
    /// A layer's attention shapes per sequence.
    pub(crate) params: Vec<AttnParams>,
    pub(crate) results: Vec<Result<Option<u32>>>,
    /// The step's inputs, host side and the backend's copy.
    pub(crate) input: StepInput,
    pub(crate) step: B::Step,
    /// Identity of these buffers (see [`GraphKey::buffers`]).
    pub(crate) id: u64,
}

impl<B: Backend> Scratch<B> {
    /// Scratch for a model whose backend fuses no projections (see
    /// [`Model::new_scratch`]).
    pub fn new(b: &B, cfg: &ModelConfig, max_tokens: usize) -> Result<Self> {
        Self::sized(b, cfg, max_tokens, false)
    }

    /// `fused`: the wide buffers also take the fused projections' outputs
    /// (`[n, q + k + v]`, `[ffn_rows, 2 * ffn]`).
    pub(crate) fn sized(b: &B, cfg: &ModelConfig, max_tokens: usize, fused: bool) -> Result<Self> {
        if max_tokens == 0 {
            return Err(ModelError::Invalid("scratch for 0 tokens".into()));
        }
        let n = max_tokens;
        let d = cfg.n_embd;
        let max_q = cfg.layers.iter().map(|l| l.q_dim()).max().unwrap_or(0);
        let max_ff = cfg.layers.iter().map(|l| l.ffn).max().unwrap_or(0);
        let moe = cfg.layers.iter().filter_map(|l| l.moe.as_ref()).next();
        let (ne, eff) = moe.map_or((0, 0), |m| (m.n_expert, m.expert_ffn));
        let ffn_rows = if moe.is_some() { n } else { n.min(FFN_ROWS) };
        let mut wide = (n * max_q).max(ffn_rows * max_ff);
        if fused {
            let max_qkv = cfg.layers.iter().map(|l| l.q_dim() + 2 * l.kv_dim());
            wide = wide
                .max(n * max_qkv.max().unwrap_or(0))
                .max(ffn_rows * 2 * max_ff);
        }
        let mut chunk_k = Vec::with_capacity(cfg.n_layer);
        let mut chunk_v = Vec::with_capacity(cfg.n_layer);
        let mut layer_kv = 0;
        for l in &cfg.layers {
            let read_later = cfg
                .layers
                .iter()
                .any(|m| m.index != l.index && m.kv_source == l.index);
            if l.owns_kv() && read_later {
                chunk_k.push(Some(b.alloc(n * l.kv_dim())?));
                chunk_v.push(Some(b.alloc(n * l.kv_dim())?));
            } else {
                if l.owns_kv() {
                    layer_kv = layer_kv.max(l.kv_dim());
                }
                chunk_k.push(None);
                chunk_v.push(None);
            }
        }
        let pw = cfg.n_layer * cfg.ple_dim;
        Ok(Scratch {
            max_tokens,
            ffn_rows,
            x: b.alloc(n * d)?,
            h: b.alloc(n * d)?,
            q_up: b.alloc(wide)?,
            attn_gate: b.alloc(wide)?,
            o: b.alloc(ffn_rows * d)?,
            chunk_k,
            chunk_v,
            layer_k: b.alloc(n * layer_kv)?,
            layer_v: b.alloc(n * layer_kv)?,
            ple: b.alloc(n * pw)?,
            ple_tok: b.alloc(n * pw)?,
            ple_gate: b.alloc(n * cfg.ple_dim)?,
            ple_slice: b.alloc(n * cfg.ple_dim)?,
            router: b.alloc(n * ne)?,
            router_host: Vec::with_capacity(n * ne),
            router_probs: Vec::with_capacity(ne),
            router_order: Vec::with_capacity(ne),
            expert_tokens: vec![Vec::with_capacity(n); ne],
            moe_x: b.alloc(if ne > 0 { n * d } else { 0 })?,
            moe_gate: b.alloc(n * eff)?,
            moe_up: b.alloc(n * eff)?,
            moe_out: b.alloc(if ne > 0 { n * d } else { 0 })?,
            logits: None,
            sample_logits: None,
            logits_host: Vec::new(),
            ids_host: Vec::new(),
            plan: Vec::new(),
            params: Vec::new(),
            results: Vec::new(),
            input: StepInput::default(),
            step: b.new_step(n)?,
            id: buffer_id(),
        })
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
}
