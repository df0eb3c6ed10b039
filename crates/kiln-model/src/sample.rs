//! The sampling head's per-sequence state and its scalar reference.
//!
//! A sequence sampled by the head ([`Backend::sample_head`]) keeps its whole
//! sampler in one backend buffer of 32-bit words ([`state_words`]): its
//! parameters, its `logit_bias`, its random stream (xoshiro256**, [`Rng`])
//! and a ring of its last `penalty_last_n` tokens. The head reads it, picks
//! the row's token and updates it in place (pushes the token, advances the
//! stream), so a step replayed as a graph needs nothing from the host but
//! which buffer each row uses. [`sample_row`] is the algorithm on the host:
//! the CPU backend runs it, device kernels are tested against it, and the
//! runtime's tests hold it to `kiln_runtime::Sampler` (same ids).
//!
//! The order is the runtime sampler's: `logit_bias`, repetition / presence
//! / frequency penalties over the ring, then greedy (argmax, ties → lowest
//! id) or temperature, top-k, top-p, min-p and one draw. A row whose logits
//! hold NaN or +inf after that, or no finite logit, gets id `u32::MAX`.
//!
//! [`Backend::sample_head`]: crate::Backend::sample_head

use crate::rng::Rng;

/// Most `top_k` the head keeps (a sampler with more, or with none and
/// `top_p < 1`, needs a sort of the whole vocabulary: the host does it).
pub const TOPK_MAX: usize = 256;
/// Most top logprobs the head reports per token.
pub const LOGPROBS_MAX: usize = 20;
/// Most tokens the penalty ring holds.
pub const PENALTY_MAX: usize = 1024;

// Word offsets of the state (mirrored in kiln-cuda's kernels/sample.cu).
const TEMP: usize = 0;
const TOPK: usize = 1;
const TOPP: usize = 2;
const MINP: usize = 3;
const REP: usize = 4;
const PRES: usize = 5;
const FREQ: usize = 6;
const LAST_N: usize = 7;
const N_BIAS: usize = 8;
const N_LOGPROBS: usize = 9;
const SEEN: usize = 10;
const RNG: usize = 12;
/// The head's output: id, its logprob, then (id, logprob) pairs.
pub const OUT: usize = 20;
const RING: usize = OUT + 2 + 2 * LOGPROBS_MAX;

/// What the head samples with: the subset of a request's sampling
/// parameters it implements (see [`SampleSpec::unsupported`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampleSpec {
    /// `<= 0`: greedy.
    pub temperature: f32,
    /// 0: no top-k.
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// The ring's length; 0 (or neutral penalties): no penalties.
    pub penalty_last_n: usize,
    /// Added to the logit of each id (`-inf` bans it); ids distinct.
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
    /// Top logprobs to report (0: none; the token's own is reported when
    /// this is at least 1).
    pub logprobs: usize,
}

impl SampleSpec {
    fn has_penalties(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repetition_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }

    /// Why the head cannot run this sampler over `n_vocab` logits (the
    /// caller samples on the host then), or None.
    pub fn unsupported(&self, n_vocab: usize) -> Option<&'static str> {
        let all = self.top_k == 0 || self.top_k >= n_vocab;
        if self.temperature > 0.0 && all && self.top_p < 1.0 {
            Some("top_p without top_k sorts the whole vocabulary")
        } else if self.temperature > 0.0 && !all && self.top_k > TOPK_MAX {
            Some("top_k above the head's 256")
        } else if self.logprobs > LOGPROBS_MAX {
            Some("more than 20 top logprobs")
        } else if self.has_penalties() && self.penalty_last_n > PENALTY_MAX {
            Some("a penalty window above 1024 tokens")
        } else if self
            .logit_bias
            .iter()
            .any(|&(id, _)| id as usize >= n_vocab)
        {
            Some("a logit_bias id outside the vocabulary")
        } else {
            None
        }
    }
}

