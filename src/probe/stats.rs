//! Counters: hits, exits and misses by cause, per thread and per probe
//! slot, stored by their thread only and summed on read.

use crate::sync::Ordering;
use crate::sync::unmodelled::AtomicU64;

/// Misses by cause (the kernel's `nmissed`, split).
///
/// # Examples
///
/// ```
/// let m = fprobe::probe::Missed::default();
/// assert_eq!(m.recursion + m.depth + m.disabled + m.unwound, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Missed {
    /// Hits refused as recursion: a handler of the same execution context
    /// (normal code, or one signal-handler level) was already running on
    /// the thread.
    pub recursion: u64,
    /// Exit handlers skipped: the thread's shadow stack was full.
    pub depth: u64,
    /// Hits while the probe was disabled.
    pub disabled: u64,
    /// Exit handlers skipped because the call never returned: an
    /// exception, a forced unwind (`pthread_exit`, `pthread_cancel`) or a
    /// `longjmp` went past it. Found by stack pointer by an engine that
    /// takes returns over ([`Registry::on_return`](super::Registry::on_return),
    /// and its entries), which ends such calls without running their exit
    /// handlers.
    pub unwound: u64,
}

/// Counters of one probe, summed over threads.
///
/// Read while calls run, the counters are not one snapshot (threads keep
/// counting between the loads), but `exits` never exceeds `hits`.
///
/// # Examples
///
/// ```
/// let s = fprobe::probe::ProbeStats::default();
/// assert_eq!((s.hits, s.exits, s.panics), (0, 0, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeStats {
    /// Entry hits that ran the probe.
    pub hits: u64,
    /// Exit handlers run.
    pub exits: u64,
    /// Misses by cause.
    pub missed: Missed,
    /// Handler calls that panicked (caught).
    pub panics: u64,
    /// Calls in flight: their entry ran the probe (or is running its
    /// entry handler) with a return entry for its exit, and they have not
    /// returned yet (nor been forgotten after
    /// [`reset_pairing`](super::Registry::reset_pairing), which happens at
    /// each thread's next dispatch). Once the probe
    /// stops taking entries (disabled, or its functions no longer called)
    /// this only falls, to 0 when every such call has returned;
    /// [`Registry::drain`](super::Registry::drain) waits for that.
    pub in_flight: u64,
}

/// Which counter of a probe slot. A call bumps them in order of its life:
/// `Unkept` or `Kept` at its entry, then the exit side's at its return.
/// [`Counters::add_to`] loads them from last to first and relies on that
/// order.
#[derive(Clone, Copy)]
pub(super) enum Counter {
    /// The entry ran the probe and kept no return entry for it (the
    /// probe's hits ([`ProbeStats::hits`]) are `Unkept + Kept`: one count
    /// per hit).
    Unkept,
    /// The entry ran the probe with a return entry for its exit handler,
    /// counted before the entry handler runs; the entry ends in exactly
    /// one of `Exits` and `Unrun`.
    Kept,
    /// A kept exit handler ran and returned.
    Exits,
    Recursion,
    Depth,
    Disabled,
    Panics,
    /// A kept return entry that ran no exit handler to completion (its
    /// entry handler skipped the exit or panicked, the exit handler
    /// panicked, was refused as recursion, the thread was ignored, or the
    /// frame was forgotten, or the call unwound). Each kept entry ends in
    /// exactly one of `Exits` and `Unrun` while its probe stays registered.
    Unrun,
    /// A kept return entry ended because an unwind or a `longjmp` went
    /// past its call (bumped with `Unrun`, as `Recursion` is for a refused
    /// exit). Bumped off the hot path only, so kept apart from the others
    /// ([`Counters::bump_unwound`]): a slot's hot counters stay one 64-byte
    /// block.
    Unwound,
}

/// Counters per probe slot in the hot banks (64 bytes per slot and
/// thread); [`Counter::Unwound`] is kept apart.
pub(super) const NCOUNTERS: usize = 8;

/// A sum of one slot's counters, `Unwound` last.
pub(super) type Sums = [u64; NCOUNTERS + 1];

