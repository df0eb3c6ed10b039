//! The CUDA sampling head against its CPU twin (`kiln_model::sample`):
//! on the tiny Gemma 3 fixture and a synthetic Gemma 3 270M Q4_K_M (the
//! real 262,144-entry vocabulary), the same ids for fixed seeds (teacher
//! forced, so one noise-level flip does not cascade; at most 2% of the
//! picks may differ, printed); the same logprobs within 1e-3; and a
//! request's sampled tokens identical alone and in a batch of 64, with
//! each batched decode step one graph launch. Needs a GPU, else one skip
//! line.

mod common;

use common::*;
use kiln_cuda::{CudaBackend, CudaStats};
use kiln_model::sample::{state_words, SampleSpec, Sampled};
use kiln_model::{Backend, BatchSeq, KvCache, Model, Output, Scratch};
use kiln_testdata::fixture;

/// Sampler specs covering the head's paths.
fn specs() -> Vec<SampleSpec> {
    let base = SampleSpec {
        temperature: 1.0,
        top_k: 64,
        top_p: 0.95,
        repetition_penalty: 1.0,
        seed: 5,
        ..Default::default()
    };
    vec![
        base.clone(),
        SampleSpec {
            temperature: 0.0,
            repetition_penalty: 1.3,
            presence_penalty: 0.5,
            penalty_last_n: 32,
            logit_bias: vec![(7, 3.0), (9, f32::NEG_INFINITY)],
            logprobs: 5,
            ..base.clone()
        },
        SampleSpec {
            temperature: 0.7,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.02,
            frequency_penalty: 0.3,
            penalty_last_n: 64,
            seed: 9,
            ..base.clone()
        },
        SampleSpec {
            temperature: 1.5,
            top_k: 256,
            top_p: 0.8,
            logprobs: 20,
            seed: 77,
            ..base
        },
    ]
}

/// One sequence: its cache, sampler state and the token it feeds next.
struct Stream<B: Backend> {
    cache: KvCache<B>,
    state: Option<B::Buf>,
    next: [u32; 1],
    output: Output,
    out: Vec<f32>,
}

impl<B: Backend> Stream<B> {
    fn new(m: &Model<B>, spec: Option<&SampleSpec>, prompt: &[u32], len: usize) -> Self {
        let mut cache = m.new_cache().unwrap();
        cache.reserve(m.backend(), len).unwrap();
        let state = spec.map(|sp| m.backend().upload(&state_words(sp, prompt)).unwrap());
        let output = spec.map_or(Output::Argmax, |sp| Output::Sample {
            logprobs: sp.logprobs,
        });
        Stream {
            cache,
            state,
            next: [0],
            output,
            out: Vec::new(),
        }
    }
}

/// One step of `streams`, each fed `feed[i]` (its prompt, or one token):
/// each one's id.
fn step<B: Backend>(
    m: &Model<B>,
    s: &mut Scratch<B>,
    streams: &mut [Stream<B>],
    feed: &[&[u32]],
) -> Vec<u32> {
    let mut batch: Vec<BatchSeq<'_, B>> = streams
        .iter_mut()
        .zip(feed)
        .map(|(st, tokens)| BatchSeq {
            tokens,
            cache: &mut st.cache,
            output: st.output,
            out: &mut st.out,
            sampler: st.state.as_mut(),
        })
        .collect();
    let r = m.forward_batch(&mut batch, s).unwrap();
    r.into_iter().map(|x| x.unwrap().unwrap()).collect()
}

/// A stream's ids (and output words) for `steps` tokens after `prompt`,
/// each step fed `force[t]` when given (teacher forcing), else its pick.
fn run<B: Backend>(
    m: &Model<B>,
    spec: &SampleSpec,
    prompt: &[u32],
    steps: usize,
    force: Option<&[u32]>,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut s = m.new_scratch(prompt.len()).unwrap();
    let mut st = [Stream::new(m, Some(spec), prompt, prompt.len() + steps)];
    let mut ids = step(m, &mut s, &mut st, &[prompt]);
    let mut outs = vec![st[0].out.clone()];
    for t in 1..steps {
        let tok = [force.map_or(ids[t - 1], |f| f[t - 1])];
        ids.extend(step(m, &mut s, &mut st, &[&tok]));
        outs.push(st[0].out.clone());
    }
    (ids, outs)
}

fn prompt(len: usize, vocab: usize) -> Vec<u32> {
    let mut r = Rng(len as u64 * 7 + 1);
    (0..len).map(|_| 2 + r.below(vocab - 2) as u32).collect()
}

