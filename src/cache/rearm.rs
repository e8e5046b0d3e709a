//! Re-arming switched-off index caches, so that a switched-off cache costs
//! its index's lookups nothing.
//!
//! An index's lookup reads one word of its root table, `fast_above`, and
//! takes the plain inline lookup for every key above it: 0 when the cache
//! is off (every key but 0), `u64::MAX` when it is on or due for a trial
//! (no key: every lookup goes through the cache). A trial that finds the
//! cache slower stores 0 there, which leaves the lookups of a switched-off
//! cache exactly the uncached ones: no switch to test, no countdown.
//!
//! Nothing on that path counts lookups, so nothing on it can start the next
//! trial. That is the **agent**'s work: one thread per process, started
//! with the first cached index, that stores `u64::MAX` back after a delay
//! (64 ms after the first trial lost in a row, doubling with each further
//! loss up to 8 s), and otherwise sleeps.
//!
//! # Invariants
//!
//! * **A disarm is async-signal-safe.** The lookup that ends a trial may
//!   run in a signal handler (or interrupt another lookup's disarm), so it
//!   only stores atomics, pushes its [`Arm`] on a lock-free stack (a
//!   compare-exchange loop; a strong count taken with one atomic increment
//!   keeps the `Arm` alive while the agent holds it) and wakes the agent
//!   with `FUTEX_WAKE`. The agent reads the clock when it takes it up.
//! * **The agent writes only a live table's word.** An `Arm` holds the
//!   address of the current root table's word. The index points it at a
//!   new root table before publishing that table (so a trial lost on the
//!   new root is re-armed there) and so before retiring the old one, and
//!   clears it before freeing its tables on drop
//!   ([`Arm::retarget`]); then it waits while the agent is inside a
//!   re-arm of this `Arm`. The agent raises `busy` before it loads the
//!   target and lowers it after its store (all `SeqCst`: a store-buffering
//!   pair), so either its load sees the new target, or the index's load of
//!   `busy` sees it raised and waits for the store to finish. `busy` holds
//!   the process generation the agent ran in (bumped in every forked child
//!   by a `pthread_atfork` handler), and only one raised in this
//!   generation is waited for: in a child, whose agent did not survive,
//!   one left raised by the parent's is ignored.
//! * **Trials restart after a re-arm.** A thread that was in the middle of
//!   a trial when another thread switched the cache off resumes, after the
//!   re-arm, with a window timed across the whole off period; the re-arm
//!   bumps an epoch, and a thread that sees a new epoch at a step boundary
//!   discards its trial and starts again from the warm-up.
//!
//! After `fork`, the child has no agent until it builds a cached index, and
//! the parent's agent's schedule is gone with it: a cache that was off at
//! the fork stays off in the child until a resize or `clear` gives its
//! index a new root table (which starts armed). An `Arm` caught mid-push
//! or mid-pop by the fork stays marked queued in the child, so its later
//! lost trials are not re-armed either (until the next new root table);
//! its lookups stay correct, only uncached.

use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

// Unmodelled: the agent is a real thread, outside any loom model, and
// `fast_above` is a hint (a lookup is correct with either value).
use crate::sync::unmodelled::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::atomic::Ordering;

/// The first re-arm delay; each further trial lost in a row doubles it, up
/// to `BASE << MAX_DOUBLINGS`.
const BASE: Duration = Duration::from_millis(64);
const MAX_DOUBLINGS: u32 = 7;

/// Value of `fast_above` that sends every lookup through the cache.
pub(crate) const ARMED: u64 = u64::MAX;
/// Value of `fast_above` that sends every non-zero key past it.
const DISARMED: u64 = 0;

/// One index cache's re-arm state, shared with the agent.
pub(crate) struct Arm {
    /// The current root table's `fast_above` word; null once the index is
    /// being dropped.
    target: AtomicPtr<AtomicU64>,
    /// The process generation ([`generation`]) while the agent is between
    /// its load of `target` and its store through it, else 0 (module docs).
    busy: AtomicUsize,
    /// On the agent's stack (or held by it) since a disarm.
    queued: AtomicBool,
    /// The next `Arm` on the agent's stack.
    next: AtomicPtr<Arm>,
    /// Trials lost in a row (the delay's doublings).
    losses: AtomicU32,
    /// Re-arms so far; trials started before one are discarded.
    epoch: AtomicU32,
}

