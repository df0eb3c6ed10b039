//! SentencePiece BPE (llama.cpp's `llm_tokenizer_spm_session`): start from
//! one symbol per UTF-8 character, repeatedly merge the adjacent pair whose
//! concatenation is the highest-scoring vocabulary token (ties: leftmost),
//! then emit each symbol as its token or as `<0xXX>` byte tokens (the loop
//! is [`crate::merge`], shared with BPE).

use std::cmp::Ordering;

use crate::merge::Merger;
use crate::Tokenizer;

pub(crate) const ESCAPED_SPACE: &[u8] = "▁".as_bytes();

/// Replace every ' ' with '▁'.
pub(crate) fn escape_spaces(text: &[u8], out: &mut Vec<u8>) {
    for &b in text {
        if b == b' ' {
            out.extend_from_slice(ESCAPED_SPACE);
        } else {
            out.push(b);
        }
    }
}

/// Tokenize one raw fragment, appending ids to `out`.
pub(crate) fn encode(tok: &Tokenizer, raw: &[u8], space_prefix: bool, out: &mut Vec<u32>) {
    let mut text = Vec::with_capacity(raw.len() + 8);
    if space_prefix {
        text.extend_from_slice(ESCAPED_SPACE);
    }
    escape_spaces(raw, &mut text);

    // The merge priority: the score of the concatenation's token.
    Merger::new().encode(
        tok,
        &text,
        |pair, _| {
            let id = tok.lookup(pair)?;
            tok.scores.get(id as usize).map(Score)
        },
        out,
    );
}

/// A token score ordered by `f32::total_cmp`.
struct Score(f32);

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}
