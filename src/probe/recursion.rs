//! The recursion guard, per execution context (the kernel's
//! `ftrace_test_recursion_trylock`, with signal-handler levels in place of
//! its normal/softirq/irq/NMI bits).
//!
//! # What counts as recursion
//!
//! A probed call made while a handler of the *same context* runs on the
//! thread: a handler calling a probed function, directly or not. It is
//! refused and counted ([`Missed::recursion`](super::Missed::recursion)).
//! A probed call made by a signal handler that interrupted a handler is
//! another context: its probes run.
//!
//! # How a context is told apart
//!
//! The thread keeps a bit per context level that has a handler running
//! (`busy`) and, per level, the signal mask it ran with. When no handler
//! runs (`busy == 0`, the common case), a hit takes level 0 with no further
//! work. When one does, the hit reads the thread's signal mask
//! (`rt_sigprocmask`, one system call, async-signal-safe): a signal handler
//! runs with its signal blocked, so a mask equal to that of the innermost
//! running level means the same context (recursion), a different one means
//! a signal handler interrupted it, and the hit takes the next level.
//! Levels are bounded ([`MAX_LEVELS`]); a hit past the last is refused as
//! recursion.
//!
//! What this cannot see, and what follows:
//!
//! * A signal handler installed with `SA_NODEFER` and an empty `sa_mask`
//!   leaves the mask unchanged: its hits during a handler are refused as
//!   recursion (never run twice in one context, never lost silently).
//! * A signal handler that interrupted code running no handler takes level
//!   0 with no system call, so it cannot know its own mask; recursion from
//!   its handlers is refused one level later (the first recursive hit runs
//!   as a new level; the next is refused).
//! * Code that changes its signal mask inside a handler and then recurses
//!   looks like a signal context: the same one extra level.
//! * Level 0's mask is read once, when the thread first dispatches.
//!
//! Outside Linux the mask is not read: every hit during a handler is
//! refused as recursion, as in a guard with one context.
//!
//! # Where the levels live
//!
//! Level 0 is the `DISPATCH` bit of the thread's RCU word (`rcu/raw.rs`):
//! an outermost dispatch sets it for its whole length, lookup included,
//! so a dispatch that finds it clear runs its handlers at level 0 with no
//! other test, and one that finds it set is nested and comes here
//! ([`enter_nested`]). Setting the bit for the lookup too changes nothing
//! for the same context (no code of the thread's own runs there) and
//! sends a signal handler that interrupts a lookup through the mask test,
//! which finds it another context. The levels above, the masks and the
//! ignore bit are in the thread's context (`crate::context`).
//!
//! # Signal safety
//!
//! Every field is owner-only, and each change is undone by the code that
//! made it before it returns (a level's bit is cleared on leaving): a
//! signal handler that runs between any two instructions of
//! [`enter_nested`] or [`Level`]'s drop finds and leaves `busy` as the
//! interrupted code will next read it. A level's mask is meaningful only
//! while its bit is set; `enter_nested` says how it stays right.

use crate::context::{Context, MAX_LEVELS, context};

/// A signal mask as the kernel's `rt_sigprocmask` reads it (64 signals).
type Mask = u64;

/// The calling thread's signal mask, if it can be read.
fn current_mask() -> Option<Mask> {
    crate::sys::signal::blocked()
}

/// Reads level 0's mask once per thread: called on a thread's first
/// dispatch through a registry (which allocates anyway).
#[cold]
pub(super) fn init_thread() {
    let c = context();
    if !c.mask0_read.get() {
        c.masks[0].set(current_mask().unwrap_or(0));
        c.mask0_read.set(true);
    }
}

/// A context level above 0 whose handlers are running; leaves it on drop.
/// Holds the mask that clears the level's bit (`!(1 << level)`), so that
/// leaving is one `and`.
pub(super) struct Level(u32);

impl Level {
    #[inline(always)]
    const fn of(level: u32) -> Self {
        Level(!(1 << level))
    }

    #[cfg(test)]
    fn level(&self) -> u32 {
        (!self.0).trailing_zeros()
    }
}

/// What a nested hit may do.
pub(super) enum Entered {
    /// Run handlers, at this level.
    Run(Level),
    /// Refused: a handler of the caller's own context is running.
    Recursion,
    /// The thread is ignored ([`ignore_current_thread`](super::ignore_current_thread)).
    Ignored,
}