impl ProbeStats {
    /// The stats of `now - base`.
    pub(super) fn from_sums(now: &Sums, base: &Sums) -> Self {
        let c = |k: Counter| now[k as usize] - base[k as usize];
        Self {
            hits: c(Counter::Unkept) + c(Counter::Kept),
            exits: c(Counter::Exits),
            missed: Missed {
                recursion: c(Counter::Recursion),
                depth: c(Counter::Depth),
                disabled: c(Counter::Disabled),
                unwound: c(Counter::Unwound),
            },
            panics: c(Counter::Panics),
            in_flight: pending(now).saturating_sub(pending(base)),
        }
    }
}

/// Kept return entries not yet ended, in one sum of counters (loaded by
/// [`Counters::add_to`] so that it is never negative per thread).
fn pending(s: &Sums) -> u64 {
    s[Counter::Kept as usize]
        .saturating_sub(s[Counter::Exits as usize])
        .saturating_sub(s[Counter::Unrun as usize])
}

/// One thread's counters for every slot of a registry, in two banks: the
/// *outer* bank, bumped by the thread's outermost dispatch, and the
/// *nested* bank, bumped by a dispatch that runs while another does (a
/// handler's, or a signal handler's).
///
/// An outer bump is a plain load, add and store, which the compiler may
/// keep in registers around it and schedule freely: no other bump of the
/// outer bank can run between the load and the store, because a dispatch
/// that interrupts the outermost one (a signal handler's) finds the
/// thread's `DISPATCH` bit set and bumps the nested bank. A nested bump
/// may itself be interrupted by another nested one, so it is one
/// instruction (x86-64) or an atomic read-modify-write (elsewhere).
///
/// Invariant: stored only by the owning thread; any thread may load them.
pub(super) struct Counters {
    /// `[outer bank | nested bank]`, `NCOUNTERS` per slot in each.
    words: Box<[AtomicU64]>,
    /// [`Counter::Unwound`] per slot, `[outer | nested]` likewise.
    unwound: Box<[AtomicU64]>,
    slots: usize,
}

impl Counters {
    pub(super) fn new(slots: usize) -> Self {
        Self {
            words: (0..2 * slots * NCOUNTERS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            unwound: (0..2 * slots).map(|_| AtomicU64::new(0)).collect(),
            slots,
        }
    }

    /// The outer bank, for the thread's outermost dispatch to keep in a
    /// register ([`CounterView::bump`]).
    #[inline(always)]
    pub(super) fn outer(&self) -> CounterView {
        CounterView {
            base: self.words.as_ptr(),
            nested: false,
        }
    }

    /// The nested bank, for a dispatch that runs inside another.
    #[inline(always)]
    pub(super) fn nested(&self) -> CounterView {
        CounterView {
            // In bounds: the words hold two banks of `slots * NCOUNTERS`.
            base: self.words[self.slots * NCOUNTERS..].as_ptr(),
            nested: true,
        }
    }

    /// Adds this thread's counters of `slot` to `sums`.
    ///
    /// The loads are not one snapshot: the owner keeps counting between
    /// them. They run from the last counter to the first (each counter's
    /// nested bank before its outer one), so a count bumped later in a
    /// call's life ([`Counter::Exits`]) is loaded before one bumped earlier
    /// ([`Counter::Unkept`]): a reader never sees more exits than hits.
    pub(super) fn add_to(&self, slot: u32, sums: &mut Sums) {
        // Acquire, both: pair with the Release of `bump_unwound` (its
        // `bump_one`), as below; loaded first, as a count bumped at the
        // end of a call's life.
        sums[NCOUNTERS] += self.unwound[self.slots + slot as usize].load(Ordering::Acquire);
        sums[NCOUNTERS] += self.unwound[slot as usize].load(Ordering::Acquire);
        let outer = slot as usize * NCOUNTERS;
        let nested = outer + self.slots * NCOUNTERS;
        for (i, s) in sums[..NCOUNTERS].iter_mut().enumerate().rev() {
            // Acquire, both: pair with the Release of the bumps; the counts
            // loaded after these (lower indices) are at least those bumped
            // before the counts seen here.
            *s += self.words[nested + i].load(Ordering::Acquire);
            *s += self.words[outer + i].load(Ordering::Acquire);
        }
    }
}

impl Counters {
    /// Adds one to `slot`'s [`Counter::Unwound`], in the bank `view` is
    /// (outer or nested), as [`CounterView::bump`] does: owner only.
    ///
    /// # Safety
    ///
    /// As [`CounterView::bump`], with `view` a view of these counters.
    pub(super) unsafe fn bump_unwound(&self, view: CounterView, slot: u32) {
        let bank = if view.nested { self.slots } else { 0 };
        debug_assert!((slot as usize) < self.slots);
        // SAFETY: `slot` is below the slot count (the caller's contract),
        // so the index is in `unwound`'s bank.
        let c = unsafe { self.unwound.get_unchecked(bank + slot as usize) };
        // SAFETY: the caller's contract: an outer view only in the
        // thread's outermost dispatch.
        unsafe { bump_one(c, view.nested) }
    }
}

/// One bank of one thread's counters ([`Counters::outer`],
/// [`Counters::nested`]), by address.
#[derive(Clone, Copy)]
pub(super) struct CounterView {
    base: *const AtomicU64,
    nested: bool,
}

impl CounterView {
    /// Whether this is the nested bank (a dispatch inside another).
    #[inline(always)]
    pub(super) fn is_nested(self) -> bool {
        self.nested
    }