/// The state of a sequence sampled by `spec` whose tokens so far (prompt
/// and generated) are `history`, as f32-typed words (bit patterns).
pub fn state_words(spec: &SampleSpec, history: &[u32]) -> Vec<f32> {
    let last_n = if spec.has_penalties() {
        spec.penalty_last_n
    } else {
        0
    };
    let nb = spec.logit_bias.len();
    let mut w = vec![0u32; RING + last_n + 2 * nb];
    w[TEMP] = spec.temperature.to_bits();
    w[TOPK] = spec.top_k.min(u32::MAX as usize) as u32;
    w[TOPP] = spec.top_p.to_bits();
    w[MINP] = spec.min_p.to_bits();
    w[REP] = spec.repetition_penalty.to_bits();
    w[PRES] = spec.presence_penalty.to_bits();
    w[FREQ] = spec.frequency_penalty.to_bits();
    w[LAST_N] = last_n as u32;
    w[N_BIAS] = nb as u32;
    w[N_LOGPROBS] = spec.logprobs.min(LOGPROBS_MAX) as u32;
    w[SEEN] = history.len() as u32;
    for (i, s) in Rng::new(spec.seed).state().into_iter().enumerate() {
        w[RNG + 2 * i] = s as u32;
        w[RNG + 2 * i + 1] = (s >> 32) as u32;
    }
    if last_n > 0 {
        let first = history.len().saturating_sub(last_n);
        for (i, &t) in history.iter().enumerate().skip(first) {
            w[RING + i % last_n] = t;
        }
    }
    for (j, &(id, b)) in spec.logit_bias.iter().enumerate() {
        w[RING + last_n + j] = id;
        w[RING + last_n + nb + j] = b.to_bits();
    }
    w.into_iter().map(f32::from_bits).collect()
}

/// The token and logprobs the head wrote to a state's output words
/// (`state[OUT..]`, `2 + 2k` of them for `k` top logprobs).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub id: u32,
    pub logprob: f32,
    /// Descending, ties to the lowest id.
    pub top: Vec<(u32, f32)>,
}

impl Sampled {
    /// Parses `2 + 2k` output words.
    pub fn parse(out: &[f32]) -> Sampled {
        let id = out.first().map_or(u32::MAX, |w| w.to_bits());
        let logprob = out.get(1).copied().unwrap_or(f32::NAN);
        let top = out
            .get(2..)
            .unwrap_or(&[])
            .chunks_exact(2)
            .map(|p| (p[0].to_bits(), p[1]))
            .collect();
        Sampled { id, logprob, top }
    }
}

/// Top logprobs a state asks for.
pub fn logprobs_asked(state: &[f32]) -> usize {
    state.get(N_LOGPROBS).map_or(0, |w| w.to_bits() as usize)
}

/// A candidate after the filters: id, scaled logit, probability.
#[derive(Clone, Copy, Debug)]
struct Cand {
    id: u32,
    logit: f32,
    p: f32,
}

/// Samples one row: `logits` (softcapped already) is modified in place
/// (bias, penalties), `state` advanced and its output words written.
/// Returns the id, `u32::MAX` for a row that cannot be sampled.
pub fn sample_row(logits: &mut [f32], state: &mut [f32]) -> u32 {
    let mut w: Vec<u32> = state.iter().map(|x| x.to_bits()).collect();
    let f = |i: usize| f32::from_bits(w[i]);
    let (last_n, nb) = (w[LAST_N] as usize, w[N_BIAS] as usize);
    let bias0 = RING + last_n;
    for j in 0..nb {
        if let Some(l) = logits.get_mut(w[bias0 + j] as usize) {
            *l += f32::from_bits(w[bias0 + nb + j]);
        }
    }
    if last_n > 0 {
        let n = (w[SEEN] as usize).min(last_n);
        let mut ring = w[RING..RING + n].to_vec();
        ring.sort_unstable();
        let (rep, pres, freq) = (f(REP), f(PRES), f(FREQ));
        for run in ring.chunk_by(|a, b| a == b) {
            let Some(l) = logits.get_mut(run[0] as usize) else {
                continue;
            };
            *l = if *l > 0.0 { *l / rep } else { *l * rep };
            *l -= run.len() as f32 * freq + pres;
        }
    }
    if !sampleable(logits) {
        return u32::MAX;
    }
    let temp = f(TEMP);
    let mut rng = Rng::from_state(std::array::from_fn(|i| {
        u64::from(w[RNG + 2 * i]) | u64::from(w[RNG + 2 * i + 1]) << 32
    }));
    let id = if temp <= 0.0 {
        greedy(logits)
    } else {
        draw(logits, temp, w[TOPK] as usize, f(TOPP), f(MINP), &mut rng)
    };
    if id == u32::MAX {
        return id;
    }
    for (i, s) in rng.state().into_iter().enumerate() {
        w[RNG + 2 * i] = s as u32;
        w[RNG + 2 * i + 1] = (s >> 32) as u32;
    }
    if last_n > 0 {
        let at = RING + w[SEEN] as usize % last_n;
        w[at] = id;
    }
    w[SEEN] = w[SEEN].wrapping_add(1);
    w[OUT] = id;
    let k = w[N_LOGPROBS] as usize;
    if k > 0 {
        let (lp, top) = logprobs(logits, id, k);
        w[OUT + 1] = lp.to_bits();
        for (j, (t, l)) in top.into_iter().enumerate() {
            w[OUT + 2 + 2 * j] = t;
            w[OUT + 3 + 2 * j] = l.to_bits();
        }
    }
    for (s, x) in state.iter_mut().zip(w) {
        *s = f32::from_bits(x);
    }
    id
}

