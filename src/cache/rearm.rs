//! The hit cache's switch, and the agent that schedules its trials.
//!
//! A cache's switch is one word, [`Arm::state`], that every lookup loads:
//! the cache's key while the cache is on, the key with [`OFF`] while a
//! trial found it slower, the key with [`TRIAL`] while a trial is due or
//! running. A thread's lookup takes the hit path only when the word equals
//! the key the thread's context holds for the cache (`cache/mod.rs`), so
//! one compare answers "is this the cache I used last, and is it on?";
//! in the two other states lookups leave the hit path (straight to the
//! table behind the cache while off; through the trial's schedule while a
//! trial runs).
//!
//! Nothing on the hit path counts lookups, so nothing on it can start the
//! next trial. That is the **agent**'s work: one thread per process,
//! started with the first cache that has a switch, that sets [`TRIAL`]
//! when a trial is due ([`RUN`] after a trial the cache won, 64 ms after
//! the first it lost in a row, doubling with each further loss up to 8 s)
//! and otherwise sleeps.
//!
//! # Invariants
//!
//! * **A decision is async-signal-safe.** The lookup that ends a trial may
//!   run in a signal handler, so [`Arm::decide`] only stores atomics,
//!   pushes its [`Arm`] on a lock-free stack (a compare-exchange loop; a
//!   strong count taken with one atomic increment keeps the `Arm` alive
//!   while the agent holds it) and wakes the agent with `FUTEX_WAKE`. The
//!   agent reads the clock when it takes the `Arm` up.
//! * **The agent writes only its own `Arm`s.** The switch lives in the
//!   `Arm`, which the cache and the agent share by reference count: the
//!   agent never writes memory the cache frees. A dropped cache marks its
//!   `Arm` closed, and the agent lets it go at its next due time.
//! * **One decision per trial.** The agent bumps the `Arm`'s trial number as it
//!   starts a trial; a thread's schedule runs in the trial it started in,
//!   and a decision of an older trial (a thread that was in the middle of
//!   a trial another thread decided) changes nothing.
//!
//! After `fork`, the child has no agent until it builds a cache with a
//! switch, and the parent's agent's schedule is gone with it: a cache that
//! was off at the fork stays off in the child, and one that was on stays
//! on without further trials. Its lookups stay correct.

use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

// Unmodelled: the agent is a real thread, outside any loom model, and the
// switch is a hint (a lookup is correct in every state).
use crate::sync::unmodelled::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::atomic::Ordering;

/// The first re-arm delay; each further trial lost in a row doubles it, up
/// to `BASE << MAX_DOUBLINGS`.
const BASE: Duration = Duration::from_millis(64);
const MAX_DOUBLINGS: u32 = 7;
/// How long a cache that won its trial stays on before the next trial.
pub(crate) const RUN: Duration = Duration::from_millis(256);

/// The switch's bit for "off".
pub(crate) const OFF: u64 = 1 << 63;
/// The switch's bit for "a trial is due or running".
pub(crate) const TRIAL: u64 = 1 << 62;

/// One cache's switch and its schedule, shared with the agent.
pub(crate) struct Arm {
    /// The switch: `key`, `key | OFF` or `key | TRIAL` (module docs).
    pub(crate) state: AtomicU64,
    /// The switch as a bound for a table that composes the cache in front
    /// of its lookups (`AddrIndex`): keys above it skip the cache. 0 while
    /// off, `u64::MAX` otherwise; stored after `state` by whoever changes
    /// it. A hint: a lookup is correct whichever path it takes (the
    /// cache's path reads `state` again).
    pub(crate) bound: AtomicU64,
    /// The cache's key (below [`TRIAL`]).
    key: u64,
    /// Trials started so far; decisions of older ones are ignored.
    trial: AtomicU32,
    /// On the agent's stack (or held by it) since a decision.
    queued: AtomicBool,
    /// The next `Arm` on the agent's stack.
    next: AtomicPtr<Arm>,
    /// Trials lost in a row (the delay's doublings).
    losses: AtomicU32,
    /// The cache was dropped: the agent lets the `Arm` go.
    closed: AtomicBool,
}

