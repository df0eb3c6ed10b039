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
