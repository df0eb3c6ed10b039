//! Session tests on the tiny fixture models (greedy reference ids, logits
//! and hidden states from transformers) and on the real Gemma 3 270M
//! (llama.cpp greedy reference ids).

mod common;

use std::ops::ControlFlow;

use common::max_abs_diff;
use kiln_runtime::{
    ChatMessage, FinishReason, Prompt, RuntimeError, SamplingParams, Session, SessionOptions,
    Truncation,
};
use serde_json::Value;

fn fixture_session(model: &str, opts: SessionOptions) -> Session {
    Session::load(
        kiln_testdata::fixture(&format!("{model}/model-f32.gguf")),
        opts,
    )
    .unwrap()
}

/// (input ids, greedy generated ids) of sequence `seq` of a fixture model.
fn reference(model: &str, seq: &str) -> (Vec<u32>, Vec<u32>) {
    let text = std::fs::read_to_string(kiln_testdata::fixture(&format!("{model}/reference.json")))
        .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let s = &v["reference"]["sequences"][seq];
    let ids = |k: &str| -> Vec<u32> {
        s[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    (ids("input_ids"), ids("greedy_generated_ids"))
}

fn read_f32(path: std::path::PathBuf) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        max_tokens: n,
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

fn generate_ids(s: &mut Session, prompt: &[u32], params: &SamplingParams) -> Vec<u32> {
    s.generate(prompt, params, |_| ControlFlow::Continue(()))
        .unwrap()
        .tokens
}

#[test]
fn greedy_matches_reference_on_every_fixture_family() {
    for model in ["gemma2-tiny", "gemma3-tiny", "gemma4-tiny"] {
        let mut s = fixture_session(model, SessionOptions::default());
        for seq in ["5", "24", "64"] {
            let (prompt, want) = reference(model, seq);
            let out = s
                .generate(&prompt, &greedy(want.len()), |_| ControlFlow::Continue(()))
                .unwrap();
            assert_eq!(out.tokens, want, "{model} seq {seq}");
            assert_eq!(out.finish, FinishReason::Length);
            assert_eq!(out.stats.prompt_tokens, prompt.len());
            assert_eq!(out.stats.decode_tokens, want.len() - 1);
        }
    }
}

#[test]
fn sampled_top_k_1_equals_the_argmax_fast_path() {
    let (prompt, want) = reference("gemma3-tiny", "24");
    let mut s = fixture_session("gemma3-tiny", SessionOptions::default());
    // top-k 1 goes through full logits and the sampler, not the argmax head.
    let p = SamplingParams {
        top_k: 1,
        temperature: 1.0,
        max_tokens: 16,
        ignore_eos: true,
        ..Default::default()
    };
    assert_eq!(generate_ids(&mut s, &prompt, &p), want);
}

#[test]
fn logits_match_transformers_and_generate_reuses_the_prefill() {
    let (prompt, want) = reference("gemma3-tiny", "24");
    let all_ref = read_f32(kiln_testdata::fixture("gemma3-tiny/logits_seq24.bin"));
    let mut s = fixture_session("gemma3-tiny", SessionOptions::default());
    let n_vocab = s.config().n_vocab;
    let last = s.logits(&prompt).unwrap();
    let d = max_abs_diff(&last, &all_ref[all_ref.len() - n_vocab..]);
    assert!(d < 1e-3, "last-position logits differ by {d}");

    let out = s
        .generate(&prompt, &greedy(16), |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(out.stats.reused_tokens, prompt.len());
    assert_eq!(out.stats.prefill_tokens, 0);
    assert_eq!(out.tokens, want);

    let all = s.logits_all(&prompt).unwrap();
    let d = max_abs_diff(&all, &all_ref);
    assert!(d < 1e-3, "all-position logits differ by {d}");
}

#[test]
fn chunked_prefill_equals_one_batch() {
    // Buckets of at most 8 tokens: the 64-token prompt runs in 8 chunks,
    // crossing the 16-row sliding window several times.
    let (prompt, want) = reference("gemma3-tiny", "64");
    let opts = SessionOptions {
        max_prefill: 8,
        ..Default::default()
    };
    let mut s = fixture_session("gemma3-tiny", opts);
    assert_eq!(generate_ids(&mut s, &prompt, &greedy(16)), want);
    assert!(s.prefill_buckets().iter().all(|&b| b <= 8));
}

#[test]
fn prefill_plans_are_cached_per_bucket() {
    let (prompt, _) = reference("gemma3-tiny", "64");
    let mut s = fixture_session("gemma3-tiny", SessionOptions::default());
    assert_eq!(s.prefill_buckets(), vec![1]);
    for n in [15, 16, 5, 8, 64] {
        s.reset();
        s.logits(&prompt[..n]).unwrap();
    }
    // 15 and 16 share bucket 16; 5 → 8 (wastes 3/8 > 1/8 → exact 5).
    assert_eq!(s.prefill_buckets(), vec![1, 5, 8, 16, 64]);
}

#[test]
fn multi_turn_extends_the_cache_and_matches_a_fresh_session() {
    let (prompt, _) = reference("gemma3-tiny", "24");
    let mut s = fixture_session("gemma3-tiny", SessionOptions::default());
    let first = generate_ids(&mut s, &prompt, &greedy(10));
    // Next turn: the previous prompt, the reply and a few new tokens.
    let mut next = prompt.clone();
    next.extend_from_slice(&first);
    next.extend_from_slice(&[300, 301, 302]);
    let out = s
        .generate(&next, &greedy(12), |_| ControlFlow::Continue(()))
        .unwrap();
    // All but the last reply token were fed during the first turn.
    assert_eq!(out.stats.reused_tokens, prompt.len() + first.len() - 1);
    assert_eq!(out.stats.prefill_tokens, 4);
    let mut fresh = fixture_session("gemma3-tiny", SessionOptions::default());
    assert_eq!(out.tokens, generate_ids(&mut fresh, &next, &greedy(12)));
}

#[test]
fn diverging_prompt_past_the_sliding_window_is_recomputed() {
    // gemma3-tiny has a 16-row ring: after 64 tokens, rewinding to 40 would
    // need rows that were overwritten, so the session must recompute.
    let (prompt, _) = reference("gemma3-tiny", "64");
    let mut s = fixture_session("gemma3-tiny", SessionOptions::default());
    s.logits(&prompt).unwrap();
    let mut other = prompt[..40].to_vec();
    other.extend_from_slice(&[7, 8, 9]);
    let out = s
        .generate(&other, &greedy(8), |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(out.stats.reused_tokens, 0);
    assert_eq!(out.stats.prefill_tokens, other.len());
    let mut fresh = fixture_session("gemma3-tiny", SessionOptions::default());
    assert_eq!(out.tokens, generate_ids(&mut fresh, &other, &greedy(8)));
}

#[test]
fn embeddings_match_the_final_norm_hidden_states() {
    let text =
        std::fs::read_to_string(kiln_testdata::fixture("gemma3-tiny/hidden_seq24.json")).unwrap();
    let meta: Value = serde_json::from_str(&text).unwrap();
    let shape: Vec<usize> = meta["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let (layers, n, d) = (shape[0], shape[1], shape[2]);
    let hidden = read_f32(kiln_testdata::fixture("gemma3-tiny/hidden_seq24.bin"));
    let final_norm = &hidden[(layers - 1) * n * d..];
    let (prompt, _) = reference("gemma3-tiny", "24");
    let mut s = fixture_session("gemma3-tiny", SessionOptions::default());
    let e = s.embed(&prompt, true).unwrap();
    let dl = max_abs_diff(&e.last, &final_norm[(n - 1) * d..]);
    assert!(dl < 1e-3, "last hidden differs by {dl}");
    let mean: Vec<f32> = (0..d)
        .map(|c| (0..n).map(|t| final_norm[t * d + c]).sum::<f32>() / n as f32)
        .collect();
    let dm = max_abs_diff(e.mean.as_ref().unwrap(), &mean);
    assert!(dm < 1e-3, "mean hidden differs by {dm}");
    let fast = s.embed(&prompt, false).unwrap();
    assert!(max_abs_diff(&fast.last, &e.last) < 1e-4);
}

#[test]
fn stops_on_eog_stop_tokens_stop_strings_and_callback() {
    let (prompt, want) = reference("gemma3-tiny", "5");
    let mut s = fixture_session("gemma3-tiny", SessionOptions::default());

    // A reference token as a stop token: the tokens before its first
    // occurrence come out.
    let stop_id = want[3];
    let first = want.iter().position(|&t| t == stop_id).unwrap();
    let p = SamplingParams {
        stop_token_ids: vec![stop_id],
        ..greedy(16)
    };
    let out = s
        .generate(&prompt, &p, |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(
        (out.tokens.as_slice(), out.finish),
        (&want[..first], FinishReason::StopToken(stop_id))
    );

    // Without ignore_eos, an EOG token ends generation (biased to the top).
    let eog = s.eog_ids()[0];
    let mut p = SamplingParams {
        max_tokens: 5,
        ..SamplingParams::greedy()
    };
    p.logit_bias.insert(eog, 1e4);
    let out = s
        .generate(&prompt, &p, |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!((out.tokens.len(), out.finish), (0, FinishReason::Eog(eog)));

    // A stop string taken from the reference text cuts the text before it.
    let full = s
        .generate(&prompt, &greedy(16), |_| ControlFlow::Continue(()))
        .unwrap();
    let chars: Vec<char> = full.text.chars().collect();
    assert!(chars.len() > 6, "reference text too short: {:?}", full.text);
    let stop: String = chars[3..6].iter().collect();
    let cut = full.text.find(&stop).unwrap();
    let p = SamplingParams {
        stop: vec![stop.clone()],
        ..greedy(16)
    };
    let mut streamed = String::new();
    let out = s
        .generate(&prompt, &p, |ev| {
            streamed.push_str(&ev.text);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(out.finish, FinishReason::StopString(0));
    assert_eq!(out.text, full.text[..cut]);
    assert_eq!(streamed, out.text);

    // The callback stops generation after three tokens.
    let mut seen = 0;
    let out = s
        .generate(&prompt, &greedy(16), |_| {
            seen += 1;
            if seen == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(
        (out.tokens.as_slice(), out.finish),
        (&want[..3], FinishReason::Cancelled)
    );
}

#[test]
fn seeded_sampling_is_reproducible() {
    let (prompt, _) = reference("gemma3-tiny", "24");
    let mut s = fixture_session("gemma3-tiny", SessionOptions::default());
    let p = |seed| SamplingParams {
        seed,
        max_tokens: 24,
        ignore_eos: true,
        top_k: 0,
        top_p: 1.0,
        ..Default::default()
    };
    let a = generate_ids(&mut s, &prompt, &p(1));
    let b = generate_ids(&mut s, &prompt, &p(1));
    let c = generate_ids(&mut s, &prompt, &p(2));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn long_prompts_error_or_truncate() {
    let (prompt, _) = reference("gemma3-tiny", "64");
    let mut s = fixture_session(
        "gemma3-tiny",
        SessionOptions {
            max_context: 32,
            ..Default::default()
        },
    );
    let err = s
        .generate(&prompt, &greedy(4), |_| ControlFlow::Continue(()))
        .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::PromptTooLong {
                prompt_len: 64,
                max_context: 32,
                ..
            }
        ),
        "{err}"
    );
    let opts = SessionOptions {
        max_context: 32,
        truncation: Truncation::KeepTail,
        ..Default::default()
    };
    let mut s = fixture_session("gemma3-tiny", opts);
    let out = s
        .generate(&prompt, &greedy(40), |_| ControlFlow::Continue(()))
        .unwrap();
    // Room for min(40, 32/2) = 16 new tokens: BOS + the last 15 prompt tokens.
    assert_eq!(out.stats.prompt_tokens, 16);
    assert_eq!(s.cached_tokens()[0], prompt[0]);
    assert_eq!(&s.cached_tokens()[1..16], &prompt[64 - 15..]);
    // 16 prompt + 16 fed tokens fill the 32 positions; the 17th token is
    // sampled from the last position and needs no KV row.
    assert_eq!(out.finish, FinishReason::ContextFull);
    assert_eq!(out.tokens.len(), 17);
}

#[test]
fn bad_prompts_are_errors() {
    let mut s = fixture_session("gemma3-tiny", SessionOptions::default());
    let empty: &[u32] = &[];
    assert!(matches!(s.logits(empty), Err(RuntimeError::EmptyPrompt)));
    let bad: &[u32] = &[2, 100_000];
    assert!(matches!(
        s.logits(bad),
        Err(RuntimeError::TokenOutOfVocab { id: 100_000, .. })
    ));
    let p = SamplingParams {
        top_p: 2.0,
        ..Default::default()
    };
    assert!(matches!(
        s.generate(Prompt::Tokens(&[2, 5]), &p, |_| ControlFlow::Continue(())),
        Err(RuntimeError::InvalidSamplingParam { name: "top_p", .. })
    ));
}

#[test]
fn fixture_chat_template_renders_through_the_session() {
    let s = fixture_session("gemma3-tiny", SessionOptions::default());
    assert_eq!(
        s.render_chat(&[ChatMessage::user("Hi")]).unwrap(),
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
}

/// llama.cpp's greedy ids for a prompt of `refdata/greedy.json`.
fn llama_cpp_greedy(name: &str) -> (String, Vec<u32>, Vec<u32>) {
    let text = std::fs::read_to_string(kiln_testdata::refdata("greedy.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let item = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == name)
        .unwrap();
    let ids = |k: &str| -> Vec<u32> {
        item[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    (
        item["prompt_text"].as_str().unwrap().to_string(),
        ids("prompt_ids"),
        ids("generated_ids"),
    )
}

#[test]
fn real_model_greedy_matches_llama_cpp() {
    let mut s = Session::load(kiln_testdata::real_model(), SessionOptions::default()).unwrap();
    assert_eq!(
        s.eog_ids()
            .iter()
            .filter(|&&id| id == 1 || id == 106)
            .count(),
        2
    );

    // Both prompts have no step with a top1-top2 margin below 0.75, so the
    // whole 48-token continuation must agree.
    let (text, ids, want) = llama_cpp_greedy("count");
    assert_eq!(s.tokenize(Prompt::Text(&text)).unwrap(), ids);
    let out = s
        .generate(text.as_str(), &greedy(want.len()), |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(out.tokens, want);
    assert!(out.text.starts_with(" 6, 7, 8, 9, 10,"), "{:?}", out.text);
    assert!(out.stats.decode_tokens_per_s() > 0.0 && out.stats.prefill_tokens_per_s() > 0.0);

    let (text, _, want) = llama_cpp_greedy("chat_mountain");
    let rendered = s
        .render_chat(&[ChatMessage::user(
            "What is the tallest mountain in the world?",
        )])
        .unwrap();
    assert_eq!(rendered, text);
    let out = s
        .generate(
            &rendered,
            &greedy(want.len()),
            |_| ControlFlow::Continue(()),
        )
        .unwrap();
    assert_eq!(out.tokens, want);
}
