//! A team of spinning threads for the many short parallel steps of a decoding step.
//!
//! Why it exists: decoding one token of SmolLM2-135M runs 121 matrix products of a few dozen
//! microseconds each. Handed to rayon one by one, a product often finds the pool's other threads
//! asleep (they sleep after a few microseconds without work) and pays a futex wake-up, which on a
//! virtual machine costs about as much as the product: at batch 1, two threads decoded only 1.46×
//! as fast as one. llama.cpp keeps its threads spinning for the whole graph; [`with_team`] does the
//! same for the span of one forward pass: the pool's other threads spin on a job slot, and
//! [`for_each_init`] hands them tasks with two stores and takes part itself. Outside a team (or from a
//! thread that is not the team's owner) [`for_each_init`] is rayon's `for_each_init`.
//! [`for_each_range_init`] does the same for a loop whose tasks are best taken in runs of consecutive
//! ones (a product's columns: one stream of weights per run), claimed in shrinking sizes.
//!
//! While spinning, helpers also run the pool's pending rayon work (`rayon::yield_now`), so rayon's
//! parallel iterators used inside a team (attention across sequences) still have every thread.

use std::cell::Cell;
use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One published job: every participant calls `participate`, which claims tasks until none is left.
struct Job<'a> {
    participate: &'a (dyn Fn() + Sync),
}

/// The shared state of one team, owned by the thread that runs [`with_team`]'s body.
struct Team {
    /// rayon index of the owner's thread: a helper job that thread runs itself returns at once.
    owner: Option<usize>,
    /// Threads taking part in each job: the owner and its helpers.
    size: usize,
    /// The job being worked on, or null; points into the owner's stack while it waits for `inside`.
    current: AtomicPtr<Job<'static>>,
    /// Bumped with every job, so a helper joins each job once.
    epoch: AtomicU64,
    /// Helpers that may be reading `current`'s job.
    inside: AtomicUsize,
    stop: AtomicBool,
}

thread_local! {
    /// The team this thread owns, while its body runs and it is not itself running a task.
    static OWNED: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// After this long without a job, a spinning helper also offers its core to the OS between checks,
/// so that a team does not starve other processes on a busy machine.
const SPIN_ALONE: Duration = Duration::from_micros(200);

/// Runs `body` with the pool's other threads spinning as helpers of [`for_each_init`], when `wanted`,
/// the caller is a thread of rayon's pool and the pool has more than one thread but no more threads than
/// the machine has logical cores (spinning threads on shared cores would take turns with the owner).
/// Otherwise just runs `body`.
pub fn with_team<R: Send>(wanted: bool, body: impl FnOnce() -> R + Send) -> R {
    let threads = rayon::current_num_threads();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let owner = rayon::current_thread_index();
    if !wanted || threads < 2 || threads > cores || owner.is_none() || owned_team().is_some() {
        return body();
    }
    let team = Team {
        owner,
        size: threads,
        current: AtomicPtr::new(std::ptr::null_mut()),
        epoch: AtomicU64::new(0),
        inside: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    };
    rayon::scope(|s| {
        for _ in 1..threads {
            s.spawn(|_| help(&team));
        }
        // Stops the helpers even when `body` panics, so that the scope can end.
        struct Stop<'t>(&'t Team);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                OWNED.with(|o| o.set(std::ptr::null()));
                self.0.stop.store(true, Ordering::Release);
            }
        }
        let _stop = Stop(&team);
        OWNED.with(|o| o.set(&team));
        body()
    })
}

/// Runs `f(state, task)` for every task in `0..n`, each participating thread with a `state` of its
/// own made by `init` (made once per thread and call, as rayon's `for_each_init` does). On a team's
/// owner the team's helpers take part; anywhere else rayon does the work.
pub fn for_each_init<S, I, F>(n: usize, init: I, f: F)
where
    I: Fn() -> S + Sync + Send,
    F: Fn(&mut S, usize) + Sync + Send,
{
    for_each(n, init, f, false)
}

