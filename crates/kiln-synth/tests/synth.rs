//! Synthetic files against what loaders and the real model expect.

use std::path::PathBuf;

use kiln_gguf::{GgmlType, Gguf};
use kiln_model::{Arch, ModelConfig};
use kiln_synth::{plan, synthesize_with_progress, write_skeleton, Quant, SynthSpec, PRESETS};

/// A file in the temp dir, removed when dropped (also on a failed assert).
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> TempFile {
        TempFile(std::env::temp_dir().join(format!("kiln-synth-{}-{name}", std::process::id())))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Global (non-sliding) layers per GEMMA.md §1.3.
fn expected_globals(arch: Arch, size: &str, n_layer: usize) -> Vec<usize> {
    match (arch, size) {
        (Arch::Gemma2, _) => (0..n_layer).filter(|i| i % 2 == 1).collect(),
        (Arch::Gemma3, _) => (0..n_layer).filter(|i| i % 6 == 5).collect(),
        (Arch::Gemma4, "e2b") => (0..n_layer).filter(|i| i % 5 == 4).collect(),
        (Arch::Gemma4, _) => (0..n_layer).filter(|i| i % 6 == 5).collect(),
    }
}

/// The file's tensor table exactly as planned.
fn assert_matches_plan(g: &Gguf, spec: &SynthSpec) {
    let planned = plan(spec).unwrap();
    let infos = g.tensor_infos();
    assert_eq!(infos.len(), planned.len());
    for (i, p) in infos.iter().zip(&planned) {
        assert_eq!(
            (&i.name, &i.dims, i.ty),
            (&p.name, &p.dims, p.ty),
            "{}",
            p.name
        );
    }
}

#[test]
fn every_preset_header_loads_with_the_real_config() {
    for p in PRESETS {
        let spec = SynthSpec::new(p.arch, p.size);
        let f = TempFile::new(&format!("{}.gguf", p.label()));
        let rep = write_skeleton(&spec, &f.0).unwrap();
        let g = Gguf::open(&f.0).unwrap();
        assert_eq!(g.file_len(), rep.file_bytes);
        assert_matches_plan(&g, &spec);
        let c = ModelConfig::from_gguf(&g).unwrap();
        let label = p.label();
        assert_eq!(
            (c.arch, c.n_layer, c.n_embd),
            (p.arch, p.n_layer, p.n_embd),
            "{label}"
        );
        assert_eq!(c.n_vocab, p.n_vocab, "{label}");
        assert!(c.tied_output, "{label}");
        let globals: Vec<usize> = c
            .layers
            .iter()
            .filter(|l| !l.sliding)
            .map(|l| l.index)
            .collect();
        assert_eq!(
            globals,
            expected_globals(p.arch, p.size, p.n_layer),
            "{label}"
        );
        for l in &c.layers {
            assert_eq!(l.n_head, p.n_head, "{label} layer {}", l.index);
            assert_eq!(l.n_kv_head, p.n_kv_head, "{label} layer {}", l.index);
            assert_eq!(
                l.head_dim,
                p.layer_head_dim(l.index),
                "{label} layer {}",
                l.index
            );
            assert_eq!(l.ffn, p.layer_ffn(l.index), "{label} layer {}", l.index);
            assert_eq!(l.window, l.sliding.then_some(p.window), "{label}");
        }
        let kv = |k: &str| g.get_u32(&format!("{}.{k}", p.arch.gguf_name())).unwrap();
        assert_eq!(kv("context_length") as usize, p.context, "{label}");
        assert_eq!(g.get_u32("general.file_type").unwrap(), 15);
        // The synthetic vocabulary is one the tokenizer accepts.
        let tok = kiln_tokenizer::Tokenizer::from_gguf(&g).unwrap();
        assert_eq!(tok.n_vocab(), p.n_vocab, "{label}");
    }
}

#[test]
fn family_specific_config_is_read_back() {
    let cfg = |arch, size| {
        let f = TempFile::new(&format!("cfg-{size}.gguf"));
        write_skeleton(&SynthSpec::new(arch, size), &f.0).unwrap();
        ModelConfig::from_gguf(&Gguf::open(&f.0).unwrap()).unwrap()
    };
    let g2 = cfg(Arch::Gemma2, "9b");
    assert_eq!(
        (g2.attn_softcap, g2.final_softcap),
        (Some(50.0), Some(30.0))
    );
    // 4B+: linear x8 on global layers only.
    let g3 = cfg(Arch::Gemma3, "4b");
    assert_eq!(g3.layers[5].rope.freq_scale, 0.125);
    assert_eq!(g3.layers[4].rope.freq_scale, 1.0);
    // 27B scales queries by n_embd/n_head = 168, not head_dim 128.
    let g27 = cfg(Arch::Gemma3, "27b");
    assert_eq!(g27.layers[0].attn_scale, 1.0 / 168f32.sqrt());
    // E2B: PLE, KV sharing from layer 15 (13 sliding / 14 global), and the
    // written proportional-RoPE factors.
    let e2b = cfg(Arch::Gemma4, "e2b");
    assert_eq!(e2b.ple_dim, 256);
    assert_eq!(
        (e2b.layers[15].kv_source, e2b.layers[19].kv_source),
        (13, 14)
    );
    assert_eq!(e2b.layers[34].ffn, 12288);
    let ff = e2b.layers[4].rope.freq_factors.as_ref().unwrap();
    assert_eq!((ff.len(), ff[63], ff[64]), (256, 1.0, 1e30));
    assert_eq!(e2b.final_softcap, Some(30.0));
}

#[test]
fn q4_k_m_mix_follows_llama_cpp_rules_on_256_aligned_models() {
    let tensors = plan(&SynthSpec::new(Arch::Gemma3, "4b")).unwrap();
    let ty = |n: &str| tensors.iter().find(|t| t.name == n).unwrap().ty;
    assert_eq!(ty("token_embd.weight"), GgmlType::Q6K);
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q4K);
    assert_eq!(ty("blk.0.ffn_up.weight"), GgmlType::Q4K);
    // 34 layers: use_more_bits = 0..4, 5, 8, ..., 29..34.
    let promoted = |kind: &str| -> Vec<usize> {
        (0..34)
            .filter(|i| ty(&format!("blk.{i}.{kind}.weight")) == GgmlType::Q6K)
            .collect()
    };
    let want = vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 29, 30, 31, 32, 33];
    assert_eq!(promoted("attn_v"), want);
    assert_eq!(promoted("ffn_down"), want);
    // Gemma 4 E2B: the PLE table is a token embedding (Q6_K), the PLE
    // projection is never quantized.
    let e2b = plan(&SynthSpec::new(Arch::Gemma4, "e2b")).unwrap();
    let ty4 = |n: &str| e2b.iter().find(|t| t.name == n).unwrap().ty;
    assert_eq!(ty4("per_layer_token_embd.weight"), GgmlType::Q6K);
    assert_eq!(ty4("per_layer_model_proj.weight"), GgmlType::F16);
    assert_eq!(ty4("blk.0.inp_gate.weight"), GgmlType::Q4K);
    assert_eq!(e2b.len(), 601);
}

