//! Output constraint flags (`--json-schema`, `--grammar`, `--regex`) and
//! the mask-time summary printed after a constrained run.

use std::path::PathBuf;

use anyhow::{Context, Result};
use kiln_runtime::constrain::{percentiles, Constraint, ConstraintSpec};

use super::common::read_text;

/// Flags that constrain the generated text (at most one).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConstraintArgs {
    /// The output must be JSON valid against the JSON schema in FILE.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["grammar", "regex"])]
    pub json_schema: Option<PathBuf>,
    /// The output must match the grammar in FILE (llguidance's Lark
    /// dialect, e.g. `start: "yes" | "no"`).
    #[arg(long, value_name = "FILE", conflicts_with = "regex")]
    pub grammar: Option<PathBuf>,
    /// The whole output must match the regular expression RE.
    #[arg(long, value_name = "RE")]
    pub regex: Option<String>,
}

impl ConstraintArgs {
    /// The constraint the flags ask for (files read here, so a bad path
    /// fails before the model loads); None without one.
    pub fn spec(&self) -> Result<Option<(ConstraintSpec, String)>> {
        if let Some(path) = &self.json_schema {
            let text = read_text(path)?;
            let schema = serde_json::from_str(&text)
                .with_context(|| format!("{}: not valid JSON", path.display()))?;
            return Ok(Some((
                ConstraintSpec::JsonSchema(schema),
                path.display().to_string(),
            )));
        }
        if let Some(path) = &self.grammar {
            let text = read_text(path)?;
            return Ok(Some((
                ConstraintSpec::Lark(text),
                path.display().to_string(),
            )));
        }
        Ok(self
            .regex
            .as_ref()
            .map(|re| (ConstraintSpec::Regex(re.clone()), "--regex".to_string())))
    }
}

/// ` | mask: median X ms, p99 Y ms` for the summary line (empty when no
/// mask was computed).
pub fn mask_summary(c: Option<&Constraint>) -> String {
    match c.and_then(|c| percentiles(c.mask_times())) {
        Some((p50, p99)) => format!(
            " | mask: median {:.3} ms, p99 {:.3} ms",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        ),
        None => String::new(),
    }
}
