//! The process-wide domain: read-side sections, thread registration, grace
//! periods, and the fork handler that keeps them working in a child.

use std::cell::Cell;
use std::marker::PhantomData;

use super::raw::{Domain, FenceMode, ReaderRecord};

/// The process-wide domain every [`ReadGuard`] belongs to.
#[cfg(not(loom))]
pub(super) static DOMAIN: Domain = Domain::new(FenceMode::Asymmetric);

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
            // leaked (the record must stay active: see the `rcu` module
            // docs) or another thread-local destructor still holds it and
            // will drop it later; then the record goes quiescent but is not
            // reused.
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
pub(super) fn init() {
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
pub(super) fn init() {}

/// Whether the process-wide domain uses asymmetric fences (compiler fence
/// on the fast side, the process-wide barrier on the slow side: `rcu`
/// module docs, "Writer-side barrier"); initialises the
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
        super::reclaim::state::after_fork_child();
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
