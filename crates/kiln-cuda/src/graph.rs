//! CUDA graphs per step shape: the first step of a [`GraphKey`] runs
//! plainly (kernels compile, workspaces grow), the second is captured and
//! launched, later ones replay the graph with one launch.

use std::collections::HashMap;
use std::sync::Mutex;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use kiln_model::{GraphKey, Result};

use crate::gpu::{cuda_err, Counters, Gpu};

/// A captured graph. cudarc's `CudaGraph` is not `Send`: CUDA graph objects
/// must not be used from two threads at once, which the `Graphs` mutex
/// ensures.
struct Captured(CudaGraph);

// SAFETY: only touched under `Graphs::map`'s lock (see `Captured`).
unsafe impl Send for Captured {}

enum State {
    /// Ran once; capture next time.
    Warm,
    Captured(Captured),
    /// Capture failed once: always run plainly.
    Plain,
}

/// A key's state and the workspace generation it was seen under (a graph
/// holds workspace addresses: a reallocation drops it).
struct Entry {
    state: State,
    generation: u64,
}

#[derive(Default)]
pub(crate) struct Graphs {
    map: Mutex<HashMap<GraphKey, Entry>>,
}

/// `KILN_CUDA_GRAPHS=0` runs every step plainly (for triage and timing),
/// as does profiling (`KILN_CUDA_PROFILE=1`).
fn graphs_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("KILN_CUDA_GRAPHS").map_or(true, |v| v.trim() != "0")
            && !crate::profile::profile_enabled()
    })
}

impl Graphs {
    /// Runs `f` (a whole step) under `key`; see the module doc.
    pub(crate) fn run(
        &self,
        gpu: &Gpu,
        key: Option<GraphKey>,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let Some(key) = key.filter(|_| graphs_enabled()) else {
            return f();
        };
        // Held for the whole step: one step at a time owns the stream.
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let generation = gpu.workspace_generation();
        let state = map
            .get(&key)
            .filter(|e| e.generation == generation)
            .map(|e| &e.state);
        match state {
            Some(State::Captured(g)) => {
                Counters::bump(&gpu.counters.graph_launches);
                g.0.launch()
                    .map_err(|e| cuda_err("launching a step graph", e))
            }
            Some(State::Warm) => {
                let state = match capture(gpu, f) {
                    Some(g) => {
                        Counters::bump(&gpu.counters.graph_captures);
                        Counters::bump(&gpu.counters.graph_launches);
                        g.launch()
                            .map_err(|e| cuda_err("launching a step graph", e))?;
                        State::Captured(Captured(g))
                    }
                    // The captured work did not run: run it plainly (and
                    // from now on), which also reports a genuine error.
                    None => {
                        map.insert(
                            key,
                            Entry {
                                state: State::Plain,
                                generation,
                            },
                        );
                        return f();
                    }
                };
                map.insert(key, Entry { state, generation });
                Ok(())
            }
            Some(State::Plain) => f(),
            None => {
                if map.values().any(|e| e.generation != generation) {
                    map.retain(|_, e| e.generation == generation);
                }
                f()?;
                let generation = gpu.workspace_generation();
                map.insert(
                    key,
                    Entry {
                        state: State::Warm,
                        generation,
                    },
                );
                Ok(())
            }
        }
    }

    /// Captured graphs held.
    pub(crate) fn captured(&self) -> usize {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.values()
            .filter(|e| matches!(e.state, State::Captured(_)))
            .count()
    }
}

/// Captures `f` into a graph; `None` when `f` failed or did something a
/// graph cannot hold (nothing ran either way).
fn capture(gpu: &Gpu, f: &mut dyn FnMut() -> Result<()>) -> Option<CudaGraph> {
    gpu.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .ok()?;
    gpu.set_capturing(true);
    let r = f();
    gpu.set_capturing(false);
    // Always end the capture, so the stream is usable whatever happened.
    let g = gpu.stream.end_capture(CUgraphInstantiate_flags(0));
    match (r, g) {
        (Ok(()), Ok(Some(g))) => Some(g),
        _ => None,
    }
}
