//! Engine counters, gauges and latency histograms: written by the engine
//! thread, read by `/metrics` (relaxed atomics; a scrape may see one step's
//! updates half applied, which Prometheus tolerates).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the latency histogram buckets: 1 ms to 60 s,
/// roughly ×2.5 apart (time to first token spans queueing and prefill;
/// inter-token latency is a decode step, 5–200 ms on a CPU).
pub const LATENCY_BUCKETS_S: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0,
];

/// A Prometheus histogram of durations over [`LATENCY_BUCKETS_S`].
#[derive(Debug, Default)]
pub struct Histogram {
    /// Per-bucket counts (not cumulative), plus one for +Inf.
    counts: [AtomicU64; LATENCY_BUCKETS_S.len() + 1],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = LATENCY_BUCKETS_S
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(LATENCY_BUCKETS_S.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// `(upper bound, cumulative count)` per bucket, `+Inf` last (as
    /// `f64::INFINITY`), then the total count and the sum in seconds.
    pub fn snapshot(&self) -> (Vec<(f64, u64)>, u64, f64) {
        let mut cum = 0;
        let mut buckets = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            cum += c.load(Ordering::Relaxed);
            let le = LATENCY_BUCKETS_S.get(i).copied().unwrap_or(f64::INFINITY);
            buckets.push((le, cum));
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 * 1e-6;
        (buckets, self.count.load(Ordering::Relaxed), sum)
    }
}

/// What the engine reports.
#[derive(Debug, Default)]
pub struct EngineMetrics {
    /// Sequences submitted and not yet admitted (or refused).
    pub waiting: AtomicUsize,
    /// The queue limit in force (set once the engine has started).
    pub max_queue: AtomicUsize,
    /// Sequences in flight.
    pub running: AtomicUsize,
    /// The in-flight limit in force.
    pub parallel: AtomicUsize,
    /// KV bytes held by running sequences.
    pub kv_running_bytes: AtomicUsize,
    /// KV bytes held by the prefix cache.
    pub kv_prefix_bytes: AtomicUsize,
    /// The KV budget in force.
    pub kv_budget_bytes: AtomicUsize,
    /// Positions per sequence in force.
    pub max_context: AtomicUsize,
    /// Prompt tokens of admitted sequences.
    pub prompt_tokens: AtomicU64,
    /// Of those, tokens taken from the prefix cache instead of computed.
    pub prefix_hit_tokens: AtomicU64,
    /// Generated tokens.
    pub generated_tokens: AtomicU64,
    /// Forward steps run, and those that failed.
    pub steps: AtomicU64,
    pub failed_steps: AtomicU64,
    /// Sequences cancelled because their receiver went away.
    pub cancelled: AtomicU64,
    /// Microseconds of engine turns that ran a step (admission, planning,
    /// the forward, sampling and sending events), and of those, inside
    /// the model's forward: the rest is the host's share of a step.
    pub busy_us: AtomicU64,
    pub forward_us: AtomicU64,
    /// From arrival to the first generated token.
    pub time_to_first_token: Histogram,
    /// Between consecutive tokens of one sequence.
    pub inter_token_latency: Histogram,
}

impl EngineMetrics {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_time(counter: &AtomicU64, d: Duration) {
        counter.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_with_inf_last() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(100));
        let (b, count, sum) = h.snapshot();
        assert_eq!(count, 3);
        assert!((sum - 100.0305).abs() < 1e-9);
        assert_eq!(b[0], (0.001, 1));
        assert_eq!(b[5], (0.05, 2));
        assert_eq!(b[13], (60.0, 2));
        assert_eq!(b[14], (f64::INFINITY, 3));
    }
}
