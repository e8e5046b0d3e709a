//! Userspace RCU: read-side critical sections with no atomic
//! read-modify-write and no fence, grace periods, and deferred reclamation.
//!
//! The flavour is liburcu's "memb": readers touch only a thread-local word
//! and run no fence, and writers pay with a process-wide barrier
//! (`membarrier(2)` on Linux; see "Writer-side barrier" below for every
//! platform). It is hand-written
//! rather than taken from crossbeam-epoch, seize or arc-swap because their
//! read guards cost an atomic read-modify-write or a `SeqCst` fence per pin
//! (several times this read side: `BENCHMARKS.md`, "RCU read side"), and
//! this is the hot path of every probe hit.
//!
//! # Usage
//!
//! ```
//! use fprobe::rcu::{self, RcuPtr};
//!
//! let table = RcuPtr::new(vec![1, 2, 3]);
//!
//! // Readers: no lock, no atomic read-modify-write, no fence.
//! let sum: i32 = {
//!     let guard = rcu::read_lock();
//!     table.load(&guard).map_or(0, |v| v.iter().sum())
//! };
//! assert_eq!(sum, 6);
//!
//! // Writers: publish a new version; the old one is dropped after every
//! // reader that might still see it has left its critical section.
//! table.replace(vec![4, 5]);
//! rcu::synchronize(); // wait for a grace period explicitly…
//! rcu::barrier(); // …or for every retired object to have been dropped.
//! ```
//!
//! # Consistency
//!
//! * [`synchronize`] returns only after every read-side critical section
//!   that was running when it was called has ended.
//! * Everything a writer stored before calling [`synchronize`] (or
//!   [`retire`], [`RcuPtr::replace`]) is visible to every critical section
//!   that begins after `synchronize` returns.
//! * An object passed to [`retire`] is dropped after a grace period that
//!   began after the `retire` call; [`barrier`] returns once every object
//!   retired before it was called has been dropped.
//!
//! # Execution context
//!
//! | operation | blocks? | allocates? | async-signal-safe? |
//! |---|---|---|---|
//! | [`read_lock`] / guard drop | never (wait-free) | first call on a thread only | yes, once the thread is registered ([`register_thread`]) |
//! | [`RcuPtr::load`] | never | no | yes |
//! | [`register_thread`] | never (lock-free) | yes, the first time | no |
//! | [`synchronize`] | yes: until pre-existing readers leave | no | no |
//! | [`retire`], [`call_rcu`] | only under back-pressure (more than 65,536 objects pending) | yes | no |
//! | [`barrier`] | yes | no | no |
//!
//! A read-side critical section may nest, including from a signal handler
//! that interrupted another section on the same thread: every update of the
//! thread's word is one load and one store, and a handler leaves the word as
//! it found it. [`synchronize`] and [`barrier`] panic when called inside a
//! read-side section of the calling thread (they would wait for themselves).
//!
//! Threads register lazily on their first [`read_lock`] and give their
//! record back when they exit; an exited thread never delays a grace period.
//! A thread that exits while still holding a guard (one leaked with
//! `mem::forget`) keeps its record active forever: grace periods then never
//! end, which is the only sound choice (the leaked guard's references may
//! still be in use elsewhere).
//!
//! # Writer-side barrier
//!
//! A reader orders its record store before the section's loads with a
//! compiler fence only; the full fence that store-buffering needs on the
//! reader's side is run for it by the writer, on every CPU that runs a
//! thread of the process (`raw`, "The protocol"). Each platform gets the
//! best such barrier it has (`sys::barrier`):
//!
//! | platform | writer side | reader side |
//! |---|---|---|
//! | Linux ≥ 4.14 | `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` | compiler fence |
//! | Windows | `FlushProcessWriteBuffers` | compiler fence |
//! | macOS, FreeBSD, Linux without `membarrier`, `FPROBE_RCU_NO_MEMBARRIER` set | `SeqCst` fence | `SeqCst` fence |
//!
//! * `membarrier(2)` interrupts (IPI) every CPU currently running a thread
//!   of the process and has it execute a full memory barrier before the
//!   call returns; a thread not running then passes a barrier at its next
//!   context switch, before it runs again. Every reader has therefore had a
//!   full fence between its record store and its later loads, or before
//!   its record store, by the time the writer scans: as if it had run the
//!   fence itself.
//! * `FlushProcessWriteBuffers` gives the same guarantee: it flushes the
//!   write buffers of every processor running a thread of the process, by
//!   IPI, and returns once each has done so (a full barrier on each; a
//!   thread not running passes one at its context switch).
//! * Where the system has neither (macOS, FreeBSD), readers pay one
//!   `SeqCst` fence per outermost section and the writer runs one where it
//!   would have called the barrier: with a full fence on both sides of the
//!   store-buffering pattern, either the writer's scan sees the reader's
//!   record store or the reader's loads see the writer's earlier stores,
//!   which is all a grace period needs. The mode is carried in the word
//!   readers load anyway, so the fence costs only itself.
//!
//! # Fork
//!
//! (Unix; Windows has no `fork`.) In the child of `fork`, only the forking
//! thread exists. A `pthread_atfork`
//! child handler marks every other thread's record quiescent, releases the
//! grace-period lock if a parent thread held it, and starts the deferred
//! reclamation afresh (objects the parent had queued are leaked in the
//! child, never dropped twice). The child may keep using RCU. As with any
//! multi-threaded fork, a child that forked while another parent thread was
//! inside `retire` must `exec` rather than retire more objects.
//!
//! # Performance
//!
//! `read_lock` + drop is one thread-local load, two loads and one store to
//! the thread's own line and a compiler fence; `BENCHMARKS.md`, "RCU read
//! side", compares it with crossbeam-epoch, seize and arc-swap in the same
//! run.

