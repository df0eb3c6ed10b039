//! Model hyper-parameters read from GGUF metadata, resolved per layer so the
//! forward pass never branches on the architecture for shapes or RoPE.

use kiln_gguf::{Gguf, Value};
use serde::Serialize;

use crate::error::{ModelError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Gemma2,
    Gemma3,
    Gemma4,
}

impl Arch {
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Gemma4 => "gemma4",
        }
    }
}

/// NEOX RoPE for one layer: pairs `(i, i + n_rot/2)` for `i < n_rot/2`,
/// angle `pos * freq_scale * base^(-2i/n_rot) / factor[i]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RopeConfig {
    pub base: f32,
    /// 1 / linear scaling factor (Gemma 3 4B+ global layers: 1/8).
    pub freq_scale: f32,
    /// Rotated dimensions (head_dim for every Gemma layer; Gemma 4 global
    /// layers get their partial rotation from `freq_factors`).
    pub n_rot: usize,
    /// Per-pair frequency divisors from `rope_freqs.weight` (Gemma 4 global
    /// "proportional" RoPE); `None` = all 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freq_factors: Option<Vec<f32>>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub expert_ffn: usize,
}

/// Everything the forward pass needs to know about one decoder layer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerConfig {
    pub index: usize,
    /// Sliding-window (local) attention; `false` = global.
    pub sliding: bool,
    /// Keys visible to a query: itself and the previous `window - 1`
    /// positions. `None` on global layers.
    pub window: Option<usize>,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Dense GeGLU width.
    pub ffn: usize,
    pub rope: RopeConfig,
    /// Multiplier on attention scores (applied as `q * scale`).
    pub attn_scale: f32,
    /// Layer whose KV cache this layer attends over (itself unless KV-shared).
    pub kv_source: usize,
    /// False for Gemma 4 K=V global layers (no `attn_v`: V is the raw K
    /// projection).
    pub has_v: bool,
    /// Per-head RMSNorm on Q and K (Gemma 3/4).
    pub qk_norm: bool,
    /// Weightless RMSNorm on V (Gemma 4).
    pub v_norm: bool,
    /// Gemma 4 `layer_output_scale`.
    pub output_scale: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeConfig>,
}

impl LayerConfig {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
    /// Whether this layer computes and stores its own K/V.
    pub fn owns_kv(&self) -> bool {
        self.kv_source == self.index
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    /// Sliding window of the local layers (None: no sliding layers).
    pub sliding_window: Option<usize>,
    /// `s = c * tanh(s / c)` on attention scores (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// `z = c * tanh(z / c)` on output logits (Gemma 2/4).
    pub final_softcap: Option<f32>,
    /// `x0 = E[token] * embed_scale` (= sqrt(n_embd)).
    pub embed_scale: f32,
    /// Per-layer-embedding width (Gemma 4 E models), 0 = none.
    pub ple_dim: usize,
    /// Output matrix is the token embedding (no `output.weight`).
    pub tied_output: bool,
    pub layers: Vec<LayerConfig>,
}

fn bad(key: &str, reason: impl Into<String>) -> ModelError {
    ModelError::BadKey {
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn opt_u32(g: &Gguf, key: &str) -> Result<Option<usize>> {
    match g.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(g.get_u32(key)? as usize)),
    }
}

fn opt_f32(g: &Gguf, key: &str) -> Result<Option<f32>> {
    match g.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(g.get_f32(key)?)),
    }
}

fn req_u32(g: &Gguf, key: &str) -> Result<usize> {
    Ok(g.get_u32(key)? as usize)
}

