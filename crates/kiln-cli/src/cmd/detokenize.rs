//! `kiln detokenize`: token ids back to text.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use kiln_tokenizer::DecodeOptions;

use super::tokenize;

/// Print the text of token ids.
///
/// Writes the exact bytes, then a newline. Control tokens such as `<bos>`
/// print nothing unless --special.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF model whose tokenizer to use (default: see `kiln --help`).
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub hf: crate::model_path::HfArg,
    /// Render control tokens as their text (`<bos>`, `<end_of_turn>`).
    #[arg(long)]
    pub special: bool,
    /// Token ids, separated by spaces or commas (`2 9259 1902`, `2,9259`).
    #[arg(required = true, value_name = "IDS")]
    pub ids: Vec<String>,
}

fn parse_ids(args: &[String]) -> Result<Vec<u32>> {
    args.iter()
        .flat_map(|a| a.split(|c: char| c == ',' || c.is_whitespace() || c == '[' || c == ']'))
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .with_context(|| format!("token id {s:?} is not a non-negative integer"))
        })
        .collect()
}

pub fn run(a: Args) -> Result<()> {
    let ids = parse_ids(&a.ids)?;
    let tok = tokenize::load(a.model, &a.hf)?;
    let opts = DecodeOptions {
        remove_special: false,
        unparse_special: a.special,
    };
    let bytes = tok.decode(&ids, opts)?;
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_split_on_spaces_commas_and_brackets() {
        let args = [
            "[2,9259".to_string(),
            "1902]".to_string(),
            " 7 ".to_string(),
        ];
        assert_eq!(parse_ids(&args).unwrap(), [2, 9259, 1902, 7]);
        let err = parse_ids(&["2 x".to_string()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "token id \"x\" is not a non-negative integer"
        );
        assert!(parse_ids(&["-1".to_string()]).is_err());
    }
}
