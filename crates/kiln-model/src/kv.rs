//! Per-layer K/V storage: a ring of `window` rows on sliding layers, a
//! growable buffer (up to the context length) on global layers, nothing on
//! KV-shared layers (they read their source layer's cache).

use crate::backend::{Backend, PastKv};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

pub(crate) struct LayerKv<B: Backend> {
    pub k: B::Buf,
    pub v: B::Buf,
    /// Allocated rows.
    pub rows: usize,
    /// Sliding layers: fixed `window` rows, position `p` in row `p % rows`.
    pub ring: bool,
    pub row_len: usize,
}

pub struct KvCache<B: Backend> {
    pub(crate) layers: Vec<Option<LayerKv<B>>>,
    len: usize,
    max_len: usize,
}

impl<B: Backend> KvCache<B> {
    pub fn new(backend: &B, cfg: &ModelConfig) -> Result<Self> {
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for l in &cfg.layers {
            if !l.owns_kv() {
                layers.push(None);
                continue;
            }
            let row_len = l.kv_dim();
            let (rows, ring) = match l.window {
                Some(w) => (w.min(cfg.context_length), true),
                None => (0, false),
            };
            layers.push(Some(LayerKv {
                k: backend.alloc(rows * row_len)?,
                v: backend.alloc(rows * row_len)?,
                rows,
                ring,
                row_len,
            }));
        }
        Ok(KvCache {
            layers,
            len: 0,
            max_len: cfg.context_length,
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

    /// Grows global layers to hold `n_pos` positions exactly, so a caller
    /// that knows prompt + generation length never reallocates.
    pub fn reserve(&mut self, backend: &B, n_pos: usize) -> Result<()> {
        if n_pos > self.max_len {
            return Err(ModelError::Invalid(format!(
                "{n_pos} positions exceed the context length {}",
                self.max_len
            )));
        }
        let len = self.len;
        for l in self.layers.iter_mut().flatten() {
            if !l.ring && l.rows < n_pos {
                let mut k = backend.alloc(n_pos * l.row_len)?;
                let mut v = backend.alloc(n_pos * l.row_len)?;
                let live = len.min(l.rows) * l.row_len;
                if live > 0 {
                    backend.copy_strided(&l.k, 0, 0, &mut k, 0, 0, 1, live, 1.0, false)?;
                    backend.copy_strided(&l.v, 0, 0, &mut v, 0, 0, 1, live, 1.0, false)?;
                }
                l.k = k;
                l.v = v;
                l.rows = n_pos;
            }
        }
        Ok(())
    }

    /// Makes room for positions up to `end` (amortised doubling).
    pub(crate) fn ensure(&mut self, backend: &B, end: usize) -> Result<()> {
        if end > self.max_len {
            return Err(ModelError::Invalid(format!(
                "position {} exceeds the context length {}",
                end - 1,
                self.max_len
            )));
        }
        let need = self
            .layers
            .iter()
            .flatten()
            .any(|l| !l.ring && l.rows < end);
        if need {
            let cur = self
                .layers
                .iter()
                .flatten()
                .filter(|l| !l.ring)
                .map(|l| l.rows)
                .min()
                .unwrap_or(0);
            let target = end.max(cur * 2).max(64).min(self.max_len);
            self.reserve(backend, target)?;
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

    /// Stores `n` new rows (positions `len..len+n`) of each owning layer
    /// from `chunk_k/chunk_v` and advances the length.
    pub(crate) fn commit(
        &mut self,
        backend: &B,
        n: usize,
        chunk_k: &[Option<B::Buf>],
        chunk_v: &[Option<B::Buf>],
    ) -> Result<()> {
        let p0 = self.len;
        for (il, slot) in self.layers.iter_mut().enumerate() {
            let Some(l) = slot.as_mut() else { continue };
            let (Some(ck), Some(cv)) = (&chunk_k[il], &chunk_v[il]) else {
                return Err(ModelError::Backend(format!("layer {il}: no K/V computed")));
            };
            // A ring only keeps the last `rows` positions of the chunk.
            let first = if l.ring { n.saturating_sub(l.rows) } else { 0 };
            let mut t = first;
            while t < n {
                let slot_row = (p0 + t) % l.rows;
                // Contiguous run until the ring wraps.
                let run = (n - t).min(l.rows - slot_row);
                let (off_s, off_d, len) = (t * l.row_len, slot_row * l.row_len, run * l.row_len);
                backend.copy_strided(ck, off_s, 0, &mut l.k, off_d, 0, 1, len, 1.0, false)?;
                backend.copy_strided(cv, off_s, 0, &mut l.v, off_d, 0, 1, len, 1.0, false)?;
                t += run;
            }
        }
        self.len = p0 + n;
        Ok(())
    }
}
