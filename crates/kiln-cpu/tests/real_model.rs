//! Gemma 3 270M Q4_K_M against the exact float64 NumPy reference.

mod common;

use std::time::Instant;

use common::*;
use kiln_model::Output;
use kiln_testdata::{real_model, refdata};

/// Parses a little-endian f32 `.npy` (v1/v2 header) into (shape, data).
fn read_npy(name: &str) -> (Vec<usize>, Vec<f32>) {
    let b = std::fs::read(refdata(name)).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY", "{name}: not a .npy file");
    let (hlen, start) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
    };
    let header = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    assert!(
        header.contains("'<f4'") && header.contains("'fortran_order': False"),
        "{header}"
    );
    let shape_s = header
        .split("'shape': (")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    let shape: Vec<usize> = shape_s
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let data = read_f32_bytes(&b[start + hlen..]);
    assert_eq!(data.len(), shape.iter().product::<usize>());
    (shape, data)
}

fn read_f32_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn long_prompt() -> Vec<u32> {
    let j = json(&refdata("logits.json"));
    let item = j["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "long_gt512")
        .unwrap();
    ids(&item["prompt_ids"])
}

#[test]
fn capital_france_last_logits_match_exact_reference() {
    let m = load(&real_model());
    let tokens = [2u32, 818, 5279, 529, 7001, 563];
    let (shape, want) = read_npy("logits_exactf64_capital_france_allpos.npy");
    let vocab = shape[1];
    assert_eq!(vocab, m.config.n_vocab);
    let got = all_logits(&m, &tokens);
    for p in 0..tokens.len() {
        let r = p * vocab..(p + 1) * vocab;
        let (d, _) = max_diff(&got[r.clone()], &want[r.clone()]);
        println!("capital_france pos {p}: max|d| {d:.2e}");
        assert_eq!(argmax(&got[r.clone()]), argmax(&want[r]), "pos {p} top-1");
    }
    let last = (tokens.len() - 1) * vocab..tokens.len() * vocab;
    let (d, _) = max_diff(&got[last.clone()], &want[last.clone()]);
    assert!(d <= 0.05, "last position max|d| {d}");
    assert_eq!(argmax(&got[last]), 506);
}

#[test]
fn long_prompt_crossing_the_window_matches_exact_reference() {
    let m = load(&real_model());
    let tokens = long_prompt();
    assert!(tokens.len() > 512);
    let (_, want) = read_npy("logits_exactf64_long_gt512_last.npy");
    let mut cache = m.new_cache().unwrap();
    let mut s = m.new_scratch(tokens.len()).unwrap();
    let mut got = Vec::new();
    let t = Instant::now();
    m.forward(&tokens, &mut cache, &mut s, Output::LastLogits, &mut got)
        .unwrap();
    let prefill = t.elapsed().as_secs_f64();
    let (d, _) = max_diff(&got, &want);
    println!(
        "long_gt512 ({} tokens): max|d| {d:.2e}, prefill {:.1} tok/s",
        tokens.len(),
        tokens.len() as f64 / prefill
    );
    assert!(d <= 0.05, "max|d| {d}");
    assert_eq!(argmax(&got), argmax(&want));

    // Sliding layers hold exactly the window; global layers everything.
    for (il, l) in m.config.layers.iter().enumerate() {
        let want_rows = if l.sliding { 512 } else { tokens.len() };
        assert_eq!(cache.rows_in_use(il), want_rows, "layer {il}");
    }

    // Decode speed (greedy, argmax over the packed tied embedding).
    let mut tok = argmax(&got) as u32;
    let t = Instant::now();
    let steps = 8;
    for _ in 0..steps {
        tok = m
            .forward(&[tok], &mut cache, &mut s, Output::Argmax, &mut got)
            .unwrap()
            .unwrap();
    }
    let decode = t.elapsed().as_secs_f64();
    println!("decode at ~800 context: {:.1} tok/s", steps as f64 / decode);
}

/// KV memory for a 1,500-token context: 3 global layers x 1,500 rows plus
/// 15 sliding layers x 512 rows (1 KV head x 256 dims, K and V, f32).
#[test]
fn kv_memory_for_1500_tokens() {
    let m = load(&real_model());
    let mut cache = m.new_cache().unwrap();
    cache.reserve(m.backend(), 1500).unwrap();
    let mut global = 0;
    let mut sliding = 0;
    for (il, l) in m.config.layers.iter().enumerate() {
        if l.sliding {
            assert_eq!(cache.allocated_rows(il), 512, "layer {il}");
            sliding += 1;
        } else {
            assert_eq!(cache.allocated_rows(il), 1500, "layer {il}");
            global += 1;
        }
    }
    assert_eq!((global, sliding), (3, 15));
    let row_bytes = 256 * 4 * 2;
    assert_eq!(cache.allocated_bytes(), (3 * 1500 + 15 * 512) * row_bytes);
    assert!(cache
        .reserve(m.backend(), m.config.context_length + 1)
        .is_err());
}
