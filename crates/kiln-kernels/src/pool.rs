//! A small fork/join pool for the per-token kernels: one decode step runs
//! a few hundred short GEMVs (~20 per layer), so the fixed cost of a
//! fork/join matters. Workers spin for a while after each job (the next
//! one usually arrives within microseconds), then park on a condvar so an
//! idle pool costs nothing.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! let pool = kiln_kernels::pool::Pool::new(2);
//! let sum = AtomicUsize::new(0);
//! pool.run(10, |i| {
//!     sum.fetch_add(i, Ordering::Relaxed);
//! });
//! assert_eq!(sum.into_inner(), 45);
//! ```

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spin iterations before a worker parks (tens of microseconds).
const SPINS: u32 = 1 << 14;

type Job<'a> = dyn Fn(usize) + Sync + 'a;

struct Shared {
    /// Bumped once per [`Pool::run`]; workers wait for it to change.
    epoch: AtomicU64,
    /// The current job, lifetime erased; valid while `live`, and while
    /// any worker that joined it (counted in `active`) still runs.
    job: Mutex<Option<JobPtr>>,
    next: AtomicUsize,
    n_tasks: AtomicUsize,
    /// Whether workers may still join the current job.
    live: AtomicBool,
    /// Workers inside the current job.
    active: AtomicUsize,
    sleepers: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Held by the one `run` that owns the job slot.
    busy: Mutex<()>,
}

#[derive(Clone, Copy)]
struct JobPtr(*const Job<'static>);
// SAFETY: the pointee is `Sync`, and `run` keeps it alive until every
// worker is done with it.
unsafe impl Send for JobPtr {}

/// Fork/join pool of `threads - 1` workers plus the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool where `threads` threads (the caller included) run tasks.
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: Mutex::new(None),
            next: AtomicUsize::new(0),
            n_tasks: AtomicUsize::new(0),
            live: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panic: Mutex::new(None),
            busy: Mutex::new(()),
        });
        let workers = (1..threads.max(1))
            .map(|i| {
                let sh = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("kiln-pool-{i}"))
                    .spawn(move || worker(&sh))
                    .expect("spawn pool worker")
            })
            .collect();
        Pool { shared, workers }
    }

    /// Threads that run tasks, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(0) .. f(n_tasks - 1)` across the pool and returns when all
    /// are done. Tasks are handed out dynamically, one index at a time.
    /// A panic in any task is re-raised here after all tasks finished.
    /// There is one job slot: a `run` that finds it taken (another thread
    /// sharing the pool, or a task calling `run`) runs its tasks inline.
    /// One task (or no workers) runs inline without taking the slot, so
    /// the task's own `run` calls still get the pool.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        if self.workers.is_empty() || n_tasks <= 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let sh = &*self.shared;
        let guard = match sh.busy.try_lock() {
            Ok(g) => Some(g),
            // A panicking task poisons nothing the slot relies on.
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if guard.is_none() {
            (0..n_tasks).for_each(f);
            return;
        }
        let job: &Job<'_> = &f;
        // SAFETY: only the lifetime is erased. `Close` below (run even
        // while unwinding) stops workers from joining and waits for those
        // that joined, so no worker touches the job after `f` is gone.
        let ptr = JobPtr(unsafe { std::mem::transmute::<&Job<'_>, &'static Job<'static>>(job) });
        *sh.job.lock().expect("pool job lock") = Some(ptr);
        sh.next.store(0, Ordering::Relaxed);
        sh.n_tasks.store(n_tasks, Ordering::Relaxed);
        sh.live.store(true, Ordering::SeqCst);
        sh.epoch.fetch_add(1, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = sh.park.lock().expect("pool park lock");
            sh.wake.notify_all();
        }
        struct Close<'a>(&'a Shared);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                // Store-then-load on both sides (SeqCst): a worker either
                // sees `live == false` or is counted in `active` here.
                self.0.live.store(false, Ordering::SeqCst);
                while self.0.active.load(Ordering::SeqCst) > 0 {
                    std::hint::spin_loop();
                }
                *self.0.job.lock().expect("pool job lock") = None;
            }
        }
        let close = Close(sh);
        // The caller takes tasks too, so a worker that is slow to wake
        // (a busy machine) delays nothing: the caller waits only for
        // workers that already joined.
        take_tasks(sh, &f);
        drop(close);
        if let Some(p) = sh.panic.lock().expect("pool panic lock").take() {
            resume_unwind(p);
        }
    }
}

