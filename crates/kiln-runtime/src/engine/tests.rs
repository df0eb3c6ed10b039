//! Scheduler tests on the tiny Gemma 3 fixture (8 layers, a 16-token
//! sliding window, 768-token vocab): batched results equal single-sequence
//! `Session` results, seeds are independent of batch mates, and the queue,
//! budget, cancellation and prefix cache behave.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_cpu::CpuBackend;
use kiln_gguf::Gguf;
use kiln_model::Model;
use kiln_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedReceiver;

use super::*;
use crate::{Session, SessionOptions};

fn fixture_path() -> std::path::PathBuf {
    kiln_testdata::fixture("gemma3-tiny/model-f32.gguf")
}

fn start(cfg: EngineConfig) -> (Engine, Arc<Tokenizer>) {
    let gguf = Arc::new(Gguf::open(fixture_path()).unwrap());
    let tok = Arc::new(Tokenizer::from_gguf(&gguf).unwrap());
    let engine = Engine::start(
        move || Ok(Model::load(CpuBackend::with_threads(1), gguf)?),
        tok.clone(),
        cfg,
    );
    engine.wait_ready().unwrap();
    (engine, tok)
}

/// Every event of a job, in order, until its sender closes.
fn collect(mut rx: UnboundedReceiver<Event>) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        out.push(ev);
    }
    out
}

/// (token ids, text, finish) of choice `c`.
fn choice(events: &[Event], c: usize) -> (Vec<u32>, String, Done) {
    let mut ids = Vec::new();
    let mut text = String::new();
    let mut done = None;
    for ev in events {
        match ev {
            Event::Token(t) if t.choice == c => {
                ids.extend(t.id);
                text.push_str(&t.text);
            }
            Event::Done(d) if d.choice == c => done = Some(d.clone()),
            Event::Failed { index, error } if *index == c => panic!("choice {c} failed: {error}"),
            _ => {}
        }
    }
    (ids, text, done.expect("a Done event"))
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

/// Prompts of different lengths (one longer than the sliding window and
/// than a 8-token step budget, so it prefills in chunks across steps).
fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    [
        "Hello",
        "The quick brown fox jumps over the lazy dog",
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen",
        "a",
    ]
    .iter()
    .map(|p| tok.encode(p, true, true))
    .collect()
}

#[test]
fn batched_greedy_equals_session_generate() {
    let mut session = Session::load(fixture_path(), SessionOptions::default()).unwrap();
    let (engine, tok) = start(EngineConfig {
        step_tokens: 8,
        ..Default::default()
    });
    let prompts = prompts(&tok);
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let job = GenerateJob::new(p.clone(), greedy(12));
            engine.submit(Job::Generate(job)).unwrap()
        })
        .collect();
    for (p, rx) in prompts.iter().zip(rxs) {
        let (ids, text, done) = choice(&collect(rx), 0);
        let want = session
            .generate(p, &greedy(12), |_| std::ops::ControlFlow::Continue(()))
            .unwrap();
        assert_eq!(ids, want.tokens, "prompt {p:?}");
        assert_eq!(text, want.text);
        assert_eq!(done.completion_tokens, 12);
        assert_eq!(done.prompt_tokens, p.len());
        assert_eq!(done.finish, FinishReason::Length);
    }
}

#[test]
fn seeded_sampling_does_not_depend_on_batch_mates() {
    let (engine, tok) = start(EngineConfig::default());
    let params = SamplingParams {
        temperature: 1.5,
        top_k: 0,
        top_p: 1.0,
        seed: 42,
        max_tokens: 16,
        ignore_eos: true,
        ..Default::default()
    };
    let prompt = tok.encode("Once upon a time", true, true);
    let alone = {
        let job = GenerateJob {
            n: 2,
            ..GenerateJob::new(prompt.clone(), params.clone())
        };
        collect(engine.submit(Job::Generate(job)).unwrap())
    };
    // The same job again, now among other requests.
    let others: Vec<_> = prompts(&tok)
        .into_iter()
        .map(|p| {
            let job = GenerateJob::new(
                p,
                SamplingParams {
                    seed: 7,
                    ..params.clone()
                },
            );
            engine.submit(Job::Generate(job)).unwrap()
        })
        .collect();
    let job = GenerateJob {
        n: 2,
        ..GenerateJob::new(prompt, params)
    };
    let mixed = collect(engine.submit(Job::Generate(job)).unwrap());
    others.into_iter().for_each(|rx| drop(collect(rx)));
    for c in 0..2 {
        assert_eq!(choice(&alone, c).0, choice(&mixed, c).0, "choice {c}");
    }
    // Choices use different seeds (seed + index).
    assert_ne!(choice(&alone, 0).0, choice(&alone, 1).0);
}

