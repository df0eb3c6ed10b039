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

/// The exactness budget every kernel path keeps against the exact f64
/// reference (issue 12; the project's bar is 0.05, llama.cpp 0.24-1.12).
const BUDGET: f32 = 1e-3;

/// All positions of capital_france (prefill), on every SIMD level.
#[test]
fn capital_france_last_logits_match_exact_reference() {
    let tokens = [2u32, 818, 5279, 529, 7001, 563];
    let (shape, want) = read_npy("logits_exactf64_capital_france_allpos.npy");
    let vocab = shape[1];
    let (_, llama) = read_npy("logits_primary_capital_france_last.npy");
    for isa in simd_levels() {
        let m = load_isa(&real_model(), isa);
        assert_eq!(vocab, m.config.n_vocab);
        let got = all_logits(&m, &tokens);
        let mut worst = 0.0f32;
        for p in 0..tokens.len() {
            let r = p * vocab..(p + 1) * vocab;
            let (d, _) = max_diff(&got[r.clone()], &want[r.clone()]);
            worst = worst.max(d);
            assert_eq!(
                argmax(&got[r.clone()]),
                argmax(&want[r]),
                "{isa} pos {p} top-1"
            );
        }
        let last = (tokens.len() - 1) * vocab..tokens.len() * vocab;
        let (d, _) = max_diff(&got[last.clone()], &want[last.clone()]);
        let (dl, _) = max_diff(&llama, &want[last.clone()]);
        println!(
            "{isa} capital_france all positions: max|kiln - exact| {worst:.2e}; last, all \
             262,144: {d:.2e}, max|llama.cpp - exact| {dl:.2e}"
        );
        assert!(worst <= BUDGET, "{isa}: max|d| {worst}");
        assert!(d < dl);
        assert_eq!(argmax(&got[last]), 506);
    }
}

/// (id, logit) pairs of a logits.json top-20 list.
fn top20(v: &serde_json::Value) -> Vec<(usize, f32)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_u64().unwrap() as usize,
                e["logit"].as_f64().unwrap() as f32,
            )
        })
        .collect()
}

/// Every logits.json prompt at its last position against the exact f64
/// reference, on every SIMD level: max|Kiln - exact| within the budget
/// over the exact top-20 (and over all 262,144 logits where a .npy exists)
/// and the same top-1, printed next to llama.cpp's (primary config) own
/// error against the exact reference.
#[test]
fn last_logits_match_exact_reference_on_every_prompt() {
    for isa in simd_levels() {
        println!("-- {isa}");
        last_logits_on_every_prompt(&load_isa(&real_model(), isa));
    }
}