/// [`for_each_init`] for work too small to be worth rayon's hand-off: on a team's owner the helpers
/// take part (they are spinning anyway); anywhere else the calling thread does every task in order.
pub fn for_each_init_on_team<S, I, F>(n: usize, init: I, f: F)
where
    I: Fn() -> S + Sync + Send,
    F: Fn(&mut S, usize) + Sync + Send,
{
    for_each(n, init, f, true)
}

/// The team's way when this thread owns one; otherwise the calling thread alone (`serial`) or rayon.
fn for_each<S, I, F>(n: usize, init: I, f: F, serial: bool)
where
    I: Fn() -> S + Sync + Send,
    F: Fn(&mut S, usize) + Sync + Send,
{
    match owned_team() {
        Some(team) if n >= 2 => run_on_team(team, n, &init, &f),
        _ if serial => {
            let mut state = init();
            (0..n).for_each(|t| f(&mut state, t));
        }
        _ => {
            use rayon::prelude::*;
            (0..n).into_par_iter().for_each_init(init, f);
        }
    }
}

/// Threads taking part in [`for_each_init_on_team`]'s tasks from this thread: its team's size on a
/// team's owner, else 1 (the tasks then run one after the other).
pub fn team_size() -> usize {
    owned_team().map_or(1, |team| team.size)
}

/// The team this thread owns, if any.
fn owned_team() -> Option<&'static Team> {
    let team = OWNED.with(|o| o.get());
    // SAFETY: `OWNED` is set only while the team lives (`with_team`'s scope, on its stack), and the
    // reference does not leave the call that reads it.
    (!team.is_null()).then(|| unsafe { &*team })
}

/// Publishes `0..n` to `team`'s helpers, takes part, and returns when every task is done.
fn run_on_team<S, I, F>(team: &Team, n: usize, init: &I, f: &F)
where
    I: Fn() -> S + Sync + Send,
    F: Fn(&mut S, usize) + Sync + Send,
{
    let next = AtomicUsize::new(0);
    work_on_team(team, &|| {
        let mut state = None;
        loop {
            let task = next.fetch_add(1, Ordering::Relaxed);
            if task >= n {
                break;
            }
            f(state.get_or_insert_with(init), task);
        }
    });
}

/// Runs `f(state, range)` over ranges that cover `0..n` once, each participating thread with a `state`
/// of its own made by `init`. On a team's owner the ranges are claimed in shrinking sizes ("guided", as
/// OpenMP's schedule): each claim takes the unclaimed part divided by the team's threads, at least `min`
/// and rounded up to a multiple of `align` (but never past `n`), so a call is a few long runs per thread
/// and only its last ones are short enough to even out the threads' finishing times. Anywhere else rayon
/// runs ranges of `min` (rounded up to `align`).
///
/// Why: a decoding step's products stream their weights from memory, and every range a thread starts
/// away from its last one is a cold start for the prefetchers, hardware and software (the kernels ask
/// for weights a little ahead of the row they read, which at a range's end is the next range's start).
/// Qwen2.5-Coder-1.5B's largest batch-1 product was 140 tasks of 128 rows taken in turn by two threads;
/// guided, it is 8 runs (README, speed).
pub fn for_each_range_init<S, I, F>(n: usize, min: usize, align: usize, init: I, f: F)
where
    I: Fn() -> S + Sync + Send,
    F: Fn(&mut S, std::ops::Range<usize>) + Sync + Send,
{
    let min = min.max(1).next_multiple_of(align.max(1));
    match owned_team() {
        Some(team) if n > min => {
            let next = AtomicUsize::new(0);
            work_on_team(team, &|| {
                let mut state = None;
                while let Some(range) = claim_guided(&next, n, min, align, team.size) {
                    f(state.get_or_insert_with(&init), range);
                }
            });
        }
        _ => {
            use rayon::prelude::*;
            (0..n.div_ceil(min))
                .into_par_iter()
                .for_each_init(init, |s, c| f(s, c * min..((c + 1) * min).min(n)));
        }
    }
}

