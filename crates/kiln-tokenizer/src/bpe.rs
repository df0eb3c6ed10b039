//! Gemma 4 BPE (llama.cpp's `llm_tokenizer_bpe_session` with the `gemma4`
//! pre-tokenizer): spaces become `▁`, the text is split into runs of
//! newlines and runs of everything else, and within each run the adjacent
//! pair with the lowest merge rank is merged (ties: leftmost) until none
//! is left. Symbols that are not tokens become `<0xXX>` byte tokens.
//!
//! The splitter is a single linear pass (llama.cpp's std::regex version
//! overflowed the stack on long lines, PR #21587).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::spm::{escape_spaces, split_chars, Symbol};
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

struct Bigram {
    rank: u32,
    left: i32,
    right: i32,
    size: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap: lowest rank first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        other.rank.cmp(&self.rank).then(other.left.cmp(&self.left))
    }
}

/// Tokenize one raw fragment, appending ids to `out`.
pub(crate) fn encode(tok: &Tokenizer, raw: &[u8], out: &mut Vec<u32>) {
    let mut escaped = Vec::with_capacity(raw.len() + 8);
    escape_spaces(raw, &mut escaped);
    let text = reencode_lossy(&escaped);

    let mut symbols: Vec<Symbol> = Vec::new();
    let mut heap: BinaryHeap<Bigram> = BinaryHeap::new();
    let mut key = Vec::new();
    let mut start = 0usize;
    while start < text.len() {
        let nl = text[start] == b'\n';
        let end = text[start..]
            .iter()
            .position(|&b| (b == b'\n') != nl)
            .map_or(text.len(), |p| start + p);
        encode_word(
            tok,
            &text[start..end],
            nl,
            &mut symbols,
            &mut heap,
            &mut key,
            out,
        );
        start = end;
    }
}

fn encode_word(
    tok: &Tokenizer,
    word: &[u8],
    newlines: bool,
    symbols: &mut Vec<Symbol>,
    heap: &mut BinaryHeap<Bigram>,
    key: &mut Vec<u8>,
    out: &mut Vec<u32>,
) {
    // A run of newlines that is itself a token ("\n\n" = 108) is kept
    // whole (llama.cpp PR #21343).
    if newlines {
        if let Some(id) = tok.lookup(word) {
            out.push(id);
            return;
        }
    }
    split_chars(word, symbols);
    heap.clear();

    let try_add = |symbols: &[Symbol],
                   heap: &mut BinaryHeap<Bigram>,
                   key: &mut Vec<u8>,
                   left: i32,
                   right: i32| {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (symbols[left as usize], symbols[right as usize]);
        let (ls, rs) = (l.start as usize, r.start as usize);
        merge_key_into(
            key,
            &word[ls..ls + l.len as usize],
            &word[rs..rs + r.len as usize],
        );
        if let Some(rank) = tok.merge_rank(key) {
            heap.push(Bigram {
                rank,
                left,
                right,
                size: l.len + r.len,
            });
        }
    };

    for i in 1..symbols.len() as i32 {
        try_add(symbols, heap, key, i - 1, i);
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (symbols[b.left as usize], symbols[b.right as usize]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left as usize].len += r.len;
        symbols[b.right as usize].len = 0;
        symbols[b.left as usize].next = r.next;
        if r.next >= 0 {
            symbols[r.next as usize].prev = b.left;
        }
        try_add(symbols, heap, key, l.prev, b.left);
        try_add(symbols, heap, key, b.left, r.next);
    }

    for s in symbols.iter().filter(|s| s.len > 0) {
        let piece = &word[s.start as usize..(s.start + s.len) as usize];
        match tok.lookup(piece) {
            Some(id) => out.push(id),
            None => tok.push_bytes(piece, out),
        }
    }
}
