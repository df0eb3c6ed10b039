//! Binding a GGUF file's tensors to a [`Model`]: names, shapes, and the
//! backend's fused q/k/v rows.

use std::sync::Arc;

use kiln_gguf::{GgmlType, Gguf};

use super::*;

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
}
