//! Deferred reclamation's API: [`retire`], [`call_rcu`], [`barrier`], the
//! reclaimer's placement and the RCU counters ([`stats`]).

#[cfg(not(loom))]
use super::domain::{DOMAIN, init};
#[cfg(not(loom))]
use super::raw::FenceMode;
#[cfg(not(loom))]
use super::reclaim;

/// Drops `value` after a grace period (`kfree_rcu`).
///
/// Never waits for the grace period itself; the reclaimer thread batches
/// retired objects so that many share one grace period. Blocks only when
/// more than 65,536 objects are pending and the caller is outside any
/// read-side section (back-pressure that keeps memory bounded).
///
/// # Examples
///
/// ```
/// let old = Box::new([0u8; 64]);
/// fprobe::rcu::retire(old);
/// fprobe::rcu::barrier(); // dropped by now
/// ```
#[cfg(not(loom))]
pub fn retire<T: Send + 'static>(value: Box<T>) {
    // SAFETY: the caller gave up ownership of the box; `drop_box::<T>` frees
    // exactly that box, and `T: Send` lets the reclaimer thread do it.
    unsafe { retire_box_raw(Box::into_raw(value)) }
}

/// Runs `f` after a grace period (`call_rcu`), on the reclaimer thread.
///
/// A panic in `f` is caught, counted in [`stats`] and reported once.
///
/// # Examples
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
/// let ran = Arc::new(AtomicBool::new(false));
/// let r = ran.clone();
/// fprobe::rcu::call_rcu(move || r.store(true, Ordering::Relaxed));
/// fprobe::rcu::barrier();
/// assert!(ran.load(Ordering::Relaxed));
/// ```
#[cfg(not(loom))]
pub fn call_rcu<F: FnOnce() + Send + 'static>(f: F) {
    unsafe fn run<F: FnOnce()>(p: *mut ()) {
        // SAFETY: `p` came from `Box::into_raw(Box<F>)` below and is run
        // exactly once.
        let f = unsafe { Box::from_raw(p.cast::<F>()) };
        f()
    }
    // SAFETY: `run::<F>` consumes exactly this box once; `F: Send`.
    unsafe { reclaim::retire_raw(Box::into_raw(Box::new(f)).cast(), run::<F>) }
}

/// Retires a boxed object by raw pointer.
///
/// # Safety
///
/// `p` comes from `Box::into_raw`, the caller owns it, no new reader can
/// reach it, and `T` may be dropped on another thread.
#[cfg(not(loom))]
pub(crate) unsafe fn retire_box_raw<T: Send + 'static>(p: *mut T) {
    unsafe fn drop_box<T>(p: *mut ()) {
        // SAFETY: `retire_box_raw`'s contract: a box we own, dropped once.
        drop(unsafe { Box::from_raw(p.cast::<T>()) });
    }
    // SAFETY: forwarded contract of `retire_box_raw`.
    unsafe { reclaim::retire_raw(p.cast(), drop_box::<T>) }
}

/// Under loom there is no reclaimer thread; retired boxes are leaked.
///
/// # Safety
///
/// As for the non-loom version.
#[cfg(loom)]
pub(crate) unsafe fn retire_box_raw<T: Send + 'static>(_p: *mut T) {}

/// Retires with a custom destructor (used by the address index).
///
/// # Safety
///
/// See `reclaim::retire_raw`.
#[cfg(not(loom))]
pub(crate) unsafe fn retire_raw(p: *mut (), drop_fn: unsafe fn(*mut ())) {
    // SAFETY: forwarded contract.
    unsafe { reclaim::retire_raw(p, drop_fn) }
}

/// Under loom there is no reclaimer thread; retired objects are leaked.
///
/// # Safety
///
/// As for the non-loom version.
#[cfg(loom)]
pub(crate) unsafe fn retire_raw(_p: *mut (), _drop_fn: unsafe fn(*mut ())) {}

/// Waits until every object retired (by any thread) before this call has
/// been dropped: `rcu_barrier()`, for deterministic teardown and tests.
///
/// # Panics
///
/// Inside a read-side critical section of the calling thread, or from a
/// destructor that the reclaimer runs.
///
/// # Examples
///
/// ```
/// fprobe::rcu::retire(Box::new(42u32));
/// fprobe::rcu::barrier();
/// assert_eq!(fprobe::rcu::stats().pending, 0);
/// ```
#[cfg(not(loom))]
pub fn barrier() {
    reclaim::barrier();
}

/// Whether the reclaimer thread follows the CPU of the threads that retire
/// objects (default: on).
///
/// On, the reclaimer confines itself, before each batch, to the CPU on
/// which the batch's last object was retired, so that the work of dropping
/// retired objects lands on the writers' CPUs rather than the readers'
/// (by default the kernel runs RCU callbacks on the CPU that queued them).
/// It only goes to CPUs in the affinity the process's main thread had when
/// the reclaimer started; threads under a real-time policy do not steer
/// it; and a thread waiting for reclamation, or a retirer, that sees no
/// progress for 100 ms sends it back to all of those CPUs for a second.
/// Off, it goes back to them for good and the scheduler places it. Takes
/// effect at the next batch. Does nothing where threads have no affinity
/// (outside Linux, under miri).
///
/// # Examples
///
/// ```
/// // A process whose writers share CPUs with latency-critical threads
/// // may prefer the scheduler's placement.
/// fprobe::rcu::set_reclaimer_follows_retirer(false);
/// fprobe::rcu::retire(Box::new(1u8));
/// fprobe::rcu::barrier();
/// fprobe::rcu::set_reclaimer_follows_retirer(true);
/// ```
#[cfg(not(loom))]
pub fn set_reclaimer_follows_retirer(on: bool) {
    // Relaxed: a setting the reclaimer reads once per batch.
    reclaim::FOLLOW.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Counters of the RCU machinery, for monitoring and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RcuStats {
    /// Objects retired since the process started.
    pub retired: u64,
    /// Objects dropped after their grace period.
    pub reclaimed: u64,
    /// Objects waiting for a grace period now.
    pub pending: usize,
    /// Grace periods the reclaimer has waited for.
    pub reclaim_grace_periods: u64,
    /// Retired objects whose destructor panicked.
    pub destructor_panics: u64,
    /// Reader records ever allocated (threads registered at the same time).
    pub records: usize,
    /// Records claimed by live threads now.
    pub records_in_use: usize,
    /// Whether readers rely on the process-wide barrier (asymmetric
    /// fences): `membarrier(2)` on Linux, `FlushProcessWriteBuffers` on
    /// Windows; `false` where readers run `SeqCst` fences.
    pub membarrier: bool,
}

/// Reads the RCU counters.
///
/// # Examples
///
/// ```
/// let s = fprobe::rcu::stats();
/// assert!(s.reclaimed <= s.retired);
/// ```
#[cfg(not(loom))]
pub fn stats() -> RcuStats {
    init();
    let r = reclaim::stats();
    let (records, records_in_use) = DOMAIN.records();
    RcuStats {
        retired: r.retired,
        reclaimed: r.reclaimed,
        pending: r.pending,
        reclaim_grace_periods: r.grace_periods,
        destructor_panics: r.panics,
        records,
        records_in_use,
        membarrier: DOMAIN.mode() == FenceMode::Asymmetric,
    }
}
