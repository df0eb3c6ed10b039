//! Per-layer K/V storage: a ring of `window` rows on sliding layers, a
//! growable buffer (up to the context length) on global layers, nothing on
//! KV-shared layers (they read their source layer's cache). Both kinds are
//! allocated only as far as positions are reserved (a ring never beyond its
//! window), so a short context costs short buffers.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{Backend, KvBinding, KvDst, PastKv};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

pub(crate) struct LayerKv<B: Backend> {
    pub k: B::Buf,
    pub v: B::Buf,
    /// Allocated rows.
    pub rows: usize,
    /// Sliding layers: position `p` in row `p % rows`. Fewer rows than the
    /// window only while no position past them was reserved, so a ring
    /// wraps only once it has all `window` rows.
    pub ring: bool,
    /// The window of a ring (its most rows); unused on global layers.
    pub window: usize,
    pub row_len: usize,
}

pub struct KvCache<B: Backend> {
    pub(crate) layers: Vec<Option<LayerKv<B>>>,
    len: usize,
    max_len: usize,
    /// The batch being stored overwrote ring rows of positions before
    /// `len`: if it fails, the cache no longer holds them.
    clobbered: bool,
    /// Identity of the current allocations ([`buffer_id`]), renewed on
    /// every reallocation.
    id: u64,
}

/// A process-unique id for a set of buffers: steps keyed by it (see
/// [`crate::GraphKey`]) can tell a reallocated buffer from the old one.
pub(crate) fn buffer_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Positions the cache grows by when a forward call outruns what was
/// reserved: enough to amortise the copy, little enough not to double
/// memory (callers that know the final length reserve it instead).
const GROW_ROWS: usize = 256;

impl<B: Backend> KvCache<B> {
    pub fn new(backend: &B, cfg: &ModelConfig) -> Result<Self> {
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for l in &cfg.layers {
            if !l.owns_kv() {
                layers.push(None);
                continue;
            }
            let (ring, window) = match l.window {
                Some(w) => (true, w.min(cfg.context_length)),
                None => (false, 0),
            };
            layers.push(Some(LayerKv {
                k: backend.alloc(0)?,
                v: backend.alloc(0)?,
                rows: 0,
                ring,
                window,
                row_len: l.kv_dim(),
            }));
        }
        Ok(KvCache {
            layers,
            len: 0,
            max_len: cfg.context_length,
            clobbered: false,
            id: buffer_id(),
        })
    }

