//! Synthetic Gemma GGUF files: the real tensor names, shapes and metadata
//! of each supported model and llama.cpp's per-tensor quantization mix,
//! filled with seeded random weights.
//!
//! They let benchmarks and loaders run on 1B–27B shapes without
//! downloading weights. The output is not a language model (the weights are
//! noise), but every byte is a valid tensor of the advertised type, so the
//! cost of loading and running it is the real model's.
//!
//! ```no_run
//! use kiln_synth::{synthesize, Arch, Quant, SynthSpec};
//!
//! let spec = SynthSpec::new(Arch::Gemma3, "1b").quant(Quant::Q4KM).seed(7);
//! let report = synthesize(&spec, "/tmp/gemma3-1b-synth.gguf".as_ref())?;
//! println!("{} tensors, {} bytes", report.n_tensors, report.file_bytes);
//! # Ok::<(), kiln_synth::SynthError>(())
//! ```
//!
//! Generation streams: tensors are produced in row chunks (rayon-parallel,
//! each chunk seeded on its own so the file does not depend on the thread
//! count), quantized and written in order; at most a few chunks per worker
//! are in memory at once.

mod plan;
mod preset;
mod rng;
mod tokenizer;
mod write;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use kiln_gguf::Value;
pub use kiln_model::Arch;
pub use plan::{Init, TensorPlan};
pub use preset::{Preset, PRESETS};
pub use write::{synthesize, synthesize_with_progress, write_skeleton, Progress};

/// Why a synthetic model could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("no {arch} model of size {size:?} (known: {known})")]
    UnknownModel {
        arch: &'static str,
        size: String,
        known: String,
    },
    #[error("unknown quantization {0:?} (Q4_K_M, Q8_0 or F16)")]
    UnknownQuant(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tokenizer source: {0}")]
    Tokenizer(#[from] kiln_gguf::GgufError),
    #[error("GGUF header: {0}")]
    Header(#[from] kiln_gguf::write::WriteError),
    #[error("quantizing {tensor}: {source}")]
    Quant {
        tensor: String,
        source: kiln_quant::QuantError,
    },
}

pub type Result<T, E = SynthError> = std::result::Result<T, E>;

/// The file type: llama.cpp's `LLAMA_FTYPE_MOSTLY_*` mixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quant {
    /// Q4_K_M: Q4_K base with Q6_K/Q8_0 promotions and Q5_0 fallbacks.
    Q4KM,
    Q8_0,
    F16,
}

impl Quant {
    /// `general.file_type` (llama_ftype).
    pub fn file_type(self) -> u32 {
        match self {
            Quant::F16 => 1,
            Quant::Q8_0 => 7,
            Quant::Q4KM => 15,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Quant::Q4KM => "Q4_K_M",
            Quant::Q8_0 => "Q8_0",
            Quant::F16 => "F16",
        }
    }
}

impl FromStr for Quant {
    type Err = SynthError;
    fn from_str(s: &str) -> Result<Quant> {
        match s.to_ascii_uppercase().replace('-', "_").as_str() {
            "Q4_K_M" | "Q4KM" => Ok(Quant::Q4KM),
            "Q8_0" | "Q80" => Ok(Quant::Q8_0),
            "F16" => Ok(Quant::F16),
            _ => Err(SynthError::UnknownQuant(s.to_string())),
        }
    }
}

/// What to synthesize.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub arch: Arch,
    /// Size label of a [`PRESETS`] entry: "270m", "1b", "e2b", ...
    pub size: String,
    pub quant: Quant,
    pub seed: u64,
    /// Copy every `tokenizer.*` key from this GGUF (the token embedding then
    /// gets its vocabulary size) instead of a synthetic vocabulary.
    pub tokenizer_from: Option<PathBuf>,
}

impl SynthSpec {
    /// Q4_K_M, seed 0, synthetic vocabulary.
    pub fn new(arch: Arch, size: impl Into<String>) -> SynthSpec {
        SynthSpec {
            arch,
            size: size.into(),
            quant: Quant::Q4KM,
            seed: 0,
            tokenizer_from: None,
        }
    }

    /// Parses "gemma3-270m" / "gemma4-e2b" (the [`Preset::label`] form).
    pub fn parse_model(model: &str) -> Result<SynthSpec> {
        let unknown = || SynthError::UnknownModel {
            arch: "gemma",
            size: model.to_string(),
            known: known_models(),
        };
        let (arch, size) = model.split_once(['-', ':']).ok_or_else(unknown)?;
        let arch = match arch.to_ascii_lowercase().as_str() {
            "gemma2" => Arch::Gemma2,
            "gemma3" => Arch::Gemma3,
            "gemma4" => Arch::Gemma4,
            _ => return Err(unknown()),
        };
        let spec = SynthSpec::new(arch, size);
        spec.preset()?;
        Ok(spec)
    }