impl Arm {
    /// The switch of the cache with `key`: starting with a trial when
    /// `adaptive` (and then starting the agent if this process has none),
    /// else on for good.
    pub(crate) fn new(key: u64, adaptive: bool) -> Arc<Self> {
        debug_assert!(key != 0 && key < TRIAL);
        if adaptive {
            start_agent();
        }
        Arc::new(Self {
            state: AtomicU64::new(if adaptive { key | TRIAL } else { key }),
            bound: AtomicU64::new(u64::MAX),
            key,
            trial: AtomicU32::new(0),
            queued: AtomicBool::new(false),
            next: AtomicPtr::new(ptr::null_mut()),
            losses: AtomicU32::new(0),
            closed: AtomicBool::new(false),
        })
    }

    /// The number of the trial running or last run (module docs).
    #[inline]
    pub(crate) fn trial(&self) -> u32 {
        // Relaxed: a hint for a thread's schedule; it orders nothing.
        self.trial.load(Ordering::Relaxed)
    }

    /// Ends the trial numbered `trial`: the cache goes on (`pays`) or off, and
    /// the agent schedules the next trial. Nothing when another thread's
    /// decision ended that trial first. Async-signal-safe.
    pub(crate) fn decide(self: &Arc<Self>, trial: u32, pays: bool) {
        if self.trial() != trial {
            return;
        }
        let to = if pays { self.key } else { self.key | OFF };
        // Relaxed: the switch publishes nothing (module docs); the
        // compare-exchange keeps one decision per trial.
        if self
            .state
            .compare_exchange(self.key | TRIAL, to, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let n = self.losses.load(Ordering::Relaxed);
        self.losses.store(
            if pays { 0 } else { n.saturating_add(1) },
            Ordering::Relaxed,
        );
        // Acquire: pairs with the agent's Release store of `false`, which
        // follows its last read of `next`; the store to `next` below
        // cannot reach that read. A second decision before the agent took
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

    /// The cache is being dropped: the agent lets the `Arm` go.
    pub(crate) fn close(&self) {
        // Relaxed: the agent only stops re-arming; nothing is published.
        self.closed.store(true, Ordering::Relaxed);
    }
}

/// Arms disarmed since the agent last looked (a Treiber stack the agent
/// empties whole).
static PENDING: AtomicPtr<Arm> = AtomicPtr::new(ptr::null_mut());
/// Bumped by every disarm; the agent sleeps while it is unchanged.
static WAKE: AtomicU32 = AtomicU32::new(0);
/// The process the agent thread was started in (0: none).
static AGENT_PID: AtomicUsize = AtomicUsize::new(0);

/// Starts the agent unless one runs in this process.
fn start_agent() {
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
        // No agent: switched-off caches stay off, switched-on ones run
        // without trials; the next cache with a switch tries again.
        AGENT_PID.store(0, Ordering::Relaxed);
    }
}

/// The agent: takes up decided arms, starts each one's next trial when its
/// delay is up.
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
            let delay = match arm.losses.load(Ordering::Relaxed) {
                0 => RUN,
                n => BASE * (1 << (n - 1).min(MAX_DOUBLINGS)),
            };
            let due = now + delay.as_nanos() as u64;
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

/// Starts `arm`'s next trial, unless its cache was dropped.
fn rearm(arm: &Arm) {
    // Relaxed: see `Arm::close`.
    if arm.closed.load(Ordering::Relaxed) {
        return;
    }
    // Relaxed: the trial number and the switch are hints (module docs); a
    // thread that sees the new state before the new number runs its
    // schedule in the old trial, whose decision is then ignored.
    arm.trial.fetch_add(1, Ordering::Relaxed);
    arm.state.store(arm.key | TRIAL, Ordering::Relaxed);
    arm.bound.store(u64::MAX, Ordering::Relaxed);
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
