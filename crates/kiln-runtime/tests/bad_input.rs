//! Bad requests and bad models give clear errors, never panics; prefix
//! reuse rewinds the cache. Tiny fixture models only (fast).

use std::ops::ControlFlow;
use std::sync::Arc;

use kiln_cpu::CpuBackend;
use kiln_gguf::{write::GgufWriter, Gguf, Value};
use kiln_model::ModelError;
use kiln_runtime::{perplexity, Prompt, RuntimeError, SamplingParams, Session, SessionOptions};

fn tiny_gguf() -> Gguf {
    Gguf::open(kiln_testdata::fixture("gemma3-tiny/model-f32.gguf")).unwrap()
}

fn session(opts: SessionOptions) -> Session<CpuBackend> {
    Session::with_backend(CpuBackend::new(), Arc::new(tiny_gguf()), opts).unwrap()
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        max_tokens: n,
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

/// The fixture re-written with `edit` applied to each (name, data) tensor
/// and `arch` as `general.architecture`.
fn rewritten(arch: &str, edit: impl Fn(&str, usize, &mut [u8])) -> Arc<Gguf> {
    let g = tiny_gguf();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        let v = if k == "general.architecture" {
            Value::String(arch.into())
        } else {
            v.clone()
        };
        w.metadata(k.clone(), v);
    }
    for t in g.tensor_infos() {
        let mut data = g.tensor(&t.name).unwrap().data.to_vec();
        edit(&t.name, t.dims[0] as usize, &mut data);
        w.tensor(t.name.clone(), &t.dims, t.ty, data).unwrap();
    }
    Arc::new(Gguf::from_bytes(w.to_bytes().unwrap()).unwrap())
}

#[test]
fn empty_prompts_are_errors_everywhere() {
    let mut s = session(SessionOptions::default());
    let empty: &[u32] = &[];
    assert!(matches!(s.logits(empty), Err(RuntimeError::EmptyPrompt)));
    assert!(matches!(
        s.logits_all(empty),
        Err(RuntimeError::EmptyPrompt)
    ));
    assert!(matches!(
        s.embed(empty, true),
        Err(RuntimeError::EmptyPrompt)
    ));
    let r = s.generate(empty, &greedy(4), |_| ControlFlow::Continue(()));
    assert!(matches!(r, Err(RuntimeError::EmptyPrompt)));
    // The session still works afterwards.
    assert_eq!(s.logits(Prompt::Tokens(&[2, 5])).unwrap().len(), 768);
}

