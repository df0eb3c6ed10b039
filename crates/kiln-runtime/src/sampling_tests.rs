use super::*;

fn sampler(p: SamplingParams) -> Sampler {
    Sampler::new(p).expect("valid params")
}

/// Pearson chi-square statistic of `counts` against `probs` over `n` draws.
fn chi_square(counts: &[u64], probs: &[f64], n: u64) -> f64 {
    counts
        .iter()
        .zip(probs)
        .map(|(&o, &p)| {
            let e = p * n as f64;
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

/// Draws `n` samples from fresh copies of `logits` and checks the observed
/// frequencies against [`Sampler::distribution`] with a chi-square test.
/// The threshold is the 99.9% quantile for the given degrees of freedom, so a
/// correct sampler fails with probability 0.1%; the seed is fixed, so the
/// test is deterministic.
fn check_frequencies(params: SamplingParams, logits: &[f32], n: u64, chi2_999: &[f64]) {
    let mut s = sampler(params);
    let dist = s.distribution(&mut logits.to_vec()).unwrap();
    let total: f32 = dist.iter().map(|c| c.p).sum();
    assert!((total - 1.0).abs() < 1e-5, "distribution sums to {total}");
    let mut counts = vec![0u64; logits.len()];
    for _ in 0..n {
        let id = s.sample(&mut logits.to_vec()).unwrap();
        counts[id as usize] += 1;
    }
    let support: Vec<u32> = dist.iter().map(|c| c.id).collect();
    for (id, &c) in counts.iter().enumerate() {
        if !support.contains(&(id as u32)) {
            assert_eq!(c, 0, "token {id} was filtered out but sampled {c} times");
        }
    }
    let observed: Vec<u64> = dist.iter().map(|c| counts[c.id as usize]).collect();
    let probs: Vec<f64> = dist.iter().map(|c| c.p as f64).collect();
    let df = dist.len() - 1;
    assert!(df >= 1 && df <= chi2_999.len(), "test setup: df {df}");
    let stat = chi_square(&observed, &probs, n);
    assert!(
        stat < chi2_999[df - 1],
        "chi2 {stat:.2} >= {} (df {df}); observed {observed:?} expected p {probs:?}",
        chi2_999[df - 1]
    );
}

/// 99.9% quantiles of chi-square for df = 1..=10.
const CHI2_999: [f64; 10] = [
    10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59,
];

const LOGITS: [f32; 10] = [1.0, 2.5, 0.3, 2.4, -1.0, 0.0, 1.7, 3.0, -0.5, 0.9];

#[test]
fn frequencies_match_plain_softmax() {
    let p = SamplingParams {
        top_k: 0,
        top_p: 1.0,
        temperature: 1.0,
        seed: 11,
        ..Default::default()
    };
    // The plain distribution is the softmax of the raw logits.
    let mut s = sampler(p.clone());
    let dist = s.distribution(&mut LOGITS.to_vec()).unwrap();
    let z: f64 = LOGITS.iter().map(|&l| (l as f64).exp()).sum();
    for c in &dist {
        let want = (LOGITS[c.id as usize] as f64).exp() / z;
        assert!(
            (c.p as f64 - want).abs() < 1e-6,
            "token {}: {} vs {want}",
            c.id,
            c.p
        );
    }
    check_frequencies(p, &LOGITS, 50_000, &CHI2_999);
}

#[test]
fn frequencies_match_filtered_distribution() {
    let p = SamplingParams {
        temperature: 0.7,
        top_k: 6,
        top_p: 0.9,
        min_p: 0.05,
        seed: 3,
        ..Default::default()
    };
    let dist = sampler(p.clone())
        .distribution(&mut LOGITS.to_vec())
        .unwrap();
    // top-k 6 keeps {7, 1, 3, 6, 0, 9}; top-p 0.9 and min-p then cut the tail.
    let ids: Vec<u32> = dist.iter().map(|c| c.id).collect();
    assert_eq!(&ids[..3], &[7, 1, 3]);
    assert!(ids.len() < 6, "top-p must drop some of the 6: {ids:?}");
    check_frequencies(p, &LOGITS, 50_000, &CHI2_999);
}

#[test]
fn frequencies_match_typical() {
    let p = SamplingParams {
        top_k: 0,
        top_p: 1.0,
        typical_p: 0.8,
        seed: 5,
        ..Default::default()
    };
    check_frequencies(p, &LOGITS, 50_000, &CHI2_999);
}

#[test]
fn greedy_is_argmax_with_lowest_id_on_ties() {
    let mut s = sampler(SamplingParams::greedy());
    assert_eq!(s.sample(&mut [0.0, 5.0, 1.0, 5.0]).unwrap(), 1);
    assert_eq!(s.sample(&mut [-1.0, -1.0]).unwrap(), 0);
    // Temperature <= 0 with a bias is still greedy, on the biased logits.
    let mut p = SamplingParams::greedy();
    p.logit_bias.insert(1, f32::NEG_INFINITY);
    let mut s = sampler(p);
    assert_eq!(s.sample(&mut [0.0, 5.0, 1.0, 4.0]).unwrap(), 3);
}

#[test]
fn top_k_on_full_vocab_matches_a_full_sort() {
    const V: usize = 262_144;
    let mut rng = Rng::new(99);
    let logits: Vec<f32> = (0..V)
        .map(|_| (rng.next_f64() * 20.0 - 10.0) as f32)
        .collect();
    let p = SamplingParams {
        top_k: 40,
        top_p: 1.0,
        temperature: 1.0,
        ..Default::default()
    };
    let dist = sampler(p).distribution(&mut logits.clone()).unwrap();
    let mut order: Vec<u32> = (0..V as u32).collect();
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    let got: Vec<u32> = dist.iter().map(|c| c.id).collect();
    assert_eq!(got, order[..40]);
}

#[test]
fn top_p_without_top_k_on_full_vocab() {
    const V: usize = 262_144;
    let mut rng = Rng::new(5);
    let mut logits: Vec<f32> = (0..V).map(|_| (rng.next_f64() * 4.0) as f32).collect();
    // A peaked head: 10 tokens carry most of the mass.
    for i in 0..10 {
        logits[i * 1000] = 16.0 - i as f32;
    }
    let p = SamplingParams {
        top_k: 0,
        top_p: 0.5,
        temperature: 1.0,
        ..Default::default()
    };
    let dist = sampler(p).distribution(&mut logits.clone()).unwrap();
    // Reference: full sort, cumulative mass.
    let max = logits.iter().cloned().fold(f32::MIN, f32::max);
    let z: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let mut probs: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, ((l - max) as f64).exp() / z))
        .collect();
    probs.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut cum = 0.0;
    let mut want = Vec::new();
    for (id, p) in probs {
        want.push(id);
        cum += p;
        if cum >= 0.5 {
            break;
        }
    }
    let got: Vec<u32> = dist.iter().map(|c| c.id).collect();
    assert_eq!(got, want);
}

#[test]
fn repetition_penalty_scales_seen_tokens_only() {
    let p = SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::greedy()
    };
    let mut s = sampler(p);
    s.accept_all(&[0, 1]);
    let mut logits = vec![4.0, -4.0, 4.0, -4.0];
    s.distribution(&mut logits).unwrap();
    assert_eq!(logits, vec![2.0, -8.0, 4.0, -4.0]);
    // Greedy now prefers the unseen token 2 over the penalized 0.
    let mut s2 = s.clone();
    assert_eq!(s2.sample(&mut [4.0, -4.0, 3.0, -4.0]).unwrap(), 2);
}