    pub fn quant(mut self, q: Quant) -> Self {
        self.quant = q;
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn tokenizer_from(mut self, path: impl Into<PathBuf>) -> Self {
        self.tokenizer_from = Some(path.into());
        self
    }

    pub fn preset(&self) -> Result<&'static Preset> {
        Preset::find(self.arch, &self.size).ok_or_else(|| SynthError::UnknownModel {
            arch: self.arch.gguf_name(),
            size: self.size.clone(),
            known: known_models(),
        })
    }

    /// The model's vocabulary size: the preset's, or the tokenizer
    /// source's when one is given.
    pub fn n_vocab(&self) -> Result<usize> {
        match &self.tokenizer_from {
            Some(p) => tokenizer::vocab_size_of(p),
            None => Ok(self.preset()?.n_vocab),
        }
    }
}

/// "gemma2-2b, gemma2-9b, gemma3-270m, ...".
pub fn known_models() -> String {
    PRESETS
        .iter()
        .map(Preset::label)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every tensor of the file in file order, with shape, type and init,
/// without generating any data.
pub fn plan(spec: &SynthSpec) -> Result<Vec<TensorPlan>> {
    Ok(plan::tensors(spec.preset()?, spec.n_vocab()?, spec.quant))
}

/// All metadata key-values of the file, in write order.
pub fn metadata(spec: &SynthSpec) -> Result<Vec<(String, Value)>> {
    let p = spec.preset()?;
    let (tok, _) = match &spec.tokenizer_from {
        Some(path) => tokenizer::copy_from(path)?,
        None => (tokenizer::synthetic(p.arch, p.n_vocab), p.n_vocab),
    };
    let a = p.arch.gguf_name();
    let u = |v: usize| Value::U32(v as u32);
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.type".into(), Value::String("model".into())),
        (
            "general.name".into(),
            Value::String(format!("Kiln synthetic {} (random weights)", p.label())),
        ),
        (
            "general.size_label".into(),
            Value::String(p.size.to_ascii_uppercase()),
        ),
    ];
    let mut arch_kv = |k: &str, v: Value| kv.push((format!("{a}.{k}"), v));
    arch_kv("context_length", u(p.context));
    arch_kv("embedding_length", u(p.n_embd));
    arch_kv("block_count", u(p.n_layer));
    if p.double_wide_shared_ffn {
        let per_layer: Vec<u32> = (0..p.n_layer).map(|il| p.layer_ffn(il) as u32).collect();
        arch_kv("feed_forward_length", Value::Array(per_layer.into()));
    } else {
        arch_kv("feed_forward_length", u(p.ffn));
    }
    arch_kv("attention.head_count", u(p.n_head));
    arch_kv("attention.head_count_kv", u(p.n_kv_head));
    arch_kv("attention.layer_norm_rms_epsilon", Value::F32(1e-6));
    arch_kv("attention.key_length", u(p.head_dim_global));
    arch_kv("attention.value_length", u(p.head_dim_global));
    arch_kv("attention.sliding_window", u(p.window));
    match p.arch {
        Arch::Gemma2 => {
            arch_kv("attn_logit_softcapping", Value::F32(50.0));
            arch_kv("final_logit_softcapping", Value::F32(30.0));
        }
        Arch::Gemma3 => {
            arch_kv("rope.freq_base", Value::F32(1e6));
            if let Some(f) = p.rope_scale {
                arch_kv("rope.scaling.type", Value::String("linear".into()));
                arch_kv("rope.scaling.factor", Value::F32(f));
            }
        }
        Arch::Gemma4 => {
            arch_kv("attention.key_length_swa", u(p.head_dim));
            arch_kv("attention.value_length_swa", u(p.head_dim));
            arch_kv("rope.freq_base", Value::F32(1e6));
            arch_kv("rope.freq_base_swa", Value::F32(1e4));
            arch_kv("rope.dimension_count", u(p.head_dim_global));
            arch_kv("rope.dimension_count_swa", u(p.head_dim));
            arch_kv("final_logit_softcapping", Value::F32(30.0));
            arch_kv("attention.shared_kv_layers", u(p.shared_kv_layers));
            arch_kv("embedding_length_per_layer_input", u(p.ple_dim));
            let pattern: Vec<bool> = (0..p.n_layer).map(|il| p.is_sliding(il)).collect();
            arch_kv(
                "attention.sliding_window_pattern",
                Value::Array(pattern.into()),
            );
        }
    }
    kv.extend(tok);
    kv.push(("general.quantization_version".into(), Value::U32(2)));
    kv.push((
        "general.file_type".into(),
        Value::U32(spec.quant.file_type()),
    ));
    Ok(kv)
}

/// What [`synthesize`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthReport {
    pub path: PathBuf,
    /// "gemma3-270m".
    pub model: String,
    pub quant: Quant,
    pub n_tensors: usize,
    pub n_params: u64,
    pub n_vocab: usize,
    pub file_bytes: u64,
    /// Tensor count and data bytes per GGML type name, sorted by name.
    pub types: Vec<(&'static str, usize, u64)>,
    pub elapsed: Duration,
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError + '_ {
    move |source| SynthError::Io {
        path: path.to_path_buf(),
        source,
    }
}
