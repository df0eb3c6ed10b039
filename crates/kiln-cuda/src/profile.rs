//! `KILN_CUDA_PROFILE=1`: device time per kernel, for finding where a step
//! goes without a profiler (the H200 machine's Nsight tools are not always
//! usable). Each launch is bracketed by two timing events; kernels are
//! grouped by what they did with layer numbers blanked ("matvec on
//! blk.#.ffn_up.weight"), and the table is printed to stderr when the
//! backend is dropped. Profiling runs every step plainly (graphs off:
//! events cannot be recorded into a replayed graph) and serializes
//! programmatic dependent launches, so totals are a little above a
//! replayed step's; the split between kernels is what it is for.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
use cudarc::driver::{CudaEvent, CudaStream};

/// Pending event pairs are folded into the table once this many wait.
const FOLD_AT: usize = 2048;

pub(crate) fn profile_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_CUDA_PROFILE").is_ok_and(|v| v.trim() == "1"))
}

#[derive(Default)]
pub(crate) struct Profile {
    pending: Mutex<Vec<(String, CudaEvent, CudaEvent)>>,
    /// Per kernel key: launches and total device milliseconds.
    table: Mutex<HashMap<String, (u64, f64)>>,
}

/// `what` with every run of digits replaced by `#`.
fn key_of(what: &str) -> String {
    let mut key = String::with_capacity(what.len());
    let mut in_digits = false;
    for c in what.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                key.push('#');
            }
            in_digits = true;
        } else {
            key.push(c);
            in_digits = false;
        }
    }
    key
}

impl Profile {
    /// An event recorded on `stream` now (None if recording failed: the
    /// profile then skips that launch rather than failing it).
    pub(crate) fn mark(stream: &CudaStream) -> Option<CudaEvent> {
        stream.record_event(Some(CU_EVENT_DEFAULT)).ok()
    }

    pub(crate) fn record(&self, what: &str, start: Option<CudaEvent>, end: Option<CudaEvent>) {
        let (Some(start), Some(end)) = (start, end) else {
            return;
        };
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.push((key_of(what), start, end));
        if pending.len() >= FOLD_AT {
            self.fold(&mut pending);
        }
    }

    fn fold(&self, pending: &mut Vec<(String, CudaEvent, CudaEvent)>) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        for (key, start, end) in pending.drain(..) {
            if let Ok(ms) = start.elapsed_ms(&end) {
                let cell = table.entry(key).or_default();
                cell.0 += 1;
                cell.1 += f64::from(ms);
            }
        }
    }

    /// The table, largest total first.
    pub(crate) fn report(&self) -> String {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        self.fold(&mut pending);
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<_> = table.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let total: f64 = rows.iter().map(|r| r.1 .1).sum();
        let mut out = format!("kiln-cuda profile: {total:.3} ms of kernels\n");
        out += "      ms      %   launches   us/launch  kernel\n";
        for (key, (n, ms)) in rows.iter().take(40) {
            out += &format!(
                "{ms:8.3} {:6.1} {n:10} {:11.2}  {key}\n",
                100.0 * ms / total.max(1e-9),
                1000.0 * ms / (*n).max(1) as f64
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_blank_layer_numbers() {
        assert_eq!(
            super::key_of("matvec on blk.12.ffn_up.weight"),
            "matvec on blk.#.ffn_up.weight"
        );
        assert_eq!(super::key_of("rms_norm"), "rms_norm");
    }
}
