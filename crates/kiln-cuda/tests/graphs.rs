//! Graph replay: greedy decode through `Output::Argmax` (each step keyed by
//! its KV bucket) gives the same ids as the uncaptured logits path, and
//! inside a bucket every step after the capture is one graph launch, one
//! copy of the step's inputs and one 4-byte read, with no kernel launched
//! on its own; crossing into a new bucket warms up, then captures one new
//! graph. Needs a GPU, else one skip line.

mod common;

use common::*;
use kiln_cuda::CudaStats;
use kiln_model::Output;
use kiln_testdata::fixture;

fn delta(a: CudaStats, b: CudaStats) -> [u64; 5] {
    [
        b.kernel_launches - a.kernel_launches,
        b.graph_launches - a.graph_launches,
        b.graph_captures - a.graph_captures,
        b.host_to_device - a.host_to_device,
        b.device_to_host - a.device_to_host,
    ]
}

#[test]
fn decode_replays_one_graph_per_bucket() {
    let Some(c) = backend() else { return };
    for model in ["gemma3-tiny", "gemma2-tiny", "gemma4-e2b-tiny"] {
        let m = load(
            kiln_cuda::CudaBackend::new(0).unwrap(),
            &fixture(&format!("{model}/model-f32.gguf")),
        );
        let prompt = ids(&json(&fixture(&format!("{model}/logits_seq5.json")))["input_ids"]);
        let steps = 40;
        let (want, _) = greedy(&m, &prompt, steps, false);

        let mut cache = m.new_cache().unwrap();
        let mut s = m.new_scratch(prompt.len()).unwrap();
        let b = m.backend();
        let mut next = prompt.clone();
        let mut got = Vec::new();
        let mut seen_in_bucket = std::collections::HashMap::new();
        for step in 0..steps {
            let before = b.stats();
            let id = m
                .forward(&next, &mut cache, &mut s, Output::Argmax, &mut Vec::new())
                .unwrap()
                .expect("argmax output");
            let d = delta(before, b.stats());
            got.push(id);
            next = vec![id];
            if step == 0 {
                continue; // the prompt: no graph
            }
            // The step's position is prompt + step - 1; its key's bucket
            // holds kv_end = position + 1.
            let bucket = (prompt.len() + step).next_power_of_two();
            let seen = seen_in_bucket.entry(bucket).or_insert(0);
            *seen += 1;
            match *seen - 1 {
                0 => assert!(d[0] > 0 && d[1] == 0, "{model} step {step}: warm-up {d:?}"),
                1 => assert_eq!(d[1..3], [1, 1], "{model} step {step}: capture {d:?}"),
                _ => assert_eq!(d, [0, 1, 0, 1, 1], "{model} step {step}: replay {d:?}"),
            }
        }
        assert_eq!(
            got, want,
            "{model}: replayed ids vs the uncaptured logits path"
        );
        println!(
            "{model}: {steps} greedy ids equal; {} graphs held",
            b.stats().graphs_held
        );
    }
    drop(c);
}

/// A sequence of the batched test: its prompt (a slice of the fixture's
/// tokens), the step it joins at and the greedy tokens the CPU gives it
/// alone, with each one's top-1 minus top-2 logit margin.
struct Stream {
    prompt: Vec<u32>,
    join: usize,
    ids: Vec<u32>,
    margins: Vec<f32>,
}

/// The CPU's greedy continuation of `prompt`, `steps` tokens, alone.
fn cpu_greedy(
    m: &kiln_model::Model<kiln_cpu::CpuBackend>,
    prompt: &[u32],
    steps: usize,
) -> (Vec<u32>, Vec<f32>) {
    let (ids, logits) = greedy(m, prompt, steps, false);
    let margins = logits
        .iter()
        .map(|row| {
            let top = argmax(row);
            let second = row
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != top)
                .map(|(_, &x)| x)
                .fold(f32::NEG_INFINITY, f32::max);
            row[top] - second
        })
        .collect();
    (ids, margins)
}

