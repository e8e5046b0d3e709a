//! The reclamation state: the queue of retired objects, its counters and
//! the reclaimer's placement, under one lock.
//!
//! The state sits behind a pointer so that the child of a `fork` can start
//! from a fresh one (the reclaimer thread does not survive `fork`); see
//! `after_fork_child`.

use std::time::Instant;

use crate::sync::{AtomicPtr, Condvar, Mutex, Ordering};
use crate::sys::affinity;

/// A type-erased object to drop after a grace period.
pub(crate) struct Deferred {
    pub(super) ptr: *mut (),
    pub(super) drop_fn: unsafe fn(*mut ()),
}

// SAFETY: a `Deferred` is only created by `retire_raw`, whose contract
// requires the object to be safe to drop on another thread (`Send`).
unsafe impl Send for Deferred {}

impl Deferred {
    pub(super) fn run(self) {
        // SAFETY: `retire_raw`'s contract: `drop_fn(ptr)` is valid exactly
        // once, after a grace period, which the reclaimer has waited for.
        unsafe { (self.drop_fn)(self.ptr) }
    }
}

pub(super) struct Inner {
    pub(super) queue: Vec<Deferred>,
    /// Objects retired so far.
    pub(super) retired: u64,
    /// Objects dropped so far (a prefix in retirement order).
    pub(super) reclaimed: u64,
    pub(super) grace_periods: u64,
    pub(super) panics: u64,
    pub(super) worker: Worker,
    /// CPU of the last retirement (a hint; `None` where it cannot be read
    /// or the retirer runs under a real-time policy).
    pub(super) last_cpu: Option<usize>,
    /// When the queue last went from empty to non-empty.
    pub(super) queue_since: Option<Instant>,
    /// Where the reclaimer runs; `None` until it has started.
    pub(super) placement: Option<Placement>,
}

/// The reclaimer thread's affinity (module docs of `rcu::reclaim`:
/// placement).
pub(super) struct Placement {
    /// Its thread id, for a waiter that sends it home.
    #[cfg_attr(not(all(target_os = "linux", not(miri))), allow(dead_code))]
    pub(super) tid: i32,
    /// The CPUs it inherited.
    pub(super) home: affinity::Mask,
    /// The one CPU it is confined to now; `None`: its home mask.
    pub(super) pinned: Option<usize>,
    /// Following is suspended until then (after a stall).
    pub(super) paused_until: Option<Instant>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Worker {
    NotStarted,
    Running,
    /// Thread creation failed: retiring threads reclaim inline.
    Unavailable,
}

pub(super) struct State {
    pub(super) inner: Mutex<Inner>,
    /// The reclaimer waits here for work.
    pub(super) work: Condvar,
    /// `barrier` and back-pressured retirers wait here for progress.
    pub(super) progress: Condvar,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());

pub(super) fn state() -> &'static State {
    // Acquire: pairs with the Release CAS below; the State is initialised.
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: states are leaked, never freed.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(State {
        inner: Mutex::new(Inner {
            queue: Vec::new(),
            retired: 0,
            reclaimed: 0,
            grace_periods: 0,
            panics: 0,
            worker: Worker::NotStarted,
            last_cpu: None,
            queue_since: None,
            placement: None,
        }),
        work: Condvar::new(),
        progress: Condvar::new(),
    }));
    // Release: publishes the initialised State.
    match STATE.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::Release,
        Ordering::Acquire,
    ) {
        // SAFETY: just published; leaked for the rest of the process.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // SAFETY: `fresh` never became visible to another thread.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: the winner's State is leaked, never freed.
            unsafe { &*winner }
        }
    }
}

/// In the child of `fork`: the reclaimer thread did not survive, and the
/// queue's lock may have been held by a thread that no longer exists. Start
/// from a fresh state; the inherited queue is leaked (never dropped: its
/// objects may still be referenced by the inherited copies of the parent's
/// structures).
pub(crate) fn after_fork_child() {
    // Release: the child's next `state()` (Acquire load) starts afresh.
    STATE.store(std::ptr::null_mut(), Ordering::Release);
}