#[test]
fn prompt_over_the_context_is_an_error() {
    let mut s = session(SessionOptions {
        max_context: 32,
        ..Default::default()
    });
    let long: Vec<u32> = (0..40).map(|i| 2 + i).collect();
    let r = s.generate(&long, &greedy(4), |_| ControlFlow::Continue(()));
    match r {
        Err(e @ RuntimeError::PromptTooLong { prompt_len: 40, .. }) => {
            assert!(e.to_string().contains("exceeds the context of 32"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.logits(&long),
        Err(RuntimeError::PromptTooLong { .. })
    ));
}

#[test]
fn max_tokens_zero_is_an_error() {
    let mut s = session(SessionOptions::default());
    let r = s.generate(Prompt::Tokens(&[2, 5]), &greedy(0), |_| {
        ControlFlow::Continue(())
    });
    match r {
        Err(
            e @ RuntimeError::InvalidSamplingParam {
                name: "max_tokens", ..
            },
        ) => assert!(e.to_string().contains("max_tokens = 0"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn other_architectures_are_refused_by_name() {
    // A full Gemma file relabelled as llama.
    let g = rewritten("llama", |_, _, _| {});
    let r = Session::with_backend(CpuBackend::new(), g, SessionOptions::default());
    match r {
        Err(e @ RuntimeError::Model(ModelError::UnsupportedArch(_))) => {
            assert!(e.to_string().contains("\"llama\""), "{e}")
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a llama file loaded"),
    }
    // A bare file with only the architecture key, through Session::load.
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("llama".into()));
    let path = std::env::temp_dir().join(format!("kiln-llama-{}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes().unwrap()).unwrap();
    let r = Session::load(&path, SessionOptions::default());
    let _ = std::fs::remove_file(&path);
    assert!(
        matches!(r, Err(RuntimeError::Model(ModelError::UnsupportedArch(ref a))) if a == "llama"),
        "{:?}",
        r.err()
    );
}

#[test]
fn nan_logits_name_the_step() {
    // Row 300 of the tied embedding is NaN: so is logit 300 everywhere.
    let g = rewritten("gemma3", |name, cols, data| {
        if name == "token_embd.weight" {
            for c in 0..cols {
                let at = (300 * cols + c) * 4;
                data[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
            }
        }
    });
    let mut s = Session::with_backend(CpuBackend::new(), g, SessionOptions::default()).unwrap();
    let r = s.generate(Prompt::Tokens(&[2, 5]), &greedy(4), |_| {
        ControlFlow::Continue(())
    });
    match r {
        Err(
            e @ RuntimeError::NonFiniteLogit {
                step: 0,
                index: 300,
                ..
            },
        ) => assert!(e.to_string().starts_with("NaN in logits at step 0"), "{e}"),
        other => panic!("{other:?}"),
    }
    let e = s.logits(Prompt::Tokens(&[2, 5])).unwrap_err();
    assert!(e.to_string().starts_with("NaN in logits at step 0"), "{e}");
    let e = s.logits_all(Prompt::Tokens(&[2, 5])).unwrap_err();
    assert!(e.to_string().contains("NaN in logits at position 0"), "{e}");
    let toks: Vec<u32> = (0..64).map(|i| 2 + i).collect();
    let e = perplexity(&mut s, &toks, 16).unwrap_err();
    assert!(e.to_string().contains("NaN in logits"), "{e}");
}

#[test]
fn perplexity_rejects_bad_contexts() {
    let mut s = session(SessionOptions {
        max_context: 64,
        ..Default::default()
    });
    let toks: Vec<u32> = (0..100).map(|i| 2 + i).collect();
    for n_ctx in [0, 3, 65] {
        assert!(
            matches!(
                perplexity(&mut s, &toks, n_ctx),
                Err(RuntimeError::InvalidOption { name: "n_ctx", .. })
            ),
            "n_ctx {n_ctx}"
        );
    }
    // 100 tokens: at least 2 chunks of 64 are needed.
    assert!(perplexity(&mut s, &toks[..100], 64).is_err());
    assert!(matches!(
        perplexity(&mut s, &[2, 5, 900, 7, 8, 9, 10, 11], 4),
        Err(RuntimeError::TokenOutOfVocab { id: 900, .. })
    ));
}

#[test]
fn perplexity_scores_the_second_half_of_each_chunk() {
    let mut s = session(SessionOptions {
        max_prefill: 8, // chunks of 32 run as 4 prefill batches
        ..Default::default()
    });
    let toks: Vec<u32> = (0..70).map(|i| 2 + (i * 13) % 700).collect();
    let r = perplexity(&mut s, &toks, 32).unwrap();
    assert_eq!((r.n_chunks, r.n_scored), (2, 2 * 15));
    // The same by hand from full logits of each BOS-led chunk.
    let v = 768;
    let mut nll = 0.0;
    for k in 0..2 {
        let mut chunk = toks[k * 32..(k + 1) * 32].to_vec();
        chunk[0] = 2;
        let all = s.logits_all(&chunk).unwrap();
        for j in 16..31 {
            nll += kiln_runtime::perplexity::nll(&all[j * v..(j + 1) * v], chunk[j + 1]);
        }
        if k == 0 {
            assert!((r.running_ppl[0] - (nll / 15.0).exp()).abs() < 1e-6 * r.running_ppl[0]);
        }
    }
    let want = (nll / 30.0).exp();
    assert!((r.ppl - want).abs() < 1e-6 * want, "{} vs {want}", r.ppl);
}

/// The per-chunk callback sees every running PPL in order; a cap of one
/// chunk is allowed once the text holds 2 chunks (llama.cpp's rule).
#[test]
fn perplexity_with_reports_each_chunk_and_caps_the_count() {
    let mut s = session(SessionOptions::default());
    let toks: Vec<u32> = (0..100).map(|i| 2 + (i * 13) % 700).collect();
    let mut seen = Vec::new();
    let r = s
        .perplexity_with(&toks, 32, None, |k, n, p| seen.push((k, n, p)))
        .unwrap();
    assert_eq!(r.n_chunks, 3);
    let want: Vec<_> = (0..3).map(|k| (k, 3, r.running_ppl[k])).collect();
    assert_eq!(seen, want);
    assert_eq!(s.perplexity(&toks, 32).unwrap(), r);

    seen.clear();
    let one = s
        .perplexity_with(&toks, 32, Some(1), |k, n, p| seen.push((k, n, p)))
        .unwrap();
    assert_eq!((one.n_chunks, one.n_scored), (1, 15));
    assert_eq!(one.running_ppl, r.running_ppl[..1]);
    assert_eq!(seen, [(0, 1, one.ppl)]);
    // A cap above the text's chunks scores them all.
    let all = s.perplexity_with(&toks, 32, Some(9), |_, _, _| {}).unwrap();
    assert_eq!(all, r);
    // The 2-chunk minimum holds whatever the cap; a cap of 0 is refused.
    assert!(matches!(
        s.perplexity_with(&toks[..63], 32, Some(1), |_, _, _| {}),
        Err(RuntimeError::InvalidOption { name: "n_ctx", .. })
    ));
    assert!(matches!(
        s.perplexity_with(&toks, 32, Some(0), |_, _, _| {}),
        Err(RuntimeError::InvalidOption {
            name: "max_chunks",
            ..
        })
    ));
}

#[test]
fn diverging_prompt_rewinds_to_the_common_prefix() {
    let mut s = session(SessionOptions::default());
    let a: Vec<u32> = (0..12).map(|i| 2 + i * 7).collect();
    let mut b = a[..7].to_vec();
    b.extend([500, 501, 502]);
    s.logits(&a).unwrap();
    let out = s
        .generate(&b, &greedy(3), |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(out.stats.reused_tokens, 7);
    assert_eq!(out.stats.prefill_tokens, 3);
    let mut fresh = session(SessionOptions::default());
    let want = fresh
        .generate(&b, &greedy(3), |_| ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(out.tokens, want.tokens);
    let rewound = {
        s.logits(&a).unwrap();
        s.logits(&b).unwrap()
    };
    let d = rewound
        .iter()
        .zip(fresh.logits(&b).unwrap())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(d < 1e-5, "{d}");
    assert_eq!(s.cached_tokens(), &b[..]);
}