mod ptr;
pub(crate) mod raw;
#[cfg(not(loom))]
mod reclaim;

use std::cell::Cell;
use std::marker::PhantomData;

pub use ptr::RcuPtr;
use raw::{Domain, FenceMode, ReaderRecord};

/// The process-wide domain every [`ReadGuard`] belongs to.
#[cfg(not(loom))]
static DOMAIN: Domain = Domain::new(FenceMode::Asymmetric);

#[cfg(not(loom))]
static INIT: std::sync::Once = std::sync::Once::new();

std::thread_local! {
    /// Gives the record back at thread exit. The record itself is in the
    /// thread's context (`crate::context`): null before registration and
    /// after this exit handler ran.
    static OWNER: Owner = const { Owner };
}

/// The thread's record slot in its context.
#[inline(always)]
fn record() -> &'static Cell<*const ReaderRecord> {
    &crate::context::context().rcu
}

struct Owner;

impl Drop for Owner {
    fn drop(&mut self) {
        let rec = record().replace(std::ptr::null());
        if rec.is_null() {
            return;
        }
        // SAFETY: records of the process-wide domain are never freed.
        let rec = unsafe { &*rec };
        if rec.nesting() == 0 {
            domain().unregister(rec);
        } else {
            // A guard outlives the thread's exit handler. Either it was
            // leaked (the record must stay active: see the module docs) or
            // another thread-local destructor still holds it and will drop
            // it later; then the record goes quiescent but is not reused.
            eprintln!(
                "fprobe::rcu: thread exits inside a read-side critical section; its record stays claimed"
            );
        }
    }
}

#[cfg(not(loom))]
#[inline(always)]
fn domain() -> &'static Domain {
    &DOMAIN
}

#[cfg(loom)]
fn domain() -> &'static Domain {
    unreachable!("the process-wide RCU domain is not available under loom; use raw::Domain")
}

#[cfg(not(loom))]
fn init() {
    INIT.call_once(|| {
        #[cfg(not(miri))]
        let asymmetric = crate::sync::ASYMMETRIC_FENCES && crate::sys::barrier::register();
        #[cfg(miri)]
        let asymmetric = false;
        let mode = if asymmetric {
            FenceMode::Asymmetric
        } else {
            FenceMode::Symmetric
        };
        DOMAIN.set_mode(mode);
        install_fork_handler();
    });
}

