//! Token sampling: request parameters ([`SamplingParams`]) and a stateful
//! [`Sampler`] that turns one logits row into one token id.
//!
//! The pipeline follows llama.cpp's sampler chain, with temperature applied
//! before the truncation filters (as HF transformers and vLLM do, so that
//! `top_p` acts on the distribution that is actually sampled):
//!
//! 1. `logit_bias` (added; `-inf` bans a token),
//! 2. repetition / presence / frequency penalties over the last
//!    `penalty_last_n` accepted tokens,
//! 3. greedy shortcut when `temperature <= 0`: argmax, ties → lowest id,
//! 4. temperature, top-k, top-p, min-p, typical-p,
//! 5. a draw from the remaining candidates with a seeded [`Rng`].
//!
//! Cost on a 262,144-entry vocab: biases and penalties are sparse; top-k is a
//! single pass with a k-element heap (no full sort); without top-k, top-p
//! grows a partially selected prefix (`select_nth_unstable`) until it holds
//! the requested mass, so a full sort happens only for typical-p.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};
use crate::rng::Rng;

/// Parameters of one generation request.
///
/// `Default` gives the Gemma model-card settings (temperature 1.0, top-k 64,
/// top-p 0.95; GEMMA.md §2.3) with every other filter and penalty neutral.
/// Deserializing fills missing fields from `Default`, so `{}` is valid JSON.
///
/// ```
/// use kiln_runtime::SamplingParams;
/// let p: SamplingParams = serde_json::from_str(
///     r#"{"temperature": 0.7, "logit_bias": {"106": -100.0}, "stop": ["\n\n"]}"#,
/// ).unwrap();
/// assert_eq!(p.top_k, 64);
/// assert_eq!(p.logit_bias[&106], -100.0);
/// p.validate().unwrap();
/// assert!(SamplingParams::greedy().is_greedy());
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set whose probability mass reaches `top_p`; 1 disables.
    pub top_p: f32,
    /// Drop tokens with probability below `min_p` × the top probability; 0 disables.
    pub min_p: f32,
    /// Locally typical sampling mass; 1 disables.
    pub typical_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens; 1 disables.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every recent token; 0 disables.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of recent tokens; 0 disables.
    pub frequency_penalty: f32,
    /// How many of the last accepted tokens the penalties look at; 0 disables.
    pub penalty_last_n: usize,
    /// Added to the logit of a token id (`-inf` bans it).
    pub logit_bias: BTreeMap<u32, f32>,
    /// Seed of the sampling PRNG: same seed and inputs → same tokens.
    pub seed: u64,
    /// Stop when the generated text contains one of these (not emitted).
    pub stop: Vec<String>,
    /// Stop after generating one of these token ids (not emitted).
    pub stop_token_ids: Vec<u32>,
    /// Maximum number of tokens to generate.
    pub max_tokens: usize,
    /// Keep generating past end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 64,
            top_p: 0.95,
            min_p: 0.0,
            typical_p: 1.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            logit_bias: BTreeMap::new(),
            seed: 0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            max_tokens: 512,
            ignore_eos: false,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (argmax, ties → lowest id), everything else neutral.
    ///
    /// ```
    /// let p = kiln_runtime::SamplingParams::greedy();
    /// assert_eq!(p.temperature, 0.0);
    /// ```
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            ..Default::default()
        }
    }

    /// True when the request is plain argmax: the session may then use the
    /// model's argmax fast path and skip the sampler entirely.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 && !self.has_penalties() && self.logit_bias.is_empty()
    }

    fn has_penalties(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repetition_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }

    /// Checks every field's range; [`Sampler::new`] calls this.
    pub fn validate(&self) -> Result<()> {
        fn bad(name: &'static str, value: impl ToString, expected: &'static str) -> RuntimeError {
            RuntimeError::InvalidSamplingParam {
                name,
                value: value.to_string(),
                expected,
            }
        }
        if !self.temperature.is_finite() {
            return Err(bad("temperature", self.temperature, "a finite number"));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad("top_p", self.top_p, "0 < top_p <= 1"));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(bad("min_p", self.min_p, "0 <= min_p <= 1"));
        }
        if !(self.typical_p > 0.0 && self.typical_p <= 1.0) {
            return Err(bad("typical_p", self.typical_p, "0 < typical_p <= 1"));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(bad(
                "repetition_penalty",
                self.repetition_penalty,
                "a finite number > 0",
            ));
        }
        if !self.presence_penalty.is_finite() {
            return Err(bad(
                "presence_penalty",
                self.presence_penalty,
                "a finite number",
            ));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(bad(
                "frequency_penalty",
                self.frequency_penalty,
                "a finite number",
            ));
        }
        if let Some((id, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| b.is_nan() || **b == f32::INFINITY)
        {
            return Err(bad(
                "logit_bias",
                format!("{id}: {b}"),
                "a finite number or -inf",
            ));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(bad("stop", "\"\"", "non-empty stop strings"));
        }
        Ok(())
    }
}

