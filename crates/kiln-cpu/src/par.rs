//! Fork/join for the backend's ops on `kiln_kernels::pool` (sized by the
//! backend's config). Chosen over a dedicated rayon pool by decode speed
//! on the real model (~130 fork/joins per token, 2 threads): on a quiet
//! machine the pool gives 47-48 vs 45-46 tok/s at depth 16, 44 vs 39-42
//! at depth 4096, and 165-179 vs 126-146 tok/s without the LM head. Rayon
//! was ahead on large batches (prefill 512: 711-733 vs 645-677 tok/s;
//! all-position logits: 0.29 vs 0.35 s) and on an oversubscribed machine,
//! where spinning workers burn time slices the other threads need.

use kiln_kernels::pool::Pool;

pub(crate) struct Par(Pool);

/// A raw pointer handed to tasks that write disjoint parts of one buffer.
pub(crate) struct SendPtr<T>(pub *mut T);
// Manual: derive would require `T: Copy`.
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: users write disjoint ranges only (see each use).
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// Through a method, so closures capture the wrapper (not the field).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

impl Par {
    pub(crate) fn new(threads: usize) -> Par {
        Par(Pool::new(threads))
    }

    /// The pool itself, for kernels that take one.
    pub(crate) fn pool(&self) -> &Pool {
        &self.0
    }

    pub(crate) fn threads(&self) -> usize {
        self.0.threads()
    }

    /// Runs `f(0) .. f(n - 1)`, each exactly once (inline when `n <= 1`).
    pub(crate) fn run(&self, n: usize, f: impl Fn(usize) + Sync) {
        self.0.run(n, f);
    }

    /// `f(i, chunk_i)` over consecutive `chunk`-sized pieces of `s`.
    pub(crate) fn chunks_mut<T: Send>(
        &self,
        s: &mut [T],
        chunk: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let chunk = chunk.max(1);
        let len = s.len();
        let base = SendPtr(s.as_mut_ptr());
        self.run(len.div_ceil(chunk), |i| {
            let start = i * chunk;
            let n = chunk.min(len - start);
            // SAFETY: `run` hands out each index once, so the ranges
            // `start..start + n` are disjoint and inside `s`, which is
            // borrowed mutably for the whole call.
            let c = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), n) };
            f(i, c);
        });
    }
}
