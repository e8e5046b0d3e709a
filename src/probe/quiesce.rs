//! A registry's own grace period for exits: how `unregister` knows that no
//! exit handler of a probe still runs, without exits entering an RCU
//! read-side section.
//!
//! # The handshake
//!
//! Each thread's state for a registry counts the dispatches of that
//! registry running on the thread ([`Activity`]; more than one only when a
//! handler or a signal handler dispatched inside one). Dispatch pays for
//! the count anyway: it tells the outermost dispatch, which alone may
//! empty a stack of an older pairing epoch. An exit uses it as its
//! read-side marker:
//!
//! ```text
//! exit (owner thread)                  unregister
//!   active += 1                          state = dead generation
//!   compiler fence (SeqCst fence)        membarrier(2) (SeqCst fence)
//!   load state; if it is the frame's     for each thread's state: wait
//!     generation: run the exit handler     until the dispatches it saw
//!   active -= 1 (Release)                  running have ended
//!                                        free the probe
//! ```
//!
//! This is store buffering: each side stores, then loads what the other
//! stored. `membarrier(2)` runs a full fence on every CPU that runs a
//! thread of the process, so once it returns, either the exit's `active`
//! store is visible to `unregister` (which then waits for that dispatch to
//! end: the exit's Release stores pair with its Acquire loads, and
//! everything the exit did with the probe happens before the free), or the
//! exit's load of the state comes after the barrier and sees the dead
//! generation (the exit leaves the probe alone). Without
//! `membarrier(2)` (old kernels, `FPROBE_RCU_NO_MEMBARRIER`, miri, loom,
//! ThreadSanitizer) both sides run a `SeqCst` fence; the mode is the RCU
//! domain's, fixed for the process (`rcu::asymmetric_fences`). Entries
//! need none of this: they run inside an RCU read-side section, for the
//! index lookup, and `unregister` waits for a grace period too.
//!
//! The word also counts the outermost dispatches begun on the thread (its
//! high half; a dispatch with none running before it is outermost), so
//! that the waiter knows when the dispatches it saw running have ended
//! even if it never reads the count at 0: once the number of outermost
//! dispatches begun has changed, or the count reads 0, every dispatch that
//! was running when it first read the word has ended (outermost dispatches
//! of one thread run one after another, each with its nested ones inside).
//! A thread that dispatches without pause, or that was preempted inside a
//! dispatch, thus holds the waiter up for one dispatch at most; a thread
//! parked inside a probed function counts 0 and holds nothing up.
//!
//! # Signals
//!
//! `begin` and `end` are each a load and a store of the thread's own word.
//! A signal handler that dispatches between the two leaves the word as it
//! found it when it interrupted a running dispatch (its own is nested: one
//! up, one down). When it interrupted an outermost `begin`, its own
//! dispatch is outermost too, and the interrupted store then writes the
//! word that dispatch left it with, running again: the two outermost
//! dispatches share one number, and a waiter that read the word during the
//! handler's dispatch waits for the interrupted one as well (longer, never
//! shorter). Between dispatches, the handler's is simply one more.

use crate::sync::{AtomicU64, Ordering, compiler_fence, fence};

/// The dispatches of one registry running on one thread: `outermost <<
/// 32 | running`, the outermost dispatches begun (wrapping) and the
/// dispatches running now. Invariant: stored only by the owning thread (a
/// signal handler on it restores what it found, or leaves it as if its
/// dispatch had run just before); read by any thread.
pub(super) struct Activity(AtomicU64);

/// One outermost dispatch in an [`Activity`] word.
const OUTERMOST: u64 = 1 << 32;

/// The running dispatches of an [`Activity`] word.
#[inline(always)]
fn running(word: u64) -> u32 {
    word as u32
}

impl Activity {
    pub(super) fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Starts a dispatch (owner only); returns whether it is the outermost
    /// one on the thread.
    #[inline(always)]
    pub(super) fn begin(&self) -> bool {
        // Relaxed: only this thread stores the word.
        let word = self.0.load(Ordering::Relaxed);
        let outermost = running(word) == 0;
        let step = if outermost { OUTERMOST + 1 } else { 1 };
        // Release: a waiter that reads the new number of outermost
        // dispatches (Acquire in `read` and `wait_past`) must see
        // everything the previous one did, which `end`'s Release alone
        // would not carry past this later store. An exit orders this store
        // before its state loads with `order_exit`. Wrapping: the number
        // of outermost dispatches wraps (after 2^32 of them).
        self.0.store(word.wrapping_add(step), Ordering::Release);
        outermost
    }

    /// Orders this dispatch's `begin` before the loads of probe states
    /// that follow (owner only, in exits): a compiler fence when the
    /// waiter runs `membarrier(2)` (`asymmetric`), a `SeqCst` fence
    /// otherwise (module docs).
    #[inline(always)]
    pub(super) fn order_exit(&self, asymmetric: bool) {
        if cfg!(fprobe_canary) {
            // Deliberately broken build (`--cfg fprobe_canary`): no fence,
            // so loom must report an exit handler running on a freed probe.
        } else if asymmetric {
            // Pairs with membarrier(2) in `rcu::heavy_barrier`, run by the
            // waiter before it reads the count.
            compiler_fence(Ordering::SeqCst);
        } else {
            // Pairs with the SeqCst fence of `rcu::heavy_barrier`.
            fence(Ordering::SeqCst);
        }
    }

