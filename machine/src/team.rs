//! The threads that run the CPU backend's parallel loops: the caller and
//! `threads() - 1` workers, which take a loop's tasks one at a time from a
//! shared counter.
//!
//! Between loops the workers spin on a generation counter for a while
//! (`SPIN`) before they sleep, as OpenBLAS's and OpenMP's threads do, so
//! that a loop that follows another soon after starts on every core at
//! once. Handed to rayon's pool, the caller asleep until it was done, a
//! loop of two tasks took tens of microseconds longer than one task:
//! sleeping workers and callers wake slowly in a virtual machine. With this
//! team, small kernels and products take less time
//! (`benches/RESULTS-cpu.md`).
//!
//! One loop runs at a time: a loop started while another runs (from
//! another thread, or from inside one of its tasks) runs its tasks on its
//! caller alone. A process that runs models on several threads at once
//! gets the team on one of them at a time.
//!
//! `unsafe` here is the loop's closure handed to the workers by address,
//! while its caller waits for every worker to let go of it.

#![allow(unsafe_code)]

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How long a worker spins for the next loop before it sleeps: long enough
/// to span the gaps between the launches of a run and between runs back to
/// back (a training loop), short enough to give the core back soon when
/// kiln is idle.
const SPIN: Duration = Duration::from_millis(1);

/// Threads that run a loop's tasks, the caller's included: rayon's count
/// (`RAYON_NUM_THREADS`, else one per core) when the first loop starts, so
/// that one setting sizes kiln's threads and the `gemm` crate's.
pub fn threads() -> usize {
    team().threads
}

/// Runs `task(i)` for every `i < tasks`, each once, on the caller and the
/// workers, and returns when all have. A task's panic ends the loop (tasks
/// not yet taken do not run) and is raised again on the caller once no
/// other task of it runs.
pub fn for_each(tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    let team = team();
    if tasks < 2
        || team.threads < 2
        || team
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        (0..tasks).for_each(task);
        return;
    }
    let region = Region {
        // SAFETY: only the lifetime is erased. The region, and with it the
        // closure, is handed to workers only while `Open` borrows it, and
        // `Open`'s drop returns (also when the caller's task unwinds) only
        // once no worker holds the region.
        task: unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Task>(task) },
        tasks,
        next: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    {
        let _open = Open::new(team, &region);
        region.work();
    }
    let panic = region
        .panic
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(panic) = panic {
        resume_unwind(panic);
    }
}

/// Runs `task(i, chunk)` on every chunk `i` of `chunk` elements of `data`
/// (the last may be shorter), each once, as `for_each` runs its tasks:
/// `data.chunks_mut(chunk)`, in parallel.
pub fn for_each_chunk<T: Send>(
    data: &mut [T],
    chunk: usize,
    task: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    let chunk = chunk.max(1);
    let (len, base) = (data.len(), Base(data.as_mut_ptr()));
    for_each(len.div_ceil(chunk), &|i| {
        let start = i * chunk;
        let end = (start + chunk).min(len);
        // SAFETY: `for_each` runs each task once, so chunk `i` is this
        // task's alone, and it lies inside `data`, which the call borrows
        // mutably until every task is done.
        let part = unsafe { std::slice::from_raw_parts_mut(base.at(start), end - start) };
        task(i, part)
    });
}

/// The first element of a slice whose chunks `for_each_chunk` hands out.
struct Base<T>(*mut T);

// SAFETY: the tasks reach disjoint chunks through it, each of which holds
// `Send` values.
unsafe impl<T: Send> Sync for Base<T> {}

impl<T> Base<T> {
    /// Element `i`'s address (`i` at most the slice's length).
    fn at(&self, i: usize) -> *mut T {
        self.0.wrapping_add(i)
    }
}

type Task = &'static (dyn Fn(usize) + Sync);

/// One loop, on its caller's stack while it runs.
struct Region {
    task: Task,
    tasks: usize,
    /// The next task to take.
    next: AtomicUsize,
    /// A worker's task's panic, for the caller to raise.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Region {
    /// Takes and runs tasks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.tasks {
                return;
            }
            (self.task)(i);
        }
    }

    /// Leaves the tasks not yet taken untaken.
    fn end(&self) {
        self.next.store(self.tasks, Ordering::Relaxed);
    }
}

struct Team {
    threads: usize,
    /// Whether a loop runs.
    busy: AtomicBool,
    /// Bumped as each loop starts; on a cache line of its own, which the
    /// spinning workers read and only a loop's start writes.
    generation: Line<AtomicU64>,
    /// The running loop, null between loops.
    region: AtomicPtr<Region>,
    /// Workers that may hold `region`.
    active: AtomicUsize,
    /// Workers asleep, or going to sleep, on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

#[repr(align(64))]
struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

fn team() -> &'static Team {
    static TEAM: OnceLock<Team> = OnceLock::new();
    static STARTED: std::sync::Once = std::sync::Once::new();
    let team = TEAM.get_or_init(|| Team {
        threads: rayon::current_num_threads(),
        busy: AtomicBool::new(false),
        generation: Line(AtomicU64::new(0)),
        region: AtomicPtr::new(ptr::null_mut()),
        active: AtomicUsize::new(0),
        sleepers: AtomicUsize::new(0),
        lock: Mutex::new(()),
        wake: Condvar::new(),
    });
    STARTED.call_once(|| {
        for w in 1..team.threads {
            // A worker that cannot be started leaves its share to the
            // others: loops never wait for a worker to join.
            let _ = std::thread::Builder::new()
                .name(format!("kiln-worker-{w}"))
                .spawn(move || team.serve());
        }
    });
    team
}

