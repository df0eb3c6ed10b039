//! SentencePiece BPE (llama.cpp's `llm_tokenizer_spm_session`): start from
//! one symbol per UTF-8 character, repeatedly merge the adjacent pair whose
//! concatenation is the highest-scoring vocabulary token (ties: leftmost),
//! then emit each symbol as its token or as `<0xXX>` byte tokens.
//!
//! Symbols form a linked list over the text; candidate pairs live in a
//! binary heap and are invalidated lazily (a pair is stale when either side
//! has been merged away or grown), so a line of n characters costs
//! O(n log n) whatever its content.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::Tokenizer;

pub(crate) const ESCAPED_SPACE: &[u8] = "▁".as_bytes();

/// Byte length of the UTF-8 sequence a lead byte announces; continuation
/// and invalid bytes count as 1 (llama.cpp's `unicode_len_utf8`).
pub(crate) fn utf8_len(lead: u8) -> usize {
    const LEN: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LEN[(lead >> 4) as usize] as usize
}

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

#[derive(Clone, Copy)]
pub(crate) struct Symbol {
    pub start: u32,
    /// 0 once merged into its left neighbour.
    pub len: u32,
    pub prev: i32,
    pub next: i32,
}

/// Split `text` into one symbol per (possibly truncated) UTF-8 sequence.
pub(crate) fn split_chars(text: &[u8], symbols: &mut Vec<Symbol>) {
    symbols.clear();
    let mut offs = 0usize;
    while offs < text.len() {
        let len = utf8_len(text[offs]).min(text.len() - offs);
        let idx = symbols.len() as i32;
        offs += len;
        symbols.push(Symbol {
            start: (offs - len) as u32,
            len: len as u32,
            prev: idx - 1,
            next: if offs == text.len() { -1 } else { idx + 1 },
        });
    }
}

struct Bigram {
    score: f32,
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
    /// Max-heap: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

/// Tokenize one raw fragment, appending ids to `out`.
pub(crate) fn encode(tok: &Tokenizer, raw: &[u8], space_prefix: bool, out: &mut Vec<u32>) {
    let mut text = Vec::with_capacity(raw.len() + 8);
    if space_prefix {
        text.extend_from_slice(ESCAPED_SPACE);
    }
    escape_spaces(raw, &mut text);

    let mut symbols = Vec::with_capacity(text.len());
    split_chars(&text, &mut symbols);
    let mut heap = BinaryHeap::with_capacity(symbols.len());

    let try_add = |symbols: &[Symbol], heap: &mut BinaryHeap<Bigram>, left: i32, right: i32| {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (symbols[left as usize], symbols[right as usize]);
        let size = l.len + r.len;
        let s = l.start as usize;
        if let Some(id) = tok.lookup(&text[s..s + size as usize]) {
            heap.push(Bigram {
                score: tok.scores[id as usize],
                left,
                right,
                size,
            });
        }
    };

    for i in 1..symbols.len() as i32 {
        try_add(&symbols, &mut heap, i - 1, i);
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
        try_add(&symbols, &mut heap, l.prev, b.left);
        try_add(&symbols, &mut heap, b.left, r.next);
    }

    // Every merged symbol is a token by construction, so llama.cpp's
    // "resegment" recursion reduces to: the token, or its bytes.
    let mut i = if symbols.is_empty() { -1 } else { 0 };
    while i >= 0 {
        let s = symbols[i as usize];
        let piece = &text[s.start as usize..(s.start + s.len) as usize];
        match tok.lookup(piece) {
            Some(id) => out.push(id),
            None => tok.push_bytes(piece, out),
        }
        i = s.next;
    }
}