#[test]
fn prefix_cache_reuses_the_shared_prompt_and_gives_the_same_tokens() {
    let (engine, tok) = start(EngineConfig::default());
    // With its generated tokens, shorter than the 16-token window, so the
    // rewind is allowed.
    let base = tok.encode("Paris is", true, true);
    assert!(base.len() + 4 < 16);
    let first = collect(
        engine
            .submit(Job::Generate(GenerateJob::new(base.clone(), greedy(4))))
            .unwrap(),
    );
    let mut longer = base.clone();
    longer.extend(tok.encode(" a city", false, false));
    let again = collect(
        engine
            .submit(Job::Generate(GenerateJob::new(longer.clone(), greedy(4))))
            .unwrap(),
    );
    let (ids, _, done) = choice(&again, 0);
    assert_eq!(choice(&first, 0).2.cached_tokens, 0);
    assert_eq!(done.cached_tokens, base.len());
    let mut session = Session::load(fixture_path(), SessionOptions::default()).unwrap();
    let want = session
        .generate(&longer, &greedy(4), |_| std::ops::ControlFlow::Continue(()))
        .unwrap();
    assert_eq!(ids, want.tokens);
    assert!(engine.metrics().prefix_hit_tokens.load(Ordering::Relaxed) >= base.len() as u64);
}