/// The next range of a guided schedule over `0..n` (see [`for_each_range_init`]), or `None` when all of
/// it is claimed. `min` is a multiple of `align`.
fn claim_guided(
    next: &AtomicUsize,
    n: usize,
    min: usize,
    align: usize,
    threads: usize,
) -> Option<std::ops::Range<usize>> {
    let mut start = next.load(Ordering::Relaxed);
    loop {
        if start >= n {
            return None;
        }
        let take = ((n - start) / threads.max(1))
            .next_multiple_of(align.max(1))
            .max(min);
        let end = start.saturating_add(take).min(n);
        match next.compare_exchange_weak(start, end, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(start..end),
            Err(now) => start = now,
        }
    }
}

/// Publishes a job to `team`'s helpers, runs `participate` on this thread too, and returns when no
/// helper is still inside it (`participate` returns once every task of the job is claimed and its
/// own are done, so the job is then complete).
fn work_on_team(team: &Team, participate: &(dyn Fn() + Sync)) {
    let job = Job { participate };
    // Withdraws the job and waits until no helper can still be reading it, even when a task panics.
    struct Withdraw<'t>(&'t Team);
    impl Drop for Withdraw<'_> {
        fn drop(&mut self) {
            self.0.current.store(std::ptr::null_mut(), Ordering::SeqCst);
            while self.0.inside.load(Ordering::SeqCst) != 0 {
                spin_loop();
            }
            OWNED.with(|o| o.set(self.0));
        }
    }
    // A task that itself asks for parallel work gets rayon's, not this team's.
    OWNED.with(|o| o.set(std::ptr::null()));
    let _withdraw = Withdraw(team);
    team.epoch.fetch_add(1, Ordering::SeqCst);
    // The job outlives every use of the pointer: `Withdraw` clears it and waits for the helpers.
    let ptr = &job as *const Job<'_> as *mut Job<'static>;
    team.current.store(ptr, Ordering::SeqCst);
    participate();
}

