//! `kiln pull`, `kiln list`, `kiln rm`: the model cache (see kiln-hub).

use std::io::Write;

use anyhow::Result;
use indicatif::HumanBytes;
use kiln_hub::{CachedModel, Hub, ModelSpec};
use serde_json::json;

use crate::download::DownloadProgress;

const SPEC_HELP: &str = "A Hugging Face repository, REPO[:QUANT], e.g. \
    ggml-org/gemma-3-1b-it-GGUF:Q4_K_M. QUANT is case-insensitive (a quant tag \
    or a file name); without it the repository's Q4_K_M, else its smallest \
    model. A missing QUANT lists the repository's.";

/// Download a model from the Hugging Face Hub into the cache.
///
/// Asks the Hub for the repository's current files, downloads the chosen
/// model's (all parts of a split model), resuming a partial download and
/// verifying each file's sha256, and prints the path to open (its first
/// file). `-hf REPO[:QUANT]` on any model command does the same on first
/// use. Environment: HF_ENDPOINT (default https://huggingface.co),
/// HF_TOKEN, HF_HUB_OFFLINE=1, HF_HUB_CACHE or KILN_CACHE_DIR (cache:
/// $KILN_CACHE_DIR/models, default ~/.cache/kiln/models, in the Hugging
/// Face cache layout).
#[derive(clap::Args)]
pub struct PullArgs {
    #[arg(value_name = "REPO[:QUANT]", help = SPEC_HELP)]
    pub spec: ModelSpec,
}

pub fn pull(a: PullArgs) -> Result<()> {
    let model = Hub::from_env().pull(&a.spec, &mut DownloadProgress::new())?;
    println!("{}", model.path.display());
    Ok(())
}

/// List the models in the cache, with their sizes.
///
/// One line per model: REPO:QUANT (what -hf and `kiln rm` take), its size
/// and its file (the first part of a split model, with the part count).
#[derive(clap::Args)]
pub struct ListArgs {
    /// One JSON line: [{"model", "repo", "quant", "size", "files", "path"}].
    #[arg(long)]
    pub json: bool,
}

pub fn list(a: ListArgs) -> Result<()> {
    let hub = Hub::from_env();
    let models = hub.cache().list()?;
    let mut out = std::io::stdout().lock();
    if a.json {
        let items: Vec<_> = models.iter().map(to_json).collect();
        serde_json::to_writer(&mut out, &items)?;
        writeln!(out)?;
    } else if models.is_empty() {
        eprintln!(
            "no models in {} (kiln pull REPO[:QUANT] adds one)",
            hub.cache().root().display()
        );
    } else {
        let width = models.iter().map(|m| m.spec().len()).max().unwrap_or(0);
        writeln!(out, "{:width$}  {:>10}  FILE", "MODEL", "SIZE")?;
        for m in &models {
            let parts = match m.model.files.len() {
                1 => String::new(),
                n => format!(" (+{} parts)", n - 1),
            };
            writeln!(
                out,
                "{:width$}  {:>10}  {}{parts}",
                m.spec(),
                HumanBytes(m.model.size).to_string(),
                m.model.first().path
            )?;
        }
    }
    out.flush()?;
    Ok(())
}

fn to_json(m: &CachedModel) -> serde_json::Value {
    json!({
        "model": m.spec(),
        "repo": m.repo,
        "quant": m.model.quant(),
        "size": m.model.size,
        "files": m.model.files.iter().map(|f| &f.path).collect::<Vec<_>>(),
        "path": m.path,
    })
}

/// Remove a model from the cache.
///
/// REPO:QUANT removes that model's files; REPO alone removes everything
/// cached of the repository (partial downloads too).
#[derive(clap::Args)]
pub struct RmArgs {
    #[arg(value_name = "REPO[:QUANT]")]
    pub spec: ModelSpec,
}

pub fn rm(a: RmArgs) -> Result<()> {
    let removed = Hub::from_env().cache().remove(&a.spec)?;
    let mut out = std::io::stdout().lock();
    if removed.is_empty() {
        writeln!(
            out,
            "removed {} (no complete model was cached)",
            a.spec.repo
        )?;
    }
    for m in removed {
        writeln!(out, "removed {} ({})", m.spec(), HumanBytes(m.model.size))?;
    }
    out.flush()?;
    Ok(())
}
