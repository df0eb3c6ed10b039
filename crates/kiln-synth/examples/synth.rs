//! Writes one synthetic model until `kiln synth` lands in kiln-cli:
//! `cargo run --release -p kiln-synth --example synth -- gemma3-1b OUT.gguf [Q4_K_M|Q8_0|F16] [SEED]`

use std::io::Write;
use std::path::Path;

use kiln_synth::{known_models, synthesize_with_progress, Quant, SynthSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, out, rest @ ..] = args.as_slice() else {
        return Err(format!(
            "usage: synth MODEL OUT.gguf [QUANT] [SEED]; models: {}",
            known_models()
        )
        .into());
    };
    let mut spec = SynthSpec::parse_model(model)?;
    if let Some(q) = rest.first() {
        spec = spec.quant(q.parse::<Quant>()?);
    }
    if let Some(s) = rest.get(1) {
        spec = spec.seed(s.parse()?);
    }
    let mut last_pct = u64::MAX;
    let rep = synthesize_with_progress(&spec, Path::new(out), &mut |p| {
        let pct = p.done_bytes * 100 / p.total_bytes.max(1);
        if pct != last_pct {
            last_pct = pct;
            eprint!("\r{pct:3}% {:<40}", p.tensor);
            let _ = std::io::stderr().flush();
        }
    })?;
    eprintln!();
    println!(
        "{} {}: {} tensors, {:.2}B params, {:.1} MiB in {:.1}s",
        rep.model,
        rep.quant.name(),
        rep.n_tensors,
        rep.n_params as f64 / 1e9,
        rep.file_bytes as f64 / (1 << 20) as f64,
        rep.elapsed.as_secs_f64()
    );
    for (ty, n, bytes) in &rep.types {
        println!(
            "  {ty:>5}: {n:4} tensors, {:8.1} MiB",
            *bytes as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}
