//! Requests sampled by the model's sampling head
//! ([`kiln_model::Output::Sample`]): the head's spec of a request, or why
//! the request is sampled on the host from downloaded logits instead.

use kiln_model::sample::SampleSpec;

use crate::sampling::SamplingParams;

/// The sampling head's spec for `params` with `logprobs` top logprobs over
/// `n_vocab` logits, or why the host samples it: the head implements every
/// filter but typical-p, top-p without top-k (a sort of the whole
/// vocabulary), top-k above 256, more than 20 logprobs and penalty windows
/// above 1024 tokens; an output constraint masks the logits on the host.
pub fn head_spec(
    params: &SamplingParams,
    logprobs: Option<usize>,
    constrained: bool,
    n_vocab: usize,
) -> Result<SampleSpec, &'static str> {
    if constrained {
        return Err("an output constraint masks the logits on the host");
    }
    if params.typical_p < 1.0 && params.temperature > 0.0 {
        return Err("typical-p sorts the whole vocabulary");
    }
    let spec = SampleSpec {
        temperature: params.temperature,
        top_k: params.top_k,
        top_p: params.top_p,
        min_p: params.min_p,
        repetition_penalty: params.repetition_penalty,
        presence_penalty: params.presence_penalty,
        frequency_penalty: params.frequency_penalty,
        penalty_last_n: params.penalty_last_n,
        logit_bias: params.logit_bias.iter().map(|(&i, &b)| (i, b)).collect(),
        seed: params.seed,
        logprobs: logprobs.unwrap_or(0),
    };
    match spec.unsupported(n_vocab) {
        Some(why) => Err(why),
        None => Ok(spec),
    }
}

#[cfg(test)]
mod tests {
    use kiln_model::sample::{sample_row, state_words, Sampled, OUT};

    use super::*;
    use crate::engine::token_logprob_for_tests as token_logprob;
    use crate::rng::Rng;
    use crate::sampling::Sampler;

    /// Logits with ties and banned tokens, a few near the top.
    fn logits(rng: &mut Rng, v: usize) -> Vec<f32> {
        (0..v)
            .map(|i| match rng.next_u64() % 50 {
                0 => f32::NEG_INFINITY,
                1 => 2.0,
                _ => ((rng.next_f64() * 8.0 - 4.0) as f32) + (i % 3) as f32 * 0.25,
            })
            .collect()
    }

    /// The twin picks what `Sampler` picks, token after token (penalty
    /// ring and random stream advancing alike), with the same logprobs.
    #[test]
    fn the_head_twin_samples_like_the_host_sampler() {
        let mut rng = Rng::new(3);
        let v = 700;
        let mut cases = 0;
        for case in 0..400u64 {
            let pick = |n: u64| (case / n) as usize;
            let params = SamplingParams {
                temperature: [0.0, 0.5, 1.0, 1.7][pick(1) % 4],
                top_k: [0, 1, 5, 40, 256, 900][pick(4) % 6],
                top_p: [1.0, 0.9, 0.5][pick(24) % 3],
                min_p: [0.0, 0.05][pick(72) % 2],
                repetition_penalty: [1.0, 1.3][pick(144) % 2],
                presence_penalty: [0.0, 0.4][pick(2) % 2],
                frequency_penalty: [0.0, 0.2][pick(3) % 2],
                penalty_last_n: [0, 8, 64][pick(5) % 3],
                logit_bias: [(3, 2.5), (10, f32::NEG_INFINITY), (699, 1.0)]
                    .into_iter()
                    .take(pick(7) % 4)
                    .collect(),
                seed: case,
                ..Default::default()
            };
            let lp = [None, Some(1), Some(5)][pick(11) % 3];
            let Ok(spec) = head_spec(&params, lp, false, v) else {
                continue;
            };
            cases += 1;
            let history: Vec<u32> = (0..20).map(|i| (i * 37 % v) as u32).collect();
            let mut host = Sampler::new(params.clone()).unwrap();
            host.accept_all(&history);
            let mut state = state_words(&spec, &history);
            for step in 0..6 {
                let row = logits(&mut rng, v);
                let (mut a, mut b) = (row.clone(), row);
                let want = host.sample(&mut a).unwrap();
                let got = sample_row(&mut b, &mut state);
                assert_eq!(got, want, "case {case} step {step}: {params:?}");
                if let Some(k) = lp {
                    let want = token_logprob(&a, want, k);
                    let out = Sampled::parse(&state[OUT..OUT + 2 + 2 * k]);
                    assert_eq!(out.id, want.id);
                    assert_eq!(out.logprob, want.logprob, "case {case}");
                    assert_eq!(out.top, want.top, "case {case}");
                }
                host.accept(want);
            }
        }
        assert!(cases > 250, "{cases} cases ran");
    }

    #[test]
    fn host_only_samplers_say_why() {
        let p = SamplingParams::default();
        assert!(head_spec(&p, None, false, 1000).is_ok());
        assert!(head_spec(&p, None, true, 1000).is_err());
        assert!(head_spec(&p, Some(21), false, 1000).is_err());
        let typical = SamplingParams {
            typical_p: 0.5,
            ..p.clone()
        };
        assert!(head_spec(&typical, None, false, 1000).is_err());
        let nucleus = SamplingParams { top_k: 0, ..p };
        assert!(head_spec(&nucleus, None, false, 1000).is_err());
    }
}