#[test]
fn a_rewind_the_ring_refuses_recomputes_with_the_same_result() {
    let (engine, tok) = start(EngineConfig::default());
    let long: Vec<u32> = tok.encode("word ".repeat(30), true, true);
    drop(collect(
        engine
            .submit(Job::Generate(GenerateJob::new(long.clone(), greedy(2))))
            .unwrap(),
    ));
    // Shares 5 tokens with the cached 30+: the 16-row rings overwrote them.
    let mut diverging = long[..5].to_vec();
    diverging.extend(tok.encode(" other words here", false, false));
    let (ids, _, done) = choice(
        &collect(
            engine
                .submit(Job::Generate(GenerateJob::new(
                    diverging.clone(),
                    greedy(3),
                )))
                .unwrap(),
        ),
        0,
    );
    assert_eq!(done.cached_tokens, 0);
    let mut session = Session::load(fixture_path(), SessionOptions::default()).unwrap();
    let want = session
        .generate(&diverging, &greedy(3), |_| {
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(ids, want.tokens);
}

#[test]
fn kv_bytes_predicts_the_reserved_cache() {
    let gguf = Arc::new(Gguf::open(fixture_path()).unwrap());
    let model = Model::load(CpuBackend::with_threads(1), gguf).unwrap();
    for n in [1, 15, 16, 17, 300] {
        let mut c = model.new_cache().unwrap();
        c.reserve(model.backend(), n).unwrap();
        assert_eq!(
            kv_bytes(&model.config, n),
            c.allocated_bytes(),
            "{n} positions"
        );
    }
}

#[test]
fn limits_default_from_the_budget() {
    let gguf = Gguf::open(fixture_path()).unwrap();
    let cfg = kiln_model::ModelConfig::from_gguf(&gguf).unwrap();
    let per_seq = kv_bytes(&cfg, 1024);
    let l = scheduler::Limits::resolve(
        &EngineConfig {
            kv_budget_bytes: 3 * per_seq + 1,
            ..Default::default()
        },
        &cfg,
        None,
    );
    assert_eq!(
        (l.parallel, l.max_context, l.max_queue, l.step_tokens),
        (3, 1024, 64, 256)
    );
    // On a device the default budget is half the free memory, and up to
    // 64 sequences run by default.
    let free = 200 * per_seq;
    let l = scheduler::Limits::resolve(&EngineConfig::default(), &cfg, Some(free));
    assert_eq!(l.kv_budget_bytes, (free / 2).max(1 << 30));
    assert_eq!(
        l.parallel,
        (l.kv_budget_bytes / kv_bytes(&cfg, l.max_context)).clamp(1, 64)
    );
    // A narrow model (the fixture) prefills 960 prompt tokens a step on a
    // device, 256 on the CPU; a 4B-wide one 256 everywhere.
    assert_eq!(l.step_tokens, 960);
    let cpu = scheduler::Limits::resolve(&EngineConfig::default(), &cfg, None);
    assert_eq!(cpu.kv_budget_bytes, 1 << 30);
    assert!(cpu.parallel <= 16);
    assert_eq!(cpu.step_tokens, 256);
    let wide = kiln_model::ModelConfig {
        n_embd: 2560,
        ..cfg.clone()
    };
    let l = scheduler::Limits::resolve(&EngineConfig::default(), &wide, Some(free));
    assert_eq!(l.step_tokens, 256);
}

#[test]
fn embeddings_equal_session_embed() {
    let (engine, tok) = start(EngineConfig {
        step_tokens: 4,
        ..Default::default()
    });
    let inputs = prompts(&tok);
    let mut session = Session::load(fixture_path(), SessionOptions::default()).unwrap();
    for pooling in [Pooling::Mean, Pooling::Last] {
        let job = EmbedJob {
            inputs: inputs.clone(),
            pooling,
        };
        let events = collect(engine.submit(Job::Embed(job)).unwrap());
        assert_eq!(events.len(), inputs.len());
        for ev in events {
            let Event::Embedding {
                index,
                vector,
                prompt_tokens,
            } = ev
            else {
                panic!("unexpected {ev:?}");
            };
            assert_eq!(prompt_tokens, inputs[index].len());
            let want = session
                .embed(&inputs[index], pooling == Pooling::Mean)
                .unwrap();
            let want = want.mean.unwrap_or(want.last);
            let diff = vector
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(diff < 1e-4, "input {index} {pooling:?}: max diff {diff}");
        }
    }
}

#[test]
fn a_full_queue_is_busy_and_bad_jobs_fail_alone() {
    let (engine, tok) = start(EngineConfig {
        parallel: 1,
        max_queue: 2,
        ..Default::default()
    });
    let p = tok.encode("Hello", true, true);
    let long = || Job::Generate(GenerateJob::new(p.clone(), greedy(200)));
    let a = engine.submit(long()).unwrap();
    // Wait until `a` runs, so the queue holds only what follows.
    let t0 = Instant::now();
    while engine.metrics().running.load(Ordering::Relaxed) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(1));
    }
    let b = engine.submit(long()).unwrap();
    let c = engine.submit(long()).unwrap();
    assert!(matches!(
        engine.submit(long()),
        Err(SubmitError::Busy { limit: 2, .. })
    ));
    drop((a, b, c));
    while engine.metrics().waiting.load(Ordering::Relaxed) > 0 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(1));
    }
    // A prompt longer than the context fails by itself.
    let too_long = Job::Generate(GenerateJob::new(vec![2; 2000], greedy(1)));
    let events = collect(engine.submit(too_long).unwrap());
    assert!(matches!(
        &events[..],
        [Event::Failed {
            error: EngineError::Invalid(_),
            ..
        }]
    ));
    let ok = collect(
        engine
            .submit(Job::Generate(GenerateJob::new(p, greedy(3))))
            .unwrap(),
    );
    assert_eq!(choice(&ok, 0).2.completion_tokens, 3);
}