#[cfg(loom)]
fn init() {}

/// Whether the process-wide domain uses asymmetric fences (compiler fence
/// on the fast side, the process-wide barrier on the slow side: module
/// docs, "Writer-side barrier"); initialises the
/// domain. Other store-buffering handshakes of the crate (the object pool's
/// per-thread caches) follow the same mode, so that one registration and
/// one fallback serve the whole crate.
#[cfg(not(loom))]
pub(crate) fn asymmetric_fences() -> bool {
    init();
    DOMAIN.mode() == FenceMode::Asymmetric
}

/// Under loom there is no process-wide barrier: symmetric fences.
#[cfg(loom)]
pub(crate) fn asymmetric_fences() -> bool {
    false
}

/// The slow side of a store-buffering handshake whose fast side ran a
/// compiler fence (`asymmetric`, as [`asymmetric_fences`] returned) or a
/// `SeqCst` fence: the process-wide barrier (`membarrier(2)`,
/// `FlushProcessWriteBuffers`), which runs a full fence on every CPU that
/// runs a thread of the process, or a `SeqCst` fence.
pub(crate) fn heavy_barrier(asymmetric: bool) {
    #[cfg(not(any(loom, miri)))]
    if asymmetric {
        crate::sys::barrier::barrier();
        return;
    }
    let _ = asymmetric;
    crate::sync::fence(crate::sync::Ordering::SeqCst);
}

#[cfg(not(any(loom, miri)))]
fn install_fork_handler() {
    extern "C" fn child() {
        let me = record().get();
        DOMAIN.after_fork_child(me);
        reclaim::after_fork_child();
    }
    if let Err(rc) = crate::sys::fork::on_fork_child(child) {
        eprintln!(
            "fprobe::rcu: pthread_atfork failed ({rc}); RCU is not fork-safe in this process"
        );
    }
}

#[cfg(any(loom, miri))]
fn install_fork_handler() {}

/// A read-side critical section of the calling thread.
///
/// While a `ReadGuard` lives, no object that was reachable when it was
/// created is reclaimed, and [`synchronize`] on another thread waits for it
/// to drop. Guards nest. `!Send`: a critical section belongs to one thread.
///
/// Create one with [`read_lock`].
#[must_use = "the critical section ends when the guard is dropped"]
pub struct ReadGuard {
    rec: &'static ReaderRecord,
    /// The record was claimed just for this guard (the thread's own record
    /// is gone: thread-local destructors are running) and is released when
    /// the guard drops.
    transient: bool,
    _not_send: PhantomData<*mut ()>,
}

impl ReadGuard {
    #[inline(always)]
    fn enter(rec: &'static ReaderRecord, transient: bool) -> Self {
        rec.enter(&domain().gp);
        Self {
            rec,
            transient,
            _not_send: PhantomData,
        }
    }
}

impl Drop for ReadGuard {
    #[inline(always)]
    fn drop(&mut self) {
        self.rec.exit();
        if self.transient {
            domain().unregister(self.rec);
        }
    }
}

impl std::fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadGuard")
            .field("nesting", &self.rec.nesting())
            .finish()
    }
}

/// Enters a read-side critical section; it lasts until the guard drops.
///
/// Costs one thread-local load, two loads and one store to the thread's own
/// cache line, and a compiler fence: no atomic read-modify-write, no memory
/// fence (unless the system lacks a process-wide barrier: module docs,
/// "Writer-side barrier"), no shared-memory write.
///
/// The first call on a thread registers it (lock-free; allocates a record
/// once per concurrently live thread).
///
/// # Examples
///
/// ```
/// let outer = fprobe::rcu::read_lock();
/// let inner = fprobe::rcu::read_lock(); // nests
/// drop(inner);
/// drop(outer);
/// ```
#[inline]
pub fn read_lock() -> ReadGuard {
    let rec = record().get();
    if rec.is_null() {
        return read_lock_slow();
    }
    // SAFETY: a non-null record slot points to a record of the process-wide
    // domain, which is never freed, claimed by this thread.
    ReadGuard::enter(unsafe { &*rec }, false)
}

