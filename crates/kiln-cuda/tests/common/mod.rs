//! Helpers of the CUDA tests: the device (or the skip line), reproducible
//! random inputs, and comparisons that print what they found.
#![allow(dead_code)]

use kiln_cuda::{CudaBackend, CudaBuf};
use kiln_model::Backend;

/// The backend on GPU 0, or `None` after printing the one skip line.
pub fn backend() -> Option<CudaBackend> {
    if let Some(reason) = kiln_cuda::unavailable_reason() {
        println!("skipped: no CUDA device ({reason})");
        return None;
    }
    Some(CudaBackend::new(0).unwrap_or_else(|e| panic!("GPU 0 is present but did not open: {e}")))
}

/// xorshift64*: reproducible inputs without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub fn float(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values uniform in [-scale, scale).
    pub fn floats(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.float() * scale).collect()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A device buffer holding `v`.
pub fn dev(c: &CudaBackend, v: &[f32]) -> CudaBuf {
    c.upload(v).expect("upload")
}

/// A device buffer of `n` NaNs: whatever an op fails to write stays NaN.
pub fn poisoned(c: &CudaBackend, n: usize) -> CudaBuf {
    dev(c, &vec![f32::NAN; n])
}

pub fn host(c: &CudaBackend, b: &CudaBuf) -> Vec<f32> {
    let mut out = vec![0.0; c.buf_len(b)];
    c.download(b, 0, &mut out).expect("download");
    out
}

/// The CUDA ops' twin: the CPU backend.
pub fn cpu() -> kiln_cpu::CpuBackend {
    kiln_cpu::CpuBackend::with_threads(2)
}

/// The whole of `buf`, on either backend.
pub fn read<B: Backend>(b: &B, buf: &B::Buf) -> Vec<f32> {
    let mut out = vec![0.0; b.buf_len(buf)];
    b.download(buf, 0, &mut out).expect("download");
    out
}

/// Asserts `|got - want| <= tol * max(1, |want|)` everywhere (NaN fails),
/// printing the largest difference.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = (0.0f32, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs() / w.abs().max(1.0);
        assert!(d <= tol, "{what}: [{i}] {g} vs {w} (tolerance {tol})");
        if d > worst.0 {
            worst = (d, i);
        }
    }
    println!("{what}: max rel diff {:.2e} at [{}]", worst.0, worst.1);
}

// --- models ------------------------------------------------------------------

use std::path::Path;
use std::sync::Arc;

use kiln_gguf::Gguf;
use kiln_model::{Model, Output};

pub fn load<B: Backend>(b: B, path: &Path) -> Model<B> {
    let g = Arc::new(Gguf::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    Model::load(b, g).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn read_f32(path: &Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn json(path: &Path) -> serde_json::Value {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&b).unwrap()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Logits of every position of `tokens`, in one prefill.
pub fn all_logits<B: Backend>(m: &Model<B>, tokens: &[u32]) -> Vec<f32> {
    let mut cache = m.new_cache().unwrap();
    let mut s = m.new_scratch(tokens.len()).unwrap();
    let mut out = Vec::new();
    m.forward(tokens, &mut cache, &mut s, Output::AllLogits, &mut out)
        .unwrap();
    out
}

/// Greedy decode after `prompt` for `steps` tokens through the logits
/// (each step's logits kept), or through `Output::Argmax` (ids only: the
/// path a CUDA graph replays).
pub fn greedy<B: Backend>(
    m: &Model<B>,
    prompt: &[u32],
    steps: usize,
    argmax_only: bool,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut cache = m.new_cache().unwrap();
    let mut s = m.new_scratch(prompt.len()).unwrap();
    let output = if argmax_only {
        Output::Argmax
    } else {
        Output::LastLogits
    };
    let (mut ids, mut logits) = (Vec::new(), Vec::new());
    let mut next = prompt.to_vec();
    for _ in 0..steps {
        let mut out = Vec::new();
        let top = m
            .forward(&next, &mut cache, &mut s, output, &mut out)
            .unwrap();
        let id = match top {
            Some(id) => id,
            None => argmax(&out) as u32,
        };
        if !argmax_only {
            logits.push(out);
        }
        ids.push(id);
        next = vec![id];
    }
    (ids, logits)
}

pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// max |a - b| and max |b|.
pub fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let d = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, |m, d| if d.is_nan() || d > m { d } else { m });
    let m = b.iter().map(|x| x.abs()).fold(0.0f32, f32::max);
    (d, m)
}

/// The synthetic file for `size`, written once.
pub fn synth_file(size: &str) -> std::path::PathBuf {
    let base = std::env::var_os("KILN_CACHE_DIR").map_or_else(
        || {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/kiln")
        },
        std::path::PathBuf::from,
    );
    let path = base.join(format!("synth/gemma3-{size}-q4_k_m.gguf"));
    if !path.exists() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let spec = kiln_synth::SynthSpec::new(kiln_model::Arch::Gemma3, size)
            .quant(kiln_synth::Quant::Q4KM);
        // Side-by-side writers are safe: each writes its own part file.
        kiln_synth::synthesize(&spec, &path).unwrap_or_else(|e| panic!("synthesizing {size}: {e}"));
    }
    path
}
