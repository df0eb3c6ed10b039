//! Which tensors a model has, their shapes, how they are initialized and
//! which GGML type each is stored as.

use kiln_model::Arch;
use kiln_quant::GgmlType;

use crate::preset::Preset;
use crate::Quant;

/// How a tensor's values are drawn.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    /// N(mean, std²) per element.
    Normal { mean: f32, std: f32 },
    /// Gemma 4 "proportional" RoPE factors: `rotated` ones, then 1e30
    /// (which stops the rotation of the remaining pairs).
    RopeFreqs { rotated: usize },
}

/// One tensor of the file, in file order.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    pub name: String,
    /// ggml order: row length first.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub init: Init,
}

impl TensorPlan {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    pub fn row_len(&self) -> usize {
        self.dims[0] as usize
    }

    pub fn n_rows(&self) -> usize {
        (self.n_elements() / self.dims[0]) as usize
    }

    pub fn n_bytes(&self) -> u64 {
        self.ty
            .bytes_for(self.n_elements())
            .expect("planned shapes are whole blocks of their type")
    }
}

/// Norm weights: Gemma 2/3 GGUFs store `1 + w` and Gemma 4 stores `w`, and
/// trained values of either sit near 1, so both are drawn around 1.
const NORM: Init = Init::Normal {
    mean: 1.0,
    std: 0.05,
};

/// N(0, 1/fan_in): keeps activations O(1) through every projection.
fn weight(fan_in: usize) -> Init {
    Init::Normal {
        mean: 0.0,
        std: 1.0 / (fan_in as f32).sqrt(),
    }
}

/// The tensor roles llama.cpp's quantizer distinguishes (its
/// `tensor_get_category`, by name substring).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnV,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        Category::TokenEmbd
    } else if name.contains("attn_v.weight") {
        Category::AttnV
    } else if name.contains("ffn_down") {
        Category::FfnDown
    } else {
        Category::Other
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and
/// every third layer in between get the bigger type.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as isize - (n / 8) as isize).rem_euclid(3) == 2
}

/// llama.cpp's `tensor_type_fallback`: a 256-block type on rows that are
/// not whole 256-blocks becomes the nearest 32-block type.
fn fallback(ty: GgmlType, row_len: usize) -> GgmlType {
    if row_len.is_multiple_of(ty.block_elems()) {
        return ty;
    }
    let fb = match ty {
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q6K => GgmlType::Q8_0,
        other => other,
    };
    if row_len.is_multiple_of(fb.block_elems()) {
        fb
    } else {
        GgmlType::F16
    }
}

/// Assigns each tensor its type, in file order, following
/// `llama_tensor_get_type` of llama.cpp b11312 for the three file types:
///
/// - only 2-D tensors whose name ends in `weight` are quantized, never
///   `*_norm.weight` nor `per_layer_model_proj` (kept as the converter's
///   F16); everything 1-D stays F32;
/// - Q8_0 / F16 files: every quantizable tensor is Q8_0 / F16;
/// - Q4_K_M (base Q4_K): with a tied output (all Gemmas), `token_embd` and
///   `per_layer_token_embd` follow the output rule: Q8_0 when the row is not
///   whole 256-blocks, else Q6_K. The i-th `attn_v` (counted in file order
///   over all `attn_v` tensors) and the i-th `ffn_down` (over n_layer) are
///   Q6_K when `use_more_bits(i, n)`; every other matrix stays Q4_K. Then
///   the shape fallback: Q4_K→Q5_0, Q6_K→Q8_0 on rows not divisible by 256
///   (so Gemma 3 270M/1B get Q5_0 attn_q/k/ffn_gate/up and Q8_0 embeddings).
fn assign_types(tensors: &mut [TensorPlan], quant: Quant, n_layer: usize) {
    let n_attn_v = tensors
        .iter()
        .filter(|t| category(&t.name) == Category::AttnV)
        .count();
    let (mut i_attn_v, mut i_ffn_down) = (0, 0);
    for t in tensors.iter_mut() {
        let quantizable = t.dims.len() >= 2
            && t.name.ends_with("weight")
            && !t.name.contains("_norm.weight")
            && !t.name.contains("per_layer_model_proj");
        if !quantizable {
            continue;
        }
        let row = t.row_len();
        let ty = match quant {
            Quant::F16 => GgmlType::F16,
            Quant::Q8_0 => GgmlType::Q8_0,
            Quant::Q4KM => match category(&t.name) {
                Category::TokenEmbd if !row.is_multiple_of(256) => GgmlType::Q8_0,
                Category::TokenEmbd => GgmlType::Q6K,
                Category::AttnV => {
                    i_attn_v += 1;
                    if use_more_bits(i_attn_v - 1, n_attn_v) {
                        GgmlType::Q6K
                    } else {
                        GgmlType::Q4K
                    }
                }
                Category::FfnDown => {
                    i_ffn_down += 1;
                    if use_more_bits(i_ffn_down - 1, n_layer) {
                        GgmlType::Q6K
                    } else {
                        GgmlType::Q4K
                    }
                }
                Category::Other => GgmlType::Q4K,
            },
        };
        t.ty = fallback(ty, row);
    }
}