/// Bit of `busy` set while the thread is ignored: never a level's bit.
const IGNORE: u32 = 1 << 31;

/// Sets or clears the ignore bit, and empties the thread's registry cache
/// so that the next dispatch takes the slow path, which sees the bit.
pub(super) fn set_ignored(ignore: bool) {
    let c = context();
    let busy = c.busy.get();
    c.busy.set(if ignore {
        busy | IGNORE
    } else {
        busy & !IGNORE
    });
    // Only makes lookups miss (`crate::context` invariants).
    c.registry_key.set(0);
}

/// Whether the thread is ignored.
#[inline]
pub(super) fn ignored(c: &Context) -> bool {
    c.busy.get() & IGNORE != 0
}

/// Whether a dispatch or a handler runs on the calling thread, in any
/// context level.
#[inline]
pub(super) fn in_handler() -> bool {
    let c = context();
    let rec = c.rcu.get();
    // SAFETY: a non-null record of the thread's context is its claimed
    // record of the process-wide domain, never freed.
    let dispatching = !rec.is_null() && unsafe { &*rec }.dispatching();
    dispatching || c.busy.get() & !IGNORE != 0
}

/// Enters a context level above 0 for a hit made while a dispatch runs on
/// the thread (level 0 is held), unless a handler of the caller's own
/// context is running or the thread is ignored.
#[cold]
pub(super) fn enter_nested() -> Entered {
    let c = context();
    let busy = c.busy.get();
    if busy & IGNORE != 0 {
        return Entered::Ignored;
    }
    // Level 0 is held (the caller found `DISPATCH` set).
    let top = 31 - (busy | 1).leading_zeros();
    let Some(cur) = current_mask() else {
        return Entered::Recursion;
    };
    if cur == c.masks[top as usize].get() {
        return Entered::Recursion;
    }
    let level = top + 1;
    if level as usize >= MAX_LEVELS {
        return Entered::Recursion;
    }
    // A level's mask matters only while its bit is set, and only the code
    // that sets the bit writes it. A signal handler that runs before the
    // bit is set may take this level too and leave its own mask here, so
    // the mask is written again once the bit is set (from then on nested
    // code takes a higher level). In between, a nested hit compares with
    // that other handler's mask: at worst it is refused as recursion.
    c.masks[level as usize].set(cur);
    c.busy.set(busy | 1 << level);
    c.masks[level as usize].set(cur);
    Entered::Run(Level::of(level))
}

impl Drop for Level {
    #[inline(always)]
    fn drop(&mut self) {
        let c = context();
        c.busy.set(c.busy.get() & self.0);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn run(e: Entered) -> Level {
        match e {
            Entered::Run(l) => l,
            _ => panic!("expected to run"),
        }
    }

    /// Holds level 0 as an outermost dispatch does.
    fn level0() -> &'static crate::rcu::raw::ReaderRecord {
        let rec = crate::rcu::thread_record().unwrap();
        assert!(crate::rcu::begin_dispatch(rec));
        rec
    }

    #[test]
    fn nested_entry_in_the_same_context_is_refused() {
        init_thread();
        let rec = level0();
        assert!(in_handler());
        assert!(
            matches!(enter_nested(), Entered::Recursion),
            "same mask: recursion"
        );
        set_ignored(true);
        assert!(matches!(enter_nested(), Entered::Ignored));
        set_ignored(false);
        rec.end_dispatch();
        assert!(!in_handler());
    }

    #[cfg(all(target_os = "linux", not(miri)))]
    #[test]
    fn a_different_signal_mask_is_a_new_level() {
        init_thread();
        let rec = level0();
        // Block a signal as a signal handler's entry would.
        // SAFETY: plain sigset manipulation on locals; restored below.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR2);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            let inner = run(enter_nested());
            assert_eq!(inner.level(), 1);
            assert!(
                matches!(enter_nested(), Entered::Recursion),
                "recursion inside the new context"
            );
            drop(inner);
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        assert!(
            matches!(enter_nested(), Entered::Recursion),
            "back in level 0's context"
        );
        rec.end_dispatch();
    }
}
