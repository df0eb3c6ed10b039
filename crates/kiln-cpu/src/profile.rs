//! Per-op timing of the backend, for finding where a decode step's time
//! goes (`cargo run --release -p kiln-cpu --example profile_decode`).
//!
//! Off by default: every backend op then pays one relaxed atomic load.
//! [`start`] switches it on and clears the counters; each op then adds
//! its wall time, the calling thread's CPU time, its call count and the
//! weight bytes it streamed under a key naming the op class (matmuls by
//! type and shape); [`take`] returns the table and switches it off. An
//! op's fork/join and its wait for the slowest worker count as the
//! caller's time; with one thread the CPU time is the op's whole cost and
//! does not grow when other processes take the cores (the wall time
//! does), so compare variants by it, one thread, on a shared machine.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ON: AtomicBool = AtomicBool::new(false);
static STATS: Mutex<BTreeMap<String, OpStat>> = Mutex::new(BTreeMap::new());

/// Totals of one op class since [`start`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpStat {
    pub calls: u64,
    pub time: Duration,
    /// CPU time of the calling thread (zero where the clock is missing).
    pub cpu: Duration,
    /// Packed weight bytes read (matmuls and heads; 0 for the rest).
    pub weight_bytes: u64,
}

/// Clears the counters and starts recording.
pub fn start() {
    STATS.lock().expect("profile lock").clear();
    ON.store(true, Ordering::Relaxed);
}

/// Stops recording; returns every op class seen, sorted by name.
pub fn take() -> Vec<(String, OpStat)> {
    ON.store(false, Ordering::Relaxed);
    std::mem::take(&mut *STATS.lock().expect("profile lock"))
        .into_iter()
        .collect()
}

/// Records the time until it is dropped.
pub(crate) struct OpTimer {
    key: String,
    weight_bytes: u64,
    t0: Instant,
    cpu0: Duration,
}

/// A timer for one op, when profiling is on; `key` is only built then.
#[inline]
pub(crate) fn op(key: impl FnOnce() -> String, weight_bytes: u64) -> Option<OpTimer> {
    ON.load(Ordering::Relaxed).then(|| OpTimer {
        key: key(),
        weight_bytes,
        cpu0: thread_cpu(),
        t0: Instant::now(),
    })
}

/// CPU time of the calling thread.
#[cfg(target_os = "linux")]
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu() -> Duration {
    Duration::ZERO
}

impl Drop for OpTimer {
    fn drop(&mut self) {
        let dt = self.t0.elapsed();
        let cpu = thread_cpu().saturating_sub(self.cpu0);
        let mut stats = STATS.lock().expect("profile lock");
        let s = stats.entry(std::mem::take(&mut self.key)).or_default();
        s.calls += 1;
        s.time += dt;
        s.cpu += cpu;
        s.weight_bytes += self.weight_bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_between_start_and_take() {
        drop(op(|| "before".into(), 1));
        start();
        for _ in 0..3 {
            let _t = op(|| "matmul q4_k".into(), 10);
        }
        let stats = take();
        drop(op(|| "after".into(), 1));
        // Other tests may run backend ops meanwhile: look at these keys only.
        let get = |k: &str| stats.iter().find(|s| s.0 == k).map(|s| s.1.clone());
        let s = get("matmul q4_k").expect("recorded");
        assert_eq!((s.calls, s.weight_bytes), (3, 30));
        assert_eq!(get("before"), None);
        assert!(!take().iter().any(|s| s.0 == "after"));
    }
}