/// Whether no logit is NaN or +inf.
fn sampleable(logits: &[f32]) -> bool {
    !logits.iter().any(|l| l.is_nan() || *l == f32::INFINITY)
}

/// The head's pick for a row without a sampler: its first maximum, or
/// `u32::MAX` when a logit is NaN or +inf or every one is `-inf`.
pub fn argmax_row(logits: &[f32]) -> u32 {
    if sampleable(logits) {
        greedy(logits)
    } else {
        u32::MAX
    }
}

/// The first maximum (lowest id); `u32::MAX` when every logit is `-inf`.
fn greedy(logits: &[f32]) -> u32 {
    let (mut best, mut at) = (f32::NEG_INFINITY, u32::MAX);
    for (i, &l) in logits.iter().enumerate() {
        if l > best {
            (best, at) = (l, i as u32);
        }
    }
    at
}

/// Temperature, top-k, top-p, min-p and the draw (see the module doc).
fn draw(logits: &[f32], temp: f32, top_k: usize, top_p: f32, min_p: f32, rng: &mut Rng) -> u32 {
    let inv_t = 1.0 / temp;
    let finite = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| **l != f32::NEG_INFINITY);
    let sorted = top_k > 0 && top_k < logits.len();
    let mut c: Vec<Cand> = if sorted {
        let mut raw: Vec<(u32, f32)> = finite.map(|(i, &l)| (i as u32, l)).collect();
        raw.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        raw.truncate(top_k);
        let mut c: Vec<Cand> = raw
            .into_iter()
            .map(|(id, l)| Cand {
                id,
                logit: l * inv_t,
                p: 0.0,
            })
            .collect();
        c.sort_unstable_by(|a, b| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id)));
        c
    } else {
        finite
            .map(|(i, &l)| Cand {
                id: i as u32,
                logit: l * inv_t,
                p: 0.0,
            })
            .collect()
    };
    if c.is_empty() {
        return u32::MAX;
    }
    let max = c.iter().map(|x| x.logit).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for x in c.iter_mut() {
        x.p = (x.logit - max).exp();
        sum += x.p as f64;
    }
    scale(&mut c, (1.0 / sum) as f32);
    if top_p < 1.0 && sorted {
        let mut cum = 0.0f64;
        let keep = c
            .iter()
            .position(|x| {
                cum += x.p as f64;
                cum >= top_p as f64
            })
            .map_or(c.len(), |i| i + 1);
        c.truncate(keep);
        renormalize(&mut c);
    }
    if min_p > 0.0 {
        let max_p = if sorted {
            c[0].p
        } else {
            c.iter().map(|x| x.p).fold(0.0, f32::max)
        };
        let threshold = min_p * max_p;
        c.retain(|x| x.p >= threshold);
        renormalize(&mut c);
    }
    let total: f64 = c.iter().map(|x| x.p as f64).sum();
    let mut u = rng.next_f64() * total;
    for x in &c {
        u -= x.p as f64;
        if u < 0.0 {
            return x.id;
        }
    }
    c.last().map_or(u32::MAX, |x| x.id)
}

fn scale(c: &mut [Cand], inv: f32) {
    c.iter_mut().for_each(|x| x.p *= inv);
}

fn renormalize(c: &mut [Cand]) {
    let sum: f64 = c.iter().map(|x| x.p as f64).sum();
    if sum > 0.0 {
        scale(c, (1.0 / sum) as f32);
    }
}

