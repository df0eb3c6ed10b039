//! `kiln logits`: the model's raw logits for a prompt.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use kiln_runtime::Session;
use serde::Serialize;

use super::common::{check_fits, ModelArgs, Progress, PromptArgs, ENV_HELP};

/// Show the top logits of a prompt's last position (or of every position).
///
/// Logits are raw (pre-softmax, no temperature). The text output is a
/// table of id, logit, log-probability and the token's piece. With --all,
/// every prompt position is shown (row i: the logits after prompt token i)
/// and --out writes the full matrix.
#[derive(clap::Args)]
#[command(after_long_help = ENV_HELP)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// How many of the largest logits to show per position (ties: lowest id
    /// first).
    #[arg(long, value_name = "K", default_value_t = 10)]
    pub top: usize,
    /// Every prompt position, not just the last (holds n_tokens x vocab
    /// f32 in memory: 1 MiB per token for a 262,144-token vocabulary).
    #[arg(long)]
    pub all: bool,
    /// With --all: write all logits to FILE as raw little-endian f32,
    /// shape [n_tokens, vocab] row-major.
    #[arg(long, value_name = "FILE", requires = "all")]
    pub out: Option<PathBuf>,
    /// Print one JSON object: {"ids":[prompt ids],"top":[{"id","logit"}]},
    /// with --all also "positions":[[{"id","logit"},...],...].
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Clone, Copy)]
struct Entry {
    id: u32,
    logit: f32,
}

#[derive(Serialize)]
struct Report<'a> {
    ids: &'a [u32],
    top: &'a [Entry],
    #[serde(skip_serializing_if = "Option::is_none")]
    positions: Option<&'a [Vec<Entry>]>,
    n_vocab: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    out: Option<String>,
}

/// The `k` largest logits, descending; ties to the lowest id; NaN skipped.
fn top_k(row: &[f32], k: usize) -> Vec<Entry> {
    let k = k.min(row.len());
    let mut top: Vec<Entry> = Vec::with_capacity(k + 1);
    if k == 0 {
        return top;
    }
    for (i, &z) in row.iter().enumerate() {
        if z.is_nan() || (top.len() == k && z <= top[k - 1].logit) {
            continue;
        }
        let at = top.partition_point(|e| e.logit >= z);
        top.insert(
            at,
            Entry {
                id: i as u32,
                logit: z,
            },
        );
        top.truncate(k);
    }
    top
}

/// log Σ exp(row), in f64.
fn logsumexp(row: &[f32]) -> f64 {
    let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    mx + row
        .iter()
        .map(|&z| (f64::from(z) - mx).exp())
        .sum::<f64>()
        .ln()
}

pub fn run(a: Args) -> Result<()> {
    let (mut session, _path, _load) = a.model.load(false)?;
    let ids = a.prompt.token_ids(&session, None)?;
    check_fits(&session, ids.len(), None)?;
    let n_vocab = session.config().n_vocab;
    let rows: Vec<f32> = {
        let _spinner = Progress::spinner(format!("computing {} positions", ids.len()));
        if a.all {
            session.logits_all(&ids)?
        } else {
            session.logits(&ids)?
        }
    };
    if let Some(path) = &a.out {
        write_f32(path, &rows).with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "wrote {}: [{}, {n_vocab}] f32 little-endian ({} bytes)",
            path.display(),
            ids.len(),
            rows.len() * 4
        );
    }
    let tops: Vec<Vec<Entry>> = rows
        .chunks_exact(n_vocab)
        .map(|r| top_k(r, a.top))
        .collect();
    let last = tops.last().map_or(&[][..], Vec::as_slice);
    let mut out = std::io::stdout().lock();
    if a.json {
        let report = Report {
            ids: &ids,
            top: last,
            positions: a.all.then_some(tops.as_slice()),
            n_vocab,
            out: a.out.as_ref().map(|p| p.display().to_string()),
        };
        serde_json::to_writer(&mut out, &report)?;
        writeln!(out)?;
    } else {
        let first = ids.len() - tops.len();
        for (i, (top, row)) in tops.iter().zip(rows.chunks_exact(n_vocab)).enumerate() {
            let pos = first + i;
            writeln!(
                out,
                "position {pos} (after {} {:?}):",
                ids[pos],
                piece(&session, ids[pos])
            )?;
            write_table(&mut out, &session, top, logsumexp(row))?;
        }
    }
    out.flush()?;
    Ok(())
}

fn piece(session: &Session, id: u32) -> String {
    session
        .tokenizer()
        .token_to_piece(id, true)
        .map(|p| String::from_utf8_lossy(&p).into_owned())
        .unwrap_or_default()
}

fn write_table(out: &mut impl Write, session: &Session, top: &[Entry], lse: f64) -> Result<()> {
    writeln!(
        out,
        "  {:>8}  {:>10}  {:>9}  piece",
        "id", "logit", "logprob"
    )?;
    for e in top {
        writeln!(
            out,
            "  {:>8}  {:>10.4}  {:>9.4}  {:?}",
            e.id,
            e.logit,
            f64::from(e.logit) - lse,
            piece(session, e.id)
        )?;
    }
    Ok(())
}

fn write_f32(path: &PathBuf, data: &[f32]) -> std::io::Result<()> {
    let mut w = BufWriter::new(std::fs::File::create(path)?);
    for z in data {
        w.write_all(&z.to_le_bytes())?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_descending_with_ties_to_the_lowest_id() {
        let z = [0.5, 3.0, f32::NAN, 3.0, -1.0, 2.0, 7.0];
        let ids: Vec<u32> = top_k(&z, 3).iter().map(|e| e.id).collect();
        assert_eq!(ids, [6, 1, 3]);
        assert!(top_k(&z, 0).is_empty());
        assert_eq!(top_k(&[1.0], 5).len(), 1);
        assert_eq!(top_k(&[1.0, 2.0], usize::MAX).len(), 2);
    }

    #[test]
    fn logsumexp_is_stable() {
        assert!((logsumexp(&[1e4, 1e4]) - (1e4 + 2f64.ln())).abs() < 1e-9);
        assert!((logsumexp(&[0.0; 4]) - 4f64.ln()).abs() < 1e-12);
    }
}