    /// Adds one to counter `which` of `slot` in this bank: owner only.
    ///
    /// # Safety
    ///
    /// `slot` is below the slot count the counters were made for (no
    /// bounds check: this runs on every hit), the counters outlive the
    /// call, and an outer view is used only by the thread's outermost
    /// dispatch, while it holds the `DISPATCH` bit (see [`Counters`]), or
    /// on a state the thread is adopting, before any other dispatch of the
    /// thread can reach it (a thread's first dispatch through a registry is
    /// not async-signal-safe: `probe` module docs).
    #[inline(always)]
    pub(super) unsafe fn bump(self, slot: u32, which: Counter) {
        debug_assert!((which as usize) < NCOUNTERS, "Unwound: bump_unwound");
        let i = slot as usize * NCOUNTERS + which as usize;
        // SAFETY: `i` is in the bank and the counters live, by the
        // caller's contract.
        let c = unsafe { &*self.base.add(i) };
        // SAFETY: the caller's contract.
        unsafe { bump_one(c, self.nested) }
    }
}

/// Adds one to counter `c` of a bank (`nested` or outer): see
/// [`CounterView::bump`].
///
/// # Safety
///
/// `c` is a counter of the calling thread's [`Counters`]; an outer one
/// (`nested == false`) only in the thread's outermost dispatch, while it
/// holds the `DISPATCH` bit, or on a state the thread is adopting (as for
/// [`CounterView::bump`]).
#[inline(always)]
unsafe fn bump_one(c: &AtomicU64, nested: bool) {
    if !nested {
        // Relaxed load: only this thread stores the counter, and no
        // other outer bump runs meanwhile (`Counters`). Release: pairs
        // with the Acquire loads of `add_to`, so a reader that sees
        // this count sees the counts the thread bumped before it.
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Release);
        return;
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `c` is a valid, aligned `u64` owned by this allocation;
    // the instruction reads and writes those 8 bytes only. Other
    // threads only load it (aligned 8-byte accesses are single-copy
    // atomic on x86-64), and only this thread stores it (invariant of
    // `Counters`); one instruction, so a signal handler's bump cannot
    // fall between its load and its store.
    unsafe {
        std::arch::asm!(
            "add qword ptr [{0}], 1",
            in(reg) c.as_ptr(),
            options(nostack)
        );
    }
    // Release: as above (on x86-64 the `add` gives the same: stores
    // are not reordered with earlier stores).
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    c.fetch_add(1, Ordering::Release);
}
