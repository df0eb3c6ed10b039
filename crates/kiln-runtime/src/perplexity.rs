//! Perplexity computed exactly as llama.cpp's `llama-perplexity` does, so
//! the numbers compare one to one with its output:
//!
//! - chunk `k` is `tokens[k*n_ctx .. (k+1)*n_ctx]` for `k < n_tokens / n_ctx`
//!   (the tail is dropped), with its first token replaced by BOS;
//! - each chunk runs from an empty KV cache at positions `0..n_ctx`;
//! - only the second half is scored: for `j = n_ctx/2 ..= n_ctx-2`, the
//!   negative log-likelihood of token `j+1` under `softmax(logits[j])`
//!   (`n_ctx/2 - 1` tokens per chunk), with the log-softmax in f64;
//! - `PPL = exp(Σ NLL / count)`, also reported after every chunk.
//!
//! As in llama.cpp, the text must hold at least `2 * n_ctx` tokens (its
//! `you need at least 2*n_ctx tokens` check, made before `--chunks` caps
//! the count), so a cap of one chunk is allowed:
//! [`Session::perplexity_with`] takes that cap and a per-chunk callback.

use kiln_model::Backend;

use crate::error::Result;
use crate::session::Session;

/// The result of [`perplexity`].
#[derive(Clone, Debug, PartialEq)]
pub struct PerplexityResult {
    /// Final perplexity over all scored tokens.
    pub ppl: f64,
    /// llama.cpp's `±` estimate: `ppl · sqrt(var(NLL) / (count - 1))`.
    pub ppl_stderr: f64,
    /// The perplexity after chunk 1, 2, … (llama.cpp's `[1]…[n]` line).
    pub running_ppl: Vec<f64>,
    pub n_chunks: usize,
    pub n_ctx: usize,
    /// Tokens scored (`n_chunks * (n_ctx/2 - 1)`).
    pub n_scored: usize,
    /// Σ NLL over the scored tokens (nats).
    pub nll_sum: f64,
}

/// `-log softmax(logits)[target]`, in f64.
pub fn nll(logits: &[f32], target: u32) -> f64 {
    let mx = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&z| (f64::from(z) - mx).exp()).sum();
    mx + sum.ln()
        - logits
            .get(target as usize)
            .map_or(f64::NAN, |&z| f64::from(z))
}

/// Running NLL sums (llama.cpp accumulates NLL and NLL² per token).
#[derive(Clone, Debug, Default)]
pub(crate) struct NllAccumulator {
    sum: f64,
    sum2: f64,
    count: usize,
    running: Vec<f64>,
}

impl NllAccumulator {
    pub(crate) fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum2 += nll * nll;
        self.count += 1;
    }
    /// Records the running perplexity after a chunk and returns it.
    pub(crate) fn end_chunk(&mut self) -> f64 {
        let ppl = (self.sum / self.count.max(1) as f64).exp();
        self.running.push(ppl);
        ppl
    }
    pub(crate) fn finish(self, n_ctx: usize) -> PerplexityResult {
        let n = self.count.max(1) as f64;
        let mean = self.sum / n;
        let ppl = mean.exp();
        let var = self.sum2 / n - mean * mean;
        let ppl_stderr = if var > 0.0 && self.count > 1 {
            ppl * (var / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        PerplexityResult {
            ppl,
            ppl_stderr,
            n_chunks: self.running.len(),
            running_ppl: self.running,
            n_ctx,
            n_scored: self.count,
            nll_sum: self.sum,
        }
    }
}

/// Perplexity of `tokens` (already tokenized, BOS included) with chunks of
/// `n_ctx`; see the module docs. Needs at least `2 * n_ctx` tokens, as
/// llama.cpp does, and `4 <= n_ctx <= max_context`. Leaves the last chunk
/// in the session's cache.
pub fn perplexity<B: Backend>(
    session: &mut Session<B>,
    tokens: &[u32],
    n_ctx: usize,
) -> Result<PerplexityResult> {
    session.perplexity(tokens, n_ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_is_the_negative_log_softmax() {
        let z = [1.0f32, 2.0, 3.0];
        let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert!((nll(&z, 2) - (lse - 3.0)).abs() < 1e-12);
        assert!((nll(&z, 0) - (lse - 1.0)).abs() < 1e-12);
        // Uniform over 4: NLL = ln 4 whatever the shift.
        assert!((nll(&[1e4; 4], 1) - 4f64.ln()).abs() < 1e-9);
        assert!(nll(&z, 7).is_nan());
    }

    #[test]
    fn accumulator_matches_llama_cpp_formulas() {
        let mut a = NllAccumulator::default();
        a.add(1.0);
        a.add(3.0);
        a.end_chunk();
        a.add(2.0);
        a.end_chunk();
        let r = a.finish(8);
        assert_eq!(r.n_chunks, 2);
        assert_eq!(r.n_scored, 3);
        assert!((r.running_ppl[0] - 2f64.exp()).abs() < 1e-12);
        assert!((r.ppl - 2f64.exp()).abs() < 1e-12);
        // var = (1+9+4)/3 - 4 = 2/3; stderr = ppl * sqrt(var / 2).
        assert!((r.ppl_stderr - 2f64.exp() * (1.0f64 / 3.0).sqrt()).abs() < 1e-12);
    }
}
