use kiln_gguf::Gguf;
use kiln_model::{Arch, ModelConfig};

fn cfg(model: &str) -> ModelConfig {
    let g = Gguf::open(kiln_testdata::fixture(&format!("{model}/model-f32.gguf"))).unwrap();
    ModelConfig::from_gguf(&g).unwrap()
}

#[test]
fn gemma2_alternates_sliding_and_softcaps() {
    let c = cfg("gemma2-tiny");
    assert_eq!(c.arch, Arch::Gemma2);
    assert_eq!(c.n_vocab, 768);
    assert_eq!(c.attn_softcap, Some(10.0));
    assert_eq!(c.final_softcap, Some(30.0));
    let sliding: Vec<bool> = c.layers.iter().map(|l| l.sliding).collect();
    assert_eq!(sliding, [true, false, true, false, true, false]);
    assert!(c
        .layers
        .iter()
        .all(|l| l.rope.base == 10_000.0 && l.n_kv_head == 2));
    assert!((c.layers[0].attn_scale - 1.0 / 32f32.sqrt()).abs() < 1e-7);
}

#[test]
fn gemma3_rope_scaling_only_on_global_layers() {
    let plain = cfg("gemma3-tiny");
    let scaled = cfg("gemma3-ropescale-tiny");
    for (p, s) in plain.layers.iter().zip(&scaled.layers) {
        assert_eq!(p.sliding, p.index % 6 != 5);
        assert_eq!(p.rope.freq_scale, 1.0);
        let want = if s.sliding { 1.0 } else { 0.125 };
        assert_eq!(s.rope.freq_scale, want, "layer {}", s.index);
        assert_eq!(s.rope.base, if s.sliding { 1e4 } else { 1e6 });
        assert!(s.qk_norm && !s.v_norm);
    }
    assert_eq!(plain.final_softcap, None);
}

#[test]
fn gemma4_kv_sharing_ple_and_k_eq_v() {
    let e2b = cfg("gemma4-e2b-tiny");
    assert_eq!(e2b.ple_dim, 16);
    let src: Vec<usize> = e2b.layers.iter().map(|l| l.kv_source).collect();
    assert_eq!(src, [0, 1, 2, 3, 4, 3, 3, 3, 3, 4]);
    assert_eq!(e2b.layers[9].ffn, 256);
    assert_eq!(e2b.layers[4].head_dim, 64);
    assert_eq!(e2b.layers[0].head_dim, 32);

    let d = cfg("gemma4-tiny");
    let g = &d.layers[2];
    assert!(!g.sliding && !g.has_v && g.n_kv_head == 1 && g.head_dim == 64);
    let ff = g.rope.freq_factors.as_ref().unwrap();
    assert_eq!(ff.len(), 32);
    assert_eq!(d.layers[0].rope.freq_factors, None);
    assert!(d.layers[0].has_v && d.layers[0].attn_scale == 1.0);

    let moe = cfg("gemma4-moe-tiny");
    let m = moe.layers[0].moe.as_ref().unwrap();
    assert_eq!((m.n_expert, m.n_expert_used, m.expert_ffn), (4, 2, 32));
}

#[test]
fn real_model_config() {
    let g = Gguf::open(kiln_testdata::real_model()).unwrap();
    let c = ModelConfig::from_gguf(&g).unwrap();
    let global: Vec<usize> = c
        .layers
        .iter()
        .filter(|l| !l.sliding)
        .map(|l| l.index)
        .collect();
    assert_eq!(global, [5, 11, 17]);
    assert_eq!(c.sliding_window, Some(512));
    assert_eq!(c.n_vocab, 262_144);
    assert!((c.layers[0].attn_scale - 1.0 / 16.0).abs() < 1e-7);
}

#[test]
fn wrong_arch_is_an_error() {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    let key = b"general.architecture";
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&5u64.to_le_bytes());
    b.extend_from_slice(b"llama");
    let g = Gguf::from_bytes(b).unwrap();
    let e = ModelConfig::from_gguf(&g).unwrap_err().to_string();
    assert!(e.contains("llama"), "{e}");
}
