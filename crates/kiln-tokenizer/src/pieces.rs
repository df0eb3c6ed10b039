//! Byte-string lookup without an allocation per entry: an open-addressing
//! [`Index`] of ids hashed on bytes that live elsewhere, the [`Vocab`]
//! (token texts, read from the GGUF's own bytes) and [`Pieces`] (Gemma 4's
//! merge keys, stored end to end). A 262,144-token vocabulary costs a
//! 2 MiB index, where a `Box<str>` per token and a `HashMap<Box<[u8]>,
//! u32>` took ~20 MB in half a million allocations.

use kiln_gguf::StringArray;

/// An entry would need an id or byte offset beyond what the index holds
/// (ids below 2^31 - 1, bytes below 4 GiB).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TooLarge;

/// What [`Index::insert`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Inserted {
    /// The key got the next id.
    New(u32),
    /// An equal key already has this id.
    Existing(u32),
}

/// Ids `0..len` of byte strings, found by their bytes. The strings are the
/// caller's: every call gets `entry(id)`, the bytes of entry `id`.
#[derive(Debug)]
pub(crate) struct Index {
    /// Power-of-two table, at most half full, linear probing. A slot holds
    /// `id + 1` in its low `id_bits` bits (0: empty) and the entry's hash
    /// tag above them, which turns most mismatched probes away without
    /// reading the entry.
    slots: Vec<u32>,
    id_bits: u32,
    len: usize,
}

/// Word-at-a-time multiply-fold hash (tokens are one or two words).
fn hash(key: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let fold = |a: u64, b: u64| {
        let m = u128::from(a) * u128::from(b);
        (m as u64) ^ ((m >> 64) as u64)
    };
    let mut h = key.len() as u64;
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8-byte chunk"));
        h = fold(h ^ w, K);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = fold(h ^ u64::from_le_bytes(w), K);
    }
    fold(h, K ^ 0x2D35_8DCC_AA6C_78A5)
}

impl Index {
    /// An index with room for `n` entries before it grows.
    pub(crate) fn with_capacity(n: usize) -> Index {
        let mut index = Index {
            slots: Vec::new(),
            id_bits: 0,
            len: 0,
        };
        index.rebuild(n, |_| &[]);
        index
    }

    /// The id of the entry equal to `key`.
    pub(crate) fn find<'k>(&self, key: &[u8], entry: impl Fn(u32) -> &'k [u8]) -> Option<u32> {
        self.probe(key, hash(key), &entry).ok()
    }

    /// Indexes `key` as entry `len` (the caller stores it under that id),
    /// unless an equal entry is indexed.
    pub(crate) fn insert<'k>(
        &mut self,
        key: &[u8],
        entry: impl Fn(u32) -> &'k [u8],
    ) -> Result<Inserted, TooLarge> {
        let h = hash(key);
        if let Ok(id) = self.probe(key, h, &entry) {
            return Ok(Inserted::Existing(id));
        }
        let id = u32::try_from(self.len)
            .ok()
            .filter(|&id| id < i32::MAX as u32)
            .ok_or(TooLarge)?;
        if 2 * (self.len + 1) > self.slots.len() {
            self.rebuild(2 * (self.len + 1), &entry);
        }
        let slot = self.probe(key, h, &entry).expect_err("not present");
        self.slots[slot] = self.tag(h) | (id + 1);
        self.len += 1;
        Ok(Inserted::New(id))
    }

    /// The bits of a slot above the id.
    fn tag(&self, h: u64) -> u32 {
        (h as u32).checked_shl(self.id_bits).unwrap_or(0)
    }

    /// `Ok(id)` of the entry equal to `key`, else `Err(slot)`: the empty
    /// slot where it would go.
    fn probe<'k>(
        &self,
        key: &[u8],
        h: u64,
        entry: &impl Fn(u32) -> &'k [u8],
    ) -> Result<u32, usize> {
        let mask = self.slots.len() - 1;
        let id_mask = (1u32 << self.id_bits) - 1;
        let tag = self.tag(h);
        // High bits pick the slot, low bits make the tag.
        let mut i = (h >> 32) as usize & mask;
        loop {
            let s = self.slots[i];
            if s == 0 {
                return Err(i);
            }
            if s & !id_mask == tag && entry((s & id_mask) - 1) == key {
                return Ok((s & id_mask) - 1);
            }
            i = (i + 1) & mask;
        }
    }

    /// Rebuilds the table for `n` entries (at least the indexed ones).
    fn rebuild<'k>(&mut self, n: usize, entry: impl Fn(u32) -> &'k [u8]) {
        let cap = n.max(self.len).max(8).next_power_of_two();
        // `id + 1 <= cap` fits in `id_bits`; at most 31 (ids stay below
        // 2^31 - 1), so `1 << id_bits` never overflows.
        self.id_bits = (cap.trailing_zeros() + 1).min(31);
        self.slots = vec![0; 2 * cap];
        for id in 0..self.len as u32 {
            let key = entry(id);
            let h = hash(key);
            let slot = self.probe(key, h, &entry).expect_err("unique keys");
            self.slots[slot] = self.tag(h) | (id + 1);
        }
    }
}

/// Why a vocabulary cannot be indexed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum VocabError {
    /// Two tokens have this text.
    Duplicate(String),
    TooLarge,
}

/// Token texts by id and ids by text. The texts are the GGUF's
/// `tokenizer.ggml.tokens`, shared with its metadata (no copy).
#[derive(Debug)]
pub(crate) struct Vocab {
    texts: StringArray,
    /// Empty tokens, renamed `[EMPTY_{id}]` (as llama.cpp does, so that
    /// they stay unique), by ascending id.
    renamed: Vec<(u32, Box<str>)>,
    index: Index,
}

