//! Gemma 4 BPE (llama.cpp's `llm_tokenizer_bpe_session` with the `gemma4`
//! pre-tokenizer): spaces become `▁`, the text is split into runs of
//! newlines and runs of everything else, and within each run the adjacent
//! pair with the lowest merge rank is merged (ties: leftmost) until none
//! is left. Symbols that are not tokens become `<0xXX>` byte tokens (the
//! merge loop is [`crate::merge`], shared with SentencePiece).
//!
//! The splitter is a single linear pass (llama.cpp's std::regex version
//! overflowed the stack on long lines, PR #21587).

use std::cmp::Reverse;

use crate::merge::Merger;
use crate::spm::escape_spaces;
use crate::vocab::merge_key_into;
use crate::Tokenizer;

/// Re-encode `text` the way llama.cpp's pre-splitter does: decode code
/// points without checking for overlong forms or surrogates, turn each
/// undecodable byte into U+FFFD, and re-encode. A code point above
/// U+10FFFF (lead bytes F4 9x..F7) makes llama.cpp throw; we emit U+FFFD.
fn reencode_lossy(text: &[u8]) -> Vec<u8> {
    const FFFD: [u8; 3] = [0xEF, 0xBF, 0xBD];
    let mut out = Vec::with_capacity(text.len() + 8);
    let mut i = 0usize;
    let cont = |j: usize| text.get(j).is_some_and(|&b| b & 0xC0 == 0x80);
    while i < text.len() {
        let b = text[i];
        let (cp, n) = if b & 0x80 == 0 {
            (b as u32, 1)
        } else if b & 0x40 == 0 {
            (u32::MAX, 1)
        } else if b & 0x20 == 0 {
            if cont(i + 1) {
                (((b as u32 & 0x1F) << 6) | (text[i + 1] as u32 & 0x3F), 2)
            } else {
                (u32::MAX, 1)
            }
        } else if b & 0x10 == 0 {
            if cont(i + 1) && cont(i + 2) {
                let cp = ((b as u32 & 0x0F) << 12)
                    | ((text[i + 1] as u32 & 0x3F) << 6)
                    | (text[i + 2] as u32 & 0x3F);
                (cp, 3)
            } else {
                (u32::MAX, 1)
            }
        } else if b & 0x08 == 0 {
            if cont(i + 1) && cont(i + 2) && cont(i + 3) {
                let cp = ((b as u32 & 0x07) << 18)
                    | ((text[i + 1] as u32 & 0x3F) << 12)
                    | ((text[i + 2] as u32 & 0x3F) << 6)
                    | (text[i + 3] as u32 & 0x3F);
                (cp, 4)
            } else {
                (u32::MAX, 1)
            }
        } else {
            (u32::MAX, 1)
        };
        i += n;
        match cp {
            0..=0x7F => out.push(cp as u8),
            0x80..=0x7FF => {
                out.extend_from_slice(&[0xC0 | (cp >> 6) as u8, 0x80 | (cp & 0x3F) as u8])
            }
            0x800..=0xFFFF => out.extend_from_slice(&[
                0xE0 | (cp >> 12) as u8,
                0x80 | ((cp >> 6) & 0x3F) as u8,
                0x80 | (cp & 0x3F) as u8,
            ]),
            0x10000..=0x10FFFF => out.extend_from_slice(&[
                0xF0 | (cp >> 18) as u8,
                0x80 | ((cp >> 12) & 0x3F) as u8,
                0x80 | ((cp >> 6) & 0x3F) as u8,
                0x80 | (cp & 0x3F) as u8,
            ]),
            _ => out.extend_from_slice(&FFFD),
        }
    }
    out
}

/// Tokenize one raw fragment, appending ids to `out`.
pub(crate) fn encode(tok: &Tokenizer, raw: &[u8], out: &mut Vec<u32>) {
    let mut escaped = Vec::with_capacity(raw.len() + 8);
    escape_spaces(raw, &mut escaped);
    let text = reencode_lossy(&escaped);

    let mut merger = Merger::new();
    let mut key = Vec::new();
    let mut start = 0usize;
    while start < text.len() {
        let nl = text[start] == b'\n';
        let end = text[start..]
            .iter()
            .position(|&b| (b == b'\n') != nl)
            .map_or(text.len(), |p| start + p);
        let word = &text[start..end];
        // A run of newlines that is itself a token ("\n\n" = 108) is kept
        // whole (llama.cpp PR #21343).
        let whole = if nl { tok.lookup(word) } else { None };
        match whole {
            Some(id) => out.push(id),
            // The merge priority: the pair's rank, lowest first.
            None => merger.encode(
                tok,
                word,
                |pair, left_len| {
                    let (l, r) = pair.split_at(left_len);
                    merge_key_into(&mut key, l, r);
                    tok.merge_rank(&key).map(Reverse)
                },
                out,
            ),
        }
        start = end;
    }
}
