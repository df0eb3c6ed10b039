//! `kiln synth`: a random-weight GGUF with a real Gemma's shapes and tensor
//! types, so every size can be benchmarked without downloading it.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_synth::{known_models, synthesize_with_progress, Quant, SynthSpec};

/// Write a random-weight GGUF with the real shapes of a Gemma model.
///
/// Tensor names, shapes and the quantization mix are those of llama.cpp's
/// files (`q4_k_m` applies llama.cpp's Q4_K_M rules per tensor); weights are
/// random (N(0, 1/fan_in)), so the text it generates is noise, but its speed
/// is the real model's.
#[derive(clap::Args)]
pub struct Args {
    /// Family: gemma2, gemma3 or gemma4.
    #[arg(long, value_name = "ARCH")]
    pub arch: String,
    /// Size label: 2b, 9b (gemma2); 270m, 1b, 4b, 12b, 27b (gemma3); e2b, e4b (gemma4).
    #[arg(long, value_name = "SIZE")]
    pub size: String,
    /// Tensor types: q4_k_m, q8_0 or f16.
    #[arg(long, default_value = "q4_k_m", value_name = "QUANT")]
    pub quant: String,
    /// Output GGUF path.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Copy the tokenizer metadata from this GGUF (else a synthetic
    /// vocabulary of the model's size).
    #[arg(long, value_name = "GGUF")]
    pub tokenizer_from: Option<PathBuf>,
    /// Seed of the random weights (same seed, same bytes).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(a: Args) -> Result<()> {
    let model = format!("{}-{}", a.arch, a.size);
    let mut spec = SynthSpec::parse_model(&model)
        .with_context(|| format!("known models: {}", known_models()))?
        .quant(a.quant.parse::<Quant>()?)
        .seed(a.seed);
    if let Some(t) = &a.tokenizer_from {
        spec = spec.tokenizer_from(t);
    }
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(0);
        if let Ok(style) =
            ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {eta} {msg}")
        {
            b.set_style(style);
        }
        b
    });
    let report = synthesize_with_progress(&spec, &a.output, &mut |p| {
        if let Some(b) = &bar {
            b.set_length(p.total_bytes);
            b.set_position(p.done_bytes);
            b.set_message(p.tensor.to_string());
        }
    })
    .with_context(|| format!("writing {}", a.output.display()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    println!(
        "{}: {} {}, {} tensors, {:.2}B params, {:.1} MiB in {:.1} s",
        a.output.display(),
        report.model,
        report.quant.name(),
        report.n_tensors,
        report.n_params as f64 / 1e9,
        report.file_bytes as f64 / (1u64 << 20) as f64,
        report.elapsed.as_secs_f64()
    );
    for (ty, n, bytes) in &report.types {
        println!(
            "  {ty:>5}: {n:4} tensors, {:9.1} MiB",
            *bytes as f64 / (1u64 << 20) as f64
        );
    }
    Ok(())
}
