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
//! # Signal safety
//!
//! Every field is owner-only, and each change is undone by the code that
//! made it before it returns (a level's bit is cleared on leaving): a
//! signal handler that runs between any two instructions of [`enter`] or
//! [`Level`]'s drop finds and leaves `busy` as the interrupted code will
//! next read it. A level's mask is meaningful only while its bit is set;
//! `enter_nested` says how it stays right.

use std::cell::Cell;

/// Context levels: normal code and up to three nested signal handlers (as
/// the kernel's four contexts).
pub(super) const MAX_LEVELS: usize = 4;

/// A signal mask as the kernel's `rt_sigprocmask` reads it (64 signals).
type Mask = u64;

struct Guard {
    /// Bit `l` set while a handler of level `l` runs; [`IGNORE`] while the
    /// thread is ignored.
    busy: Cell<u32>,
    /// The signal mask of each level; level 0's is read at the thread's
    /// first dispatch (`mask0_read`).
    masks: [Cell<Mask>; MAX_LEVELS],
    mask0_read: Cell<bool>,
}

std::thread_local! {
    // Const-initialised, no destructor: usable at every point of a
    // thread's life, signal handlers included.
    static GUARD: Guard = const {
        Guard {
            busy: Cell::new(0),
            masks: [const { Cell::new(0) }; MAX_LEVELS],
            mask0_read: Cell::new(false),
        }
    };
}

/// The calling thread's signal mask, if it can be read.
fn current_mask() -> Option<Mask> {
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        let mut set: Mask = 0;
        // SAFETY: reads the mask into `set` (8 bytes, the kernel's sigset
        // size on Linux); `how` is ignored with a null new set.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_BLOCK,
                std::ptr::null::<Mask>(),
                &mut set as *mut Mask,
                std::mem::size_of::<Mask>(),
            )
        };
        (rc == 0).then_some(set)
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    {
        None
    }
}

/// Reads level 0's mask once per thread: called on a thread's first
/// dispatch through a registry (which allocates anyway).
#[cold]
pub(super) fn init_thread() {
    GUARD.with(|g| {
        if !g.mask0_read.get() {
            g.masks[0].set(current_mask().unwrap_or(0));
            g.mask0_read.set(true);
        }
    });
}

/// This thread's guard. `GUARD` is const-initialised and has no
/// destructor: it lives as long as the thread, and every reference handed
/// out here is used by dispatch on the same thread only.
#[inline(always)]
fn guard() -> &'static Guard {
    // SAFETY: as above: the pointer is valid for the thread's life, and
    // `Guard` is `!Sync` (its cells), so the reference cannot leave it.
    GUARD.with(|g| unsafe { &*(g as *const Guard) })
}

/// A context level whose handlers are running; leaves it on drop. Holds
/// the mask that clears the level's bit (`!(1 << level)`), so that leaving
/// is one `and`.
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

/// What a hit may do.
pub(super) enum Entered {
    /// Run handlers, at this level.
    Run(Level),
    /// Refused: a handler of the caller's own context is running.
    Recursion,
    /// The thread is ignored ([`ignore_current_thread`](super::ignore_current_thread)).
    Ignored,
}

/// Bit of `busy` set while the thread is ignored: never a level's bit, and
/// it sends every hit to the slow path, which sees it first.
const IGNORE: u32 = 1 << 31;

pub(super) fn set_ignored(ignore: bool) {
    let g = guard();
    let busy = g.busy.get();
    g.busy.set(if ignore {
        busy | IGNORE
    } else {
        busy & !IGNORE
    });
}

/// Whether a handler runs on the calling thread, in any context level
/// (an ignored thread runs none).
#[inline]
pub(super) fn in_handler() -> bool {
    guard().busy.get() & !IGNORE != 0
}

/// Enters a context level to run handlers in, unless a handler of the
/// caller's own context is running or the thread is ignored.
#[inline(always)]
pub(super) fn enter() -> Entered {
    let g = guard();
    let busy = g.busy.get();
    if busy == 0 {
        g.busy.set(1);
        return Entered::Run(Level::of(0));
    }
    enter_nested(g, busy)
}

#[cold]
fn enter_nested(g: &Guard, busy: u32) -> Entered {
    if busy & IGNORE != 0 {
        return Entered::Ignored;
    }
    let top = 31 - busy.leading_zeros();
    let Some(cur) = current_mask() else {
        return Entered::Recursion;
    };
    if cur == g.masks[top as usize].get() {
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
    g.masks[level as usize].set(cur);
    g.busy.set(busy | 1 << level);
    g.masks[level as usize].set(cur);
    Entered::Run(Level::of(level))
}

impl Drop for Level {
    #[inline(always)]
    fn drop(&mut self) {
        let g = guard();
        g.busy.set(g.busy.get() & self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(e: Entered) -> Level {
        match e {
            Entered::Run(l) => l,
            _ => panic!("expected to run"),
        }
    }

    #[test]
    fn nested_entry_in_the_same_context_is_refused() {
        init_thread();
        let outer = run(enter());
        assert_eq!(outer.level(), 0);
        assert!(
            matches!(enter(), Entered::Recursion),
            "same mask: recursion"
        );
        drop(outer);
        let again = run(enter());
        assert_eq!(again.level(), 0);
        drop(again);
        set_ignored(true);
        assert!(matches!(enter(), Entered::Ignored));
        set_ignored(false);
        drop(run(enter()));
    }

    #[cfg(all(target_os = "linux", not(miri)))]
    #[test]
    fn a_different_signal_mask_is_a_new_level() {
        init_thread();
        let outer = run(enter());
        // Block a signal as a signal handler's entry would.
        // SAFETY: plain sigset manipulation on locals; restored below.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR2);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            let inner = run(enter());
            assert_eq!(inner.level(), 1);
            assert!(
                matches!(enter(), Entered::Recursion),
                "recursion inside the new context"
            );
            drop(inner);
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        assert!(
            matches!(enter(), Entered::Recursion),
            "back in level 0's context"
        );
        drop(outer);
    }
}