/// One surviving token after the filters, with its final probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Token id.
    pub id: u32,
    /// Logit after bias, penalties and temperature.
    pub logit: f32,
    /// Probability in the final (renormalized) distribution.
    pub p: f32,
}

/// Orders candidates by logit, descending, ties → lowest id first.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Orders candidates by probability, descending, ties → lowest id first.
fn by_p_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.p.total_cmp(&a.p).then(a.id.cmp(&b.id))
}

/// Heap entry whose `Ord` makes `BinaryHeap` a min-heap of the best-so-far:
/// the root is the worst kept candidate (lowest logit, then highest id).
#[derive(Clone, Debug)]
struct Worst(f32, u32);
impl PartialEq for Worst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Worst {}
impl PartialOrd for Worst {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Worst {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(self.1.cmp(&other.1))
    }
}

/// Rejects NaN and +inf: a healthy forward pass never produces them, and they
/// would make the softmax meaningless.
fn check_finite(logits: &[f32]) -> Result<()> {
    match logits
        .iter()
        .position(|l| l.is_nan() || *l == f32::INFINITY)
    {
        Some(index) => Err(RuntimeError::NonFiniteLogit {
            step: 0,
            index,
            value: logits[index],
        }),
        None => Ok(()),
    }
}

/// Index of the largest logit, ties → lowest id. Errors on NaN / +inf and
/// when every logit is `-inf`.
///
/// ```
/// assert_eq!(kiln_runtime::argmax(&[0.5, 2.0, 2.0, -1.0]).unwrap(), 1);
/// assert!(kiln_runtime::argmax(&[0.5, f32::NAN]).is_err());
/// ```
pub fn argmax(logits: &[f32]) -> Result<u32> {
    check_finite(logits)?;
    let mut best = None;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = Some(i);
        }
    }
    best.map(|i| i as u32).ok_or(RuntimeError::NoCandidate)
}

/// Samples token ids from logits rows; holds the penalty window and the RNG.
///
/// ```
/// use kiln_runtime::{Sampler, SamplingParams};
/// let mut s = Sampler::new(SamplingParams { top_k: 2, seed: 1, ..Default::default() }).unwrap();
/// let mut logits = vec![0.0, 3.0, 2.9, -5.0];
/// let id = s.sample(&mut logits).unwrap();
/// assert!(id == 1 || id == 2);
/// s.accept(id);
/// ```
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// The last `penalty_last_n` accepted tokens, oldest first.
    window: VecDeque<u32>,
    /// Occurrences of each token id inside `window`.
    counts: HashMap<u32, u32>,
    /// Scratch reused across calls so steady-state sampling does not allocate.
    cands: Vec<Candidate>,
    heap: BinaryHeap<Worst>,
}