#[test]
fn presence_and_frequency_penalties_count_occurrences() {
    let p = SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..SamplingParams::greedy()
    };
    let mut s = sampler(p);
    s.accept_all(&[2, 2, 2, 1]);
    let mut logits = vec![1.0; 4];
    s.distribution(&mut logits).unwrap();
    assert_eq!(logits, vec![1.0, 1.0 - 0.5 - 0.25, 1.0 - 0.5 - 0.75, 1.0]);
}

#[test]
fn penalty_window_forgets_old_tokens() {
    let p = SamplingParams {
        presence_penalty: 1.0,
        penalty_last_n: 2,
        ..SamplingParams::greedy()
    };
    let mut s = sampler(p);
    s.accept_all(&[0, 1, 2]);
    let mut logits = vec![0.0; 3];
    s.distribution(&mut logits).unwrap();
    // Token 0 slid out of the 2-token window.
    assert_eq!(logits, vec![0.0, -1.0, -1.0]);
    s.clear_history();
    let mut logits = vec![0.0; 3];
    s.distribution(&mut logits).unwrap();
    assert_eq!(logits, vec![0.0; 3]);
}

#[test]
fn logit_bias_bans_and_promotes() {
    let mut p = SamplingParams {
        top_k: 0,
        top_p: 1.0,
        seed: 1,
        ..Default::default()
    };
    p.logit_bias.insert(0, f32::NEG_INFINITY);
    p.logit_bias.insert(2, 3.0);
    let mut s = sampler(p);
    let dist = s.distribution(&mut [5.0, 0.0, 0.0]).unwrap();
    assert!(dist.iter().all(|c| c.id != 0));
    let p2 = dist.iter().find(|c| c.id == 2).unwrap().p;
    let want = 3f32.exp() / (1.0 + 3f32.exp());
    assert!((p2 - want).abs() < 1e-6);
    for _ in 0..200 {
        assert_ne!(s.sample(&mut [5.0, 0.0, 0.0]).unwrap(), 0);
    }
}

