//! `kiln inspect`: what a GGUF file holds (metadata, tensors by type) and
//! the per-layer Gemma config Kiln derives from it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kiln_gguf::{Gguf, Value, ValueRef};
use kiln_model::{LayerConfig, ModelConfig};
use serde_json::json;

use crate::model_path;

/// Arrays longer than this show their length and first items only.
const ARRAY_HEAD: usize = 8;
/// Strings longer than this are cut in the text output (JSON keeps them).
const STRING_HEAD: usize = 120;

/// Show a GGUF file's metadata, tensors and derived Gemma config.
///
/// Prints the metadata (long arrays and strings summarized), tensor counts
/// and bytes by type, and the Gemma config Kiln derives per layer (sliding/global, heads, head dims, RoPE,
/// softcaps, KV sharing). Fails on a malformed file or config.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (default: see `kiln --help`).
    #[arg(value_name = "MODEL")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub hf: crate::model_path::HfArg,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Default)]
struct TypeStats {
    count: usize,
    bytes: u64,
}

fn tensor_stats(g: &Gguf) -> BTreeMap<&'static str, TypeStats> {
    let mut by_type: BTreeMap<&'static str, TypeStats> = BTreeMap::new();
    for t in g.tensor_infos() {
        let s = by_type.entry(t.ty.name()).or_default();
        s.count += 1;
        s.bytes += t.n_bytes;
    }
    by_type
}

pub fn run(a: Args) -> Result<()> {
    let (path, g) = model_path::open(a.model, &a.hf)?;
    let config =
        ModelConfig::from_gguf(&g).with_context(|| format!("{}: model config", path.display()));
    let mut out = std::io::stdout().lock();
    if a.json {
        // A file without a valid config is an error, not a partial object.
        let config = config?;
        serde_json::to_writer(&mut out, &to_json(&path, &g, &config))?;
        writeln!(out)?;
    } else {
        write_file_text(&mut out, &path, &g)?;
        // Metadata and tensors are shown even when the config is invalid.
        write_config_text(&mut out, &config?)?;
    }
    out.flush()?;
    Ok(())
}

fn to_json(path: &Path, g: &Gguf, config: &ModelConfig) -> serde_json::Value {
    let metadata: serde_json::Map<String, serde_json::Value> = g
        .metadata()
        .iter()
        .map(|(k, v)| (k.clone(), value_json(v.view())))
        .collect();
    let by_type: serde_json::Map<String, serde_json::Value> = tensor_stats(g)
        .into_iter()
        .map(|(ty, s)| {
            (
                ty.to_string(),
                json!({ "count": s.count, "bytes": s.bytes }),
            )
        })
        .collect();
    let total: u64 = g.tensor_infos().iter().map(|t| t.n_bytes).sum();
    json!({
        "file": path.display().to_string(),
        "file_bytes": g.file_len(),
        "version": g.version(),
        "alignment": g.alignment(),
        "data_start": g.data_start(),
        "metadata": metadata,
        "tensors": { "count": g.tensor_infos().len(), "bytes": total, "by_type": by_type },
        "config": config,
    })
}

/// Scalars as JSON values; arrays longer than [`ARRAY_HEAD`] as
/// `{"type", "len", "head"}`.
fn value_json(v: ValueRef<'_>) -> serde_json::Value {
    match v {
        ValueRef::U8(x) => json!(x),
        ValueRef::I8(x) => json!(x),
        ValueRef::U16(x) => json!(x),
        ValueRef::I16(x) => json!(x),
        ValueRef::U32(x) => json!(x),
        ValueRef::I32(x) => json!(x),
        ValueRef::U64(x) => json!(x),
        ValueRef::I64(x) => json!(x),
        ValueRef::F32(x) => json!(x),
        ValueRef::F64(x) => json!(x),
        ValueRef::Bool(x) => json!(x),
        ValueRef::String(s) => json!(s),
        ValueRef::Array(a) if a.len() > ARRAY_HEAD => json!({
            "type": a.elem_type().name(),
            "len": a.len(),
            "head": a.iter().take(ARRAY_HEAD).map(value_json).collect::<Vec<_>>(),
        }),
        ValueRef::Array(a) => a.iter().map(value_json).collect(),
    }
}

