//! Deferred reclamation: `call_rcu` / `kfree_rcu` for userspace.
//!
//! Retired objects go onto one process-wide queue. A reclaimer thread
//! (spawned on first use, named `fprobe-rcu-reclaim`) takes the *whole*
//! queue, waits for one grace period, and drops the batch: however many
//! objects were retired meanwhile, they share one `synchronize`.
//!
//! # Invariants
//!
//! * Every object retired with sequence number `s` is dropped after a grace
//!   period that began after it was retired, and before `reclaimed` reaches
//!   `s` (so [`barrier`] can wait on the counter).
//! * Memory is bounded: when more than [`MAX_PENDING`] objects wait, a
//!   retiring thread outside any read-side critical section waits for the
//!   reclaimer to catch up (back-pressure) instead of letting garbage grow.
//!   Nothing waits for a manual flush: the reclaimer starts a grace period
//!   at most [`COALESCE`] after the queue becomes non-empty, sooner when
//!   [`barrier`] or a back-pressured retirer wakes it (a wake-up sent just
//!   before the reclaimer starts waiting is missed, and it waits the full
//!   [`COALESCE`]) or [`COALESCE_MAX`] objects are queued.
//! * A panicking destructor is caught on the reclaimer thread, counted and
//!   reported once on stderr; the reclaimer keeps going.
//!
//! # Coalescing
//!
//! Every grace period costs the readers something: with membarrier(2) an
//! interrupt on every CPU running a thread of the process, without it a
//! wait for each reader. A reclaimer that started one per wake-up would,
//! under a steady stream of removals, run one for every few objects and
//! wake up as often. Waiting [`COALESCE`] first gathers
//! everything retired meanwhile into one grace period, as the kernel's and
//! liburcu's `call_rcu` do, bounding grace periods from the reclaimer to
//! about 1,000 a second whatever the write rate.
//!
//! # Placement
//!
//! The reclaimer runs where the garbage comes from. Before each batch it
//! restricts itself to the CPU on which the batch's last object was
//! retired, as the kernel by default (without `rcu_nocbs` offloading)
//! invokes RCU callbacks on the CPU that queued them; readers on other CPUs
//! then lose no time to it. Left to the scheduler, it can run on a
//! *reader's* CPU: with one reader and one writer flat out on two CPUs,
//! the reclaimer then takes its time from the reader (`--bench churn`;
//! BENCHMARKS.md, section "Readers under writer churn").
//!
//! * It only goes to CPUs of its *home* mask: the affinity of the
//!   process's main thread when the reclaimer started (its own inherited
//!   one if that cannot be read), so a process confined with `taskset`
//!   stays confined. It returns home when following fails (an offline CPU,
//!   a changed cpuset) or is turned off
//!   ([`super::set_reclaimer_follows_retirer`]).
//! * A retirer's CPU may be monopolised by a thread of higher priority, so
//!   progress must not depend on it:
//!   - retirers under a real-time policy (`SCHED_FIFO`, `SCHED_RR`,
//!     `SCHED_DEADLINE`, read once per thread) do not steer the reclaimer;
//!   - a thread that waits for reclamation ([`barrier`], back-pressure)
//!     and sees no progress for [`STALL`] sends the reclaimer home and
//!     suspends following for [`STALL_PAUSE`];
//!   - so does a retirer that finds the queue's oldest object [`STALL`]
//!     old (checked when the queue length reaches a power of two, so a
//!     clock is read O(log n) times per batch).
//!
//!   What is left: a reclaimer confined to a CPU that something else then
//!   monopolises, with no later retirement and no waiter, waits for that
//!   CPU; its queue is then at most what was retired before.
//! * The CPU number is a hint read from the rseq area (or `sched_getcpu`),
//!   one load per retirement, just before the retirer takes the
//!   queue lock. The affinity changes only when the CPU does: one
//!   `sched_setaffinity` per batch (two when the CPU went away), none for a
//!   single writer that stays put, plus one per release by a waiter or
//!   retirer.

pub(super) mod state;

use std::panic::{AssertUnwindSafe, catch_unwind};

use std::time::{Duration, Instant};

use state::{Deferred, Inner, Placement, State, Worker, state};

use crate::sync::{AtomicBool, MutexGuard, Ordering};
use crate::sys::affinity;

/// Objects allowed to wait for a grace period before retiring threads feel
/// back-pressure.
pub(crate) const MAX_PENDING: usize = 1 << 16;

/// How long the reclaimer lets retirements accumulate before it starts a
/// grace period for them (module docs: coalescing).
pub(crate) const COALESCE: std::time::Duration = std::time::Duration::from_millis(1);

/// Queue length at which the reclaimer stops waiting for more.
pub(crate) const COALESCE_MAX: usize = MAX_PENDING / 4;

