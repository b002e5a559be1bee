//! A fork-join team of spinning threads for the batch-1 decode matvecs and the large
//! products of training and prefill ([`crate::gemm`]).
//!
//! A decode step makes ~4 fork-joins per layer, each lasting only ~50–500 µs (a training
//! step some hundreds of products, with single-threaded work between them). With
//! rayon, the caller (outside the pool) parks on a latch for every join and is woken
//! by the OS afterwards; on a small VM that wake-up alone costs ~10–20 µs per join,
//! ~10% of the step. Here the caller runs part 0 itself and the helpers spin between
//! jobs (parking only after [`SPIN_BEFORE_PARK`] without work), so a join costs an
//! atomic round trip.
//!
//! One job runs at a time: a caller that finds the team busy (another thread is
//! decoding) gets `None` back from [`SpinTeam::try_run`]; [`SpinTeam::run`] then runs
//! the parts on rayon's pool instead.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long an idle helper spins before parking: longer than the gaps between a
/// decode step's joins (attention, norms, sampling), short enough not to hold a
/// core for long once decoding stops.
pub const SPIN_BEFORE_PARK: Duration = Duration::from_micros(500);

/// Spins of the caller waiting for its helpers before it yields its core between
/// checks (~0.1–0.5 ms; `yield_now` returns at once when nothing else is runnable).
const YIELD_AFTER_SPINS: u32 = 1 << 14;

/// A job: called once with every part index `0..parts`.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped once per job; helpers run a job when they see a new value.
    epoch: AtomicU64,
    /// Helpers done with the current job.
    done: AtomicUsize,
    /// The current job, type-erased; valid while its `try_run` call is waiting.
    job: Mutex<Option<JobPtr>>,
    /// `parked[i]`: helper `i` has announced that it is about to park.
    parked: Vec<AtomicBool>,
    /// A helper's part panicked during the current job.
    panicked: AtomicBool,
    /// Set by `Drop`: helpers return at the next epoch.
    shutdown: AtomicBool,
}

/// `Job` with its lifetime erased, so the helpers can hold it.
#[derive(Clone, Copy)]
struct JobPtr(*const (dyn Fn(usize) + Sync + 'static));

// SAFETY: the pointee is `Sync` and outlives every use (see `SpinTeam::try_run`).
unsafe impl Send for JobPtr {}

/// The caller plus `helpers` threads; see the module docs.
pub struct SpinTeam {
    shared: Arc<Shared>,
    threads: Vec<Thread>,
    /// Held by the caller of the job in flight.
    busy: Mutex<()>,
}

impl SpinTeam {
    /// Starts `helpers` threads (0 gives a team that runs everything on the caller).
    pub fn new(helpers: usize) -> Self {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            job: Mutex::new(None),
            parked: (0..helpers).map(|_| AtomicBool::new(false)).collect(),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
        });
        let threads = (0..helpers)
            .map(|i| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("elm-spin-{}", i + 1))
                    .spawn(move || helper_loop(&shared, i))
                    .expect("spawning a decode helper thread")
                    .thread()
                    .clone()
            })
            .collect();
        SpinTeam {
            shared,
            threads,
            busy: Mutex::new(()),
        }
    }

    /// The process-wide team: one thread per available core (the caller included),
    /// at most 8, started on first use.
    pub fn global() -> &'static SpinTeam {
        static TEAM: OnceLock<SpinTeam> = OnceLock::new();
        TEAM.get_or_init(|| {
            let cores = thread::available_parallelism().map_or(1, |n| n.get());
            SpinTeam::new(cores.clamp(1, 8) - 1)
        })
    }

    /// Number of parts a job is split into (helpers + the caller).
    pub fn parts(&self) -> usize {
        self.threads.len() + 1
    }

    /// Runs `job(p)` for every part `p < self.parts()` in parallel: on the team when it
    /// is free, else (another thread's job is in flight) on rayon's pool.
    pub fn run(&self, job: Job<'_>) {
        if self.try_run(job).is_none() {
            use rayon::prelude::*;
            (0..self.parts()).into_par_iter().for_each(job);
        }
    }

    /// Runs `job(p)` for every part `p < self.parts()` in parallel (part 0 on the
    /// calling thread) and returns `Some(())` once all are done, or `None` without
    /// running anything when another thread's job is in flight.
    ///
    /// A panic in any part is re-raised here after every part has finished.
    pub fn try_run(&self, job: Job<'_>) -> Option<()> {
        // A poisoned lock only means an earlier job panicked; the team itself is fine.
        let _guard = match self.busy.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        if self.threads.is_empty() {
            job(0);
            return Some(());
        }
        let shared = &*self.shared;
        // SAFETY: only the lifetime is erased. The helpers dereference the pointer
        // only between the epoch bump below and their `done` increment, and this
        // function does not return before every helper has incremented `done`.
        let erased: *const (dyn Fn(usize) + Sync + 'static) =
            unsafe { std::mem::transmute::<Job<'_>, Job<'static>>(job) };
        *shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(JobPtr(erased));
        shared.done.store(0, Ordering::Relaxed);
        shared.panicked.store(false, Ordering::Relaxed);
        // SeqCst pairs with the helpers' SeqCst `parked` store + epoch re-check: either
        // a helper sees the new epoch before parking, or we see it parked and wake it.
        shared.epoch.fetch_add(1, Ordering::SeqCst);
        self.wake_parked();
        let own = catch_unwind(AssertUnwindSafe(|| job(0)));
        let mut spins = 0u32;
        while shared.done.load(Ordering::Acquire) < self.threads.len() {
            // Spin while the helpers are running; if one was descheduled (more
            // runnable threads than cores), give it the core instead of burning it.
            spins = spins.saturating_add(1);
            if spins < YIELD_AFTER_SPINS {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
        *shared.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(payload) = own {
            std::panic::resume_unwind(payload);
        }
        if shared.panicked.load(Ordering::Relaxed) {
            panic!("a SpinTeam helper panicked while running a job");
        }
        Some(())
    }
}

impl SpinTeam {
    fn wake_parked(&self) {
        for (flag, t) in self.shared.parked.iter().zip(&self.threads) {
            if flag.load(Ordering::SeqCst) {
                t.unpark();
            }
        }
    }
}

impl Drop for SpinTeam {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        self.wake_parked();
    }
}

fn helper_loop(shared: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let mut idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            let epoch = shared.epoch.load(Ordering::Acquire);
            if epoch != seen {
                seen = epoch;
                break;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && idle_since.elapsed() > SPIN_BEFORE_PARK {
                shared.parked[index].store(true, Ordering::SeqCst);
                if shared.epoch.load(Ordering::SeqCst) == seen {
                    thread::park();
                }
                shared.parked[index].store(false, Ordering::SeqCst);
                idle_since = Instant::now();
            }
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let job = *shared.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(JobPtr(ptr)) = job {
            // SAFETY: see `SpinTeam::try_run`: the job outlives this call.
            let f = unsafe { &*ptr };
            if catch_unwind(AssertUnwindSafe(|| f(index + 1))).is_err() {
                shared.panicked.store(true, Ordering::Relaxed);
            }
        }
        shared.done.fetch_add(1, Ordering::Release);
    }
}