fn value_text(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(STRING_HEAD) {
        Some((cut, _)) => format!("{}… ({} bytes)", &s[..cut], s.len()),
        None => s,
    }
}

fn write_file_text(out: &mut impl Write, path: &Path, g: &Gguf) -> Result<()> {
    writeln!(
        out,
        "{}: GGUF v{}, {} bytes, alignment {}, data at {}",
        path.display(),
        g.version(),
        g.file_len(),
        g.alignment(),
        g.data_start()
    )?;
    writeln!(out, "\nmetadata ({} keys):", g.metadata().len())?;
    for (k, v) in g.metadata() {
        writeln!(out, "  {k} = {}", value_text(v))?;
    }
    let total: u64 = g.tensor_infos().iter().map(|t| t.n_bytes).sum();
    writeln!(
        out,
        "\ntensors: {} ({} bytes)",
        g.tensor_infos().len(),
        total
    )?;
    for (ty, s) in tensor_stats(g) {
        writeln!(
            out,
            "  {ty:<8} {:>5} tensors {:>12} bytes",
            s.count, s.bytes
        )?;
    }
    Ok(())
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "none".to_string(), |x| x.to_string())
}

fn write_config_text(out: &mut impl Write, c: &ModelConfig) -> Result<()> {
    writeln!(out, "\nconfig:")?;
    writeln!(
        out,
        "  arch {}, {} layers, n_embd {}, n_vocab {}, context {}, rms_eps {:e}",
        c.arch.gguf_name(),
        c.n_layer,
        c.n_embd,
        c.n_vocab,
        c.context_length,
        c.rms_eps
    )?;
    writeln!(
        out,
        "  sliding_window {}, attn_softcap {}, final_softcap {}, embed_scale {}, ple_dim {}, tied_output {}",
        opt(c.sliding_window),
        opt(c.attn_softcap),
        opt(c.final_softcap),
        c.embed_scale,
        c.ple_dim,
        c.tied_output
    )?;
    writeln!(
        out,
        "  {:>5} {:<7} {:>6} {:>5} {:>3} {:>8} {:>6} {:>9} {:>10} {:>5} {:>6}  flags",
        "layer",
        "kind",
        "window",
        "heads",
        "kv",
        "head_dim",
        "ffn",
        "rope_base",
        "freq_scale",
        "n_rot",
        "kv_src"
    )?;
    for l in &c.layers {
        writeln!(
            out,
            "  {:>5} {:<7} {:>6} {:>5} {:>3} {:>8} {:>6} {:>9} {:>10} {:>5} {:>6}  {}",
            l.index,
            if l.sliding { "sliding" } else { "global" },
            opt(l.window),
            l.n_head,
            l.n_kv_head,
            l.head_dim,
            l.ffn,
            l.rope.base,
            l.rope.freq_scale,
            l.rope.n_rot,
            l.kv_source,
            layer_flags(l)
        )?;
    }
    Ok(())
}

fn layer_flags(l: &LayerConfig) -> String {
    let mut f = Vec::new();
    if l.qk_norm {
        f.push("qk_norm".to_string());
    }
    if l.v_norm {
        f.push("v_norm".to_string());
    }
    if !l.has_v {
        f.push("k_eq_v".to_string());
    }
    if l.output_scale {
        f.push("output_scale".to_string());
    }
    if l.rope.freq_factors.is_some() {
        f.push("rope_freq_factors".to_string());
    }
    if let Some(m) = &l.moe {
        f.push(format!(
            "moe {}/{} x{}",
            m.n_expert_used, m.n_expert, m.expert_ffn
        ));
    }
    f.push(format!("attn_scale {}", l.attn_scale));
    f.join(" ")
}
