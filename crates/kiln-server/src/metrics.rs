//! `/metrics` in the Prometheus text format: requests by endpoint and
//! status (counted here), and the engine's tokens, queue, sequences, KV
//! pool and latency histograms.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use kiln_runtime::engine::{EngineMetrics, Histogram};

/// Paths that get their own label; anything else counts as `other`, so a
/// scanner cannot grow the label set without bound.
const KNOWN_PATHS: [&str; 8] = [
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/tokenize",
    "/detokenize",
    "/health",
    "/metrics",
];

/// The server's own counters.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
}

impl ServerMetrics {
    pub fn count_request(&self, path: &str, status: u16) {
        let path = KNOWN_PATHS
            .iter()
            .find(|&&p| p == path)
            .copied()
            .unwrap_or("other");
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((path, status)).or_insert(0) += 1;
    }

    /// Every metric as Prometheus text.
    pub fn render(&self, e: &EngineMetrics) -> String {
        let mut out = String::new();
        out.push_str("# HELP kiln_requests_total HTTP requests by endpoint and status code.\n");
        out.push_str("# TYPE kiln_requests_total counter\n");
        for ((path, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "kiln_requests_total{{endpoint=\"{path}\",status=\"{status}\"}} {n}"
            );
        }
        let counters: [(&str, &str, &AtomicU64); 6] = [
            (
                "kiln_prompt_tokens_total",
                "Prompt tokens of admitted sequences.",
                &e.prompt_tokens,
            ),
            (
                "kiln_prefix_cache_hit_tokens_total",
                "Prompt tokens reused from the prefix cache.",
                &e.prefix_hit_tokens,
            ),
            (
                "kiln_generated_tokens_total",
                "Generated tokens.",
                &e.generated_tokens,
            ),
            ("kiln_steps_total", "Batched forward steps.", &e.steps),
            (
                "kiln_failed_steps_total",
                "Forward steps that failed.",
                &e.failed_steps,
            ),
            (
                "kiln_cancelled_sequences_total",
                "Sequences cancelled by a client disconnect.",
                &e.cancelled,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let seconds: [(&str, &str, &AtomicU64); 2] = [
            (
                "kiln_engine_busy_seconds_total",
                "Engine time spent on turns that ran a step (host work included).",
                &e.busy_us,
            ),
            (
                "kiln_forward_seconds_total",
                "Of that, time inside the model's forward steps; the rest is host work.",
                &e.forward_us,
            ),
        ];
        for (name, help, v) in seconds {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {:.6}",
                v.load(Ordering::Relaxed) as f64 / 1e6
            );
        }
        let gauges: [(&str, &str, &AtomicUsize); 7] = [
            (
                "kiln_queue_depth",
                "Sequences waiting for admission.",
                &e.waiting,
            ),
            ("kiln_running_sequences", "Sequences in flight.", &e.running),
            (
                "kiln_parallel_limit",
                "Most sequences in flight.",
                &e.parallel,
            ),
            (
                "kiln_kv_running_bytes",
                "KV cache bytes of running sequences.",
                &e.kv_running_bytes,
            ),
            (
                "kiln_kv_prefix_cache_bytes",
                "KV cache bytes kept for prefix reuse.",
                &e.kv_prefix_bytes,
            ),
            (
                "kiln_kv_budget_bytes",
                "The KV cache budget.",
                &e.kv_budget_bytes,
            ),
            (
                "kiln_context_tokens",
                "Positions per sequence.",
                &e.max_context,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        histogram(
            &mut out,
            "kiln_time_to_first_token_seconds",
            "From arrival to the first generated token.",
            &e.time_to_first_token,
        );
        histogram(
            &mut out,
            "kiln_inter_token_latency_seconds",
            "Between consecutive tokens of a sequence.",
            &e.inter_token_latency,
        );
        out
    }
}

fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    let (buckets, count, sum) = h.snapshot();
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (le, n) in buckets {
        let le = if le.is_infinite() {
            "+Inf".to_owned()
        } else {
            le.to_string()
        };
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_has_typed_metrics_and_folds_unknown_paths() {
        let m = ServerMetrics::default();
        m.count_request("/v1/completions", 200);
        m.count_request("/v1/completions", 200);
        m.count_request("/wp-admin", 404);
        let e = EngineMetrics::default();
        e.running.store(3, Ordering::Relaxed);
        e.time_to_first_token
            .observe(std::time::Duration::from_millis(20));
        let text = m.render(&e);
        assert!(
            text.contains("kiln_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n")
        );
        assert!(text.contains("kiln_requests_total{endpoint=\"other\",status=\"404\"} 1\n"));
        assert!(text.contains("# TYPE kiln_running_sequences gauge\nkiln_running_sequences 3\n"));
        assert!(text.contains("kiln_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
        assert!(text.contains("kiln_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1\n"));
        assert!(text.contains("kiln_time_to_first_token_seconds_count 1\n"));
    }
}