impl Arm {
    /// A new arm pointing at `word`; starts the agent if this process has
    /// none.
    pub(crate) fn new(word: &AtomicU64) -> Arc<Self> {
        start_agent();
        Arc::new(Self {
            target: AtomicPtr::new(ptr::from_ref(word).cast_mut()),
            busy: AtomicUsize::new(0),
            queued: AtomicBool::new(false),
            next: AtomicPtr::new(ptr::null_mut()),
            losses: AtomicU32::new(0),
            epoch: AtomicU32::new(0),
        })
    }

    /// Points the agent at a new root table's word (`None`: the index is
    /// being dropped), and returns once the agent can no longer store into
    /// the old one. The caller publishes the new table after this and
    /// retires (or frees) the old one after that.
    pub(crate) fn retarget(&self, word: Option<&AtomicU64>) {
        // SeqCst: the store-buffering pair with the agent's `busy` store
        // and `target` load (module docs).
        self.target.store(
            word.map_or(ptr::null_mut(), |w| ptr::from_ref(w).cast_mut()),
            Ordering::SeqCst,
        );
        // SeqCst: as above; seeing `busy` lowered means the agent's store
        // through the old target (if any) is done, or its load will see
        // the new one.
        let me = generation();
        while self.busy.load(Ordering::SeqCst) == me {
            std::thread::yield_now();
        }
    }

    /// The re-arm epoch (see the module docs).
    #[inline]
    pub(crate) fn epoch(&self) -> u32 {
        // Relaxed: a hint for a thread's schedule; it orders nothing.
        self.epoch.load(Ordering::Relaxed)
    }

    /// A trial found the cache faster: the next loss waits the base delay.
    pub(crate) fn won(&self) {
        // Relaxed: a count only the delay depends on.
        if self.losses.load(Ordering::Relaxed) != 0 {
            self.losses.store(0, Ordering::Relaxed);
        }
    }

    /// A trial found the cache slower: switch it off in `word` (the root
    /// table the caller's lookup is reading) and have the agent re-arm it
    /// after the delay. Async-signal-safe.
    pub(crate) fn disarm(self: &Arc<Self>, word: &AtomicU64) {
        // Relaxed: `fast_above` is a hint that publishes nothing (a lookup
        // that reads either value is correct).
        word.store(DISARMED, Ordering::Relaxed);
        let n = self.losses.load(Ordering::Relaxed);
        self.losses.store(n.saturating_add(1), Ordering::Relaxed);
        // Acquire: pairs with the agent's Release store of `false`, which
        // follows its last read of `next`; the store to `next` below
        // cannot reach that read. A second disarm before the agent took
        // the first up only finds it queued.
        if self.queued.swap(true, Ordering::Acquire) {
            wake();
            return;
        }
        // The stack's reference, given back by the agent.
        let me = Arc::into_raw(self.clone()).cast_mut();
        let mut head = PENDING.load(Ordering::Relaxed);
        loop {
            // SAFETY: `me` is alive (the reference just taken) and, being
            // not yet on the stack, only this call writes its `next`.
            unsafe { &*me }.next.store(head, Ordering::Relaxed);
            // Release: pairs with the agent's Acquire swap of the head;
            // the arm's `next` and `losses` are visible to it.
            match PENDING.compare_exchange_weak(head, me, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        wake();
    }
}

/// Arms disarmed since the agent last looked (a Treiber stack the agent
/// empties whole).
static PENDING: AtomicPtr<Arm> = AtomicPtr::new(ptr::null_mut());
/// Bumped by every disarm; the agent sleeps while it is unchanged.
static WAKE: AtomicU32 = AtomicU32::new(0);
/// The process the agent thread was started in (0: none).
static AGENT_PID: AtomicUsize = AtomicUsize::new(0);
/// This process's generation: 1, plus one per `fork` since the handler was
/// installed (never 0, the value of a lowered `busy`).
static GENERATION: AtomicUsize = AtomicUsize::new(1);

fn generation() -> usize {
    // Relaxed: written only by the fork handler, in the child's one thread
    // before anything else runs there.
    GENERATION.load(Ordering::Relaxed)
}

/// Installs the fork handler that bumps [`GENERATION`] in the child, once,
/// before the first agent can raise a `busy`.
fn install_fork_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(not(miri))]
        {
            extern "C" fn child() {
                // Relaxed: see `generation`.
                GENERATION.fetch_add(1, Ordering::Relaxed);
            }
            // The handler only increments an atomic (async-signal-safe).
            let _ = crate::sys::fork::on_fork_child(child);
        }
    });
}

