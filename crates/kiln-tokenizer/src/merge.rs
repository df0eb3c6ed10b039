//! The merge loop SentencePiece ([`crate::spm`]) and Gemma 4 BPE
//! ([`crate::bpe`]) share (llama.cpp's `llm_tokenizer_spm_session` and
//! `llm_tokenizer_bpe_session`): start from one symbol per UTF-8
//! character, repeatedly merge the adjacent pair of highest priority (ties:
//! the leftmost pair), then emit each symbol as its token or as `<0xXX>`
//! byte tokens. The two differ only in a pair's priority: SPM's is the
//! score of the concatenation's token, BPE's the merge's rank (lower first).
//!
//! Symbols form a linked list over the text; candidate pairs live in a
//! binary heap and are invalidated lazily (a pair is stale when either side
//! has been merged away or grown), so a run of n characters costs
//! O(n log n) whatever its content.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::Tokenizer;

/// Byte length of the UTF-8 sequence a lead byte announces; continuation
/// and invalid bytes count as 1 (llama.cpp's `unicode_len_utf8`).
pub(crate) fn utf8_len(lead: u8) -> usize {
    const LEN: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LEN[(lead >> 4) as usize] as usize
}

#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    /// 0 once merged into its left neighbour.
    len: u32,
    prev: i32,
    next: i32,
}

/// Split `text` into one symbol per (possibly truncated) UTF-8 sequence.
fn split_chars(text: &[u8], symbols: &mut Vec<Symbol>) {
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

/// A candidate merge of the adjacent symbols `left` and `right`, `size`
/// bytes long when it was pushed.
struct Bigram<P> {
    priority: P,
    left: i32,
    right: i32,
    size: u32,
}

impl<P: Ord> PartialEq for Bigram<P> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<P: Ord> Eq for Bigram<P> {}
impl<P: Ord> PartialOrd for Bigram<P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<P: Ord> Ord for Bigram<P> {
    /// Max-heap: highest priority first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then(other.left.cmp(&self.left))
    }
}

/// The symbol list and pair heap, kept to be reused across runs of text.
pub(crate) struct Merger<P> {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Bigram<P>>,
}

impl<P: Ord> Merger<P> {
    pub(crate) fn new() -> Self {
        Merger {
            symbols: Vec::new(),
            heap: BinaryHeap::new(),
        }
    }

    /// Merges the characters of `text` as the module docs say and appends
    /// the result to `out`. `priority(pair, left_len)` is the priority of
    /// merging `pair[..left_len]` with `pair[left_len..]`, None when that
    /// pair cannot merge.
    pub(crate) fn encode(
        &mut self,
        tok: &Tokenizer,
        text: &[u8],
        mut priority: impl FnMut(&[u8], usize) -> Option<P>,
        out: &mut Vec<u32>,
    ) {
        let (symbols, heap) = (&mut self.symbols, &mut self.heap);
        split_chars(text, symbols);
        heap.clear();
        let mut try_add = |symbols: &[Symbol], heap: &mut BinaryHeap<Bigram<P>>, left, right| {
            if left < 0 || right < 0 {
                return;
            }
            let (l, r): (Symbol, Symbol) = (symbols[left as usize], symbols[right as usize]);
            let size = l.len + r.len;
            let s = l.start as usize;
            // Adjacent symbols are adjacent in the text.
            if let Some(priority) = priority(&text[s..s + size as usize], l.len as usize) {
                heap.push(Bigram {
                    priority,
                    left,
                    right,
                    size,
                });
            }
        };

        for i in 1..symbols.len() as i32 {
            try_add(symbols, heap, i - 1, i);
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
            try_add(symbols, heap, l.prev, b.left);
            try_add(symbols, heap, b.left, r.next);
        }

        // Merged symbols stay in text order (the right one is emptied), so
        // the live ones in order are the linked list walked from the head.
        // SPM's merged symbols are tokens by construction, so llama.cpp's
        // "resegment" recursion reduces to: the token, or its bytes.
        for s in symbols.iter().filter(|s| s.len > 0) {
            let piece = &text[s.start as usize..(s.start + s.len) as usize];
            match tok.lookup(piece) {
                Some(id) => out.push(id),
                None => tok.push_bytes(piece, out),
            }
        }
    }
}