#[test]
fn same_seed_same_sequence_different_seed_differs() {
    let logits: Vec<f32> = (0..1000)
        .map(|i| ((i * 7919) % 1000) as f32 / 200.0)
        .collect();
    let run = |seed| {
        let mut s = sampler(SamplingParams {
            seed,
            top_k: 0,
            top_p: 1.0,
            ..Default::default()
        });
        (0..64)
            .map(|_| s.sample(&mut logits.clone()).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

#[test]
fn bad_inputs_are_errors() {
    let bad = [
        SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        },
        SamplingParams {
            min_p: 1.5,
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 0.0,
            ..Default::default()
        },
        SamplingParams {
            stop: vec![String::new()],
            ..Default::default()
        },
    ];
    for p in bad {
        assert!(matches!(
            Sampler::new(p),
            Err(RuntimeError::InvalidSamplingParam { .. })
        ));
    }
    let mut s = sampler(SamplingParams::default());
    assert!(matches!(
        s.sample(&mut [0.0, f32::NAN]),
        Err(RuntimeError::NonFiniteLogit { index: 1, .. })
    ));
    assert!(matches!(
        s.sample(&mut [f32::NEG_INFINITY; 3]),
        Err(RuntimeError::NoCandidate)
    ));
    let mut p = SamplingParams::default();
    p.logit_bias.insert(10, 1.0);
    assert!(matches!(
        sampler(p).sample(&mut [0.0; 3]),
        Err(RuntimeError::TokenOutOfVocab {
            id: 10,
            vocab_size: 3
        })
    ));
}

#[test]
fn serde_round_trip_and_defaults() {
    let p: SamplingParams = serde_json::from_str("{}").unwrap();
    assert_eq!(p, SamplingParams::default());
    let mut q = SamplingParams::greedy();
    q.logit_bias.insert(106, -2.5);
    q.stop = vec!["</s>".into()];
    let text = serde_json::to_string(&q).unwrap();
    assert_eq!(serde_json::from_str::<SamplingParams>(&text).unwrap(), q);
}