/// The text of token `id` (empty past the end).
fn text<'a>(texts: &'a StringArray, renamed: &'a [(u32, Box<str>)], id: u32) -> &'a [u8] {
    if !renamed.is_empty() {
        if let Ok(i) = renamed.binary_search_by_key(&id, |r| r.0) {
            return renamed[i].1.as_bytes();
        }
    }
    texts.get_bytes(id as usize).unwrap_or_default()
}

impl Vocab {
    /// Indexes `texts`.
    pub(crate) fn new(texts: StringArray) -> Result<Vocab, VocabError> {
        let mut v = Vocab {
            index: Index::with_capacity(texts.len()),
            renamed: Vec::new(),
            texts,
        };
        for id in 0..v.texts.len() as u32 {
            if v.texts.get_bytes(id as usize).is_some_and(<[u8]>::is_empty) {
                v.renamed.push((id, format!("[EMPTY_{id}]").into()));
            }
            let Vocab {
                texts,
                renamed,
                index,
            } = &mut v;
            let key = text(texts, renamed, id);
            let inserted = index
                .insert(key, |i| text(texts, renamed, i))
                .map_err(|TooLarge| VocabError::TooLarge)?;
            if let Inserted::Existing(_) = inserted {
                let key = String::from_utf8_lossy(key).into_owned();
                return Err(VocabError::Duplicate(key));
            }
        }
        Ok(v)
    }

    pub(crate) fn len(&self) -> usize {
        self.texts.len()
    }

    /// The text of token `id` (UTF-8).
    pub(crate) fn get(&self, id: u32) -> Option<&[u8]> {
        ((id as usize) < self.len()).then(|| text(&self.texts, &self.renamed, id))
    }

    pub(crate) fn find(&self, key: &[u8]) -> Option<u32> {
        self.index
            .find(key, |id| text(&self.texts, &self.renamed, id))
    }
}

/// Byte strings stored end to end, ids `0..len()` in insertion order.
#[derive(Debug)]
pub(crate) struct Pieces {
    bytes: Vec<u8>,
    /// End of entry `i` in `bytes` (it starts where entry `i - 1` ends).
    ends: Vec<u32>,
    index: Index,
}

/// Entry `id` of `bytes`/`ends`.
fn piece<'a>(bytes: &'a [u8], ends: &[u32], id: u32) -> &'a [u8] {
    let i = id as usize;
    let start = if i == 0 { 0 } else { ends[i - 1] as usize };
    &bytes[start..ends[i] as usize]
}

impl Pieces {
    /// Room for `n` entries of `bytes` bytes in all without growing.
    pub(crate) fn with_capacity(n: usize, bytes: usize) -> Pieces {
        Pieces {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(n),
            index: Index::with_capacity(n),
        }
    }

    pub(crate) fn find(&self, key: &[u8]) -> Option<u32> {
        self.index
            .find(key, |id| piece(&self.bytes, &self.ends, id))
    }

    /// Adds `key` as entry `len()`, unless an equal entry exists.
    pub(crate) fn insert(&mut self, key: &[u8]) -> Result<Inserted, TooLarge> {
        let Pieces { bytes, ends, index } = self;
        let end = u32::try_from(bytes.len() + key.len()).map_err(|_| TooLarge)?;
        let r = index.insert(key, |id| piece(bytes, ends, id))?;
        if let Inserted::New(_) = r {
            bytes.extend_from_slice(key);
            ends.push(end);
        }
        Ok(r)
    }
}

impl Default for Pieces {
    fn default() -> Pieces {
        Pieces::with_capacity(0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_insert_and_duplicates() {
        let mut p = Pieces::with_capacity(3, 8);
        assert_eq!(p.insert(b"ab"), Ok(Inserted::New(0)));
        assert_eq!(p.insert(b""), Ok(Inserted::New(1)));
        assert_eq!(p.insert(b"ab"), Ok(Inserted::Existing(0)));
        assert_eq!(p.insert("▁x".as_bytes()), Ok(Inserted::New(2)));
        assert_eq!(p.find(b"ab"), Some(0));
        assert_eq!(p.find(b""), Some(1));
        assert_eq!(p.find("▁x".as_bytes()), Some(2));
        assert_eq!(p.find(b"a"), None);
    }

    /// Growing past the initial capacity rebuilds the table (and widens the
    /// id field) without losing entries; long keys hash every word.
    #[test]
    fn grows_and_keeps_every_entry() {
        let mut p = Pieces::default();
        let key = |i: u32| format!("piece-{i}-{}", "x".repeat(i as usize % 20));
        for i in 0..5000 {
            assert_eq!(p.insert(key(i).as_bytes()), Ok(Inserted::New(i)));
        }
        for i in 0..5000 {
            assert_eq!(p.find(key(i).as_bytes()), Some(i), "{i}");
        }
        assert_eq!(p.find(b"piece-5000-"), None);
    }

    #[test]
    fn vocab_renames_empty_tokens_and_refuses_repeats() {
        let v = Vocab::new(["a", "", "b", ""].into_iter().collect()).unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v.get(1), Some(&b"[EMPTY_1]"[..]));
        assert_eq!(v.get(3), Some(&b"[EMPTY_3]"[..]));
        assert_eq!(v.get(4), None);
        assert_eq!(v.find(b"b"), Some(2));
        assert_eq!(v.find(b"[EMPTY_3]"), Some(3));
        assert_eq!(v.find(b""), None);
        let e = Vocab::new(["a", "b", "a"].into_iter().collect()).unwrap_err();
        assert_eq!(e, VocabError::Duplicate("a".into()));
    }
}