/// All tensors of `p` in the order llama.cpp-produced Gemma files use:
/// non-layer tensors by name, then each layer's tensors by name.
pub(crate) fn tensors(p: &Preset, n_vocab: usize, quant: Quant) -> Vec<TensorPlan> {
    let t = |name: String, dims: &[usize], init: Init| TensorPlan {
        name,
        dims: dims.iter().map(|&d| d as u64).collect(),
        ty: if dims.len() >= 2 {
            GgmlType::F16
        } else {
            GgmlType::F32
        },
        init,
    };
    let e = p.n_embd;
    let mut globals = vec![
        t("token_embd.weight".into(), &[e, n_vocab], weight(e)),
        t("output_norm.weight".into(), &[e], NORM),
    ];
    if p.arch == Arch::Gemma4 {
        // 0.25 of the global head is rotated: head_dim_global/8 pairs.
        let rotated = p.head_dim_global / 8;
        globals.push(t(
            "rope_freqs.weight".into(),
            &[p.head_dim_global / 2],
            Init::RopeFreqs { rotated },
        ));
    }
    if p.ple_dim > 0 {
        let ple = p.n_layer * p.ple_dim;
        globals.push(t(
            "per_layer_token_embd.weight".into(),
            &[ple, n_vocab],
            weight(p.ple_dim),
        ));
        globals.push(t(
            "per_layer_model_proj.weight".into(),
            &[e, ple],
            weight(e),
        ));
        globals.push(t("per_layer_proj_norm.weight".into(), &[p.ple_dim], NORM));
    }
    globals.sort_by(|a, b| a.name.cmp(&b.name));

    let mut out = globals;
    for il in 0..p.n_layer {
        let hd = p.layer_head_dim(il);
        let (q, kv, ff) = (p.n_head * hd, p.n_kv_head * hd, p.layer_ffn(il));
        let b = |s: &str| format!("blk.{il}.{s}.weight");
        let mut layer = vec![
            t(b("attn_norm"), &[e], NORM),
            t(b("attn_q"), &[e, q], weight(e)),
            t(b("attn_k"), &[e, kv], weight(e)),
            t(b("attn_v"), &[e, kv], weight(e)),
            t(b("attn_output"), &[q, e], weight(q)),
            t(b("post_attention_norm"), &[e], NORM),
            t(b("ffn_norm"), &[e], NORM),
            t(b("ffn_gate"), &[e, ff], weight(e)),
            t(b("ffn_up"), &[e, ff], weight(e)),
            t(b("ffn_down"), &[ff, e], weight(ff)),
            t(b("post_ffw_norm"), &[e], NORM),
        ];
        if p.arch != Arch::Gemma2 {
            layer.push(t(b("attn_q_norm"), &[hd], NORM));
            layer.push(t(b("attn_k_norm"), &[hd], NORM));
        }
        if p.arch == Arch::Gemma4 {
            // Trained E2B scalars span ~0.02..0.9; a mid value keeps the
            // residual stream from vanishing over 35+ layers.
            layer.push(t(
                b("layer_output_scale"),
                &[1],
                Init::Normal {
                    mean: 0.5,
                    std: 0.1,
                },
            ));
        }
        if p.ple_dim > 0 {
            layer.push(t(b("inp_gate"), &[e, p.ple_dim], weight(e)));
            layer.push(t(b("proj"), &[p.ple_dim, e], weight(p.ple_dim)));
            layer.push(t(b("post_norm"), &[e], NORM));
        }
        layer.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(layer);
    }
    assign_types(&mut out, quant, p.n_layer);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_picks_llama_cpp_layers_for_18() {
        let picked: Vec<usize> = (0..18).filter(|&i| use_more_bits(i, 18)).collect();
        assert_eq!(picked, [0, 1, 4, 7, 10, 13, 15, 16, 17]);
    }

    #[test]
    fn fallback_demotes_only_misfit_rows() {
        assert_eq!(fallback(GgmlType::Q4K, 640), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q6K, 1152), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q4K, 2304), GgmlType::Q4K);
        assert_eq!(fallback(GgmlType::Q8_0, 48), GgmlType::F16);
    }
}