#[cold]
#[inline(never)]
fn read_lock_slow() -> ReadGuard {
    let (rec, transient) = register_current();
    ReadGuard::enter(rec, transient)
}

/// Claims a record for the calling thread.
fn register_current() -> (&'static ReaderRecord, bool) {
    init();
    let existing = record().get();
    if !existing.is_null() {
        // SAFETY: as in `read_lock`.
        return (unsafe { &*existing }, false);
    }
    // Arms the exit handler; fails once this thread's thread-local
    // destructors have started, and then the record is only borrowed for
    // the guard's lifetime.
    let armed = OWNER.try_with(|_| ()).is_ok();
    let rec = domain().register();
    if armed {
        record().set(rec);
    }
    (rec, !armed)
}

/// The calling thread's record, for the probe layer's dispatch sections
/// ([`ReaderRecord::begin_dispatch`]): registers the thread on its first
/// call; `None` while its thread-local destructors run (a record claimed
/// then could not be given back).
#[inline(always)]
pub(crate) fn thread_record() -> Option<&'static ReaderRecord> {
    let rec = record().get();
    if rec.is_null() {
        return thread_record_slow();
    }
    // SAFETY: as in `read_lock`.
    Some(unsafe { &*rec })
}

#[cold]
#[inline(never)]
fn thread_record_slow() -> Option<&'static ReaderRecord> {
    let (rec, transient) = register_current();
    if transient {
        domain().unregister(rec);
        return None;
    }
    Some(rec)
}

/// [`ReaderRecord::begin_dispatch`] on the process-wide domain.
#[inline(always)]
pub(crate) fn begin_dispatch(rec: &ReaderRecord) -> bool {
    rec.begin_dispatch(&domain().gp)
}

/// [`ReaderRecord::begin_dispatch_keeping_epoch`], for exits.
#[inline(always)]
pub(crate) fn begin_exit_dispatch(rec: &ReaderRecord) -> bool {
    rec.begin_dispatch_keeping_epoch()
}

/// Registers the calling thread now, so that later [`read_lock`] calls on it
/// never allocate: call it before installing a signal handler that reads
/// under RCU. Idempotent.
///
/// # Examples
///
/// ```
/// fprobe::rcu::register_thread();
/// assert!(!fprobe::rcu::in_read_section());
/// ```
pub fn register_thread() {
    let (rec, transient) = register_current();
    if transient {
        domain().unregister(rec);
    }
}

/// Whether the calling thread is inside a read-side critical section.
///
/// # Examples
///
/// ```
/// assert!(!fprobe::rcu::in_read_section());
/// let g = fprobe::rcu::read_lock();
/// assert!(fprobe::rcu::in_read_section());
/// # drop(g);
/// ```
#[inline]
pub fn in_read_section() -> bool {
    let rec = record().get();
    // SAFETY: as in `read_lock`.
    !rec.is_null() && unsafe { &*rec }.nesting() > 0
}

/// Waits for a grace period: returns once every read-side critical section
/// that was running when it was called has ended.
///
/// Blocks (polling readers' words with spin, yield, then short sleeps);
/// callers are serialised. Costs one process-wide barrier
/// (`membarrier(2)`, `FlushProcessWriteBuffers`) plus the wait.
///
/// # Panics
///
/// When called inside a read-side critical section of the calling thread.
///
/// # Examples
///
/// ```
/// fprobe::rcu::synchronize();
/// ```
pub fn synchronize() {
    assert!(
        !in_read_section(),
        "rcu::synchronize() called inside a read-side critical section (it would wait for itself)"
    );
    synchronize_unchecked();
}

pub(crate) fn synchronize_unchecked() {
    init();
    domain().synchronize();
}

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
