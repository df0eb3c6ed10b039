//! Shape buckets: which padded size a prefill runs at, the power-of-two KV
//! ladder decode grows along, and the LRU of per-bucket plans.
//!
//! Buckets bound the number of distinct shapes a device has to prepare
//! (compiled graphs, scratch buffers), so that a session sizes its buffers a
//! handful of times instead of once per prompt length or per token.

/// The padded length a prefill of `n` tokens runs at: the next power of two,
/// unless that wastes more than 1/8 of the compute, then `n` itself; capped
/// at `max` (longer prompts run in chunks of `max`). `0 → 1`.
///
/// ```
/// use kiln_runtime::bucket::prefill_bucket;
/// assert_eq!(prefill_bucket(15, 512), 16);
/// assert_eq!(prefill_bucket(100, 512), 100); // 128 would waste 22%
/// assert_eq!(prefill_bucket(200, 128), 128);
/// ```
pub fn prefill_bucket(n: usize, max: usize) -> usize {
    let max = max.max(1);
    if n == 0 {
        return 1;
    }
    let pow2 = n.checked_next_power_of_two().unwrap_or(n);
    let bucket = if (pow2 - n) * 8 > pow2 { n } else { pow2 };
    bucket.min(max)
}

/// The decode ladder: KV capacities 32, 64, 128, … up to `max_context`
/// (the last rung is `max_context` itself). Decode reserves the KV cache one
/// rung at a time, so growth costs one reallocation per doubling and a
/// decode step never allocates.
///
/// ```
/// use kiln_runtime::bucket::DecodeLadder;
/// let ladder = DecodeLadder::new(100);
/// assert_eq!(ladder.rungs(), &[32, 64, 100]);
/// assert_eq!(ladder.rung_for(33), Some(64));
/// assert_eq!(ladder.rung_for(101), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeLadder {
    rungs: Vec<usize>,
}

/// The smallest rung: below this, doubling saves nothing worth a step.
const LADDER_MIN: usize = 32;

impl DecodeLadder {
    /// The ladder for a context of `max_context` positions.
    pub fn new(max_context: usize) -> DecodeLadder {
        let max_context = max_context.max(1);
        let mut rungs = Vec::new();
        let mut r = LADDER_MIN;
        while r < max_context {
            rungs.push(r);
            r *= 2;
        }
        rungs.push(max_context);
        DecodeLadder { rungs }
    }

    /// All capacities, ascending.
    pub fn rungs(&self) -> &[usize] {
        &self.rungs
    }

    /// The smallest rung holding `n_pos` positions; None past the context.
    pub fn rung_for(&self, n_pos: usize) -> Option<usize> {
        self.rungs.iter().copied().find(|&r| r >= n_pos)
    }
}

/// A small least-recently-used map from bucket size to a prepared plan
/// (on the CPU: the scratch buffers sized for that bucket). Besides a
/// number of plans it can bound their total bucket size
/// ([`PlanCache::with_max_rows`]): a plan's memory grows with its bucket,
/// so sixteen large buckets a long session once used would otherwise all
/// stay resident.
///
/// ```
/// use kiln_runtime::bucket::PlanCache;
/// let mut c: PlanCache<Vec<f32>> = PlanCache::new(2);
/// let mut made = 0;
/// for b in [16, 32, 16, 64, 32] {
///     c.get_or_try_insert(b, || { made += 1; Ok::<_, ()>(vec![0.0; b]) }).unwrap();
/// }
/// // 16, 32 made; 16 hit; 64 evicts 32 (least recent); 32 made again.
/// assert_eq!(made, 4);
/// assert_eq!(c.buckets(), vec![32, 64]);
/// ```
#[derive(Debug)]
pub struct PlanCache<P> {
    capacity: usize,
    /// Most bucket rows held in all (the plan being used excepted).
    max_rows: usize,
    clock: u64,
    /// (bucket, plan, last use)
    entries: Vec<(usize, P, u64)>,
}

impl<P> PlanCache<P> {
    /// A cache holding at most `capacity` plans (at least 1).
    pub fn new(capacity: usize) -> PlanCache<P> {
        PlanCache {
            capacity: capacity.max(1),
            max_rows: usize::MAX,
            clock: 0,
            entries: Vec::new(),
        }
    }

    /// Also keeps the buckets' total at most `rows`: plans are evicted
    /// least recently used first to make room for a new one before it is
    /// made (and stay evicted if making it fails). A single bucket larger
    /// than `rows` is still cached, alone.
    ///
    /// ```
    /// use kiln_runtime::bucket::PlanCache;
    /// let mut c: PlanCache<()> = PlanCache::new(16).with_max_rows(1024);
    /// for b in [512, 256, 128, 512, 300] {
    ///     c.get_or_try_insert(b, || Ok::<_, ()>(())).unwrap();
    /// }
    /// // 300 needs 1024 - 300 >= the rest: 256 (least recent) goes.
    /// assert_eq!(c.buckets(), vec![128, 300, 512]);
    /// ```
    pub fn with_max_rows(mut self, rows: usize) -> Self {
        self.max_rows = rows;
        self
    }

    /// The plan for `bucket`, made by `make` on a miss (evicting the least
    /// recently used plan when full).
    pub fn get_or_try_insert<E>(
        &mut self,
        bucket: usize,
        make: impl FnOnce() -> Result<P, E>,
    ) -> Result<&mut P, E> {
        self.clock += 1;
        let idx = match self.entries.iter().position(|e| e.0 == bucket) {
            Some(i) => i,
            None => {
                // Room first, so that evicted plans are freed before the
                // new one is allocated.
                while !self.entries.is_empty()
                    && self.entries.iter().map(|e| e.0).sum::<usize>()
                        > self.max_rows.saturating_sub(bucket)
                {
                    self.evict_oldest();
                }
                let plan = make()?;
                if self.entries.len() >= self.capacity {
                    self.evict_oldest();
                }
                self.entries.push((bucket, plan, 0));
                self.entries.len() - 1
            }
        };
        let entry = &mut self.entries[idx];
        entry.2 = self.clock;
        Ok(&mut entry.1)
    }