    /// Ends a dispatch started by [`begin`](Self::begin) (owner only).
    #[inline(always)]
    pub(super) fn end(&self) {
        // Relaxed load: only this thread stores the word.
        let word = self.0.load(Ordering::Relaxed);
        // Release: pairs with the Acquire loads of `read` and `wait_past`;
        // everything the dispatch did happens before the waiter's next step.
        self.0.store(word - 1, Ordering::Release);
    }

    /// Whether a dispatch is running on the owning thread (owner only).
    #[inline]
    pub(super) fn running(&self) -> bool {
        // Relaxed: the owner reads its own word.
        running(self.0.load(Ordering::Relaxed)) != 0
    }

    /// Forgets dispatches of a thread that can no longer end them (a
    /// state adopted from an exited thread): none runs, and the number of
    /// outermost ones moves on, as if they had ended.
    pub(super) fn reset(&self) {
        // Relaxed load: the adopting thread is the owner now.
        let word = self.0.load(Ordering::Relaxed);
        // Release: as in `end`.
        self.0
            .store((word >> 32).wrapping_add(1) << 32, Ordering::Release);
    }

    /// The word, for [`wait_past`](Self::wait_past) (another thread, after
    /// the state stores it must order and `rcu::heavy_barrier`).
    pub(super) fn read(&self) -> u64 {
        // Acquire: pairs with the Release stores of `end` and `begin`; the
        // dispatches seen ended happen before the waiter's next step.
        self.0.load(Ordering::Acquire)
    }

    /// Waits until every dispatch running on the owning thread when
    /// [`read`](Self::read) returned `first` has ended.
    pub(super) fn wait_past(&self, first: u64) {
        if running(first) == 0 {
            return;
        }
        let mut step = 0;
        loop {
            // Acquire: as in `read`.
            let now = self.0.load(Ordering::Acquire);
            if running(now) == 0 || now >> 32 != first >> 32 {
                return;
            }
            crate::sync::backoff(step);
            step = step.saturating_add(1);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{Activity, OUTERMOST};
    use crate::sync::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[test]
    fn outermost_dispatches_are_numbered_and_nested_ones_are_not() {
        let a = Activity::new();
        assert!(a.begin(), "the first dispatch is outermost");
        let first = a.read();
        assert!(!a.begin(), "nested");
        a.end();
        assert_eq!(
            a.read(),
            first,
            "a nested dispatch leaves the word as it found it"
        );
        a.end();
        assert!(!a.running());
        assert!(a.begin());
        assert_eq!(a.read(), first + OUTERMOST, "one more outermost dispatch");
        // Its number proves the one seen ended: the wait returns while it
        // runs, though the count was never read at 0.
        a.wait_past(first);
        a.end();
    }

    #[test]
    fn the_number_wraps_without_overflowing() {
        let a = Activity(AtomicU64::new(u64::MAX << 32));
        assert!(a.begin());
        assert_eq!(a.read(), 1, "wrapped to 0, one running");
        a.end();
        a.reset();
        assert_eq!(
            a.read(),
            OUTERMOST,
            "a reset ends the dispatches and moves on"
        );
    }

    #[test]
    fn a_waiter_waits_while_the_dispatch_it_saw_runs() {
        let a = Arc::new(Activity::new());
        a.begin();
        let first = a.read();
        let done = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (a, done) = (a.clone(), done.clone());
            std::thread::spawn(move || {
                a.wait_past(first);
                done.store(true, Ordering::SeqCst);
            })
        };
        // Nested dispatches come and go inside the one seen.
        for _ in 0..100 {
            a.begin();
            a.end();
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !done.load(Ordering::SeqCst),
            "the waiter left while the dispatch ran"
        );
        a.end();
        waiter.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::Activity;
    use crate::sync::{AtomicU64, Ordering, UnsafeCell};
    use loom::sync::Arc;

    /// An exit racing an unregister: the exit runs its handler (reads the
    /// probe) only if it saw the live generation, and the unregister frees
    /// the probe (writes it) only after its barrier and the wait. loom
    /// reports a data race on the probe if the handshake lets both happen
    /// at once; the canary build, with no fence on the exit, must fail.
    #[test]
    fn loom_exit_never_runs_a_freed_probe() {
        loom::model(|| {
            let active = Arc::new(Activity::new());
            let state = Arc::new(AtomicU64::new(1));
            let probe = Arc::new(UnsafeCell::new(7u64));
            let exit = {
                let (active, state, probe) = (active.clone(), state.clone(), probe.clone());
                loom::thread::spawn(move || {
                    for _ in 0..2 {
                        active.begin();
                        active.order_exit(false);
                        // Acquire: as dispatch loads the slot's state.
                        if state.load(Ordering::Acquire) == 1 {
                            // SAFETY: the handshake under test keeps the
                            // unregister's write from overlapping.
                            let v = probe.with(|p| unsafe { *p });
                            assert_eq!(v, 7, "an exit ran a freed probe");
                        }
                        active.end();
                    }
                })
            };
            // Release: as `unregister` stores the dead generation.
            state.store(3, Ordering::Release);
            crate::rcu::heavy_barrier(false);
            active.wait_past(active.read());
            // SAFETY: the handshake under test: no exit reads it now.
            probe.with_mut(|p| unsafe { *p = 0 });
            exit.join().unwrap();
        });
    }
}
