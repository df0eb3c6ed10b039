//! Tokenizer metadata: copied from a real GGUF, or a synthetic vocabulary
//! that Kiln's and llama.cpp's loaders accept.

use std::path::Path;

use kiln_gguf::{Array, Gguf, Value};
use kiln_model::Arch;

use crate::Result;

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const BYTE: i32 = 6;

/// Characters the filler pieces are spelled with: the SPM space mark first
/// so the commonest pieces look like words.
const ALPHABET: &str =
    "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"-()";

/// Every `tokenizer.*` key of the GGUF at `path` and its vocabulary size.
pub(crate) fn copy_from(path: &Path) -> Result<(Vec<(String, Value)>, usize)> {
    let g = Gguf::open(path)?;
    let n_vocab = g.get_array("tokenizer.ggml.tokens")?.len();
    let kv = g
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .cloned()
        .collect();
    Ok((kv, n_vocab))
}

/// The vocabulary size `copy_from` would give, without cloning the keys.
pub(crate) fn vocab_size_of(path: &Path) -> Result<usize> {
    Ok(Gguf::open(path)?.get_array("tokenizer.ggml.tokens")?.len())
}

/// The `n`-th filler piece: every string over [`ALPHABET`] by length, then
/// in alphabet order. Each piece of two or more characters is its prefix
/// plus one character, both earlier pieces, which makes the BPE merge list
/// trivially valid.
fn fillers(n: usize) -> Vec<String> {
    let alphabet: Vec<char> = ALPHABET.chars().collect();
    let mut out: Vec<String> = Vec::with_capacity(n);
    let mut level_start = 0;
    for c in &alphabet {
        if out.len() == n {
            return out;
        }
        out.push(c.to_string());
    }
    while out.len() < n {
        let level_end = out.len();
        for i in level_start..level_end {
            for c in &alphabet {
                if out.len() == n {
                    return out;
                }
                let mut s = out[i].clone();
                s.push(*c);
                out.push(s);
            }
        }
        level_start = level_end;
    }
    out
}

fn strings(items: impl IntoIterator<Item = String>) -> Value {
    Value::Array(Array::String(items.into_iter().collect()))
}

/// A synthetic vocabulary of exactly `n_vocab` tokens: `<pad>`, `<eos>`,
/// `<bos>`, `<unk>`, the 256 byte tokens `<0x00>`..`<0xFF>`, then filler
/// pieces. Gemma 2/3 get an SPM (`llama`) vocabulary scored by rank,
/// Gemma 4 a `gemma4` BPE vocabulary with one merge per multi-character
/// piece.
pub(crate) fn synthetic(arch: Arch, n_vocab: usize) -> Vec<(String, Value)> {
    let specials = ["<pad>", "<eos>", "<bos>", "<unk>"];
    let n_fixed = specials.len() + 256;
    assert!(n_vocab > n_fixed, "vocabulary of {n_vocab} is too small");
    let pieces = fillers(n_vocab - n_fixed);
    let mut tokens: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let mut types = vec![CONTROL, CONTROL, CONTROL, UNKNOWN];
    types.extend(std::iter::repeat_n(BYTE, 256));
    types.extend(std::iter::repeat_n(NORMAL, pieces.len()));
    // SPM merges the pair whose result scores highest: shorter pieces
    // (earlier) score higher, like a real unigram vocabulary's frequencies.
    let mut scores = vec![-1000.0f32; n_fixed];
    scores.extend((0..pieces.len()).map(|i| -(i as f32)));
    let merges: Vec<String> = pieces
        .iter()
        .filter(|p| p.chars().count() >= 2)
        .map(|p| {
            let last = p.char_indices().last().expect("non-empty piece").0;
            format!("{} {}", &p[..last], &p[last..])
        })
        .collect();
    tokens.extend(pieces);

    let gemma4 = arch == Arch::Gemma4;
    let mut kv = vec![(
        "tokenizer.ggml.model".to_string(),
        Value::String(if gemma4 { "gemma4" } else { "llama" }.into()),
    )];
    if !gemma4 {
        kv.push(("tokenizer.ggml.pre".into(), Value::String("default".into())));
    }
    kv.push(("tokenizer.ggml.tokens".into(), strings(tokens)));
    kv.push((
        "tokenizer.ggml.scores".into(),
        Value::Array(Array::from(
            scores
                .into_iter()
                .map(|s| if gemma4 { -1000.0 } else { s })
                .collect::<Vec<f32>>(),
        )),
    ));
    kv.push((
        "tokenizer.ggml.token_type".into(),
        Value::Array(Array::from(types)),
    ));
    if gemma4 {
        kv.push(("tokenizer.ggml.merges".into(), strings(merges)));
    }
    for (key, id) in [
        ("bos_token_id", 2),
        ("eos_token_id", 1),
        ("unknown_token_id", 3),
        ("padding_token_id", 0),
    ] {
        kv.push((format!("tokenizer.ggml.{key}"), Value::U32(id)));
    }
    for (key, b) in [
        ("add_bos_token", true),
        ("add_eos_token", false),
        ("add_space_prefix", false),
    ] {
        kv.push((format!("tokenizer.ggml.{key}"), Value::Bool(b)));
    }
    kv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fillers_are_unique_and_prefix_closed() {
        let f = fillers(20_000);
        assert_eq!(f.len(), 20_000);
        let set: std::collections::HashSet<&str> = f.iter().map(|s| s.as_str()).collect();
        assert_eq!(set.len(), f.len());
        for p in f.iter().filter(|p| p.chars().count() > 1) {
            let last = p.char_indices().last().unwrap().0;
            assert!(set.contains(&p[..last]) && set.contains(&p[last..]), "{p}");
        }
    }
}