/// CUDA picks the CPU twin's ids, teacher forced by the CPU's.
fn matches_cpu(what: &str, cuda: &Model<CudaBackend>, cpu: &Model<kiln_cpu::CpuBackend>) {
    let v = cpu.config.n_vocab;
    let p = prompt(24, v);
    let steps = 48;
    let (mut total, mut differ) = (0, 0);
    for (i, spec) in specs().iter().enumerate() {
        let (want, want_out) = run(cpu, spec, &p, steps, None);
        let (got, got_out) = run(cuda, spec, &p, steps, Some(&want));
        let d = want.iter().zip(&got).filter(|(a, b)| a != b).count();
        println!("{what} spec {i}: {d} of {steps} picks differ");
        (total, differ) = (total + steps, differ + d);
        for (t, (a, b)) in want_out.iter().zip(&got_out).enumerate() {
            if spec.logprobs == 0 || want[t] != got[t] {
                continue;
            }
            let (a, b) = (Sampled::parse(a), Sampled::parse(b));
            assert_eq!(a.top.len(), spec.logprobs);
            assert!((a.logprob - b.logprob).abs() < 1e-3, "{what} {i} step {t}");
            for (x, y) in a.top.iter().zip(&b.top) {
                assert!((x.1 - y.1).abs() < 1e-3, "{what} {i} step {t}: {x:?} {y:?}");
            }
        }
    }
    assert!(
        differ * 50 <= total,
        "{what}: {differ} of {total} picks differ"
    );
}

#[test]
fn sampling_head_matches_the_cpu_twin() {
    let Some(cuda) = backend() else {
        return;
    };
    let tiny = fixture("gemma3-tiny/model-f32.gguf");
    matches_cpu("tiny", &load(cuda, &tiny), &load(cpu(), &tiny));
    let path = synth_file("270m");
    let cuda = CudaBackend::new(0).unwrap();
    let big = kiln_cpu::CpuBackend::with_threads(0);
    matches_cpu("270m", &load(cuda, &path), &load(big, &path));
}

fn delta(a: CudaStats, b: CudaStats) -> [u64; 3] {
    [
        b.kernel_launches - a.kernel_launches,
        b.graph_launches - a.graph_launches,
        b.device_to_host - a.device_to_host,
    ]
}

/// Request 0 (temperature 1, top-k 64, top-p 0.95, seed 5) decodes `steps`
/// tokens among `n - 1` others (sampled with other seeds and specs, or
/// greedy); its tokens.
fn request_in_batch(m: &Model<CudaBackend>, n: usize, steps: usize) -> Vec<u32> {
    let v = m.config.n_vocab;
    let specs = specs();
    let prompts: Vec<Vec<u32>> = (0..n).map(|i| prompt(8 + i % 13, v)).collect();
    let mut streams: Vec<_> = (0..n)
        .map(|i| {
            let spec = (i % 5 != 4).then(|| SampleSpec {
                seed: i as u64 * 31,
                ..specs[i % specs.len()].clone()
            });
            let spec = if i == 0 { Some(specs[0].clone()) } else { spec };
            Stream::new(m, spec.as_ref(), &prompts[i], prompts[i].len() + steps)
        })
        .collect();
    let mut s = m.new_scratch(64).unwrap();
    for (i, st) in streams.iter_mut().enumerate() {
        let id = step(m, &mut s, std::slice::from_mut(st), &[&prompts[i]])[0];
        st.next = [id];
    }
    let mut mine = vec![streams[0].next[0]];
    let b = m.backend();
    let mut seen = std::collections::HashMap::new();
    for t in 1..steps {
        let kv_end = streams.iter().map(|st| st.cache.len() + 1).max().unwrap();
        let seen = seen.entry(kv_end.next_power_of_two()).or_insert(0);
        *seen += 1;
        let feed: Vec<[u32; 1]> = streams.iter().map(|st| st.next).collect();
        let feed: Vec<&[u32]> = feed.iter().map(|f| &f[..]).collect();
        let before = b.stats();
        let ids = step(m, &mut s, &mut streams, &feed);
        let d = delta(before, b.stats());
        if *seen >= 3 {
            // Past its key's warm-up and capture, a step is one graph
            // launch and one read of the ids (and one of the output words
            // of each request asking for logprobs).
            let lp = streams
                .iter()
                .filter(|st| matches!(st.output, Output::Sample { logprobs } if logprobs > 0));
            let want = [0, 1, 1 + lp.count() as u64];
            if t.is_power_of_two() || t == steps - 1 {
                println!("batch of {n}, step {t}: launches/graphs/reads {d:?}");
            }
            assert_eq!(d, want, "batch of {n}, step {t}");
        }
        for (st, id) in streams.iter_mut().zip(ids) {
            st.next = [id];
        }
        mine.push(streams[0].next[0]);
    }
    mine
}

#[test]
fn a_requests_samples_do_not_depend_on_its_batch() {
    let Some(cuda) = backend() else {
        return;
    };
    let m = load(cuda, &synth_file("270m"));
    let steps = 40;
    let alone = request_in_batch(&m, 1, steps);
    let batched = request_in_batch(&m, 64, steps);
    println!("alone:   {alone:?}\nbatched: {batched:?}");
    assert_eq!(alone, batched);
    let stats = m.backend().stats();
    println!(
        "graphs held {}, captures {}",
        stats.graphs_held, stats.graph_captures
    );
}