impl Sampler {
    /// A sampler for `params` (validated), seeded with `params.seed`.
    pub fn new(params: SamplingParams) -> Result<Sampler> {
        params.validate()?;
        let rng = Rng::new(params.seed);
        Ok(Sampler {
            params,
            rng,
            window: VecDeque::new(),
            counts: HashMap::new(),
            cands: Vec::new(),
            heap: BinaryHeap::new(),
        })
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a token (prompt or generated) in the penalty window.
    pub fn accept(&mut self, id: u32) {
        let n = self.params.penalty_last_n;
        if n == 0 {
            return;
        }
        self.window.push_back(id);
        *self.counts.entry(id).or_insert(0) += 1;
        if self.window.len() > n {
            if let Some(old) = self.window.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
    }

    /// [`accept`](Self::accept) for each token in order.
    pub fn accept_all(&mut self, ids: &[u32]) {
        // Only the tail can stay in the window.
        let skip = ids.len().saturating_sub(self.params.penalty_last_n);
        for &id in &ids[skip..] {
            self.accept(id);
        }
    }

    /// Empties the penalty window (the RNG stream continues).
    pub fn clear_history(&mut self) {
        self.window.clear();
        self.counts.clear();
    }

    /// Picks the next token. `logits` is modified in place (bias and
    /// penalties); pass a copy if the raw row is needed afterwards.
    pub fn sample(&mut self, logits: &mut [f32]) -> Result<u32> {
        self.apply_bias_and_penalties(logits)?;
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        self.filter(logits)?;
        let total: f64 = self.cands.iter().map(|c| c.p as f64).sum();
        let mut u = self.rng.next_f64() * total;
        for c in &self.cands {
            u -= c.p as f64;
            if u < 0.0 {
                return Ok(c.id);
            }
        }
        // Rounding left `u` a hair above zero: take the last candidate.
        self.cands
            .last()
            .map(|c| c.id)
            .ok_or(RuntimeError::NoCandidate)
    }

    /// The distribution [`sample`](Self::sample) would draw from, as
    /// candidates with probabilities summing to 1 (greedy: the argmax with
    /// p = 1). Modifies `logits` like `sample`; does not advance the RNG.
    pub fn distribution(&mut self, logits: &mut [f32]) -> Result<Vec<Candidate>> {
        self.apply_bias_and_penalties(logits)?;
        if self.params.temperature <= 0.0 {
            let id = argmax(logits)?;
            return Ok(vec![Candidate {
                id,
                logit: logits[id as usize],
                p: 1.0,
            }]);
        }
        self.filter(logits)?;
        Ok(self.cands.clone())
    }

    /// Step 1 and 2: logit bias, then penalties over the window.
    fn apply_bias_and_penalties(&self, logits: &mut [f32]) -> Result<()> {
        let vocab_size = logits.len();
        for (&id, &b) in &self.params.logit_bias {
            let l = logits
                .get_mut(id as usize)
                .ok_or(RuntimeError::TokenOutOfVocab { id, vocab_size })?;
            *l += b;
        }
        if !self.params.has_penalties() {
            return Ok(());
        }
        let p = &self.params;
        for (&id, &count) in &self.counts {
            // Accepted ids come from this vocab; ignore one that does not
            // (a caller mixing vocabularies) rather than index out of range.
            let Some(l) = logits.get_mut(id as usize) else {
                continue;
            };
            if *l > 0.0 {
                *l /= p.repetition_penalty;
            } else {
                *l *= p.repetition_penalty;
            }
            *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
        }
        Ok(())
    }

    /// Step 4: fills `self.cands` with the surviving tokens and their
    /// normalized probabilities.
    fn filter(&mut self, logits: &[f32]) -> Result<()> {
        check_finite(logits)?;
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        self.cands.clear();
        let mut sorted = false;
        if p.top_k > 0 && p.top_k < logits.len() {
            // Temperature is monotonic, so top-k by raw logit is top-k after it.
            self.heap.clear();
            for (i, &l) in logits.iter().enumerate() {
                if l == f32::NEG_INFINITY {
                    continue;
                }
                if self.heap.len() < p.top_k {
                    self.heap.push(Worst(l, i as u32));
                } else if let Some(mut worst) = self.heap.peek_mut() {
                    if l > worst.0 {
                        *worst = Worst(l, i as u32);
                    }
                }
            }
            self.cands
                .extend(self.heap.drain().map(|Worst(l, id)| Candidate {
                    id,
                    logit: l * inv_t,
                    p: 0.0,
                }));
            self.cands.sort_unstable_by(by_logit_desc);
            sorted = true;
        } else {
            self.cands.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| **l != f32::NEG_INFINITY)
                    .map(|(i, &l)| Candidate {
                        id: i as u32,
                        logit: l * inv_t,
                        p: 0.0,
                    }),
            );
        }
        if self.cands.is_empty() {
            return Err(RuntimeError::NoCandidate);
        }
        softmax(&mut self.cands);

        if p.top_p < 1.0 {
            if !sorted {
                sort_prefix_to_mass(&mut self.cands, p.top_p);
                sorted = true;
            }
            let keep = prefix_len_for_mass(&self.cands, p.top_p);
            self.cands.truncate(keep);
            renormalize(&mut self.cands);
        }
        if p.min_p > 0.0 {
            let max_p = if sorted {
                self.cands[0].p
            } else {
                self.cands.iter().map(|c| c.p).fold(0.0, f32::max)
            };
            let threshold = p.min_p * max_p;
            self.cands.retain(|c| c.p >= threshold);
            renormalize(&mut self.cands);
        }
        if p.typical_p < 1.0 {
            typical(&mut self.cands, p.typical_p);
        }
        Ok(())
    }
}