/// A helper's loop: join each published job once, run rayon's pending work between jobs, return when
/// the owner's body is done.
fn help(team: &Team) {
    if rayon::current_thread_index() == team.owner {
        // The owner ran its own helper job (while waiting in a rayon join): nothing to help with.
        return;
    }
    let mut seen = team.epoch.load(Ordering::Acquire);
    let mut idle_since = Instant::now();
    let mut spins = 0u32;
    while !team.stop.load(Ordering::Acquire) {
        let epoch = team.epoch.load(Ordering::Acquire);
        if epoch != seen && !team.current.load(Ordering::Acquire).is_null() {
            team.inside.fetch_add(1, Ordering::SeqCst);
            // Leaves even when a task panics, so that the owner does not wait forever.
            struct Leave<'t>(&'t AtomicUsize);
            impl Drop for Leave<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let _leave = Leave(&team.inside);
            let job = team.current.load(Ordering::SeqCst);
            if !job.is_null() {
                // SAFETY: registered in `inside` before this load saw the job, so the owner, which
                // clears `current` before waiting for `inside` to drain, keeps it alive until we leave.
                (unsafe { &*job }.participate)();
            }
            seen = epoch;
            idle_since = Instant::now();
            continue;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            rayon::yield_now();
            if idle_since.elapsed() > SPIN_ALONE {
                std::thread::yield_now();
            }
        } else {
            spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    /// Runs `body` on a pool of up to four threads (as many as the machine has cores), once outside a
    /// team and once inside one.
    fn in_and_out_of_a_team(body: impl Fn() + Send + Sync) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        pool(cores.clamp(1, 4)).install(|| {
            for wanted in [false, true] {
                with_team(wanted, &body)
            }
        });
    }

    /// Every task runs exactly once, in and out of a team, over many jobs in a row.
    #[test]
    fn every_task_runs_once() {
        in_and_out_of_a_team(|| {
            for n in [0, 1, 2, 7, 64, 1000] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                let hit = |_: &mut (), t: usize| {
                    hits[t].fetch_add(1, Ordering::Relaxed);
                };
                for_each_init(n, || (), hit);
                for_each_init_on_team(n, || (), hit);
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 2), "{n}");
            }
        });
    }

    /// Every index of `0..n` is in exactly one range, in and out of a team; every range starts on a
    /// multiple of `align` and only a last one (ending at `n`) is shorter than `min`.
    #[test]
    fn ranges_cover_every_index_once() {
        in_and_out_of_a_team(|| {
            for (n, min, align) in [
                (0, 4, 4),
                (1, 4, 4),
                (5, 4, 4),
                (600, 128, 128),
                (1000, 30, 8),
            ] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                for_each_range_init(
                    n,
                    min,
                    align,
                    || (),
                    |_, r| {
                        assert_eq!(r.start % align, 0, "{r:?} of {n}");
                        assert!(
                            r.len() >= min.next_multiple_of(align) || r.end == n,
                            "{r:?}"
                        );
                        r.for_each(|i| {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        });
                    },
                );
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{n}");
            }
        });
    }

    /// A guided schedule's claims shrink, each a share of what is left, down to `min`: the largest
    /// batch-1 product of Qwen2.5-Coder-1.5B (17,920 rows, tasks of 128) goes in 8 runs on 2 threads.
    #[test]
    fn guided_claims_shrink_to_the_minimum() {
        let next = AtomicUsize::new(0);
        let sizes: Vec<usize> = std::iter::from_fn(|| claim_guided(&next, 17_920, 128, 128, 2))
            .map(|r| r.len())
            .collect();
        assert_eq!(sizes, [8960, 4480, 2304, 1152, 512, 256, 128, 128]);
        let next = AtomicUsize::new(0);
        let sizes: Vec<usize> = std::iter::from_fn(|| claim_guided(&next, 100, 32, 32, 4))
            .map(|r| r.len())
            .collect();
        assert_eq!(
            sizes,
            [32, 32, 32, 4],
            "never below the minimum but at the end"
        );
    }

    /// Outside a team, `for_each_init_on_team` runs every task on the calling thread, in order.
    #[test]
    fn outside_a_team_small_work_stays_on_the_caller() {
        let caller = std::thread::current().id();
        let order = std::sync::Mutex::new(Vec::new());
        for_each_init_on_team(
            5,
            || (),
            |_, t| {
                assert_eq!(std::thread::current().id(), caller);
                order.lock().unwrap().push(t);
            },
        );
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    /// Rayon's parallel iterators inside a team, and a team's tasks that use them, still finish.
    #[test]
    fn rayon_work_inside_a_team_finishes() {
        use rayon::prelude::*;
        let pool = pool(2);
        let total = pool.install(|| {
            with_team(true, || {
                let inner: u64 = (0..1000u64).into_par_iter().sum();
                let sums: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(0)).collect();
                for_each_init(
                    8,
                    || (),
                    |_, t| {
                        let s: u64 = (0..100u64).into_par_iter().map(|v| v * t as u64).sum();
                        sums[t].store(s, Ordering::Relaxed);
                    },
                );
                inner + sums.iter().map(|s| s.load(Ordering::Relaxed)).sum::<u64>()
            })
        });
        assert_eq!(total, 499_500 + 4950 * 28);
    }

    /// A panicking task reaches the caller instead of leaving helpers spinning forever.
    #[test]
    fn a_panicking_task_is_reported() {
        let pool = pool(2);
        let caught = pool.install(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                with_team(true, || {
                    for_each_init(
                        16,
                        || (),
                        |_, t| {
                            if t == 11 {
                                panic!("task 11");
                            }
                        },
                    )
                })
            }))
        });
        assert!(caught.is_err());
    }
}