fn last_logits_on_every_prompt(m: &kiln_model::Model<kiln_cpu::CpuBackend>) {
    let j = json(&refdata("logits.json"));
    for item in j["items"].as_array().unwrap() {
        let name = item["name"].as_str().unwrap();
        let tokens = ids(&item["prompt_ids"]);
        let mut cache = m.new_cache().unwrap();
        let mut s = m.new_scratch(tokens.len()).unwrap();
        let mut got = Vec::new();
        let t = Instant::now();
        m.forward(&tokens, &mut cache, &mut s, Output::LastLogits, &mut got)
            .unwrap();
        let prefill = t.elapsed().as_secs_f64();
        let cfgs = &item["configs"];
        let exact = top20(&cfgs["exact_f64_numpy"]["last_position_top20"]);
        let primary = top20(&cfgs["primary_fa_on_kv_f16"]["last_position_top20"]);
        let kiln_err = exact
            .iter()
            .map(|&(id, z)| (got[id] - z).abs())
            .fold(0.0f32, f32::max);
        // llama.cpp's error on the ids both top-20 lists hold.
        let llama_err = exact
            .iter()
            .filter_map(|&(id, z)| primary.iter().find(|p| p.0 == id).map(|p| (p.1 - z).abs()))
            .fold(0.0f32, f32::max);
        println!(
            "{name} ({} tokens, {:.1} tok/s): top-20 max|kiln - exact| {kiln_err:.2e}, \
             max|llama.cpp - exact| {llama_err:.2e}",
            tokens.len(),
            tokens.len() as f64 / prefill
        );
        assert!(kiln_err <= BUDGET, "{name}: {kiln_err}");
        assert!(
            kiln_err < llama_err,
            "{name}: Kiln is not closer than llama.cpp"
        );
        assert_eq!(argmax(&got), exact[0].0, "{name} top-1");

        let npy = match name {
            "capital_france" => None, // all positions: see the test above
            "long_gt512" => Some("long_gt512"),
            _ => None,
        };
        if let Some(stem) = npy {
            let (_, want) = read_npy(&format!("logits_exactf64_{stem}_last.npy"));
            let (_, llama) = read_npy(&format!("logits_primary_{stem}_last.npy"));
            let (d, _) = max_diff(&got, &want);
            let (dl, _) = max_diff(&llama, &want);
            println!(
                "{name} all 262,144: max|kiln - exact| {d:.2e}, max|llama.cpp - exact| {dl:.2e}"
            );
            assert!(d <= BUDGET, "{name}: max|d| {d}");
            assert!(d < dl);
            assert_eq!(argmax(&got), argmax(&want));
        }
        if name == "long_gt512" {
            assert!(tokens.len() > 512);
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
    }
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

/// The decode path (one token per step: the integer GEMV on int8
/// activation planes, the decode attention) against the exact f64
/// reference: every position of capital_france decoded token by token
/// (all 262,144 logits), and each logits.json prompt's last token decoded
/// after a prefill of the rest (its exact top-20; all logits for
/// long_gt512, past the sliding window), on every SIMD level. The bound
/// is the exactness budget every path keeps.
#[test]
fn decode_logits_match_exact_reference() {
    for isa in simd_levels() {
        println!("-- {isa}");
        decode_logits(&load_isa(&real_model(), isa));
    }
}

fn decode_logits(m: &kiln_model::Model<kiln_cpu::CpuBackend>) {
    const BOUND: f32 = BUDGET;
    let decode_last = |tokens: &[u32]| {
        let (prompt, last) = tokens.split_at(tokens.len() - 1);
        let mut cache = m.new_cache().unwrap();
        let mut s = m.new_scratch(prompt.len().max(1)).unwrap();
        let mut out = Vec::new();
        if !prompt.is_empty() {
            m.forward(prompt, &mut cache, &mut s, Output::LastHidden, &mut out)
                .unwrap();
        }
        m.forward(last, &mut cache, &mut s, Output::LastLogits, &mut out)
            .unwrap();
        out
    };

    let tokens = [2u32, 818, 5279, 529, 7001, 563];
    let (shape, want) = read_npy("logits_exactf64_capital_france_allpos.npy");
    let vocab = shape[1];
    let mut cache = m.new_cache().unwrap();
    let mut s = m.new_scratch(1).unwrap();
    let mut got = Vec::new();
    let mut worst = 0.0f32;
    for (p, &t) in tokens.iter().enumerate() {
        m.forward(&[t], &mut cache, &mut s, Output::LastLogits, &mut got)
            .unwrap();
        let (d, _) = max_diff(&got, &want[p * vocab..(p + 1) * vocab]);
        assert_eq!(argmax(&got), argmax(&want[p * vocab..(p + 1) * vocab]));
        worst = worst.max(d);
    }
    println!("capital_france decoded token by token: max|kiln - exact| {worst:.2e}");
    assert!(worst <= BOUND, "capital_france decode: {worst}");

    let j = json(&refdata("logits.json"));
    for item in j["items"].as_array().unwrap() {
        let name = item["name"].as_str().unwrap();
        let got = decode_last(&ids(&item["prompt_ids"]));
        let exact = top20(&item["configs"]["exact_f64_numpy"]["last_position_top20"]);
        let err = exact
            .iter()
            .map(|&(id, z)| (got[id] - z).abs())
            .fold(0.0f32, f32::max);
        let all = (name == "long_gt512").then(|| {
            let (_, want) = read_npy("logits_exactf64_long_gt512_last.npy");
            max_diff(&got, &want).0
        });
        let all_s = all.map_or(String::new(), |d| format!(", all 262,144: {d:.2e}"));
        println!("{name} last token decoded: top-20 max|kiln - exact| {err:.2e}{all_s}");
        assert!(
            err <= BOUND && all.is_none_or(|d| d <= BOUND),
            "{name}: {err} {all:?}"
        );
        assert_eq!(argmax(&got), exact[0].0, "{name} top-1");
    }
}