/// A key that is either one integer or one integer per layer.
fn per_layer_u32(g: &Gguf, key: &str, n_layer: usize) -> Result<Option<Vec<usize>>> {
    match g.get(key) {
        None => Ok(None),
        Some(Value::Array(arr)) => {
            if arr.len() != n_layer {
                return Err(bad(
                    key,
                    format!("array has {} entries, expected {n_layer}", arr.len()),
                ));
            }
            arr.iter()
                .map(|v| {
                    v.as_u64()
                        .map(|x| x as usize)
                        .ok_or_else(|| bad(key, "array entries must be non-negative integers"))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some)
        }
        Some(_) => Ok(Some(vec![g.get_u32(key)? as usize; n_layer])),
    }
}

fn positive(key: &str, v: usize) -> Result<usize> {
    if v == 0 {
        Err(bad(key, "must be > 0"))
    } else {
        Ok(v)
    }
}

impl ModelConfig {
    /// Reads the architecture and hyper-parameters from GGUF metadata (and
    /// the presence/shape of a few tensors: vocab size, K=V, MoE, RoPE
    /// factors).
    pub fn from_gguf(g: &Gguf) -> Result<ModelConfig> {
        let arch_s = g.architecture()?;
        let arch = match arch_s {
            "gemma2" => Arch::Gemma2,
            "gemma3" => Arch::Gemma3,
            "gemma4" => Arch::Gemma4,
            other => return Err(ModelError::UnsupportedArch(other.to_string())),
        };
        let a = arch.gguf_name();
        let k = |s: &str| format!("{a}.{s}");

        let n_layer = positive(&k("block_count"), req_u32(g, &k("block_count"))?)?;
        let n_embd = positive(&k("embedding_length"), req_u32(g, &k("embedding_length"))?)?;
        let context_length = opt_u32(g, &k("context_length"))?.unwrap_or(8192);
        let rms_eps = opt_f32(g, &k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6);
        let n_head = positive(
            &k("attention.head_count"),
            req_u32(g, &k("attention.head_count"))?,
        )?;
        let n_kv = per_layer_u32(g, &k("attention.head_count_kv"), n_layer)?
            .unwrap_or_else(|| vec![n_head; n_layer]);
        let ffn = per_layer_u32(g, &k("feed_forward_length"), n_layer)?
            .ok_or_else(|| bad(&k("feed_forward_length"), "missing"))?;
        let head_dim = opt_u32(g, &k("attention.key_length"))?.unwrap_or(n_embd / n_head);
        if let Some(vl) = opt_u32(g, &k("attention.value_length"))? {
            if vl != head_dim {
                return Err(bad(
                    &k("attention.value_length"),
                    format!("{vl} != key_length {head_dim} (unsupported)"),
                ));
            }
        }
        let window_key = k("attention.sliding_window");
        let window = match opt_u32(g, &window_key)? {
            Some(w) => Some(positive(&window_key, w)?),
            None => None,
        };

        let emb = g
            .tensor_info("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        if emb.dims.len() != 2 || emb.dims[0] as usize != n_embd {
            return Err(ModelError::BadTensor {
                name: "token_embd.weight".into(),
                reason: format!("shape {:?}, expected [{n_embd}, n_vocab]", emb.dims),
            });
        }
        let n_vocab = emb.dims[1] as usize;
        let tied_output = g.tensor_info("output.weight").is_none();

        // Attention scale: an explicit key wins; otherwise llama.cpp's rule
        // (27B shapes use n_embd/n_head, everything else head_dim).
        let scale_key = k("attention.scale");
        let explicit_scale = opt_f32(g, &scale_key)?;
        let gemma23_scale = |hd: usize| -> f32 {
            if let Some(s) = explicit_scale {
                return s;
            }
            let is_27b = matches!((arch, n_layer), (Arch::Gemma2, 46) | (Arch::Gemma3, 62));
            let d = if is_27b { n_embd / n_head } else { hd };
            1.0 / (d as f32).sqrt()
        };

        let mut layers = Vec::with_capacity(n_layer);
        let mut ple_dim = 0;
        let mut attn_softcap = None;
        let final_softcap = opt_f32(g, &k("final_logit_softcapping"))?;

        match arch {
            Arch::Gemma2 | Arch::Gemma3 => {
                let (pattern, default_window, base_global) = if arch == Arch::Gemma2 {
                    attn_softcap = opt_f32(g, &k("attn_logit_softcapping"))?;
                    (2, Some(4096), 10_000.0)
                } else {
                    (6, None, 1_000_000.0)
                };
                let window = window.or(default_window);
                let base_global = opt_f32(g, &k("rope.freq_base"))?.unwrap_or(base_global);
                let base_swa = opt_f32(g, &k("rope.freq_base_swa"))?.unwrap_or(10_000.0);
                // Linear scaling applies to global layers only, and only when
                // the file says so (270M/1B have no factor).
                let factor = opt_f32(g, &k("rope.scaling.factor"))?;
                if let Some(t) = g.get(&k("rope.scaling.type")) {
                    let t = t.as_str().unwrap_or("");
                    if factor.is_some() && t != "linear" && t != "none" {
                        return Err(bad(
                            &k("rope.scaling.type"),
                            format!("unsupported RoPE scaling {t:?}"),
                        ));
                    }
                }
                let global_scale = match factor {
                    Some(f) if f > 0.0 && f != 1.0 => 1.0 / f,
                    Some(f) if f <= 0.0 => {
                        return Err(bad(&k("rope.scaling.factor"), format!("{f} must be > 0")))
                    }
                    _ => 1.0,
                };
                for il in 0..n_layer {
                    let sliding = window.is_some() && il % pattern < pattern - 1;
                    layers.push(LayerConfig {
                        index: il,
                        sliding,
                        window: if sliding { window } else { None },
                        n_head,
                        n_kv_head: positive(&k("attention.head_count_kv"), n_kv[il])?,
                        head_dim,
                        ffn: ffn[il],
                        rope: RopeConfig {
                            base: if sliding { base_swa } else { base_global },
                            freq_scale: if sliding { 1.0 } else { global_scale },
                            n_rot: head_dim,
                            freq_factors: None,
                        },
                        attn_scale: gemma23_scale(head_dim),
                        kv_source: il,
                        has_v: true,
                        qk_norm: arch == Arch::Gemma3,
                        v_norm: false,
                        output_scale: false,
                        moe: None,
                    });
                }
            }
            Arch::Gemma4 => {
                let pat_key = k("attention.sliding_window_pattern");
                let pattern: Vec<bool> = if g.get(&pat_key).is_some() {
                    let p = g.get_bool_array(&pat_key)?;
                    if p.len() != n_layer {
                        return Err(bad(
                            &pat_key,
                            format!("{} entries, expected {n_layer}", p.len()),
                        ));
                    }
                    p
                } else {
                    (0..n_layer)
                        .map(|il| il % 6 != 5 && il + 1 != n_layer)
                        .collect()
                };
                if pattern.iter().any(|&s| s) && window.is_none() {
                    return Err(bad(&window_key, "missing but the model has sliding layers"));
                }
                let hd_swa = opt_u32(g, &k("attention.key_length_swa"))?.unwrap_or(head_dim);
                let rot_global = opt_u32(g, &k("rope.dimension_count"))?.unwrap_or(head_dim);
                let rot_swa = opt_u32(g, &k("rope.dimension_count_swa"))?.unwrap_or(hd_swa);
                let base_global = opt_f32(g, &k("rope.freq_base"))?.unwrap_or(1_000_000.0);
                let base_swa = opt_f32(g, &k("rope.freq_base_swa"))?.unwrap_or(10_000.0);
                let freq_factors = match g.tensor("rope_freqs.weight") {
                    None => None,
                    Some(t) => {
                        if t.ty() != kiln_gguf::GgmlType::F32
                            || t.info.n_elements as usize != rot_global / 2
                        {
                            return Err(ModelError::BadTensor {
                                name: "rope_freqs.weight".into(),
                                reason: format!(
                                    "expected F32 [{}], found {} {:?}",
                                    rot_global / 2,
                                    t.ty(),
                                    t.info.dims
                                ),
                            });
                        }
                        Some(
                            t.data
                                .chunks_exact(4)
                                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                                .collect::<Vec<f32>>(),
                        )
                    }
                };
                let shared = opt_u32(g, &k("attention.shared_kv_layers"))?.unwrap_or(0);
                if shared >= n_layer {
                    return Err(bad(
                        &k("attention.shared_kv_layers"),
                        format!("{shared} >= block_count {n_layer}"),
                    ));
                }
                let kv_from = n_layer - shared;
                ple_dim = opt_u32(g, &k("embedding_length_per_layer_input"))?.unwrap_or(0);
                let n_expert = opt_u32(g, &k("expert_count"))?.unwrap_or(0);
                let moe_cfg = if n_expert > 0 {
                    Some(MoeConfig {
                        n_expert,
                        n_expert_used: positive(
                            &k("expert_used_count"),
                            req_u32(g, &k("expert_used_count"))?,
                        )?,
                        expert_ffn: positive(
                            &k("expert_feed_forward_length"),
                            req_u32(g, &k("expert_feed_forward_length"))?,
                        )?,
                    })
                } else {
                    None
                };
                for il in 0..n_layer {
                    let sliding = pattern[il];
                    let hd = if sliding { hd_swa } else { head_dim };
                    let kv_source = if il < kv_from {
                        il
                    } else {
                        (0..kv_from)
                            .rev()
                            .find(|&j| pattern[j] == sliding)
                            .ok_or_else(|| {
                                bad(
                                    &k("attention.shared_kv_layers"),
                                    format!("layer {il} has no earlier layer of its type to share"),
                                )
                            })?
                    };
                    let has_v = g.tensor_info(&format!("blk.{il}.attn_v.weight")).is_some();
                    let moe = match &moe_cfg {
                        Some(m)
                            if g.tensor_info(&format!("blk.{il}.ffn_gate_inp.weight"))
                                .is_some() =>
                        {
                            Some(m.clone())
                        }
                        _ => None,
                    };
                    layers.push(LayerConfig {
                        index: il,
                        sliding,
                        window: if sliding { window } else { None },
                        n_head,
                        n_kv_head: positive(&k("attention.head_count_kv"), n_kv[il])?,
                        head_dim: hd,
                        ffn: ffn[il],
                        rope: RopeConfig {
                            base: if sliding { base_swa } else { base_global },
                            freq_scale: 1.0,
                            n_rot: if sliding { rot_swa } else { rot_global },
                            freq_factors: if sliding { None } else { freq_factors.clone() },
                        },
                        attn_scale: explicit_scale.unwrap_or(1.0),
                        kv_source,
                        has_v: if kv_source == il {
                            has_v
                        } else {
                            layers[kv_source].has_v
                        },
                        qk_norm: true,
                        v_norm: true,
                        output_scale: true,
                        moe,
                    });
                }
            }
        }
        for l in &layers {
            if l.rope.n_rot > l.head_dim || l.rope.n_rot % 2 != 0 {
                return Err(bad(
                    &k("rope.dimension_count"),
                    format!(
                        "layer {}: {} rotated dims for head_dim {}",
                        l.index, l.rope.n_rot, l.head_dim
                    ),
                ));
            }
            if l.n_head % l.n_kv_head != 0 {
                return Err(bad(
                    &k("attention.head_count_kv"),
                    format!(
                        "layer {}: {} heads not a multiple of {} kv heads",
                        l.index, l.n_head, l.n_kv_head
                    ),
                ));
            }
        }
        Ok(ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_vocab,
            context_length,
            rms_eps,
            sliding_window: if layers.iter().any(|l| l.sliding) {
                window
            } else {
                None
            },
            attn_softcap,
            final_softcap,
            embed_scale: (n_embd as f32).sqrt(),
            ple_dim,
            tied_output,
            layers,
        })
    }
}