    /// Drops the least recently used plan (if any).
    fn evict_oldest(&mut self) {
        if let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].2) {
            self.entries.swap_remove(oldest);
        }
    }

    /// Cached buckets, ascending.
    pub fn buckets(&self) -> Vec<usize> {
        let mut b: Vec<usize> = self.entries.iter().map(|e| e.0).collect();
        b.sort_unstable();
        b
    }

    /// Number of cached plans.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no plan is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Whether a KV cache holding `old_len` positions can be cut back to
/// `new_len` and extended from there, given the row counts of its sliding
/// layers' rings (`ring_rows`). This is the rule
/// [`kiln_model::KvCache::truncate`] enforces (sessions rely on it there).
///
/// A ring of `r` rows keeps position `p` in row `p % r`, so position `p` was
/// overwritten once position `p + r` was written. The next query, at
/// `new_len`, needs keys back to `new_len - r + 1` (the window). Those are
/// intact iff the oldest of them was never overwritten: always when cutting
/// back by at most one position or when the ring never wrapped
/// (`old_len <= r`); otherwise the prompt must be recomputed (llama.cpp's
/// "forcing full prompt re-processing due to lack of cache data", GEMMA.md
/// §1.6).
///
/// ```
/// use kiln_runtime::bucket::ring_allows_rewind;
/// assert!(ring_allows_rewind(10, 9, &[4]));  // drop one position
/// assert!(!ring_allows_rewind(10, 8, &[4])); // position 5 was overwritten by 9
/// assert!(ring_allows_rewind(10, 3, &[16])); // the ring never wrapped
/// ```
pub fn ring_allows_rewind(old_len: usize, new_len: usize, ring_rows: &[usize]) -> bool {
    new_len + 1 >= old_len || ring_rows.iter().all(|&r| old_len <= r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_buckets_follow_the_seed_rule() {
        let cases = [
            (15, 16),
            (8, 8),
            (100, 100),
            (65, 65),
            (0, 1),
            (1, 1),
            (3, 3),
            (7, 8),
            (57, 64),
            // Exactly 1/8 wasted is allowed; more is not.
            (56, 64),
            (55, 55),
        ];
        for (n, want) in cases {
            assert_eq!(prefill_bucket(n, 4096), want, "n = {n}");
        }
        assert_eq!(prefill_bucket(200, 128), 128);
        assert_eq!(prefill_bucket(15, 8), 8);
        assert_eq!(prefill_bucket(5, 0), 1);
        assert_eq!(prefill_bucket(usize::MAX, usize::MAX), usize::MAX);
    }

    #[test]
    fn ladder_is_powers_of_two_capped_at_context() {
        assert_eq!(
            DecodeLadder::new(1024).rungs(),
            &[32, 64, 128, 256, 512, 1024]
        );
        assert_eq!(DecodeLadder::new(10).rungs(), &[10]);
        let l = DecodeLadder::new(32768);
        assert_eq!(l.rung_for(1), Some(32));
        assert_eq!(l.rung_for(513), Some(1024));
        assert_eq!(l.rung_for(32768), Some(32768));
        assert_eq!(l.rung_for(32769), None);
    }

    #[test]
    fn plan_cache_evicts_least_recently_used() {
        let mut c: PlanCache<usize> = PlanCache::new(16);
        for b in 1..=16 {
            c.get_or_try_insert(b, || Ok::<_, ()>(b)).unwrap();
        }
        // Touch 1, then insert 17: 2 is now the least recently used.
        c.get_or_try_insert(1, || Err(())).unwrap();
        c.get_or_try_insert(17, || Ok::<_, ()>(17)).unwrap();
        assert_eq!(c.len(), 16);
        assert!(c.buckets().contains(&1) && !c.buckets().contains(&2));
        // A failing constructor leaves the cache unchanged.
        assert_eq!(
            c.get_or_try_insert(99, || Err("no memory")),
            Err("no memory")
        );
        assert_eq!(c.len(), 16);
    }

    #[test]
    fn plan_cache_bounds_the_rows_it_holds() {
        let mut c: PlanCache<usize> = PlanCache::new(16).with_max_rows(100);
        for b in [40, 30, 20] {
            c.get_or_try_insert(b, || Ok::<_, ()>(b)).unwrap();
        }
        assert_eq!(c.buckets(), vec![20, 30, 40]);
        // 60 rows: 40 and 30 (the least recent) make room.
        c.get_or_try_insert(60, || Ok::<_, ()>(60)).unwrap();
        assert_eq!(c.buckets(), vec![20, 60]);
        // A bucket over the budget is kept, alone.
        c.get_or_try_insert(150, || Ok::<_, ()>(150)).unwrap();
        assert_eq!(c.buckets(), vec![150]);
        assert_eq!(*c.get_or_try_insert(150, || Err(())).unwrap(), 150);
    }

    #[test]
    fn rewind_rules() {
        assert!(ring_allows_rewind(5, 5, &[4]));
        assert!(ring_allows_rewind(4, 0, &[4]));
        assert!(!ring_allows_rewind(5, 0, &[4]));
        // No sliding layers: any rewind is fine.
        assert!(ring_allows_rewind(1000, 1, &[]));
    }
}