/// Decode steps of several sequences at once (`forward_batch`, greedy
/// rows): sequences join and leave between steps, so the batch crosses
/// row buckets (padded to 1, 2, 4, 8) and KV buckets. Each sequence is
/// fed the CPU's tokens (teacher forcing) and its batched greedy id must
/// equal the CPU's alone wherever the CPU's margin is >= 1e-3. The whole
/// schedule runs twice: the second time (fresh caches, other buffers)
/// every step is exactly one graph launch, one copy of the step inputs
/// and one read of the ids, with no kernel launched on its own. Then a
/// new KV bucket: one warm-up, one capture, then replays.
#[test]
fn batched_decode_replays_one_graph_per_bucket() {
    let Some(c) = backend() else { return };
    drop(c);
    for model in ["gemma3-tiny", "gemma2-tiny", "gemma4-e2b-tiny"] {
        let path = fixture(&format!("{model}/model-f32.gguf"));
        let m = load(kiln_cuda::CudaBackend::new(0).unwrap(), &path);
        let cpu = load(kiln_cpu::CpuBackend::with_threads(2), &path);
        let tokens = ids(&json(&fixture(&format!("{model}/logits_seq64.json")))["input_ids"]);
        // (prompt start, prompt length, join step, decode steps): 1 to 7
        // sequences at once, ragged lengths past the 16-row windows.
        let plan = [
            (0, 5, 0, 30),
            (3, 20, 2, 12),
            (10, 33, 4, 20),
            (1, 9, 5, 8),
            (7, 3, 6, 22),
            (20, 17, 9, 10),
            (30, 26, 10, 6),
        ];
        let streams: Vec<Stream> = plan
            .iter()
            .map(|&(at, len, join, steps)| {
                let prompt = tokens[at..at + len].to_vec();
                let (ids, margins) = cpu_greedy(&cpu, &prompt, steps + 1);
                Stream {
                    prompt,
                    join,
                    ids,
                    margins,
                }
            })
            .collect();
        let mut s = m.new_scratch(64).unwrap();
        // Pass 0 grows the workspaces (which drops the graphs captured
        // before); pass 1 sees every key again with none dropped; pass 2
        // must replay (or, a key seen once before, capture) every step.
        for pass in 0..3 {
            let mut seen = std::collections::HashMap::new();
            let mut caches: Vec<_> = streams.iter().map(|_| m.new_cache().unwrap()).collect();
            let mut fed = vec![0usize; streams.len()];
            let last = streams
                .iter()
                .map(|st| st.join + st.ids.len())
                .max()
                .unwrap();
            for step in 0..last {
                // Joining sequences take their prompt alone (uncaptured).
                for (i, st) in streams.iter().enumerate() {
                    if st.join == step {
                        let id = m
                            .forward(
                                &st.prompt,
                                &mut caches[i],
                                &mut s,
                                Output::Argmax,
                                &mut Vec::new(),
                            )
                            .unwrap()
                            .unwrap();
                        check_id(model, i, 0, id, st);
                    }
                }
                let active: Vec<usize> = (0..streams.len())
                    .filter(|&i| step > streams[i].join && fed[i] + 1 < streams[i].ids.len())
                    .collect();
                if active.is_empty() {
                    continue;
                }
                let toks: Vec<[u32; 1]> =
                    active.iter().map(|&i| [streams[i].ids[fed[i]]]).collect();
                let mut outs: Vec<Vec<f32>> = vec![Vec::new(); active.len()];
                let mut batch: Vec<kiln_model::BatchSeq<'_, _>> = Vec::new();
                let mut rest: &mut [_] = &mut caches;
                let mut base = 0;
                for ((&i, tok), out) in active.iter().zip(&toks).zip(outs.iter_mut()) {
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(i - base);
                    let (cache, tail) = tail.split_first_mut().unwrap();
                    rest = tail;
                    base = i + 1;
                    batch.push(kiln_model::BatchSeq {
                        tokens: tok,
                        cache,
                        output: Output::Argmax,
                        out,
                        sampler: None,
                    });
                }
                let kv_end = batch.iter().map(|q| q.cache.len() + 1).max().unwrap();
                let key = (active.len().next_power_of_two(), kv_end.next_power_of_two());
                let b = m.backend();
                let before = b.stats();
                let results = m.forward_batch(&mut batch, &mut s).unwrap();
                let d = delta(before, b.stats());
                drop(batch);
                for (&i, r) in active.iter().zip(results) {
                    fed[i] += 1;
                    check_id(model, i, fed[i], r.unwrap().unwrap(), &streams[i]);
                }
                let n = active.len();
                let what = format!("{model} pass {pass} step {step} ({n} sequences, key {key:?})");
                let seen = seen.entry(key).or_insert(0);
                *seen += 1;
                if pass < 2 {
                    assert!(d[1] <= 1 && d[2] <= 1, "{what}: {d:?}");
                } else if *seen == 1 && d[2] == 1 {
                    assert_eq!(d[1..], [1, 1, 1, 1], "{what}: capture {d:?}");
                } else {
                    assert_eq!(d, [0, 1, 0, 1, 1], "{what}: replay {d:?}");
                }
            }
        }
        // A KV bucket no step has seen: two sequences decode past 64.
        let mut caches: Vec<_> = (0..2).map(|_| m.new_cache().unwrap()).collect();
        let mut next = [0u32; 2];
        for (i, cache) in caches.iter_mut().enumerate() {
            let p = &tokens[i..i + 62];
            next[i] = m
                .forward(p, cache, &mut s, Output::Argmax, &mut Vec::new())
                .unwrap()
                .unwrap();
        }
        let b = m.backend();
        for k in 0..5 {
            let (c0, c1) = caches.split_at_mut(1);
            let toks = [[next[0]], [next[1]]];
            let mut outs = [Vec::new(), Vec::new()];
            let [o0, o1] = &mut outs;
            let mut batch = [
                kiln_model::BatchSeq {
                    tokens: &toks[0],
                    cache: &mut c0[0],
                    output: Output::Argmax,
                    out: o0,
                    sampler: None,
                },
                kiln_model::BatchSeq {
                    tokens: &toks[1],
                    cache: &mut c1[0],
                    output: Output::Argmax,
                    out: o1,
                    sampler: None,
                },
            ];
            let before = b.stats();
            let r = m.forward_batch(&mut batch, &mut s).unwrap();
            let d = delta(before, b.stats());
            for (n, r) in next.iter_mut().zip(r) {
                *n = r.unwrap().unwrap();
            }
            // Positions 62..67: kv_end 63, 64 (bucket 64, seen), then 65..
            // (bucket 128, new).
            match k {
                0 | 1 => assert!(d[1] <= 1, "{model} bucket 64 step {k}: {d:?}"),
                2 => assert!(d[0] > 0 && d[1] == 0, "{model} bucket 128 warm-up: {d:?}"),
                3 => assert_eq!(d[1..3], [1, 1], "{model} bucket 128 capture: {d:?}"),
                _ => assert_eq!(d, [0, 1, 0, 1, 1], "{model} bucket 128 replay: {d:?}"),
            }
        }
        println!(
            "{model}: batched greedy ids equal the CPU's alone; {} graphs held",
            b.stats().graphs_held
        );
    }
}

/// Asserts a batched id equals the CPU's alone unless the CPU's margin is
/// under 1e-3 (then either pick is right).
fn check_id(model: &str, seq: usize, t: usize, id: u32, st: &Stream) {
    if st.margins[t] >= 1e-3 {
        assert_eq!(id, st.ids[t], "{model} sequence {seq} token {t}");
    }
}