#[test]
fn q8_0_and_f16_files_use_one_type_for_all_matrices() {
    for (q, want) in [(Quant::Q8_0, GgmlType::Q8_0), (Quant::F16, GgmlType::F16)] {
        let tensors = plan(&SynthSpec::new(Arch::Gemma4, "e4b").quant(q)).unwrap();
        for t in &tensors {
            let expect = match (t.dims.len(), t.name.as_str()) {
                (1, _) => GgmlType::F32,
                (_, "per_layer_model_proj.weight") => GgmlType::F16,
                _ => want,
            };
            assert_eq!(t.ty, expect, "{} in {q:?}", t.name);
        }
    }
}

fn real_model() -> PathBuf {
    kiln_testdata::real_model()
}

/// Std of the dequantized values of tensor `name`.
fn mean_std(g: &Gguf, name: &str) -> (f64, f64) {
    let t = g.tensor(name).unwrap();
    let mut x = vec![0.0f32; t.info.n_elements as usize];
    kiln_quant::dequantize(t.ty(), t.data, &mut x).unwrap();
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn gemma3_270m_matches_the_real_file_and_has_sane_weights() {
    let real = Gguf::open(real_model()).unwrap();
    let spec = SynthSpec::new(Arch::Gemma3, "270m")
        .seed(42)
        .tokenizer_from(real_model());
    let f = TempFile::new("270m.gguf");
    let mut calls = 0;
    let mut last = (0, 1);
    let rep = synthesize_with_progress(&spec, &f.0, &mut |p| {
        calls += 1;
        assert!(p.done_bytes <= p.total_bytes);
        last = (p.done_bytes, p.total_bytes);
    })
    .unwrap();
    assert!(calls >= rep.n_tensors && last.0 == last.1);
    // No part file of this output is left (their names add a writer's
    // tag and `.part` to the output's).
    let name = f.0.file_name().unwrap().to_string_lossy().into_owned();
    let left: Vec<String> = std::fs::read_dir(f.0.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&name) && n.ends_with(".part"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    let g = Gguf::open(&f.0).unwrap();
    // Same tensors, shapes and types, in the same order, and the same size.
    let names = |g: &Gguf| -> Vec<(String, Vec<u64>, GgmlType)> {
        g.tensor_infos()
            .iter()
            .map(|t| (t.name.clone(), t.dims.clone(), t.ty))
            .collect()
    };
    assert_eq!(names(&g), names(&real));
    assert_eq!(g.file_len(), rep.file_bytes);
    assert_eq!(
        g.data_start(),
        g.file_len() - (real.file_len() - real.data_start())
    );
    // Same tokenizer, same derived config.
    for key in [
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id",
    ] {
        assert_eq!(g.get(key), real.get(key), "{key}");
    }
    assert_eq!(
        ModelConfig::from_gguf(&g).unwrap(),
        ModelConfig::from_gguf(&real).unwrap()
    );
    // N(0, 1/fan_in) matrices and norms around 1, through quantization.
    for (name, std) in [
        ("blk.0.attn_q.weight", 1.0 / 640f64.sqrt()),
        ("blk.3.ffn_down.weight", 1.0 / 2048f64.sqrt()),
        ("blk.0.attn_v.weight", 1.0 / 640f64.sqrt()),
    ] {
        let (m, s) = mean_std(&g, name);
        assert!(
            m.abs() < 0.1 * std && (s / std - 1.0).abs() < 0.05,
            "{name}: {m} {s}"
        );
    }
    let (m, s) = mean_std(&g, "blk.0.attn_norm.weight");
    assert!((m - 1.0).abs() < 0.02 && s < 0.1, "norm {m} {s}");
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    // Gemma 3 1B Q8_0's smallest matrices are enough to compare: write the
    // skeleton's F32 tensors (seeded) for two seeds.
    let norm = |seed| {
        let f = TempFile::new(&format!("seed{seed}.gguf"));
        write_skeleton(&SynthSpec::new(Arch::Gemma3, "1b").seed(seed), &f.0).unwrap();
        let g = Gguf::open(&f.0).unwrap();
        g.tensor("blk.7.ffn_norm.weight").unwrap().data.to_vec()
    };
    assert_eq!(norm(1), norm(1));
    assert_ne!(norm(1), norm(2));
}

#[test]
fn parse_model_and_errors() {
    let s = SynthSpec::parse_model("gemma4-E2B").unwrap();
    assert_eq!((s.arch, s.size.as_str()), (Arch::Gemma4, "E2B"));
    let err = SynthSpec::parse_model("gemma3-2b").unwrap_err().to_string();
    assert!(err.contains("gemma3-270m"), "{err}");
    assert_eq!("q4_k_m".parse::<Quant>().unwrap(), Quant::Q4KM);
    assert!("q3_k".parse::<Quant>().is_err());
}

#[test]
fn gemma4_tokenizer_is_copied_from_a_vocab_file() {
    let vocab = kiln_testdata::llama_vocab("ggml-vocab-gemma-4.gguf");
    let src = Gguf::open(&vocab).unwrap();
    let spec = SynthSpec::new(Arch::Gemma4, "e2b").tokenizer_from(&vocab);
    let f = TempFile::new("e2b-vocab.gguf");
    let rep = write_skeleton(&spec, &f.0).unwrap();
    let g = Gguf::open(&f.0).unwrap();
    for key in [
        "tokenizer.ggml.model",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
    ] {
        assert_eq!(g.get(key), src.get(key), "{key}");
    }
    assert_eq!(rep.n_vocab, 262_144);
    let tok = kiln_tokenizer::Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(tok.n_vocab(), 262_144);
    assert_eq!(ModelConfig::from_gguf(&g).unwrap().n_vocab, 262_144);
}