/// Sets `p` from `logit` (max-subtracted for stability).
fn softmax(cands: &mut [Candidate]) {
    let max = cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for c in cands.iter_mut() {
        c.p = (c.logit - max).exp();
        sum += c.p as f64;
    }
    let inv = (1.0 / sum) as f32;
    for c in cands.iter_mut() {
        c.p *= inv;
    }
}

fn renormalize(cands: &mut [Candidate]) {
    let sum: f64 = cands.iter().map(|c| c.p as f64).sum();
    if sum > 0.0 {
        let inv = (1.0 / sum) as f32;
        for c in cands.iter_mut() {
            c.p *= inv;
        }
    }
}

/// Smallest `k >= 1` such that the first `k` (sorted) candidates hold `mass`.
fn prefix_len_for_mass(sorted: &[Candidate], mass: f32) -> usize {
    let mut cum = 0.0f64;
    for (i, c) in sorted.iter().enumerate() {
        cum += c.p as f64;
        if cum >= mass as f64 {
            return i + 1;
        }
    }
    sorted.len()
}

/// Sorts (by p, descending) a prefix of `cands` long enough to hold `mass`,
/// growing it geometrically: with a peaked distribution a few hundred
/// candidates suffice and the 262k-entry vocab is never fully sorted.
fn sort_prefix_to_mass(cands: &mut [Candidate], mass: f32) {
    let n = cands.len();
    let mut k = 256.min(n);
    loop {
        if k < n {
            cands.select_nth_unstable_by(k - 1, by_p_desc);
        }
        cands[..k].sort_unstable_by(by_p_desc);
        let held: f64 = cands[..k].iter().map(|c| c.p as f64).sum();
        if held >= mass as f64 || k == n {
            return;
        }
        k = (k * 4).min(n);
    }
}

/// Locally typical sampling (Meister et al. 2022, as llama.cpp): keep the
/// tokens whose surprisal is closest to the entropy until `mass` is covered.
fn typical(cands: &mut Vec<Candidate>, mass: f32) {
    let entropy: f64 = cands
        .iter()
        .filter(|c| c.p > 0.0)
        .map(|c| -(c.p as f64) * (c.p as f64).ln())
        .sum();
    let score = |c: &Candidate| {
        if c.p > 0.0 {
            (-(c.p as f64).ln() - entropy).abs()
        } else {
            f64::INFINITY
        }
    };
    cands.sort_by(|a, b| score(a).total_cmp(&score(b)).then(a.id.cmp(&b.id)));
    let keep = prefix_len_for_mass(cands, mass);
    cands.truncate(keep);
    cands.sort_unstable_by(by_p_desc);
    renormalize(cands);
}

#[cfg(test)]
#[path = "sampling_tests.rs"]
mod tests;