#[test]
fn a_dropped_receiver_cancels_within_a_step_and_frees_the_slot() {
    let (engine, tok) = start(EngineConfig {
        parallel: 1,
        ..Default::default()
    });
    let p = tok.encode("Hello", true, true);
    let mut rx = engine
        .submit(Job::Generate(GenerateJob::new(p.clone(), greedy(100_000))))
        .unwrap();
    assert!(matches!(rx.blocking_recv(), Some(Event::Token(_))));
    drop(rx);
    let t0 = Instant::now();
    while engine.metrics().cancelled.load(Ordering::Relaxed) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "not cancelled");
        std::thread::sleep(Duration::from_millis(1));
    }
    let next = collect(
        engine
            .submit(Job::Generate(GenerateJob::new(p, greedy(2))))
            .unwrap(),
    );
    assert_eq!(choice(&next, 0).2.completion_tokens, 2);
    // The gauge is published after the step that sent the last event, so
    // it may lag the receiver by one loop turn.
    let t0 = Instant::now();
    while engine.metrics().running.load(Ordering::Relaxed) != 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "slot not freed");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn logprobs_are_a_log_softmax_with_the_pick_on_top_when_greedy() {
    let (engine, tok) = start(EngineConfig::default());
    let job = GenerateJob {
        logprobs: Some(3),
        ..GenerateJob::new(tok.encode("Hello", true, true), greedy(5))
    };
    let events = collect(engine.submit(Job::Generate(job)).unwrap());
    let mut n = 0;
    for ev in &events {
        if let Event::Token(TokenOut {
            id: Some(id),
            logprob: Some(lp),
            ..
        }) = ev
        {
            n += 1;
            assert_eq!(lp.id, *id);
            assert_eq!(lp.top.len(), 3);
            assert_eq!(lp.top[0], (*id, lp.logprob));
            assert!(lp.logprob <= 0.0 && lp.top[1].1 <= lp.top[0].1);
        }
    }
    assert_eq!(n, 5);
}

#[test]
fn stop_strings_end_the_choice_and_are_not_emitted() {
    let (engine, tok) = start(EngineConfig::default());
    let p = tok.encode("Hello", true, true);
    let (_, text, _) = choice(
        &collect(
            engine
                .submit(Job::Generate(GenerateJob::new(p.clone(), greedy(12))))
                .unwrap(),
        ),
        0,
    );
    // Stop at a piece of what greedy decoding produces.
    let stop: String = text.chars().skip(2).take(3).collect();
    assert!(!stop.is_empty(), "generated {text:?}");
    let params = SamplingParams {
        stop: vec![stop.clone()],
        ..greedy(12)
    };
    let (_, cut, done) = choice(
        &collect(
            engine
                .submit(Job::Generate(GenerateJob::new(p, params)))
                .unwrap(),
        ),
        0,
    );
    assert_eq!(done.finish, FinishReason::StopString(0));
    assert_eq!(cut, text[..text.find(&stop).unwrap()]);
}

/// Sampled requests (penalties, bias, top-k/top-p/min-p) go through the
/// model's sampling head; their tokens equal `Session::generate`'s, whose
/// host `Sampler` draws from downloaded logits.
#[test]
fn head_sampled_requests_equal_session_generate() {
    let mut session = Session::load(fixture_path(), SessionOptions::default()).unwrap();
    let (engine, tok) = start(EngineConfig {
        step_tokens: 8,
        ..Default::default()
    });
    let params = |i: u64| SamplingParams {
        temperature: [0.0, 0.8, 1.3][i as usize % 3],
        top_k: [0, 40, 5][i as usize % 3],
        top_p: [1.0, 0.9, 1.0][i as usize % 3],
        min_p: [0.0, 0.0, 0.05][i as usize % 3],
        repetition_penalty: 1.2,
        frequency_penalty: 0.3,
        presence_penalty: 0.2,
        logit_bias: [(5, 2.0), (6, f32::NEG_INFINITY)].into_iter().collect(),
        seed: 11 + i,
        max_tokens: 12,
        ignore_eos: true,
        ..Default::default()
    };
    let prompts = prompts(&tok);
    let rxs: Vec<_> = (0..prompts.len())
        .map(|i| {
            let job = GenerateJob::new(prompts[i].clone(), params(i as u64));
            engine.submit(Job::Generate(job)).unwrap()
        })
        .collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        let (ids, _, _) = choice(&collect(rx), 0);
        let p = params(i as u64);
        assert!(crate::device_sample::head_spec(&p, None, false, 768).is_ok());
        let want = session
            .generate(&prompts[i], &p, |_| std::ops::ControlFlow::Continue(()))
            .unwrap();
        assert_eq!(ids, want.tokens, "prompt {i}");
    }
}