    /// Positions processed so far (the next token's position).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets everything (keeps the allocations).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Rewinds to the first `len` positions, so the next forward call
    /// continues at position `len` (prefix reuse). Global layers always can;
    /// a sliding ring of `r` rows keeps position `p` in row `p % r`, which
    /// position `p + r` overwrote. The next query (at `len`) needs keys back
    /// to `len + 1 - r`; if the oldest of those was overwritten the rewind
    /// is refused and the cache is left unchanged (recompute instead).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(ModelError::Invalid(format!(
                "cannot truncate a KV cache of {} positions to {len}",
                self.len
            )));
        }
        if len > 0 {
            for (il, l) in self.layers.iter().enumerate() {
                let Some(l) = l.as_ref().filter(|l| l.ring) else {
                    continue;
                };
                let oldest_needed = (len + 1).saturating_sub(l.rows);
                if oldest_needed + l.rows < self.len {
                    return Err(ModelError::Invalid(format!(
                        "cannot rewind the KV cache from {} to {len} positions: layer {il}'s \
                         {}-row window ring overwrote position {oldest_needed}",
                        self.len, l.rows
                    )));
                }
            }
        }
        self.len = len;
        Ok(())
    }

    /// Identity of the cache's current buffers: changes whenever
    /// [`KvCache::reserve`] reallocates them.
    pub fn buffers_id(&self) -> u64 {
        self.id
    }

    /// Rows allocated for `layer` (0 for KV-shared layers).
    pub fn allocated_rows(&self, layer: usize) -> usize {
        self.layers
            .get(layer)
            .and_then(|l| l.as_ref())
            .map_or(0, |l| l.rows)
    }

    /// Rows currently holding live positions for `layer`.
    pub fn rows_in_use(&self, layer: usize) -> usize {
        match self.layers.get(layer).and_then(|l| l.as_ref()) {
            None => 0,
            Some(l) if l.ring => self.len.min(l.rows),
            Some(_) => self.len,
        }
    }

    /// Bytes of K and V storage allocated (f32 rows).
    pub fn allocated_bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|l| 2 * l.rows * l.row_len * 4)
            .sum()
    }

    /// Grows every layer to hold `n_pos` positions exactly (a ring to at
    /// most its window), so a caller that knows prompt + generation length
    /// allocates once. Never shrinks.
    pub fn reserve(&mut self, backend: &B, n_pos: usize) -> Result<()> {
        if n_pos > self.max_len {
            return Err(ModelError::Invalid(format!(
                "{n_pos} positions exceed the context length {}",
                self.max_len
            )));
        }
        let len = self.len;
        let mut grew = false;
        for l in self.layers.iter_mut().flatten() {
            let rows = if l.ring { n_pos.min(l.window) } else { n_pos };
            if l.rows < rows {
                // A ring short of its window has not wrapped (see `ring`),
                // so on every layer the live rows are the first `len`.
                let live = len.min(l.rows) * l.row_len;
                l.k = grow(backend, &l.k, live, rows * l.row_len)?;
                l.v = grow(backend, &l.v, live, rows * l.row_len)?;
                l.rows = rows;
                grew = true;
            }
        }
        if grew {
            self.id = buffer_id();
        }
        Ok(())
    }

    /// Makes room for positions up to `end`: [`GROW_ROWS`] at a time past
    /// what was reserved.
    pub(crate) fn ensure(&mut self, backend: &B, end: usize) -> Result<()> {
        if end > self.max_len {
            return Err(ModelError::Invalid(format!(
                "position {} exceeds the context length {}",
                end - 1,
                self.max_len
            )));
        }
        let short = self
            .layers
            .iter()
            .flatten()
            .any(|l| l.rows < if l.ring { end.min(l.window) } else { end });
        if short {
            self.reserve(backend, end.next_multiple_of(GROW_ROWS).min(self.max_len))?;
        }
        Ok(())
    }

    pub(crate) fn past(&self, layer: usize) -> Option<PastKv<'_, B>> {
        let l = self.layers.get(layer)?.as_ref()?;
        if self.len == 0 {
            return None;
        }
        Some(PastKv {
            k: &l.k,
            v: &l.v,
            start: if l.ring {
                self.len.saturating_sub(l.rows)
            } else {
                0
            },
            rows: l.rows,
        })
    }

    /// Where `layer` stores the `n` positions `len..len + n` (the rows
    /// [`KvCache::ensure`] reserved); [`KvCache::advance`] then counts them
    /// once every layer has.
    pub(crate) fn store_dst(&mut self, layer: usize, n: usize) -> Result<KvDst<'_, B>> {
        let p0 = self.len;
        let Some(l) = self.layers.get_mut(layer).and_then(|l| l.as_mut()) else {
            return Err(ModelError::Backend(format!("layer {layer}: no K/V cache")));
        };
        // Rows for every position (a ring: for its window), as `ensure`
        // reserved.
        let need = if l.ring {
            (p0 + n).min(l.window)
        } else {
            p0 + n
        };
        if l.rows < need.max(1) {
            return Err(ModelError::Backend(format!(
                "layer {layer}: {} K/V rows cannot take positions up to {}",
                l.rows,
                p0 + n
            )));
        }
        // Once a ring wraps, the rows it writes held positions before `p0`.
        self.clobbered |= l.ring && p0 > 0 && p0 + n > l.rows;
        Ok(KvDst {
            k: &mut l.k,
            v: &mut l.v,
            rows: l.rows,
            row_len: l.row_len,
            ring: l.ring,
        })
    }

    /// `layer`'s buffers, for [`Backend::bind_kv`] (None on KV-shared
    /// layers).
    pub(crate) fn binding(&self, layer: usize) -> Option<KvBinding<'_, B>> {
        let l = self.layers.get(layer)?.as_ref()?;
        Some(KvBinding {
            k: &l.k,
            v: &l.v,
            rows: l.rows,
        })
    }

    /// Counts the `n` positions every layer has stored.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
        self.clobbered = false;
    }

    /// Ends a failed batch: rows it stored past `len` are ignored, but if it
    /// overwrote ring rows the cache still needed, the cache is emptied.
    pub(crate) fn abort(&mut self) {
        if self.clobbered {
            self.len = 0;
        }
        self.clobbered = false;
    }
}

/// `buf` with room for `len` values, its first `live` kept.
fn grow<B: Backend>(backend: &B, buf: &B::Buf, live: usize, len: usize) -> Result<B::Buf> {
    let mut out = backend.alloc(len)?;
    if live > 0 {
        backend.copy_strided(buf, 0, 0, &mut out, 0, 0, 1, live, 1.0, false)?;
    }
    Ok(out)
}
