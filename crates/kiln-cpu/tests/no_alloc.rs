//! The decode step allocates nothing: on the real model (every packed
//! type, the integer GEMV, the screened greedy head, split-K attention),
//! after a warm-up, greedy and last-logits steps make no heap allocation
//! on any thread.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_model::Output;

/// Counts allocations (all threads) while `ON` is set.
struct Counting;

static ON: AtomicUsize = AtomicUsize::new(0);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to `System`, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.load(Ordering::Relaxed) != 0 {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON.load(Ordering::Relaxed) != 0 {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_steps_do_not_allocate() {
    let m = common::load(&kiln_testdata::real_model());
    let mut cache = m.new_cache().unwrap();
    cache.reserve(m.backend(), 64).unwrap();
    let mut s8 = m.new_scratch(8).unwrap();
    let mut s1 = m.new_scratch(1).unwrap();
    let mut logits = Vec::new();
    let prompt = [2u32, 818, 5279, 529, 7001, 563, 9405, 236761];
    m.forward(
        &prompt,
        &mut cache,
        &mut s8,
        Output::LastLogits,
        &mut logits,
    )
    .unwrap();
    let mut tok = 1234u32;
    let mut step = |n: usize| {
        for i in 0..n {
            let out = if i % 2 == 0 {
                Output::Argmax
            } else {
                Output::LastLogits
            };
            let r = m
                .forward(&[tok], &mut cache, &mut s1, out, &mut logits)
                .unwrap();
            tok = r.unwrap_or(tok + 7) % 200_000;
        }
    };
    // Warm-up: thread-local buffers and the output vector grow here.
    step(4);
    ON.store(1, Ordering::SeqCst);
    step(16);
    ON.store(0, Ordering::SeqCst);
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        0,
        "allocations in 16 decode steps"
    );
    assert_eq!(cache.len(), prompt.len() + 20);
}