/// `id`'s log-probability under log-softmax(`logits`) and the `k` most
/// likely tokens' (descending, ties to the lowest id), in f64: the host
/// sampler's logprobs and this head's.
pub fn logprobs(logits: &[f32], id: u32, k: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .map(|&z| (f64::from(z) - f64::from(max)).exp())
        .sum();
    let lse = f64::from(max) + sum.ln();
    let lp = |z: f32| (f64::from(z) - lse) as f32;
    let own = logits
        .get(id as usize)
        .map_or(f32::NEG_INFINITY, |&z| lp(z));
    let top = top_logits(logits, k);
    (own, top.into_iter().map(|(i, z)| (i, lp(z))).collect())
}

/// The `k` largest logits with their ids, descending; ties keep the
/// lowest id first; NaN is skipped.
pub fn top_logits(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &z) in logits.iter().enumerate() {
        if k == 0 || z.is_nan() || (top.len() == k && z <= top[k - 1].1) {
            continue;
        }
        let at = top.partition_point(|&(_, v)| v >= z);
        top.insert(at, (i as u32, z));
        top.truncate(k);
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_logits_are_descending_with_ties_to_the_lowest_id() {
        let z = [0.5, 3.0, f32::NAN, 3.0, -1.0, 2.0, 7.0];
        assert_eq!(top_logits(&z, 3), vec![(6, 7.0), (1, 3.0), (3, 3.0)]);
        assert_eq!(top_logits(&z, 0), vec![]);
        assert_eq!(top_logits(&[1.0], 5), vec![(0, 1.0)]);
    }

    fn spec() -> SampleSpec {
        SampleSpec {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            repetition_penalty: 1.0,
            seed: 7,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_bias_and_penalties_move_the_argmax() {
        let mut s = SampleSpec {
            temperature: 0.0,
            logit_bias: vec![(0, 5.0)],
            ..spec()
        };
        let mut st = state_words(&s, &[]);
        assert_eq!(sample_row(&mut [1.0, 3.0, 2.0], &mut st), 0);
        s.logit_bias.clear();
        s.presence_penalty = 2.0;
        s.penalty_last_n = 4;
        let mut st = state_words(&s, &[1]);
        assert_eq!(sample_row(&mut [1.0, 3.0, 2.0], &mut st), 2);
        // The ring took 2: now both 1 and 2 are penalized.
        assert_eq!(sample_row(&mut [1.0, 3.0, 2.5], &mut st), 0);
    }

    #[test]
    fn same_seed_same_draws_and_the_stream_advances() {
        let logits = vec![0.0f32; 16];
        let s = SampleSpec { top_k: 0, ..spec() };
        let (mut a, mut b) = (state_words(&s, &[]), state_words(&s, &[]));
        let xs: Vec<u32> = (0..8)
            .map(|_| sample_row(&mut logits.clone(), &mut a))
            .collect();
        let ys: Vec<u32> = (0..8)
            .map(|_| sample_row(&mut logits.clone(), &mut b))
            .collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().any(|&x| x != xs[0]), "{xs:?}");
    }

    #[test]
    fn bad_rows_and_logprobs() {
        let mut st = state_words(&spec(), &[]);
        assert_eq!(sample_row(&mut [0.0, f32::NAN], &mut st), u32::MAX);
        let all_banned = &mut [f32::NEG_INFINITY; 4];
        assert_eq!(sample_row(all_banned, &mut st), u32::MAX);
        let s = SampleSpec {
            temperature: 0.0,
            logprobs: 2,
            ..spec()
        };
        let mut st = state_words(&s, &[]);
        let id = sample_row(&mut [0.0, 2.0, 2.0, -1.0], &mut st);
        let got = Sampled::parse(&st[OUT..OUT + 6]);
        assert_eq!((id, got.id), (1, 1));
        assert_eq!(got.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
        assert!((got.logprob - got.top[0].1).abs() < 1e-7);
        assert_eq!(logprobs_asked(&st), 2);
    }

    #[test]
    fn unsupported_samplers_are_named() {
        let s = SampleSpec {
            top_k: 0,
            top_p: 0.9,
            ..spec()
        };
        assert!(s.unsupported(100).is_some());
        assert!(spec().unsupported(100).is_none());
        let big = SampleSpec {
            top_k: 300,
            ..spec()
        };
        assert!(big.unsupported(1000).is_some());
    }
}
