//! Acceptance on the real Gemma 3 270M Q4_K_M against the exact float64
//! reference in `shared/refdata`: teacher-forced greedy argmax, KV-cached
//! decode vs recompute across the sliding window, and perplexity.
//!
//! Runtimes (2 cores, scalar kernels) are noted per test.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::max_abs_diff;
use kiln_cpu::CpuBackend;
use kiln_gguf::Gguf;
use kiln_model::{Model, Output};
use kiln_runtime::{perplexity, Session, SessionOptions};
use kiln_testdata::{real_model, refdata};
use serde_json::Value;

fn json(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(refdata(name)).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn load() -> Model<CpuBackend> {
    let g = Arc::new(Gguf::open(real_model()).unwrap());
    Model::load(CpuBackend::new(), g).unwrap()
}

/// Ties go to the lowest id, as in the reference.
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Feeds prompt + llama.cpp's generated ids in one prefill (logits only
/// from the last prompt position on) and requires Kiln's argmax to equal
/// the exact f64 reference's wherever the exact top-2 margin is >= 0.05.
/// Every SIMD level this CPU runs (`KILN_ISA` forced per level), each
/// ~25 s alone, ~100 s on a busy 2-core machine (321 steps).
#[test]
fn teacher_forced_greedy_matches_exact_reference() {
    let g = Arc::new(Gguf::open(real_model()).unwrap());
    for isa in kiln_cpu::Isa::available().filter(|&i| i != kiln_cpu::Isa::Scalar) {
        let cfg = kiln_cpu::CpuConfig {
            threads: 0,
            isa: Some(isa),
        };
        let m = Model::load(CpuBackend::with_config(cfg), g.clone()).unwrap();
        assert_eq!(m.backend().isa(), isa);
        println!("-- {isa}");
        teacher_forced(&m);
    }
}

fn teacher_forced(m: &Model<CpuBackend>) {
    let g = json("greedy.json");
    let vocab = m.config.n_vocab;
    let (mut checked, mut skipped, mut agree_llama, mut total) = (0, 0, 0, 0);
    for item in g["items"].as_array().unwrap() {
        let name = item["name"].as_str().unwrap();
        let prompt = ids(&item["prompt_ids"]);
        let gen = ids(&item["generated_ids"]);
        let steps = item["steps"].as_array().unwrap();
        assert_eq!(steps.len(), gen.len(), "{name}: one step record per id");
        // The last generated id is never fed: nothing is predicted from it.
        let mut seq = prompt.clone();
        seq.extend_from_slice(&gen[..gen.len() - 1]);
        let mut cache = m.new_cache().unwrap();
        let mut s = m.new_scratch(seq.len()).unwrap();
        let mut logits = Vec::new();
        m.forward(
            &seq,
            &mut cache,
            &mut s,
            Output::LogitsFrom(prompt.len() - 1),
            &mut logits,
        )
        .unwrap();
        assert_eq!(logits.len(), gen.len() * vocab);
        for (i, (row, st)) in logits.chunks_exact(vocab).zip(steps).enumerate() {
            assert_eq!(st["step"].as_u64(), Some(i as u64));
            let ours = argmax(row);
            let exact = st["exact_f64_argmax"].as_u64().unwrap() as u32;
            let margin = st["exact_f64_margin_top1_top2"].as_f64().unwrap();
            total += 1;
            agree_llama += usize::from(ours == gen[i]);
            if margin >= 0.05 {
                assert_eq!(ours, exact, "{name} step {i} (exact margin {margin})");
                checked += 1;
            } else {
                skipped += 1;
            }
        }
    }
    println!(
        "teacher-forced: {checked} steps equal the exact argmax, {skipped} skipped (margin < 0.05); \
         {agree_llama}/{total} equal llama.cpp's choice"
    );
    // The published greedy.json holds 7 prompts (321 steps); nearly all
    // have a clear exact margin, so a vacuous pass is impossible.
    assert!(checked * 10 >= total * 9, "{checked} of {total} checked");
}

/// 1,500 prompt tokens (the GPL text) + 200 greedy tokens, crossing the
/// 512 window on 15 of 18 layers: the decode logits at 5 steps equal a
/// fresh, differently chunked recompute; KV memory is 3 global layers x
/// all positions + 15 sliding layers x 512 rows. ~100 s on a busy 2-core
/// machine (measured: prefill 36 tok/s, decode 5.9 tok/s under contention).
#[test]
fn kv_cached_decode_equals_recompute_past_the_window() {
    let m = load();
    let text = std::fs::read_to_string(refdata("perplexity_gpl3.txt")).unwrap();
    let tok = kiln_tokenizer::Tokenizer::from_gguf(&Gguf::open(real_model()).unwrap()).unwrap();
    let all = tok.encode(&text, true, false);
    let (n_prompt, n_gen) = (1500, 200);
    let prompt = &all[..n_prompt];
    let n_pos = n_prompt + n_gen - 1;
    let sample_steps = [0usize, 37, 100, 163, 199];

    let mut cache = m.new_cache().unwrap();
    cache.reserve(m.backend(), n_pos).unwrap();
    let mut s = m.new_scratch(n_prompt).unwrap();
    let mut logits = Vec::new();
    let t = Instant::now();
    m.forward(prompt, &mut cache, &mut s, Output::LastLogits, &mut logits)
        .unwrap();
    let prefill = t.elapsed();
    let mut sampled = vec![logits.clone()];
    let mut gen = vec![argmax(&logits)];
    let mut s1 = m.new_scratch(1).unwrap();
    let t = Instant::now();
    for step in 1..n_gen {
        let prev = *gen.last().unwrap();
        let id = if sample_steps.contains(&step) {
            m.forward(
                &[prev],
                &mut cache,
                &mut s1,
                Output::LastLogits,
                &mut logits,
            )
            .unwrap();
            sampled.push(logits.clone());
            argmax(&logits)
        } else {
            m.forward(&[prev], &mut cache, &mut s1, Output::Argmax, &mut logits)
                .unwrap()
                .unwrap()
        };
        gen.push(id);
    }
    let decode = t.elapsed();
    println!(
        "prefill {n_prompt}: {:.1} s ({:.1} tok/s); decode {}: {:.1} s ({:.1} tok/s)",
        prefill.as_secs_f64(),
        n_prompt as f64 / prefill.as_secs_f64(),
        n_gen - 1,
        decode.as_secs_f64(),
        (n_gen - 1) as f64 / decode.as_secs_f64()
    );
    assert_eq!(cache.len(), n_pos);
    for (il, l) in m.config.layers.iter().enumerate() {
        let want = if l.sliding { 512 } else { n_pos };
        assert_eq!(cache.rows_in_use(il), want, "layer {il}");
    }
    assert_eq!(
        cache.allocated_bytes(),
        (3 * n_pos + 15 * 512) * 256 * 4 * 2
    );

    // Recompute from scratch in other chunks, ending at each sampled position.
    let mut seq = prompt.to_vec();
    seq.extend_from_slice(&gen[..n_gen - 1]);
    let mut fresh = m.new_cache().unwrap();
    let mut hidden = Vec::new();
    m.forward(
        &seq[..700],
        &mut fresh,
        &mut s,
        Output::LastHidden,
        &mut hidden,
    )
    .unwrap();
    for (step, want) in sample_steps.iter().zip(&sampled) {
        let end = n_prompt + step;
        m.forward(
            &seq[fresh.len()..end],
            &mut fresh,
            &mut s,
            Output::LastLogits,
            &mut logits,
        )
        .unwrap();
        let d = max_abs_diff(&logits, want);
        println!(
            "step {step} (position {}): max|cached - recompute| {d:.2e}",
            end - 1
        );
        assert!(d <= 1e-3, "step {step}: {d}");
    }
}

fn perplexity_case(n_ctx: usize, exact: f64) {
    let j = json("perplexity.json");
    let text = std::fs::read_to_string(refdata("perplexity_gpl3.txt")).unwrap();
    let mut s = Session::load(real_model(), SessionOptions::default()).unwrap();
    let tokens = s.tokenize_for_perplexity(&text);
    assert_eq!(tokens, ids(&j["token_ids"]), "tokenization of the GPL text");
    assert_eq!(tokens.len(), 7562);
    let t = Instant::now();
    let r = perplexity(&mut s, &tokens, n_ctx).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let exact_run = j["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["n_ctx"].as_u64() == Some(n_ctx as u64)
                && r["command"].as_str().unwrap().starts_with("NOT llama.cpp")
        })
        .unwrap();
    let running = exact_run["running_ppl_after_each_chunk"]
        .as_array()
        .unwrap();
    println!(
        "c={n_ctx}: PPL {:.4} +/- {:.5} (exact {exact}, rel {:.2e}), {} chunks, {} scored, {secs:.1} s",
        r.ppl,
        r.ppl_stderr,
        (r.ppl - exact).abs() / exact,
        r.n_chunks,
        r.n_scored
    );
    assert_eq!(r.n_chunks, exact_run["n_chunks"].as_u64().unwrap() as usize);
    assert_eq!(
        r.n_scored,
        exact_run["n_scored_tokens"].as_u64().unwrap() as usize
    );
    assert_eq!(r.running_ppl.len(), running.len());
    for (k, (ours, want)) in r.running_ppl.iter().zip(running).enumerate() {
        let want = want.as_f64().unwrap();
        assert!(
            (ours - want).abs() / want < 2e-3,
            "chunk {k}: running PPL {ours} vs exact {want}"
        );
    }
    assert!(
        (r.ppl - exact).abs() / exact < 1e-3,
        "PPL {} vs {exact}",
        r.ppl
    );
}

/// Measured 282 s on a contended 2-core machine (scalar kernels).
#[test]
fn perplexity_c128_matches_exact_reference() {
    perplexity_case(128, 18.3264);
}

/// Measured 140 s on a quieter 2-core machine (scalar kernels).
#[test]
fn perplexity_c256_matches_exact_reference() {
    perplexity_case(256, 16.3855);
}