/// Starts the agent unless one runs in this process.
fn start_agent() {
    install_fork_handler();
    let pid = std::process::id() as usize;
    // Relaxed: only this function writes `AGENT_PID`; two racing starts
    // in one process are told apart by the swap.
    if AGENT_PID.swap(pid, Ordering::Relaxed) == pid {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("fprobe-cache".into())
        .spawn(run);
    if spawned.is_err() {
        // No agent: switched-off caches stay off until a resize re-arms
        // them; the next cached index tries again.
        AGENT_PID.store(0, Ordering::Relaxed);
    }
}

/// The agent: takes up disarmed arms, re-arms each when its delay is up.
fn run() {
    let start = Instant::now();
    let mut scheduled: Vec<(u64, Arc<Arm>)> = Vec::new();
    loop {
        // Acquire: pairs with the Release increment in `wake`.
        let seen = WAKE.load(Ordering::Acquire);
        let now = start.elapsed().as_nanos() as u64;
        // Acquire: pairs with the Release push in `disarm`.
        let mut p = PENDING.swap(ptr::null_mut(), Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: pushed by `disarm` with the strong count it took for
            // the stack; that reference is ours now.
            let arm = unsafe { Arc::from_raw(p) };
            p = arm.next.load(Ordering::Relaxed);
            // Release: pairs with the Acquire swap in `disarm`; the load of
            // `next` above is done before a later disarm may push it again
            // (and write `next`). `scheduled` keeps one entry per arm.
            arm.queued.store(false, Ordering::Release);
            let n = arm.losses.load(Ordering::Relaxed).max(1) - 1;
            let due = now + (BASE * (1 << n.min(MAX_DOUBLINGS))).as_nanos() as u64;
            match scheduled.iter_mut().find(|(_, a)| Arc::ptr_eq(a, &arm)) {
                Some(entry) => entry.0 = due,
                None => scheduled.push((due, arm)),
            }
        }
        scheduled.retain(|(due, arm)| {
            if *due > now {
                return true;
            }
            rearm(arm);
            false
        });
        let timeout = scheduled
            .iter()
            .map(|(due, _)| Duration::from_nanos(due - now))
            .min();
        sleep_while(seen, timeout);
    }
}

/// Switches `arm`'s cache back on, unless its index is being dropped.
fn rearm(arm: &Arm) {
    // SeqCst: the store-buffering pair with `retarget` (module docs).
    arm.busy.store(generation(), Ordering::SeqCst);
    let t = arm.target.load(Ordering::SeqCst);
    // SAFETY: null, or the word of a table that `retarget` has not let go
    // of yet: it waits for `busy` to fall before the table can be retired
    // or freed (module docs).
    if let Some(word) = unsafe { t.as_ref() } {
        // Relaxed: the epoch is a hint (see `Arm::epoch`).
        arm.epoch.fetch_add(1, Ordering::Relaxed);
        word.store(ARMED, Ordering::Relaxed);
    }
    // SeqCst: as above.
    arm.busy.store(0, Ordering::SeqCst);
}

/// Wakes the agent. Async-signal-safe: one atomic and one system call.
fn wake() {
    // Release: pairs with the agent's Acquire load of `WAKE`.
    WAKE.fetch_add(1, Ordering::Release);
    crate::sys::wait::wake_one(&WAKE);
}

/// Sleeps while `WAKE` holds `seen`, at most `timeout` (forever if none).
fn sleep_while(seen: u32, timeout: Option<Duration>) {
    crate::sys::wait::wait(&WAKE, seen, timeout, BASE);
}
