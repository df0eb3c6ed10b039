//! KV memory accounting and the prefix cache: finished sequences' caches,
//! kept by their token lists in least-recently-used order, so a prompt that
//! repeats a system prompt or earlier chat turns skips recomputing them.

use kiln_model::{Backend, KvCache, ModelConfig};

/// Bytes a [`KvCache`] holds once reserved for `n_pos` positions: per
/// layer that owns K/V, f32 K and V rows of `kv_dim`, a sliding layer at
/// most its window of rows (see `KvCache::reserve`).
pub fn kv_bytes(cfg: &ModelConfig, n_pos: usize) -> usize {
    cfg.layers
        .iter()
        .filter(|l| l.owns_kv())
        .map(|l| {
            let rows = match l.window {
                Some(w) => n_pos.min(w.min(cfg.context_length)),
                None => n_pos,
            };
            2 * rows * l.kv_dim() * std::mem::size_of::<f32>()
        })
        .sum()
}

/// A finished sequence's cache and the tokens its K/V hold.
pub(crate) struct CachedPrefix<B: Backend> {
    pub tokens: Vec<u32>,
    pub cache: KvCache<B>,
}

/// Caches by recency: the front is the least recently used.
pub(crate) struct PrefixCache<B: Backend> {
    entries: Vec<CachedPrefix<B>>,
    max_entries: usize,
}

/// Length of the common prefix of two token lists.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<B: Backend> PrefixCache<B> {
    /// At most `max_entries` caches (the scan per admission is linear).
    pub fn new(max_entries: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            max_entries,
        }
    }

    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.cache.allocated_bytes()).sum()
    }

    /// Keeps a cache as the most recent entry; an entry whose tokens are a
    /// prefix of the new one's is dropped (the new one serves every prompt
    /// it did), and past `max_entries` the oldest goes.
    pub fn insert(&mut self, tokens: Vec<u32>, cache: KvCache<B>) {
        if tokens.is_empty() || cache.len() != tokens.len() {
            return;
        }
        self.entries.retain(|e| !tokens.starts_with(&e.tokens));
        self.entries.push(CachedPrefix { tokens, cache });
        if self.entries.len() > self.max_entries {
            self.entries.remove(0);
        }
    }

    /// Removes and returns the entry sharing the longest prefix with
    /// `prompt` (at least 1 token) and that length; ties go to the most
    /// recent entry.
    pub fn take_best(&mut self, prompt: &[u32]) -> Option<(CachedPrefix<B>, usize)> {
        let (i, lcp) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt)))
            .filter(|&(_, lcp)| lcp > 0)
            .max_by_key(|&(i, lcp)| (lcp, i))?;
        Some((self.entries.remove(i), lcp))
    }

    /// Drops the least recently used entry; false when empty.
    pub fn evict_oldest(&mut self) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        self.entries.remove(0);
        true
    }
}
