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
//! wait for each reader. A reclaimer that started one per wake-up ran
//! about 1,600 grace periods a second for 10,000 removals a second (one
//! per 6 objects) and woke up as often. Waiting [`COALESCE`] first gathers
//! everything retired meanwhile into one grace period, as the kernel's and
//! liburcu's `call_rcu` do, bounding grace periods from the reclaimer to
//! about 1,000 a second whatever the write rate.
//!
//! The state sits behind a pointer so that the child of a `fork` can start
//! from a fresh one (the reclaimer thread does not survive `fork`); see
//! `after_fork_child`.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::sync::{AtomicPtr, Condvar, Mutex, MutexGuard, Ordering};

/// Objects allowed to wait for a grace period before retiring threads feel
/// back-pressure.
pub(crate) const MAX_PENDING: usize = 1 << 16;

/// How long the reclaimer lets retirements accumulate before it starts a
/// grace period for them (module docs: coalescing).
pub(crate) const COALESCE: std::time::Duration = std::time::Duration::from_millis(1);

/// Queue length at which the reclaimer stops waiting for more.
pub(crate) const COALESCE_MAX: usize = MAX_PENDING / 4;

/// A type-erased object to drop after a grace period.
pub(crate) struct Deferred {
    ptr: *mut (),
    drop_fn: unsafe fn(*mut ()),
}

// SAFETY: a `Deferred` is only created by `retire_raw`, whose contract
// requires the object to be safe to drop on another thread (`Send`).
unsafe impl Send for Deferred {}

impl Deferred {
    fn run(self) {
        // SAFETY: `retire_raw`'s contract: `drop_fn(ptr)` is valid exactly
        // once, after a grace period, which the reclaimer has waited for.
        unsafe { (self.drop_fn)(self.ptr) }
    }
}

struct Inner {
    queue: Vec<Deferred>,
    /// Objects retired so far.
    retired: u64,
    /// Objects dropped so far (a prefix in retirement order).
    reclaimed: u64,
    grace_periods: u64,
    panics: u64,
    worker: Worker,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Worker {
    NotStarted,
    Running,
    /// Thread creation failed: retiring threads reclaim inline.
    Unavailable,
}

struct State {
    inner: Mutex<Inner>,
    /// The reclaimer waits here for work.
    work: Condvar,
    /// `barrier` and back-pressured retirers wait here for progress.
    progress: Condvar,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());

std::thread_local! {
    static IS_RECLAIMER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn state() -> &'static State {
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

fn lock(st: &State) -> MutexGuard<'_, Inner> {
    // A panic while holding the lock cannot leave `Inner` inconsistent: every
    // critical section below is panic-free bookkeeping.
    st.inner.lock().unwrap_or_else(|e| e.into_inner())
}

fn ensure_worker(st: &'static State, g: &mut Inner) {
    if g.worker != Worker::NotStarted {
        return;
    }
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
    loop {
        let (batch, upto) = {
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
            (std::mem::take(&mut g.queue), g.retired)
        };
        reclaim_batch(st, batch, upto);
    }
}

/// One grace period, then drop `batch` (everything retired up to `upto`).
fn reclaim_batch(st: &State, batch: Vec<Deferred>, upto: u64) {
    super::synchronize_unchecked();
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
    let mut g = lock(st);
    g.queue.push(Deferred { ptr, drop_fn });
    g.retired += 1;
    let seq = g.retired;
    ensure_worker(st, &mut g);
    let pending = g.queue.len();
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

/// Whether the calling thread may block on a grace period.
fn can_wait() -> bool {
    !super::in_read_section() && !IS_RECLAIMER.with(|f| f.get())
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
        g = st.progress.wait(g).unwrap_or_else(|e| e.into_inner());
    }
}

/// See [`crate::rcu::barrier`].
pub(crate) fn barrier() {
    assert!(
        !super::in_read_section(),
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

/// Counters of the reclamation machinery.
pub(crate) fn stats() -> (u64, u64, u64, u64, usize) {
    let g = lock(state());
    (
        g.retired,
        g.reclaimed,
        g.grace_periods,
        g.panics,
        g.queue.len(),
    )
}

/// In the child of `fork`: the reclaimer thread did not survive, and the
/// queue's lock may have been held by a thread that no longer exists. Start
/// from a fresh state; the inherited queue is leaked (never dropped: its
/// objects may still be referenced by the inherited copies of the parent's
/// structures).
pub(crate) fn after_fork_child() {
    STATE.store(std::ptr::null_mut(), Ordering::Release);
}