/// How long a waiter lets the reclaimer make no progress before it sends
/// the reclaimer back to its home CPUs (module docs: placement). Long
/// enough for an ordinary grace period (the process's first one registers
/// with membarrier(2), which itself waits for a kernel grace period).
pub(crate) const STALL: Duration = Duration::from_millis(100);

/// How long following the retirers' CPU stays suspended after a stall.
pub(crate) const STALL_PAUSE: Duration = Duration::from_secs(1);

/// Whether the reclaimer follows the retirers' CPU
/// ([`super::set_reclaimer_follows_retirer`]).
pub(crate) static FOLLOW: AtomicBool = AtomicBool::new(true);

std::thread_local! {
    static IS_RECLAIMER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn lock(st: &State) -> MutexGuard<'_, Inner> {
    // A panic while holding the lock cannot leave `Inner` inconsistent: every
    // critical section below is panic-free bookkeeping.
    st.inner.lock().unwrap_or_else(|e| e.into_inner())
}

fn ensure_worker(st: &'static State, g: &mut Inner) {
    if g.worker != Worker::NotStarted {
        return;
    }
    // The fork handler must exist before there is a reclaimer thread whose
    // id a forked child could inherit (`after_fork_child`).
    super::domain::init();
    let spawned = std::thread::Builder::new()
        .name("fprobe-rcu-reclaim".into())
        .spawn(move || reclaimer(st));
    g.worker = match spawned {
        Ok(_) => Worker::Running,
        Err(_) => Worker::Unavailable,
    };
}

