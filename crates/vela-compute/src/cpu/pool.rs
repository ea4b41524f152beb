//! A tiny fork-join thread pool tuned for dispatch latency.
//!
//! Decoding one token calls [`ThreadPool::run`] about ten times per layer, so a dispatch must cost
//! a few microseconds, not the tens of microseconds of a condition-variable hand-off. Protocol:
//!
//! * The caller publishes a type-erased pointer to the job, then bumps `generation` (Release;
//!   only the dispatching thread, holding the dispatch mutex, writes it).
//! * Each worker spins on `generation` (Acquire) for a short while after finishing a job and only
//!   then parks; the caller always `unpark`s every worker after publishing, which is a single
//!   atomic swap when the worker is still spinning (std's park token makes lost wake-ups
//!   impossible).
//! * The caller runs slice 0 itself, then spins until `pending` drops to zero. Only then does
//!   `run` return, which is what makes lending a stack-borrowed closure to the workers sound.
//!
//! [`ThreadPool::run_chunks`] is the variant for work that can be cut into independent chunks
//! (matmul row tiles): chunks are claimed from an atomic counter by the caller and by whichever
//! workers show up, and the caller does not wait for a worker that has not *entered* the job —
//! on a shared, oversubscribed machine a descheduled worker would otherwise stall every dispatch
//! for a scheduler time slice. Entry uses a gate: a worker increments `inside`, then re-checks
//! that the gate still shows this job open (both SeqCst); the caller, after the last chunk is
//! claimed, closes the gate (SeqCst) and waits for `inside` to reach zero. Either the worker's
//! re-check sees the closed gate (and it leaves without touching the job), or the caller's wait
//! sees its increment (and waits for it), so the closure is never used after `run_chunks` returns.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

/// How many spin iterations a worker waits for the next job before parking (~50-100 µs).
const SPIN_ITERS: u32 = 1 << 14;

type Job = dyn Fn(usize, usize) + Sync;

struct Shared {
    /// Incremented once per dispatched job.
    generation: AtomicUsize,
    /// Workers (excluding the caller) that have not finished the current job.
    pending: AtomicUsize,
    shutdown: AtomicBool,
    /// A worker's job panicked during the current dispatch.
    panicked: AtomicBool,
    /// The current job; written by the dispatcher before the Release bump of `generation`, read
    /// by workers after their Acquire load observes the bump. The `'static` is a lie that
    /// `run` makes true by not returning before `pending` reaches zero.
    job: UnsafeCell<Option<*const Job>>,
    n_threads: usize,
    /// The (odd) generation of the chunked job while it accepts workers, else 0.
    gate: AtomicUsize,
    /// Workers currently inside a chunked job (or about to re-check the gate).
    inside: AtomicUsize,
    /// Next unclaimed chunk of the current chunked job.
    next_chunk: AtomicUsize,
}

/// The generation after `g`: generations step by 2, and the low bit marks chunked jobs (so a
/// worker learns a job's kind from the same atomic load that announces it).
fn next_generation(g: usize, chunked: bool) -> usize {
    ((g >> 1).wrapping_add(1) << 1) | chunked as usize
}

// SAFETY: `job` is only written while no worker is running a job (between dispatches, under the
// dispatch mutex) and only read by workers after the generation handshake described above.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of worker threads; the thread calling [`ThreadPool::run`] acts as worker 0.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes concurrent `run` calls from different threads.
    dispatch: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in total (values below 1 are treated as 1); the calling
    /// thread of `run` is thread 0, so `n_threads - 1` OS threads are spawned.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            n_threads,
            gate: AtomicUsize::new(0),
            inside: AtomicUsize::new(0),
            next_chunk: AtomicUsize::new(0),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let s = shared.clone();
                thread::Builder::new()
                    .name(format!("vela-worker-{i}"))
                    .spawn(move || worker_loop(&s, i))
                    .expect("spawn vela worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            dispatch: Mutex::new(()),
        }
    }

    /// Total number of threads, including the caller.
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Run `f(thread_index, n_threads)` on every thread (index 0 on the caller) and wait for all.
    ///
    /// A panic in any invocation is re-raised on the caller after every thread finished.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let n = self.shared.n_threads;
        if n == 1 {
            f(0, 1);
            return;
        }
        let _guard = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let job: &(dyn Fn(usize, usize) + Sync + '_) = &f;
        // SAFETY: erase the closure's lifetime; we do not return before every worker is done
        // with it (the `pending` wait below runs even if our own slice panics).
        let job: *const Job = unsafe {
            std::mem::transmute::<&(dyn Fn(usize, usize) + Sync + '_), &'static Job>(job)
        };
        unsafe { *s.job.get() = Some(job) };
        s.panicked.store(false, Ordering::Relaxed);
        s.pending.store(n - 1, Ordering::Relaxed);
        let gen = next_generation(s.generation.load(Ordering::Relaxed), false);
        s.generation.store(gen, Ordering::Release);
        for w in &self.workers {
            w.thread().unpark();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(0, n)));
        let mut spins = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins & 1023 == 0 {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.load(Ordering::Relaxed) {
            panic!("a ThreadPool worker panicked");
        }
    }
}

