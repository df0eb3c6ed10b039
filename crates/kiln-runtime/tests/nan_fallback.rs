//! A non-finite value in a step (forced with `KILN_INJECT_NAN`, alone in
//! this binary because it sets the variable): on a CUDA GPU the step is
//! redone on the CPU and the session continues there with the CPU's
//! tokens; on the CPU it is a clear error, and the session stays usable.
//! Runs the CUDA case when a GPU opens, else the CPU case and one skip
//! line for the other.

use std::ops::ControlFlow;
use std::sync::Arc;

use kiln_cpu::CpuBackend;
use kiln_gguf::Gguf;
use kiln_runtime::{Device, RuntimeError, SamplingParams, Session, SessionOptions};

const MODEL: &str = "gemma3-tiny/model-f32.gguf";
const PROMPT: &str = "The quick brown fox";

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        max_tokens: n,
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

fn tokens<B: kiln_model::Backend>(s: &mut Session<B>) -> Result<Vec<u32>, RuntimeError> {
    s.generate(PROMPT, &greedy(12), |_| ControlFlow::Continue(()))
        .map(|g| g.tokens)
}

#[test]
fn a_non_finite_step_is_redone_on_the_cpu_or_reported() {
    let path = kiln_testdata::fixture(MODEL);
    // The reference, on the CPU backend directly (not counted by the
    // injection, which lives in the device layer).
    let gguf = Arc::new(Gguf::open(&path).unwrap());
    let mut reference =
        Session::with_backend(CpuBackend::new(), gguf, SessionOptions::default()).unwrap();
    let want = tokens(&mut reference).unwrap();
    // The prompt is forward 1; forward 4 is the third decode step.
    // SAFETY (edition 2021: safe): no other test runs in this binary.
    std::env::set_var("KILN_INJECT_NAN", "4");
    let cuda = SessionOptions {
        device: Device::Cuda(0),
        ..SessionOptions::default()
    };
    match Session::load(&path, cuda) {
        Ok(mut s) => {
            let got = tokens(&mut s).expect("redone on the CPU");
            let why = s.fell_back().expect("the session says it left the GPU");
            println!("{why}");
            assert!(
                why.contains("non-finite value in the step of token"),
                "{why}"
            );
            assert!(why.contains("at position"), "{why}");
            assert_eq!(s.backend().kind(), "CPU", "the rest runs on the CPU");
            assert_eq!(got, want);
        }
        Err(e) => {
            println!("skipped: no CUDA device ({e}); checking the CPU case");
            let cpu = SessionOptions {
                device: Device::Cpu,
                ..SessionOptions::default()
            };
            let mut s = Session::load(&path, cpu).unwrap();
            let err = tokens(&mut s).expect_err("the CPU has no fallback");
            let msg = err.to_string();
            println!("{msg}");
            assert!(
                matches!(
                    err,
                    RuntimeError::NonFiniteHidden | RuntimeError::NonFiniteLogit { step: 3, .. }
                ),
                "{msg}"
            );
            assert!(s.fell_back().is_none());
            // The cache still matches its tokens: the same request again
            // (the injection is spent) gives the reference.
            assert_eq!(tokens(&mut s).unwrap(), want);
        }
    }
}