fn reclaimer(st: &'static State) {
    IS_RECLAIMER.with(|f| f.set(true));
    if let Some((tid, home)) = affinity::current() {
        lock(st).placement = Some(Placement {
            tid,
            home,
            pinned: None,
            paused_until: None,
        });
    }
    loop {
        let (batch, upto, cpu) = {
            let mut g = lock(st);
            while g.queue.is_empty() {
                g = st.work.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            // Coalesce: let more retirements join this grace period. A
            // waiter (`barrier`, back-pressure) notifies `work` and ends the
            // wait early; retirers notify only an empty queue, so they do
            // not. A wake-up for any other reason just starts the grace
            // period sooner.
            if g.queue.len() < COALESCE_MAX {
                g = st
                    .work
                    .wait_timeout(g, COALESCE)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            (std::mem::take(&mut g.queue), g.retired, g.last_cpu)
        };
        follow(st, cpu);
        reclaim_batch(st, batch, upto);
    }
}

/// Confines the reclaimer (the calling thread) to `cpu`, the CPU of the
/// batch's last retirement, or sends it home (module docs: placement).
fn follow(st: &State, cpu: Option<usize>) {
    let (want, home) = {
        let mut g = lock(st);
        let Some(p) = g.placement.as_mut() else {
            return;
        };
        let now = Instant::now();
        if p.paused_until.is_some_and(|t| now >= t) {
            p.paused_until = None;
        }
        // Relaxed: a setting, read once per batch; nothing else is ordered
        // by it.
        let want = if FOLLOW.load(Ordering::Relaxed) && p.paused_until.is_none() {
            cpu.filter(|&c| p.home.contains(c))
        } else {
            None
        };
        if want == p.pinned {
            return;
        }
        (want, p.home)
    };
    // The system call runs outside the lock: retirers do not wait for it.
    let placed = match want {
        Some(c) => affinity::set_own(&affinity::Mask::single(c)),
        None => affinity::set_own(&home),
    };
    let mut g = lock(st);
    let Some(p) = g.placement.as_mut() else {
        return;
    };
    if placed {
        p.pinned = want;
    } else {
        // The CPU went away or is no longer allowed: home is always valid
        // (or, if even that fails, the thread keeps whatever it has).
        affinity::set_own(&home);
        p.pinned = None;
    }
}

/// Sends a stalled reclaimer home and suspends following for
/// [`STALL_PAUSE`] (module docs: placement). `g` is the state under the
/// lock, whose guard ([`lock`]) the caller holds.
fn release_stalled(g: &mut Inner) {
    if let Some(p) = g.placement.as_mut() {
        p.paused_until = Some(Instant::now() + STALL_PAUSE);
        if p.pinned.is_some() && affinity::set_thread(p.tid, &p.home) {
            p.pinned = None;
        }
    }
}

/// One grace period, then drop `batch` (everything retired up to `upto`).
fn reclaim_batch(st: &State, batch: Vec<Deferred>, upto: u64) {
    super::domain::synchronize_unchecked();
    let mut panics = 0;
    for d in batch {
        if catch_unwind(AssertUnwindSafe(|| d.run())).is_err() {
            panics += 1;
        }
    }
    let mut g = lock(st);
    if panics > 0 && g.panics == 0 {
        eprintln!("fprobe::rcu: a destructor of a retired object panicked; reclamation continues");
    }
    g.panics += panics;
    g.grace_periods += 1;
    g.reclaimed = g.reclaimed.max(upto);
    drop(g);
    st.progress.notify_all();
}

/// Queues `ptr` to be dropped by `drop_fn` after a grace period.
///
/// # Safety
///
/// `drop_fn(ptr)` must be sound to call exactly once, from any thread, once
/// no reader can still hold a reference obtained before this call: the
/// object is unreachable for new readers, it is `Send`, and nobody else
/// frees it.
pub(crate) unsafe fn retire_raw(ptr: *mut (), drop_fn: unsafe fn(*mut ())) {
    let st = state();
    let cpu = steering_cpu();
    let mut g = lock(st);
    g.queue.push(Deferred { ptr, drop_fn });
    g.last_cpu = cpu;
    g.retired += 1;
    let seq = g.retired;
    ensure_worker(st, &mut g);
    let pending = g.queue.len();
    if pending == 1 {
        g.queue_since = Some(Instant::now());
    } else if pending.is_power_of_two()
        && g.placement.as_ref().is_some_and(|p| p.pinned.is_some())
        && g.queue_since.is_some_and(|t| t.elapsed() >= STALL)
    {
        release_stalled(&mut g);
    }
    let worker = g.worker;
    drop(g);
    if worker == Worker::Running {
        // The first object wakes the reclaimer; COALESCE_MAX cuts its
        // coalescing wait short.
        if pending == 1 || pending == COALESCE_MAX {
            st.work.notify_one();
        }
        if pending > MAX_PENDING && can_wait() {
            wait_reclaimed(st, seq.saturating_sub(MAX_PENDING as u64 / 2));
        }
    } else if pending > MAX_PENDING / 8 && can_wait() {
        reclaim_inline(st);
    }
}

/// The calling thread's CPU, to steer the reclaimer; `None` for a thread
/// under a real-time scheduling policy (module docs: placement).
fn steering_cpu() -> Option<usize> {
    std::thread_local! {
        static REAL_TIME: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }
    let rt = REAL_TIME.with(|c| {
        c.get().unwrap_or_else(|| {
            let rt = affinity::real_time();
            c.set(Some(rt));
            rt
        })
    });
    if rt { None } else { crate::sys::cpu::current() }
}

/// Whether the calling thread may block on a grace period.
fn can_wait() -> bool {
    !super::domain::in_read_section() && !IS_RECLAIMER.with(|f| f.get())
}

fn reclaim_inline(st: &State) {
    let (batch, upto) = {
        let mut g = lock(st);
        (std::mem::take(&mut g.queue), g.retired)
    };
    reclaim_batch(st, batch, upto);
}

fn wait_reclaimed(st: &State, target: u64) {
    let mut g = lock(st);
    while g.reclaimed < target {
        st.work.notify_one();
        // Every batch bumps `grace_periods` (and `reclaimed` with it, in the
        // same critical section): unchanged means no progress.
        let gps = g.grace_periods;
        let (next, timeout) = st
            .progress
            .wait_timeout(g, STALL)
            .unwrap_or_else(|e| e.into_inner());
        g = next;
        if timeout.timed_out() && g.grace_periods == gps {
            release_stalled(&mut g);
        }
    }
}

/// See [`crate::rcu::barrier`].
pub(crate) fn barrier() {
    assert!(
        !super::domain::in_read_section(),
        "rcu::barrier() called inside a read-side critical section (it would wait for itself)"
    );
    assert!(
        !IS_RECLAIMER.with(|f| f.get()),
        "rcu::barrier() called from a destructor run by the reclaimer (it would wait for itself)"
    );
    let st = state();
    let (target, worker) = {
        let g = lock(st);
        (g.retired, g.worker)
    };
    if worker == Worker::Running {
        wait_reclaimed(st, target);
    } else {
        reclaim_inline(st);
    }
}

/// Counters of the reclamation machinery, read together under its lock.
pub(crate) struct ReclaimCounts {
    /// Objects retired so far.
    pub(crate) retired: u64,
    /// Objects reclaimed so far.
    pub(crate) reclaimed: u64,
    /// Grace periods the reclaimer waited for.
    pub(crate) grace_periods: u64,
    /// Destructors that panicked.
    pub(crate) panics: u64,
    /// Objects retired and not yet reclaimed.
    pub(crate) pending: usize,
}

/// Counters of the reclamation machinery.
pub(crate) fn stats() -> ReclaimCounts {
    let g = lock(state());
    ReclaimCounts {
        retired: g.retired,
        reclaimed: g.reclaimed,
        grace_periods: g.grace_periods,
        panics: g.panics,
        pending: g.queue.len(),
    }
}