impl ThreadPool {
    /// Run `f(chunk)` once for every `chunk < n_chunks`, spread over the caller and whichever
    /// workers are running; returns when all chunks are done.
    ///
    /// Which thread runs a chunk varies from call to call, so `f` must compute each chunk the
    /// same way regardless of the thread (it gets no thread index). Chunks are claimed in
    /// increasing order. A panic in `f` is re-raised on the caller after all threads left `f`.
    pub fn run_chunks<F: Fn(usize) + Sync>(&self, n_chunks: usize, f: F) {
        let n = self.shared.n_threads;
        if n == 1 || n_chunks <= 1 {
            (0..n_chunks).for_each(f);
            return;
        }
        let _guard = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let work = |_: usize, _: usize| loop {
            let c = s.next_chunk.fetch_add(1, Ordering::Relaxed);
            if c >= n_chunks {
                break;
            }
            f(c);
        };
        let job: &(dyn Fn(usize, usize) + Sync + '_) = &work;
        // SAFETY: as in `run`; workers only dereference the job after entering through the gate,
        // and we do not return before closing the gate and seeing `inside == 0`.
        let job: *const Job = unsafe {
            std::mem::transmute::<&(dyn Fn(usize, usize) + Sync + '_), &'static Job>(job)
        };
        unsafe { *s.job.get() = Some(job) };
        s.panicked.store(false, Ordering::Relaxed);
        s.next_chunk.store(0, Ordering::Relaxed);
        let gen = next_generation(s.generation.load(Ordering::Relaxed), true);
        s.gate.store(gen, Ordering::SeqCst);
        s.generation.store(gen, Ordering::Release);
        for w in &self.workers {
            w.thread().unpark();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(0, n)));
        if mine.is_err() {
            // Let the remaining chunks be skipped by anyone still working.
            s.next_chunk.store(usize::MAX / 2, Ordering::Relaxed);
        }
        s.gate.store(0, Ordering::SeqCst);
        let mut spins = 0u32;
        while s.inside.load(Ordering::SeqCst) != 0 {
            spins = spins.wrapping_add(1);
            if spins & 1023 == 0 {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.load(Ordering::Relaxed) {
            panic!("a ThreadPool worker panicked");
        }
    }
}

/// Enter, run and leave the chunked job of generation `gen` if it still accepts workers.
fn enter_chunked(s: &Shared, index: usize, gen: usize) {
    s.inside.fetch_add(1, Ordering::SeqCst);
    if s.gate.load(Ordering::SeqCst) == gen {
        // SAFETY: the gate was open after we announced ourselves in `inside`, so the caller
        // waits for our decrement before invalidating the job (see the module docs).
        let job = unsafe { (*s.job.get()).expect("job published before the gate opened") };
        let f = unsafe { &*job };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(index, s.n_threads))).is_err()
        {
            s.panicked.store(true, Ordering::Relaxed);
            s.next_chunk.store(usize::MAX / 2, Ordering::Relaxed);
        }
    }
    s.inside.fetch_sub(1, Ordering::SeqCst);
}

fn worker_loop(s: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        let gen = loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen || s.shutdown.load(Ordering::Acquire) {
                break g;
            }
            if spins < SPIN_ITERS {
                spins += 1;
                // Offer the core to other runnable threads now and then (on a shared machine
                // our own dispatching thread may be one of them); costs ~0.3 µs when idle.
                if spins & 63 == 0 {
                    thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            } else {
                // Spurious returns are fine: we re-check the generation.
                thread::park();
            }
        };
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = gen;
        if gen & 1 == 1 {
            enter_chunked(s, index, gen);
            continue;
        }
        // SAFETY: the Acquire load of `generation` above synchronizes with the Release bump that
        // followed the write of `job`; the dispatcher keeps the closure alive until `pending`
        // reaches zero, which happens only after this call returns.
        let job = unsafe { (*s.job.get()).expect("job published before generation bump") };
        let f = unsafe { &*job };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(index, s.n_threads))).is_err()
        {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for w in &self.workers {
            w.thread().unpark();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_index_runs_once_per_dispatch() {
        for n in 1..=4 {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            for round in 0..200u64 {
                let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
                pool.run(|i, nt| {
                    assert_eq!(nt, n);
                    hits[i].fetch_add(round + 1, Ordering::Relaxed);
                });
                for h in &hits {
                    assert_eq!(h.load(Ordering::Relaxed), round + 1);
                }
            }
        }
    }

    #[test]
    fn run_chunks_runs_every_chunk_once_interleaved_with_run() {
        for n in 1..=3 {
            let pool = ThreadPool::new(n);
            for round in 0..500usize {
                let chunks = round % 37;
                let hits: Vec<AtomicU64> = (0..chunks).map(|_| AtomicU64::new(0)).collect();
                pool.run_chunks(chunks, |c| {
                    hits[c].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "round {round}"
                );
                let sum = AtomicU64::new(0);
                pool.run(|i, _| {
                    sum.fetch_add(1 << i, Ordering::Relaxed);
                });
                assert_eq!(sum.load(Ordering::Relaxed), (1 << n) - 1);
            }
        }
    }

    #[test]
    fn run_chunks_panic_propagates_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run_chunks(64, |c| {
                if c == 40 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicU64::new(0);
        pool.run_chunks(10, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn worker_panic_propagates_and_pool_survives() {
        let pool = ThreadPool::new(3);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(|i, _| {
                if i == 2 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let sum = AtomicU64::new(0);
        pool.run(|i, _| {
            sum.fetch_add(i as u64, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 3);
    }
}