/// `f(i, &mut part_i)` for each of `parts` (one-time work split in pieces,
/// such as packing a weight): on `pool` where given, each task locking its
/// own part (no contention), else in order on this thread.
pub fn run_parts<T: Send>(
    pool: Option<&Pool>,
    parts: impl Iterator<Item = T>,
    f: impl Fn(usize, &mut T) + Sync,
) {
    match pool {
        Some(pool) => {
            let parts: Vec<Mutex<T>> = parts.map(Mutex::new).collect();
            pool.run(parts.len(), |i| {
                let mut part = parts[i].lock().unwrap_or_else(|p| p.into_inner());
                f(i, &mut part);
            });
        }
        None => parts.enumerate().for_each(|(i, mut p)| f(i, &mut p)),
    }
}

fn take_tasks(sh: &Shared, f: &Job<'_>) {
    let n = sh.n_tasks.load(Ordering::Relaxed);
    loop {
        let i = sh.next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            return;
        }
        f(i);
    }
}

fn worker(sh: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        loop {
            let e = sh.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            if sh.shutdown.load(Ordering::Acquire) {
                return;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let g = sh.park.lock().expect("pool park lock");
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            // Re-check under the lock: `run` bumps the epoch before it
            // looks at `sleepers`, so one of the two sees the other.
            if sh.epoch.load(Ordering::SeqCst) == seen && !sh.shutdown.load(Ordering::SeqCst) {
                drop(sh.wake.wait(g).expect("pool park lock"));
            } else {
                drop(g);
            }
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
            spins = 0;
        }
        sh.active.fetch_add(1, Ordering::SeqCst);
        if sh.live.load(Ordering::SeqCst) {
            let job = *sh.job.lock().expect("pool job lock");
            if let Some(JobPtr(p)) = job {
                // SAFETY: this worker counted itself in `active` before it
                // saw `live`, and `run` waits for `active` to drop to 0
                // before the job goes away.
                let f: &Job<'_> = unsafe { &*p };
                if let Err(e) = catch_unwind(AssertUnwindSafe(|| take_tasks(sh, f))) {
                    *sh.panic.lock().expect("pool panic lock") = Some(e);
                    // Let the other threads drain the remaining indices.
                    sh.next.store(usize::MAX / 2, Ordering::Relaxed);
                }
            }
        }
        sh.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.park.lock().expect("pool park lock");
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_task_once_across_many_jobs() {
        let pool = Pool::new(3);
        for n in [0usize, 1, 2, 5, 64] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                pool.run(n, |i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50));
        }
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = Pool::new(2);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let sum = AtomicUsize::new(0);
        pool.run(100, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.into_inner(), 4950);
    }

    #[test]
    fn concurrent_and_nested_runs_are_correct() {
        let pool = Pool::new(2);
        let sum = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..200 {
                        pool.run(8, |i| {
                            pool.run(3, |j| {
                                sum.fetch_add(i * j, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        // sum_i sum_j i*j = 28 * 3 per run.
        assert_eq!(sum.into_inner(), 3 * 200 * 28 * 3);
    }

    #[test]
    fn task_panics_propagate_and_the_pool_survives() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(16, |i| assert!(i != 7, "task 7"));
        }));
        assert!(r.is_err());
        let sum = AtomicUsize::new(0);
        pool.run(4, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.into_inner(), 6);
    }
}