impl Team {
    /// A worker's life: each loop, from its start until its tasks are
    /// taken.
    fn serve(&self) {
        let mut seen = self.generation.load(Ordering::Acquire);
        loop {
            seen = self.next_generation(seen);
            // `active` is raised before `region` is read, and the caller
            // clears `region` before it waits for `active` to fall to
            // zero (all four sequentially consistent): a worker either
            // reads null or is waited for.
            self.active.fetch_add(1, Ordering::SeqCst);
            // Lowered however this turn ends, so that no loop waits for a
            // worker that is gone.
            let _leave = Leave(&self.active);
            let region = self.region.load(Ordering::SeqCst);
            if !region.is_null() {
                // SAFETY: the region stays on its caller's stack until
                // `active` falls to zero (see above).
                let region = unsafe { &*region };
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| region.work())) {
                    region.end();
                    // The first panic is the one raised; a later one's
                    // payload is dropped here.
                    let mut first = region.panic.lock().unwrap_or_else(PoisonError::into_inner);
                    first.get_or_insert(panic);
                }
            }
        }
    }

    /// Waits for a generation other than `seen`: spins for `SPIN`, then
    /// sleeps until woken.
    fn next_generation(&self, seen: u64) -> u64 {
        let start = Instant::now();
        let mut turns = 0u32;
        loop {
            let generation = self.generation.load(Ordering::Acquire);
            if generation != seen {
                return generation;
            }
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(64) && start.elapsed() > SPIN {
                break;
            }
            std::hint::spin_loop();
        }
        // `sleepers` is raised before `generation` is read again, under
        // the lock; a caller bumps `generation` before it reads `sleepers`
        // (all sequentially consistent) and wakes the sleepers under the
        // lock: either this worker sees the new generation, or it is
        // waiting when woken.
        let mut guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.generation.load(Ordering::SeqCst) == seen {
            guard = self
                .wake
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        self.generation.load(Ordering::Acquire)
    }
}

/// Lowers a worker's mark in `active` when dropped.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// A loop open to the workers, from its start until it is dropped (also
/// when the caller's task unwinds): then it is ended and closed, and waits
/// for every worker to let go of it.
struct Open<'a> {
    team: &'a Team,
    region: &'a Region,
}

impl<'a> Open<'a> {
    fn new(team: &'a Team, region: &'a Region) -> Self {
        team.region
            .store(ptr::from_ref(region).cast_mut(), Ordering::SeqCst);
        team.generation.fetch_add(1, Ordering::SeqCst);
        if team.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = team.lock.lock().unwrap_or_else(PoisonError::into_inner);
            // As many as there are tasks for besides the caller's.
            for _ in 1..region.tasks.min(team.threads) {
                team.wake.notify_one();
            }
        }
        Open { team, region }
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        let team = self.team;
        // Every task is taken unless the caller's panicked.
        self.region.end();
        team.region.store(ptr::null_mut(), Ordering::SeqCst);
        // A worker still active is finishing its last task.
        wait_until(|| team.active.load(Ordering::SeqCst) == 0);
        team.busy.store(false, Ordering::Release);
    }
}

/// Returns once `done()`, which another thread at work makes true soon:
/// spins, then yields the core between tries in case that thread has lost
/// its own (after about 0.1 ms: a pause is some 65 to 140 cycles).
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < 1 << 12 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        for tasks in [0, 1, 2, 3, 17, 1000] {
            let runs: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            for_each(tasks, &|i| {
                runs[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                runs.iter().all(|r| r.load(Ordering::Relaxed) == 1),
                "{tasks} tasks"
            );
        }
    }

    #[test]
    fn every_chunk_is_handed_out_once_and_whole() {
        for (len, chunk) in [(0, 4), (1, 4), (8, 4), (10, 4), (1000, 7), (5, 0)] {
            let mut data = vec![0usize; len];
            for_each_chunk(&mut data, chunk, &|i, part| {
                for (j, x) in part.iter_mut().enumerate() {
                    *x += i * chunk.max(1) + j + 1;
                }
            });
            let want: Vec<usize> = (1..=len).collect();
            assert_eq!(data, want, "{len} elements in chunks of {chunk}");
        }
    }

    #[test]
    fn nested_and_concurrent_loops_run() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for_each(8, &|_| {
                        for_each(8, &|_| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    });
                });
            }
        });
        assert_eq!(total.into_inner(), 4 * 8 * 8);
    }

    #[test]
    fn a_panic_reaches_the_caller() {
        let ran = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            for_each(64, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i == 5 {
                    panic!("task 5");
                }
            })
        }));
        assert!(result.is_err());
        // Tasks are taken in order: at least up to the one that panicked.
        assert!(ran.into_inner() >= 6);
        // The team still runs loops.
        let after = AtomicUsize::new(0);
        for_each(16, &|_| {
            after.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(after.into_inner(), 16);
    }
}
