//! The hot path: entry and exit dispatch.
//!
//! # Invariants
//!
//! * **One section, one nesting word.** A dispatch runs inside a read-side
//!   section of the thread's RCU record, and the outermost one marks it by
//!   setting the record's `DISPATCH` bit (`rcu/raw.rs`): one load and one
//!   store to begin, one load and one store to end. That section protects
//!   everything the dispatch touches: the index record it looked up, and
//!   the probes it runs, entry and exit handlers alike (`unregister`
//!   changes a probe's generation, then waits for a grace period before it
//!   frees it). The same bit is the recursion guard's level 0 and tells the
//!   outermost dispatch from a nested one (a handler's, or a signal
//!   handler's), which takes the cold path.
//! * **One per-thread context.** The record and the registry the thread
//!   dispatched through last are in the thread's context
//!   (`crate::context`). An outermost dispatch reads the cached registry
//!   state at once (no nested dispatch can change it while the bit is
//!   set); the cache holds a state only under the key it was emptied
//!   into (the registry's pairing epoch), so a hit checks no epoch.
//! * **Only an outermost dispatch** empties a stack of an older pairing
//!   epoch, writes the context's registry cache, or bumps the outer bank of
//!   counters (plain load-add-store: `stats.rs`).
//! * **An exit's section keeps the epoch** of the thread's last section
//!   (its entry's) instead of loading the current one
//!   (`ReaderRecord::begin_dispatch_keeping_epoch`): a grace period that
//!   began since waits for the exit instead of skipping it, and the next
//!   entry loads the new epoch, so it waits for one exit at most.
//!
//! # The dispatch contract
//!
//! The helpers below the public entry points are `unsafe fn`s whose
//! `# Safety` names this contract for what they are given:
//!
//! 1. The calling thread is inside a read-side section for the whole call:
//!    its outermost dispatch's (the `DISPATCH` bit), or a nested
//!    dispatch's own guard.
//! 2. `local` is the calling thread's state in this registry (an entry of
//!    `self.locals`): its counters cover the registry's slots, and its
//!    frames name this registry's slots.
//! 3. `counters` is a bank of `local.counters`: the outer one only in the
//!    thread's outermost dispatch, while it holds the `DISPATCH` bit and
//!    the context's `registry_state` is `local` (where [`panicked`] finds
//!    it: a `cached_local` hit, or `local_outermost`, which always leaves
//!    it there); the nested one otherwise.
//!
//! An entry is one index lookup, one load of each attached probe's slot
//! state, the handlers, and one frame pushed on the thread's shadow stack
//! holding everything the exit needs (the kernel's fgraph model), or one
//! added to the bare word. An exit pops that frame and never looks the
//! address up again: a probe registered between entry and return has
//! nothing in the frame, and one unregistered since is recognised by its
//! slot's generation. Neither takes a lock, allocates (after the thread's
//! first dispatch through the registry), touches a reference count or
//! writes a line another thread writes.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;

use super::def::{EntryAction, EntryContext, ExitContext};
use super::ffi::{C_SKIP_EXIT, CEntryContext, CEntryFn, CExitContext, CExitFn, CHandler};
use super::recursion::{self, Entered};
use super::registry::{Attachment, Registry, state};
use super::section::DispatchSection;
use super::shadow::{BOTTOM, HEADER, RETURN_WORDS, ShadowStack, TAKES_RETURN, Words};
use super::stats::{Counter, CounterView};
use crate::context::{Context, context};
use crate::rcu;
use crate::sync::Ordering;

/// What a frame that took a return keeps for its engine
/// ([`Registry::on_entry_keeping_return`]), in place on the thread's
/// shadow stack from the entry until the frame is popped: an engine may
/// read it there, or have an unwinder read it (its unwind information
/// pointing at [`KeptReturn::RET_ADDR`] and [`KeptReturn::SAVED`] from a
/// register holding the address). Never moved or written while the frame
/// lives.
#[repr(C)]
#[derive(Debug)]
pub struct KeptReturn {
    /// The engine's own word (`saved`).
    pub saved: u64,
    /// The caller's return address.
    pub ret_addr: u64,
    /// Where the engine found it (`sp`).
    pub sp: u64,
}

impl KeptReturn {
    /// Byte offset of [`saved`](Self::saved).
    pub const SAVED: usize = std::mem::offset_of!(KeptReturn, saved);
    /// Byte offset of [`ret_addr`](Self::ret_addr).
    pub const RET_ADDR: usize = std::mem::offset_of!(KeptReturn, ret_addr);
}

/// Whether the calling thread runs on its alternate signal stack
/// (`sigaltstack`), where its stack pointer says nothing of the order of
/// the calls kept on the thread's stack. A system call, on a cold path.
#[cfg(all(unix, not(miri)))]
fn on_alternate_signal_stack() -> bool {
    let mut ss = std::mem::MaybeUninit::<libc::stack_t>::zeroed();
    // SAFETY: a null new stack only queries; `ss` is writable and sized
    // for the answer. Async-signal-safe.
    let r = unsafe { libc::sigaltstack(std::ptr::null(), ss.as_mut_ptr()) };
    // SAFETY: zeroed, and filled in by a successful call.
    r == 0 && unsafe { ss.assume_init() }.ss_flags & libc::SS_ONSTACK != 0
}

/// No alternate signal stacks to tell here.
#[cfg(not(all(unix, not(miri))))]
fn on_alternate_signal_stack() -> bool {
    false
}

/// Counts `which` for the probe of attachment `a` (`counters`: the bank of
/// the thread's counters this dispatch bumps).
///
/// # Safety
///
/// The dispatch contract (module docs) for `counters`, and `a` is an
/// attachment of the same registry.
#[inline(always)]
unsafe fn count(counters: CounterView, a: &Attachment, which: Counter) {
    // SAFETY: `a.slot` is below the registry's slot count (`Attachment`
    // invariant), which the thread's counters are made for; the bank is
    // the dispatch's own (the caller's contract).
    unsafe { counters.bump(a.slot, which) }
}

/// How a return ends the frames it pops: running their exit handlers, or
/// not (`recursion`: refused as recursion, else a thread the dispatch
/// found ignored).
#[derive(Clone, Copy)]
enum Ending {
    Run,
    Unrun { recursion: bool },
}

impl<C: Send + Sync + 'static> Registry<C> {
    /// Function entry at `addr`: runs the entry handlers of the probes
    /// attached there, in registration order, and keeps what their exit
    /// handlers need. Call [`on_exit`](Self::on_exit) exactly once when
    /// this call returns.
    #[inline]
    pub fn on_entry(&self, addr: u64, ret_addr: u64, ctx: &C) {
        self.entry::<true, false>(&Call::new(addr, ret_addr, 0, 0, ctx));
    }

    /// [`on_entry`](Self::on_entry) inside a read-side section the caller
    /// already holds (an engine's hook that loaded the registry under it):
    /// the dispatch's own section nests in it without loading the epoch.
    #[inline]
    pub fn on_entry_in(&self, _guard: &rcu::ReadGuard, addr: u64, ret_addr: u64, ctx: &C) {
        self.entry::<true, false>(&Call::new(addr, ret_addr, 0, 0, ctx));
    }

    /// Function entry for an engine that hooks a return only when it has
    /// to (a patched return address, as the kernel's fgraph does): runs
    /// the entry handlers like [`on_entry`](Self::on_entry), but keeps a
    /// frame only when an exit handler is to run. Returns whether it kept
    /// one: then call [`on_exit`](Self::on_exit) exactly once when this
    /// call returns; on `false`, never (nothing was pushed).
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::probe::{EntryAction, Fprobe, Registry};
    ///
    /// let registry = Registry::<()>::builder().build().unwrap();
    /// let entry_only = Fprobe::builder().entry(|_| EntryAction::Continue).build();
    /// registry.register(entry_only, &[0x1000]).unwrap();
    /// let with_exit = Fprobe::builder().exit(|_| {}).build();
    /// registry.register(with_exit, &[0x2000]).unwrap();
    ///
    /// assert!(!registry.on_entry_for_exit(0x1000, 0x500, &()));
    /// assert!(registry.on_entry_for_exit(0x2000, 0x500, &()));
    /// registry.on_exit(0x500, &());
    /// ```
    #[inline]
    pub fn on_entry_for_exit(&self, addr: u64, ret_addr: u64, ctx: &C) -> bool {
        self.entry::<false, false>(&Call::new(addr, ret_addr, 0, 0, ctx)) != 0
    }

    /// Function entry for an engine that takes the call's return over: it
    /// replaced the return address at `sp` (the stack address the caller's
    /// return address `ret_addr` was read from) so that the function
    /// returns into the engine. Runs the entry handlers like
    /// [`on_entry_for_exit`](Self::on_entry_for_exit); when it keeps a
    /// frame (returns `true`), the frame also keeps `ret_addr` and `sp`,
    /// and the engine calls [`on_return`](Self::on_return) with the same
    /// `sp` when the function returns, which runs the exit handlers and
    /// hands `ret_addr` back. On `false` nothing was kept and the engine
    /// leaves the return alone. One per-thread stack holds both, as the
    /// kernel's fgraph return stack does.
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::probe::{Fprobe, Registry};
    ///
    /// let registry = Registry::<()>::builder().build().unwrap();
    /// registry.register(Fprobe::builder().exit(|_| {}).build(), &[0x2000]).unwrap();
    ///
    /// // The call at 0x2000 from 0x500 had its return address at 0x7ff0.
    /// assert!(registry.on_entry_taking_return(0x2000, 0x500, 0x7ff0, &()));
    /// assert_eq!(registry.on_return(0x7ff0, &()), Some(0x500));
    /// ```
    #[inline]
    pub fn on_entry_taking_return(&self, addr: u64, ret_addr: u64, sp: u64, ctx: &C) -> bool {
        self.entry::<false, true>(&Call::new(addr, ret_addr, sp, 0, ctx)) != 0
    }

    /// [`on_entry_taking_return`](Self::on_entry_taking_return) that also
    /// keeps `saved`, a word of the engine's own (the value of a register
    /// it must give back, say), and returns where the frame keeps it with
    /// the return address: a [`KeptReturn`] that stays in place, unchanged,
    /// until [`on_return`](Self::on_return) with this `sp` pops the frame
    /// (or a later return or entry finds it abandoned: see
    /// [`Missed::unwound`](super::Missed::unwound)). An engine can point
    /// unwind information at it, so that an unwinder walking out of the
    /// function finds its caller's return address there. `None` when
    /// nothing was kept, as `false` from `on_entry_taking_return`.
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::probe::{Fprobe, Registry};
    ///
    /// let registry = Registry::<()>::builder().build().unwrap();
    /// registry.register(Fprobe::builder().exit(|_| {}).build(), &[0x2000]).unwrap();
    ///
    /// let kept = registry.on_entry_keeping_return(0x2000, 0x500, 0x7ff0, 42, &()).unwrap();
    /// // SAFETY: the frame stays in place until the return below.
    /// let k = unsafe { kept.as_ref() };
    /// assert_eq!((k.saved, k.ret_addr, k.sp), (42, 0x500, 0x7ff0));
    /// assert_eq!(registry.on_return(0x7ff0, &()), Some(0x500));
    /// ```
    #[inline]
    pub fn on_entry_keeping_return(
        &self,
        addr: u64,
        ret_addr: u64,
        sp: u64,
        saved: u64,
        ctx: &C,
    ) -> Option<NonNull<KeptReturn>> {
        let at = self.entry::<false, true>(&Call::new(addr, ret_addr, sp, saved, ctx));
        // The frame's address, its provenance exposed by `Words::addr`.
        NonNull::new(std::ptr::with_exposed_provenance_mut(at as usize))
    }

    /// The thread's state cached in its context, read by a dispatch that
    /// holds the `DISPATCH` bit (module docs).
    ///
    /// # Safety
    ///
    /// The calling thread holds the `DISPATCH` bit (it is inside an
    /// outermost dispatch's section) for as long as it uses the state, and
    /// `c` is its context.
    #[inline(always)]
    unsafe fn cached_local(&self, c: &Context) -> Option<&ShadowStack> {
        if c.registry_key.get() != self.locals.key() {
            return None;
        }
        // SAFETY: the key is this registry's current key, so the state is
        // this thread's state in this registry (`local_outermost` caches
        // no other under it, keys are never reused), which lives as long
        // as the registry; no nested dispatch rewrites the pair while the
        // caller holds the bit, as it does (this function's contract).
        Some(unsafe { &*c.registry_state.get().cast::<ShadowStack>() })
    }

    /// An entry; `MARK`: count a bare call when no exit handler is kept
    /// (the caller calls `on_exit` for every entry); `RET`: the frame keeps
    /// `saved`, `ret_addr` and `sp` for [`on_return`](Self::on_return).
    /// Returns 0 when no frame was pushed, else the address of the frame's
    /// [`KeptReturn`] (`RET`) or 1.
    #[inline(always)]
    fn entry<const MARK: bool, const RET: bool>(&self, call: &Call<'_, C>) -> u64 {
        let c = context();
        let rec = c.rcu.get();
        if !rec.is_null() {
            // SAFETY: a non-null record of the context is the thread's
            // claimed record of the process-wide domain, never freed.
            let rec = unsafe { &*rec };
            if rcu::begin_dispatch(rec) {
                // SAFETY: `begin_dispatch` returned `true`: this thread
                // holds the `DISPATCH` bit until `end_dispatch` below.
                let kept = unsafe { self.entry_outermost::<MARK, RET>(c, call) };
                rec.end_dispatch();
                return kept;
            }
        }
        self.entry_slow::<MARK, RET>(*call)
    }

    /// The entry of an outermost dispatch, inside its section (the
    /// `DISPATCH` bit set by `entry` or by a [`DispatchSection`]).
    ///
    /// # Safety
    ///
    /// The calling thread holds the `DISPATCH` bit for the whole call: it
    /// is inside an outermost dispatch's section (`rcu::begin_dispatch` or
    /// `rcu::begin_exit_dispatch` returned `true`, or it holds a
    /// [`DispatchSection`]), and `c` is its context.
    #[inline(always)]
    unsafe fn entry_outermost<const MARK: bool, const RET: bool>(
        &self,
        c: &Context,
        call: &Call<'_, C>,
    ) -> u64 {
        // SAFETY: the caller holds the `DISPATCH` bit, and `c` is its
        // context.
        let local = match unsafe { self.cached_local(c) } {
            Some(local) => local,
            // SAFETY: as above.
            None => match unsafe { self.local_outermost_slow::<MARK>(c) } {
                Some(local) => local,
                None => return 0,
            },
        };
        if RET {
            // SAFETY: as below.
            unsafe { self.end_frames_below(local, call.sp) };
        }
        // SAFETY: inside the dispatch's section (the caller's).
        let attached = unsafe { self.index.get_in_section(call.addr) };
        // SAFETY: as above (the dispatch contract): `local` is this
        // thread's state in this registry, left in the context's cache by
        // `cached_local`'s hit or `local_outermost`, and this dispatch holds
        // the bit, so the outer bank is its own.
        let kept =
            unsafe { self.entry_probes::<RET>(local, local.counters.outer(), attached, call) };
        if MARK && kept == 0 {
            local.push_bare();
        }
        kept
    }

    /// Before an outermost entry that takes its return at `sp`: when the
    /// top frame took its return at a lower stack address, its call is
    /// gone (an exception, a forced unwind or a `longjmp` went past it),
    /// and [`end_unwound`](Self::end_unwound) ends it and any like it
    /// below. One load and a sign test when the top frame is not one that
    /// took a return, two loads and a compare when it is: a thread whose
    /// exceptions are caught by a function without an exit probe never
    /// fills its stack with abandoned frames.
    ///
    /// # Safety
    ///
    /// The dispatch contract (module docs) for `local`, in the thread's
    /// outermost dispatch (it bumps the outer bank).
    #[inline(always)]
    unsafe fn end_frames_below(&self, local: &ShadowStack, sp: u64) {
        let t = local.top();
        // SAFETY: `local` is this thread's stack; `BOTTOM <= t < cap`, so
        // `t - 1` is a word of it, and a negative word there is the top of
        // a frame that took a return, whose `sp` word is `t - HEADER - 1`
        // (`shadow.rs`, frame layout).
        if unsafe { (local.read(t - 1) as i64) < 0 && local.read(t - HEADER - 1) < sp } {
            // SAFETY: this function's contract.
            unsafe { self.end_unwound(local, sp) };
        }
    }

    /// Ends, as [`Missed::unwound`](super::Missed::unwound), the frames on
    /// top of the stack that took their return below `sp`, for an
    /// outermost entry at `sp` on the thread's own stack. An entry made on
    /// an alternate signal stack (`sigaltstack`) ends none: that stack may
    /// lie above the thread's, under frames whose calls are live.
    ///
    /// # Safety
    ///
    /// As for [`end_frames_below`](Self::end_frames_below).
    #[cold]
    #[inline(never)]
    unsafe fn end_unwound(&self, local: &ShadowStack, sp: u64) {
        if on_alternate_signal_stack() {
            return;
        }
        let counters = local.counters.outer();
        loop {
            let t = local.top();
            // SAFETY: `local` is this thread's stack; `BOTTOM <= t < cap`.
            let word = unsafe { local.read(t - 1) };
            // Bare calls above the frame (another engine's) are left alone.
            // SAFETY: as above, `t < cap`.
            if word & TAKES_RETURN == 0 || unsafe { local.read(t) } != 0 {
                return;
            }
            // SAFETY: the top frame took a return (the test above): its
            // `sp` word is `t - HEADER - 1` (`shadow.rs`, frame layout).
            if unsafe { local.read(t - HEADER - 1) } >= sp {
                return;
            }
            let entries = t - HEADER - RETURN_WORDS;
            let n = word & !TAKES_RETURN;
            // SAFETY: the top frame of this thread's stack took a return,
            // its `n` return entries below word `entries`; `end_unrun`
            // returns its first word, which `release` ends it at; the
            // outer bank of an outermost dispatch (this function's
            // contract).
            unsafe {
                let at = self.end_unrun(local, counters, entries, n, Some(Counter::Unwound));
                local.release(at);
            }
        }
    }

    /// [`entry_outermost`](Self::entry_outermost)'s state when it is not
    /// cached: made, emptied into the current pairing epoch, cached. `None`
    /// when the thread has none, or when it is ignored (a bare call pushed
    /// with `MARK`).
    ///
    /// # Safety
    ///
    /// As for [`entry_outermost`](Self::entry_outermost).
    #[cold]
    #[inline(never)]
    unsafe fn local_outermost_slow<const MARK: bool>(&self, c: &Context) -> Option<&ShadowStack> {
        // SAFETY: the caller holds the `DISPATCH` bit, and `c` is its
        // context.
        match unsafe { self.local_outermost(c) } {
            Some(local) if recursion::ignored(c) => {
                if MARK {
                    local.push_bare();
                }
                None
            }
            local => local,
        }
    }

    /// [`on_entry`](Self::on_entry) inside a [`DispatchSection`] the
    /// engine's hook opened (and in which it loaded the registry, say):
    /// the dispatch takes the section as its own instead of nesting one.
    ///
    /// The section is borrowed mutably for the dispatch: a handler cannot
    /// dispatch in it again (that would be a second outermost dispatch
    /// inside the first, rewriting the thread's cached state under it); a
    /// handler's dispatch takes the plain methods, which nest.
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::probe::{DispatchSection, EntryAction, Fprobe, Registry};
    ///
    /// let registry = Registry::<()>::builder().build().unwrap();
    /// let probe = Fprobe::builder().entry(|_| EntryAction::Continue).build();
    /// let h = registry.register(probe, &[0x1000]).unwrap();
    /// // The engine's hooks:
    /// match DispatchSection::enter() {
    ///     Some(mut section) => registry.on_entry_held(&mut section, 0x1000, 0, &()),
    ///     None => registry.on_entry(0x1000, 0, &()), // inside another dispatch
    /// }
    /// match DispatchSection::enter_for_exit() {
    ///     Some(mut section) => registry.on_exit_held(&mut section, 0, &()),
    ///     None => registry.on_exit(0, &()),
    /// }
    /// assert_eq!(registry.stats(h).unwrap().hits, 1);
    /// ```
    ///
    /// A shared borrow of the section does not do:
    ///
    /// ```compile_fail,E0308
    /// use fprobe::probe::{DispatchSection, Registry};
    ///
    /// let registry = Registry::<()>::builder().build().unwrap();
    /// let section = DispatchSection::enter().unwrap();
    /// registry.on_entry_held(&section, 0x1000, 0, &());
    /// ```
    #[inline]
    pub fn on_entry_held(&self, _section: &mut DispatchSection, addr: u64, ret_addr: u64, ctx: &C) {
        // SAFETY: `_section` (`!Send`, so this thread's) holds the
        // `DISPATCH` bit; `context()` is this thread's.
        unsafe {
            self.entry_outermost::<true, false>(context(), &Call::new(addr, ret_addr, 0, 0, ctx))
        };
    }

    /// An entry off the fast path: the thread's first dispatch (no record
    /// yet), a state not cached (first use of the registry, another
    /// registry used since, a pairing reset, an ignored thread), or a
    /// dispatch nested in another.
    #[cold]
    #[inline(never)]
    fn entry_slow<const MARK: bool, const RET: bool>(&self, call: Call<'_, C>) -> u64 {
        let call = &call;
        let Some(rec) = rcu::thread_record() else {
            return 0;
        };
        let c = context();
        if rcu::begin_dispatch(rec) {
            // SAFETY: `begin_dispatch` returned `true`: this thread holds
            // the `DISPATCH` bit until `end_dispatch` below.
            let kept = unsafe { self.entry_outermost::<MARK, RET>(c, call) };
            rec.end_dispatch();
            return kept;
        }
        // Nested: a section of its own inside the running dispatch's.
        let guard = rcu::read_lock();
        let Some(local) = self.local_nested(&guard) else {
            return 0;
        };
        let counters = local.counters.nested();
        let attached = self.index.get(call.addr, &guard);
        match recursion::enter_nested() {
            Entered::Run(level) => {
                // SAFETY: inside `guard`'s section, which `attached` came
                // from; `local` is this thread's stack.
                let kept = unsafe { self.entry_probes::<RET>(local, counters, attached, call) };
                if MARK && kept == 0 {
                    local.push_bare();
                }
                drop(level);
                kept
            }
            entered => {
                if matches!(entered, Entered::Recursion) {
                    for a in attached {
                        // SAFETY: the nested bank of this thread's state,
                        // `a` found in this registry's index.
                        unsafe { count(counters, a, Counter::Recursion) };
                    }
                }
                if MARK {
                    local.push_bare();
                }
                0
            }
        }
    }

    /// The probe `a` names, while it is registered and enabled; counts a
    /// hit on a disabled one.
    ///
    /// # Safety
    ///
    /// The caller is inside the dispatch's read-side section for as long
    /// as the reference lives (as for `ProbeSlot::probe_of`).
    #[inline(always)]
    unsafe fn live_probe(
        &self,
        counters: CounterView,
        a: &Attachment,
    ) -> Option<&super::def::Fprobe<C>> {
        // SAFETY: `a.slot` indexes `self.slots` (`Attachment` invariant).
        let slot = unsafe { self.slots.get_unchecked(a.slot as usize) };
        // Acquire: pairs with the Release state store of
        // `register_with_cookies`; the probe's fields are visible.
        let s = slot.state.load(Ordering::Acquire);
        if s != state(a.generation, true) {
            if s == state(a.generation, false) {
                // SAFETY: this function's contract.
                unsafe { count(counters, a, Counter::Disabled) };
            }
            return None; // disabled, or being unregistered
        }
        // Relaxed: ordered by the Acquire above.
        let p = slot.probe.load(Ordering::Relaxed);
        // SAFETY: the generation matched inside the caller's read section
        // (this function's contract), so `unregister` has not passed its
        // grace period, and it frees the probe only after it: the probe
        // lives until the caller leaves the section.
        unsafe { p.as_ref() }
    }

    /// The entry of one attachment: [`entry_probes`](Self::entry_probes)'s
    /// steps and counts, without the loop and the bookkeeping of several
    /// return entries. Returns what [`entry`](Self::entry) does.
    ///
    /// # Safety
    ///
    /// As for [`entry_probes`](Self::entry_probes), with `a` one of the
    /// attachments found.
    #[inline(always)]
    unsafe fn entry_one<const RET: bool>(
        &self,
        local: &ShadowStack,
        counters: CounterView,
        a: &Attachment,
        call: &Call<'_, C>,
    ) -> u64 {
        // SAFETY: inside the dispatch's section (this function's
        // contract), which outlives every use of `p` here.
        let Some(p) = (unsafe { self.live_probe(counters, a) }) else {
            return 0;
        };
        let header = if RET { HEADER + RETURN_WORDS } else { HEADER };
        let fw = a.frame_words as usize;
        let at = match fw {
            0 => None,
            _ => local.reserve(header + fw),
        };
        let Some(at) = at else {
            // No exit handler, or its frame does not fit.
            // SAFETY: this function's contract, for all three.
            unsafe {
                count(counters, a, Counter::Unkept);
                if fw > 0 {
                    count(counters, a, Counter::Depth);
                }
                run_entry(local, p, a, counters, call, &mut []);
            }
            return 0;
        };
        // SAFETY: this function's contract.
        unsafe { count(counters, a, Counter::Kept) };
        let w = local.words();
        // SAFETY: as in `entry_probes`: the data words lie in our
        // reservation, which nothing else references until it is pushed.
        let data = unsafe { w.data_mut(at, p.data_size) };
        // SAFETY: this function's contract.
        match unsafe { run_entry(local, p, a, counters, call, data) } {
            EntryAction::Continue => {
                // SAFETY: the return entry (`fw` words from `at`) and the
                // header (`header` words from `at + fw`) fill our
                // reservation of `header + fw` words on this thread's
                // stack exactly; the data slice is no longer used.
                unsafe {
                    write_return_entry(w, at, a);
                    write_header::<C, RET>(w, at + fw, 1, call);
                }
                // The reservation was exactly the frame: `top` already
                // covers it, and the frame is complete once written.
                if RET { w.addr(at + fw) } else { 1 }
            }
            EntryAction::SkipExit => {
                // SAFETY: this function's contract.
                unsafe { count(counters, a, Counter::Unrun) };
                // SAFETY: `at` is our reservation's first word, on this
                // thread's stack.
                unsafe { local.release(at) };
                0
            }
        }
    }

    /// Runs the entry side of every probe in `attached` and pushes the
    /// call's frame when an exit is kept (see `shadow.rs` for the layout
    /// and why each step is safe against a signal handler that dispatches
    /// in between). Returns what [`entry`](Self::entry) does, for a call
    /// that keeps no bare mark.
    ///
    /// # Safety
    ///
    /// The dispatch contract (module docs) for `local` and `counters`, and
    /// `attached` was found in this registry's index under the section.
    #[inline(always)]
    unsafe fn entry_probes<const RET: bool>(
        &self,
        local: &ShadowStack,
        counters: CounterView,
        attached: &[Attachment],
        call: &Call<'_, C>,
    ) -> u64 {
        if let [a] = attached {
            // One probe at the address, the usual case: straight-line code.
            // SAFETY: this function's contract.
            return unsafe { self.entry_one::<RET>(local, counters, a, call) };
        }
        let w = local.words();
        let header = if RET { HEADER + RETURN_WORDS } else { HEADER };
        let need = header
            + attached
                .iter()
                .map(|a| a.frame_words as usize)
                .sum::<usize>();
        // With no exit handler among them nothing is kept.
        let at = if need > header {
            local.reserve(need)
        } else {
            None
        };
        let (mut used, mut n) = (0usize, 0u64);
        for a in attached {
            // SAFETY: inside the dispatch's section (this function's
            // contract), which outlives `p`'s use here.
            let Some(p) = (unsafe { self.live_probe(counters, a) }) else {
                continue;
            };
            // One count per hit: `Kept` for a hit that gets a return entry
            // (it ends in `Exits` or `Unrun`), `Unkept` for the others.
            let keep = match at {
                Some(at) if a.frame_words > 0 => {
                    // SAFETY: this function's contract.
                    unsafe { count(counters, a, Counter::Kept) };
                    Some(at + used)
                }
                _ => {
                    // SAFETY: this function's contract, for both.
                    unsafe {
                        count(counters, a, Counter::Unkept);
                        if a.frame_words > 0 {
                            count(counters, a, Counter::Depth);
                        }
                    }
                    None
                }
            };
            let data: &mut [u8] = match keep {
                // SAFETY: `frame_words` covers the data words; the words lie
                // in our reservation, which nothing else references until
                // the frame is pushed.
                Some(at) => unsafe { w.data_mut(at, p.data_size) },
                None => &mut [],
            };
            // SAFETY: this function's contract.
            let action = unsafe { run_entry(local, p, a, counters, call, data) };
            match (keep, action) {
                (Some(e), EntryAction::Continue) => {
                    // SAFETY: this attachment's `frame_words` from `e` lie
                    // in our reservation on this thread's stack (`need`
                    // counts them); the data slice is no longer used.
                    unsafe { write_return_entry(w, e, a) };
                    used += a.frame_words as usize;
                    n += 1;
                }
                // The entry handler skipped the exit (or panicked): the
                // return entry ends here, its exit unrun.
                // SAFETY: this function's contract.
                (Some(_), EntryAction::SkipExit) => unsafe { count(counters, a, Counter::Unrun) },
                (None, _) => {}
            }
        }
        let Some(at) = at else {
            return 0;
        };
        if n == 0 {
            // Reserved, nothing kept: given back.
            // SAFETY: `at` is our reservation's first word, on this
            // thread's stack.
            unsafe { local.release(at) };
            return 0;
        }
        // SAFETY: the header's `header` words from `at + used` lie in our
        // reservation (`used + header <= need`) on this thread's stack, and
        // the frame kept is those `used + header` words of it.
        unsafe {
            write_header::<C, RET>(w, at + used, n, call);
            local.commit(at, used + header);
        }
        if RET { w.addr(at + used) } else { 1 }
    }

    /// Function return: runs the exit handlers kept by the matching
    /// [`on_entry`](Self::on_entry), newest first, skipping probes
    /// unregistered since. Never looks the address up again: a probe
    /// registered between entry and return has nothing kept for this call.
    /// Exit handlers run inside the exit's read-side section (see
    /// [`ExitContext`]).
    #[inline]
    pub fn on_exit(&self, ret_addr: u64, ctx: &C) {
        let c = context();
        let rec = c.rcu.get();
        if !rec.is_null() {
            // SAFETY: as in `entry`.
            let rec = unsafe { &*rec };
            // The epoch of the entry's section serves (`rcu/raw.rs`).
            if rcu::begin_exit_dispatch(rec) {
                // SAFETY: `begin_exit_dispatch` returned `true`: this
                // thread holds the `DISPATCH` bit until `end_dispatch`.
                unsafe { self.exit_outermost(c, ret_addr, ctx) };
                rec.end_dispatch();
                return;
            }
        }
        self.exit_slow(ret_addr, ctx);
    }

    /// The exit of an outermost dispatch, inside its section (as
    /// [`entry_outermost`](Self::entry_outermost)).
    ///
    /// # Safety
    ///
    /// The calling thread holds the `DISPATCH` bit for the whole call: it
    /// is inside an outermost dispatch's section (`rcu::begin_dispatch` or
    /// `rcu::begin_exit_dispatch` returned `true`, or it holds a
    /// [`DispatchSection`]), and `c` is its context.
    #[inline(always)]
    unsafe fn exit_outermost(&self, c: &Context, ret_addr: u64, ctx: &C) {
        // SAFETY: the caller holds the `DISPATCH` bit, and `c` is its
        // context.
        let Some(local) = (unsafe { self.cached_local(c) }) else {
            // SAFETY: as above.
            return unsafe { self.exit_outermost_slow(c, ret_addr, ctx) };
        };
        if !local.pop_bare() {
            // SAFETY: the dispatch contract: inside the dispatch's section
            // (the caller's bit), on this thread's state in this registry,
            // which the cache's hit names, so the outer bank is its own.
            unsafe {
                self.exit_pop_frame(local, local.counters.outer(), Ending::Run, ret_addr, ctx)
            };
        }
    }

    /// [`exit_outermost`](Self::exit_outermost) when the state is not
    /// cached.
    ///
    /// # Safety
    ///
    /// The calling thread holds the `DISPATCH` bit for the whole call: it
    /// is inside an outermost dispatch's section (`rcu::begin_dispatch` or
    /// `rcu::begin_exit_dispatch` returned `true`, or it holds a
    /// [`DispatchSection`]), and `c` is its context.
    #[cold]
    #[inline(never)]
    unsafe fn exit_outermost_slow(&self, c: &Context, ret_addr: u64, ctx: &C) {
        // SAFETY: the caller holds the `DISPATCH` bit, and `c` is its
        // context.
        if let Some(local) = unsafe { self.local_outermost(c) } {
            let ending = match recursion::ignored(c) {
                true => Ending::Unrun { recursion: false },
                false => Ending::Run,
            };
            if !local.pop_bare() {
                // SAFETY: as in `exit_outermost`, the state left in the
                // context's `registry_state` by `local_outermost`.
                unsafe {
                    self.exit_pop_frame(local, local.counters.outer(), ending, ret_addr, ctx)
                };
            }
        }
    }

    /// [`on_exit`](Self::on_exit) inside a [`DispatchSection`] (see
    /// [`on_entry_held`](Self::on_entry_held)).
    #[inline]
    pub fn on_exit_held(&self, _section: &mut DispatchSection, ret_addr: u64, ctx: &C) {
        // SAFETY: as in `on_entry_held`.
        unsafe { self.exit_outermost(context(), ret_addr, ctx) };
    }

    /// An exit off the fast path (as [`entry_slow`](Self::entry_slow)).
    #[cold]
    #[inline(never)]
    fn exit_slow(&self, ret_addr: u64, ctx: &C) {
        let Some(rec) = rcu::thread_record() else {
            return;
        };
        let c = context();
        if rcu::begin_exit_dispatch(rec) {
            // SAFETY: `begin_exit_dispatch` returned `true`: this thread
            // holds the `DISPATCH` bit until `end_dispatch` below.
            unsafe { self.exit_outermost_slow(c, ret_addr, ctx) };
            rec.end_dispatch();
            return;
        }
        // Nested: a section of its own inside the running dispatch's.
        let guard = rcu::read_lock();
        let Some(local) = self.local_nested(&guard) else {
            return;
        };
        // A bare call needs no context level.
        if local.pop_bare() {
            return;
        }
        let counters = local.counters.nested();
        match recursion::enter_nested() {
            Entered::Run(level) => {
                // SAFETY: inside `guard`'s section, on this thread's stack.
                unsafe { self.exit_pop_frame(local, counters, Ending::Run, ret_addr, ctx) };
                drop(level);
            }
            entered => {
                let recursion = matches!(entered, Entered::Recursion);
                // SAFETY: as above.
                unsafe {
                    self.exit_pop_frame(local, counters, Ending::Unrun { recursion }, ret_addr, ctx)
                };
            }
        }
    }

    /// Pops a plain exit's frame, once no bare call is left to end, and
    /// ends it as `ending` says.
    ///
    /// # Safety
    ///
    /// The dispatch contract (module docs) for `local` and `counters`.
    #[inline(always)]
    unsafe fn exit_pop_frame(
        &self,
        local: &ShadowStack,
        counters: CounterView,
        ending: Ending,
        ret_addr: u64,
        ctx: &C,
    ) {
        let Some((t, n)) = local.pop_frame() else {
            return;
        };
        // SAFETY: `pop_frame` found a plain entry's frame with `n` return
        // entries under the bare word `t` of this thread's stack, its
        // header `[addr, n]` just below `t`; both return that frame's
        // first word, which `release` ends it at; inside a section (this
        // function's contract).
        unsafe {
            let at = match ending {
                Ending::Run => self.exit_frame::<false>(local, counters, t, n, ret_addr, ctx),
                Ending::Unrun { recursion } => {
                    let cause = recursion.then_some(Counter::Recursion);
                    self.end_unrun(local, counters, t - HEADER, n, cause)
                }
            };
            local.release(at);
        }
    }

    /// [`on_exit`](Self::on_exit) for a caller inside a read-side section:
    /// the same, kept beside [`on_entry_in`](Self::on_entry_in).
    #[inline]
    pub fn on_exit_in(&self, _guard: &rcu::ReadGuard, ret_addr: u64, ctx: &C) {
        self.on_exit(ret_addr, ctx);
    }

    /// The return of a call whose entry took it over
    /// ([`on_entry_taking_return`](Self::on_entry_taking_return) returned
    /// `true` with this `sp`): runs the exit handlers kept for it, newest
    /// first, and returns the caller's return address kept with them.
    ///
    /// Frames above it are of calls that never returned (a `longjmp`, an
    /// exception or a forced unwind went past them): calls whose return was
    /// taken and kept at a lower `sp`, and plain entries whose `on_exit`
    /// never came. They end without their exit handlers, counted in
    /// [`Missed::unwound`](super::Missed::unwound), as the kernel's fgraph
    /// runs none for the calls it skips: such a call has no return value,
    /// and the registers at hand are another call's. (An entry that takes
    /// its return ends them too, when it finds them below its own `sp`.)
    /// `None` when no frame kept at `sp` is found (the calls did not nest,
    /// or the thread's state is being destroyed): the return address is
    /// lost.
    ///
    /// # Examples
    ///
    /// See [`on_entry_taking_return`](Self::on_entry_taking_return).
    #[inline]
    pub fn on_return(&self, sp: u64, ctx: &C) -> Option<u64> {
        let c = context();
        let rec = c.rcu.get();
        if !rec.is_null() {
            // SAFETY: as in `entry`.
            let rec = unsafe { &*rec };
            // As in `on_exit`.
            if rcu::begin_exit_dispatch(rec) {
                // SAFETY: `begin_exit_dispatch` returned `true`: this
                // thread holds the `DISPATCH` bit until `end_dispatch`.
                if let Some(local) = unsafe { self.cached_local(c) } {
                    let counters = local.counters.outer();
                    // SAFETY: as in `exit_outermost`.
                    let ret = unsafe { self.return_frames(local, counters, Ending::Run, sp, ctx) };
                    rec.end_dispatch();
                    return ret;
                }
                rec.end_dispatch();
            }
        }
        self.return_slow(sp, ctx)
    }

    /// A return off the fast path (as [`entry_slow`](Self::entry_slow)).
    #[cold]
    #[inline(never)]
    fn return_slow(&self, sp: u64, ctx: &C) -> Option<u64> {
        let rec = rcu::thread_record()?;
        let c = context();
        if rcu::begin_exit_dispatch(rec) {
            // SAFETY: `begin_exit_dispatch` returned `true`: this thread
            // holds the `DISPATCH` bit until `end_dispatch` below.
            let ret = unsafe { self.local_outermost(c) }.and_then(|local| {
                let ending = match recursion::ignored(c) {
                    true => Ending::Unrun { recursion: false },
                    false => Ending::Run,
                };
                // SAFETY: as in `exit_outermost_slow`.
                unsafe { self.return_frames(local, local.counters.outer(), ending, sp, ctx) }
            });
            rec.end_dispatch();
            return ret;
        }
        let guard = rcu::read_lock();
        let local = self.local_nested(&guard)?;
        let counters = local.counters.nested();
        match recursion::enter_nested() {
            Entered::Run(level) => {
                // SAFETY: inside `guard`'s section, on this thread's stack.
                let ret = unsafe { self.return_frames(local, counters, Ending::Run, sp, ctx) };
                drop(level);
                ret
            }
            entered => {
                let recursion = matches!(entered, Entered::Recursion);
                // SAFETY: as above.
                unsafe { self.return_frames(local, counters, Ending::Unrun { recursion }, sp, ctx) }
            }
        }
    }

    /// Pops frames down to the one that took the return at `sp` (see
    /// [`on_return`](Self::on_return)), ending each as `ending` says, and
    /// returns its return address.
    ///
    /// # Safety
    ///
    /// The dispatch contract (module docs) for `local` and `counters`.
    #[inline(always)]
    unsafe fn return_frames(
        &self,
        local: &ShadowStack,
        counters: CounterView,
        ending: Ending,
        sp: u64,
        ctx: &C,
    ) -> Option<u64> {
        loop {
            // Bare calls above the frame are deeper than it: popping the
            // frame drops them (`release` goes below it).
            let t = local.top();
            // SAFETY: `local` is this thread's stack; `BOTTOM <= t < cap`.
            let word = unsafe { local.read(t - 1) };
            if word == 0 {
                return None; // the bottom: word 0
            }
            // A frame gone past (module docs of `on_return`) counts as
            // unwound, but on an ignored thread, which counts nothing.
            let gone = match ending {
                Ending::Unrun { recursion: false } => None,
                _ => Some(Counter::Unwound),
            };
            if word & TAKES_RETURN == 0 {
                // A plain entry's frame above ours, its exit never
                // dispatched.
                // SAFETY: the top frame is a plain entry's (`word`, not 0,
                // its sign bit clear) with `word` return entries below its
                // header; ended at the first word `end_unrun` returns.
                unsafe {
                    let at = self.end_unrun(local, counters, t - HEADER, word, gone);
                    local.release(at);
                }
                continue;
            }
            // SAFETY: the top frame took a return: its `sp` word is
            // `t - HEADER - 1` (`shadow.rs`, frame layout).
            let at_sp = unsafe { local.read(t - HEADER - 1) };
            if at_sp > sp {
                return None; // a frame of a caller's call: ours is gone
            }
            let entries = t - HEADER - RETURN_WORDS;
            let n = word & !TAKES_RETURN;
            if at_sp < sp {
                // SAFETY: the top frame took a return, its `n` return
                // entries below word `entries`; ended at its first word.
                unsafe {
                    let at = self.end_unrun(local, counters, entries, n, gone);
                    local.release(at);
                }
                continue;
            }
            // SAFETY: the top frame took a return: its `ret_addr` word is
            // `t - HEADER - 2`; it has `n` return entries below word
            // `entries`, and is ended at the first word both return;
            // inside a section (this function's contract).
            let ret = unsafe {
                let ret = local.read(t - HEADER - 2);
                let at = match ending {
                    Ending::Run => self.exit_frame::<true>(local, counters, t, n, ret, ctx),
                    Ending::Unrun { recursion } => {
                        let cause = recursion.then_some(Counter::Recursion);
                        self.end_unrun(local, counters, entries, n, cause)
                    }
                };
                local.release(at);
                ret
            };
            return Some(ret);
        }
    }

    /// Runs the exit handlers of the frame under the bare word `t`, with
    /// `n ≥ 1` return entries (`RET`: one that took a return); returns the
    /// frame's first word.
    ///
    /// # Safety
    ///
    /// The dispatch contract (module docs) for `local` and `counters`, and
    /// `local`'s top frame is such a frame under the bare word `t == top`,
    /// laid out as `shadow.rs` says (written by this thread's entry).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn exit_frame<const RET: bool>(
        &self,
        local: &ShadowStack,
        counters: CounterView,
        t: usize,
        n: u64,
        ret_addr: u64,
        ctx: &C,
    ) -> usize {
        let w = local.words();
        let entries = if RET {
            t - HEADER - RETURN_WORDS
        } else {
            t - HEADER
        };
        // SAFETY: the frame's `addr` word, below `t` (the caller's
        // contract).
        let addr = unsafe { w.read(t - 2) };
        match n {
            // One probe, the usual case: no loop.
            // SAFETY: the frame's newest return entry ends at `entries`;
            // inside the caller's section.
            1 => unsafe { self.exit_entry(local, counters, entries, addr, ret_addr, ctx) },
            _ => {
                let (mut p, mut left) = (entries, n);
                // `n ≥ 1`: no test before the first.
                loop {
                    // SAFETY: `p` is where the frame's next return entry
                    // ends: `entries`, then where the previous one started;
                    // inside the caller's section.
                    p = unsafe { self.exit_entry(local, counters, p, addr, ret_addr, ctx) };
                    left -= 1;
                    if left == 0 {
                        return p;
                    }
                }
            }
        }
    }

    /// Runs the exit handler of the return entry ending at word `p` (below
    /// the stack's `top`) unless its probe was unregistered since the
    /// entry; returns where the entry starts.
    ///
    /// # Safety
    ///
    /// The dispatch contract (module docs) for `local` and `counters`, and
    /// a return entry of a frame below `local`'s `top` ends at word `p`
    /// (`shadow.rs`: `[data…, cookie, generation, meta]`, written by this
    /// thread's entry).
    #[inline(always)]
    unsafe fn exit_entry(
        &self,
        local: &ShadowStack,
        counters: CounterView,
        p: usize,
        addr: u64,
        ret_addr: u64,
        ctx: &C,
    ) -> usize {
        let w = local.words();
        // SAFETY: the entry's last three words, below `top` (the caller's
        // contract).
        let (meta, generation, cookie) = unsafe { (w.read(p - 1), w.read(p - 2), w.read(p - 3)) };
        let (slot_idx, dw) = (meta as u32, (meta >> 32) as usize);
        let data_at = p - 3 - dw;
        debug_assert!((slot_idx as usize) < self.slots.len());
        // SAFETY: the entry wrote `slot_idx` from an `Attachment` (below the
        // slot count, `Attachment` invariant) into a frame nothing else writes
        // (shadow.rs: `top` covers every word in use).
        let slot = unsafe { self.slots.get_unchecked(slot_idx as usize) };
        if !slot.holds(generation) {
            // Unregistered since the entry: its counts are gone with it
            // (an `Unrun` here would land on the slot's next probe).
            return data_at;
        }
        let bump = |which| {
            // SAFETY: `slot_idx` indexes `self.slots` (above), every
            // thread's counters cover its length, and the bank is this
            // dispatch's.
            unsafe { counters.bump(slot_idx, which) }
        };
        // Relaxed: ordered by the Acquire of `holds`.
        let fp = slot.probe.load(Ordering::Relaxed);
        // SAFETY: the generation matched inside the caller's read-side
        // section (this function's contract), so `unregister` (which
        // changes the generation, then waits for a grace period before it
        // frees the probe) has not freed it, and cannot until the section
        // ends. A kept entry always has its probe and an exit handler.
        let Some(fp) = (unsafe { fp.as_ref() }) else {
            bump(Counter::Unrun);
            return data_at;
        };
        // The same probe as at the entry (same generation), so its data
        // fits the `dw` words the entry reserved.
        debug_assert!(fp.data_size <= dw * 8);
        // SAFETY: the data words of this return entry, below `top` (which
        // covers them until `release`), written by the entry.
        let data = unsafe { w.data(data_at, fp.data_size) };
        let exit = match (&fp.exit, &fp.c_exit) {
            (Some(exit), _) => exit,
            (None, Some(h)) => {
                call_c_exit(h, addr, ret_addr, cookie, ctx, data);
                bump(Counter::Exits);
                return data_at;
            }
            (None, None) => {
                bump(Counter::Unrun);
                return data_at;
            }
        };
        let xc = ExitContext {
            addr,
            ret_addr,
            cookie,
            ctx,
            data,
        };
        match catch_unwind(AssertUnwindSafe(|| exit(&xc))) {
            Ok(()) => bump(Counter::Exits),
            Err(payload) => {
                bump(Counter::Panics);
                bump(Counter::Unrun);
                // SAFETY: this function's contract.
                unsafe { panicked::<C>(counters, local, slot_idx, generation) };
                super::panics::discard(payload);
            }
        }
        data_at
    }

    /// Ends the `n` return entries below word `entries` without running
    /// their exit handlers (an ignored thread, a recursive exit, or frames
    /// an unwind went past), counting `Unrun` (and `cause`, `Recursion` or
    /// `Unwound`, if any) for those whose probe is still registered;
    /// returns the frame's first word.
    ///
    /// # Safety
    ///
    /// The dispatch contract (module docs) for `local` and `counters`, and
    /// `n` return entries of a frame below `local`'s `top` lie below word
    /// `entries`, newest first (`shadow.rs`, frame layout).
    #[cold]
    #[inline(never)]
    unsafe fn end_unrun(
        &self,
        local: &ShadowStack,
        counters: CounterView,
        entries: usize,
        n: u64,
        cause: Option<Counter>,
    ) -> usize {
        let w = local.words();
        let mut p = entries;
        for _ in 0..n {
            // SAFETY: a return entry ends at `p`, below `top` (the caller's
            // contract): these are its `meta` and `generation` words.
            let (meta, generation) = unsafe { (w.read(p - 1), w.read(p - 2)) };
            let (slot_idx, dw) = (meta as u32, (meta >> 32) as usize);
            p -= 3 + dw;
            if !self
                .slots
                .get(slot_idx as usize)
                .is_some_and(|s| s.holds(generation))
            {
                continue;
            }
            // SAFETY: `slot_idx` indexes `self.slots` (checked above), which
            // the thread's counters cover; the bank is this dispatch's.
            unsafe {
                match cause {
                    Some(Counter::Unwound) => local.counters.bump_unwound(counters, slot_idx),
                    Some(cause) => counters.bump(slot_idx, cause),
                    None => {}
                }
                counters.bump(slot_idx, Counter::Unrun);
            }
        }
        p
    }

    /// Empties a stack of an older pairing epoch, down to its topmost
    /// frame that took a return, or one adopted from an exited thread
    /// (`epoch == None`) entirely: the return entries it drops end as
    /// `Unrun`, so that `in_flight` counts only calls that can still
    /// return. Inside a section: an `unregister` that changes a
    /// generation waits for it, so a count never lands on the slot's next
    /// probe.
    ///
    /// # Safety
    ///
    /// The calling thread is inside a read-side section for the call, and
    /// `local` is its state in this registry, which no other outermost
    /// dispatch uses meanwhile (a nested one writes only above its `top`:
    /// `shadow.rs`): its outermost dispatch's (which holds the `DISPATCH`
    /// bit), or one this thread adopted just now, which no dispatch of the
    /// thread can reach yet (its outer bank is then free to bump:
    /// `stats.rs`, [`CounterView::bump`]).
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn forget_frames(&self, local: &ShadowStack, epoch: Option<u64>) {
        // A pairing reset keeps the calls whose return was taken.
        let keep = epoch.map_or(BOTTOM, |_| local.kept_by_reset());
        let counters = local.counters.outer();
        local.each_return_entry(keep, |slot_idx, generation| {
            if self
                .slots
                .get(slot_idx as usize)
                .is_some_and(|s| s.holds(generation))
            {
                // SAFETY: `slot_idx` indexes `self.slots` (checked); the
                // outer bank, by the thread's outermost dispatch or on a
                // state no dispatch of it reaches yet (the contract).
                unsafe { counters.bump(slot_idx, Counter::Unrun) };
            }
        });
        match epoch {
            // SAFETY: `local` is this thread's stack, and `keep` is what
            // `kept_by_reset` returned above (or `BOTTOM`), with no push or
            // pop since.
            Some(epoch) => unsafe { local.forget(epoch, keep) },
            None => local.adopt(),
        }
    }

    /// The thread's state for an outermost dispatch (one that set the
    /// `DISPATCH` bit) that missed the context's cache: made on first use
    /// (an exited thread's adopted), emptied into the current pairing
    /// epoch if it belongs to an older one, and left in the context's
    /// cache (under the registry's key unless the thread is ignored).
    /// `None` while the thread's thread-locals are being destroyed.
    ///
    /// # Safety
    ///
    /// The calling thread holds the `DISPATCH` bit for the call and while
    /// it uses the state: it is inside an outermost dispatch's section
    /// (`rcu::begin_dispatch` or `rcu::begin_exit_dispatch` returned
    /// `true`, or it holds a [`DispatchSection`]), and `c` is its context.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn local_outermost(&self, c: &Context) -> Option<&ShadowStack> {
        // The key before the stack is looked at: if it changes meanwhile,
        // the stack is cached under a key that no longer matches.
        let key = self.locals.key();
        // SAFETY: the caller holds the `DISPATCH` bit: inside its
        // dispatch's section.
        let local = unsafe { self.local_made(key) }?;
        if local.epoch() != key {
            // SAFETY: as above; the state is this thread's in this
            // registry, and this is its outermost dispatch.
            unsafe { self.forget_frames(local, Some(key)) };
        }
        // Read only under the bit, which this dispatch holds. The state
        // always, so that `panicked` finds it for the rest of this
        // dispatch whatever the ignore bit reads later; the key only for a
        // thread that is not ignored (a key of 0 matches no registry), so
        // that an ignored thread's dispatches keep taking the slow path,
        // which sees the bit.
        c.registry_state
            .set((local as *const ShadowStack).cast::<()>());
        c.registry_key
            .set(if recursion::ignored(c) { 0 } else { key });
        Some(local)
    }

    /// The thread's state for a dispatch nested in another: never emptied
    /// (the running dispatch may be building or reading a frame; the next
    /// outermost dispatch empties it) and never cached.
    #[cold]
    fn local_nested(&self, _section: &rcu::ReadGuard) -> Option<&ShadowStack> {
        // SAFETY: inside `_section`.
        unsafe { self.local_made(self.locals.key()) }
    }

    /// The thread's state, made (or adopted) on first use with pairing
    /// epoch `key`.
    ///
    /// # Safety
    ///
    /// The calling thread is inside a read-side section for the call (an
    /// adopted state's frames are ended there: `forget_frames`).
    pub(super) unsafe fn local_made(&self, key: u64) -> Option<&ShadowStack> {
        match self.locals.find() {
            Some(l) => Some(l),
            None => {
                recursion::init_thread();
                self.locals.get_or(
                    || {
                        let slots = self.slots.as_ptr().cast::<()>();
                        ShadowStack::new(self.stack_words, self.slots.len(), slots, key)
                    },
                    // Frames of the exited thread end as unrun.
                    // SAFETY: inside the caller's section; the state is
                    // this thread's in this registry, adopted just now: no
                    // dispatch of the thread reaches it yet, so its outer
                    // bank is free to bump even in a nested dispatch.
                    |s| unsafe { self.forget_frames(s, None) },
                )
            }
        }
    }
}

/// Writes the return entry of attachment `a` whose data words start at
/// word `at` (`shadow.rs`: `[data…, cookie, generation, meta]`).
///
/// # Safety
///
/// Words `at .. at + a.frame_words` are in the calling thread's
/// reservation on its own stack `w`, and no reference to them lives.
#[inline(always)]
unsafe fn write_return_entry(w: Words, at: usize, a: &Attachment) {
    let dw = a.frame_words as usize - 3;
    // SAFETY: the entry's last three words, in the caller's reservation.
    unsafe {
        w.write(at + dw, a.cookie);
        w.write(at + dw + 1, a.generation);
        w.write(at + dw + 2, u64::from(a.slot) | (dw as u64) << 32);
    }
}

/// Writes a frame's header at word `h`, above its `n` return entries:
/// `[addr, n]`, or `[saved, ret_addr, sp, addr, n | TAKES_RETURN]`
/// (`RET`; the first three a [`KeptReturn`]).
///
/// # Safety
///
/// The header's words, `h .. h + HEADER` (and `RETURN_WORDS` more with
/// `RET`), are in the calling thread's reservation on its own stack `w`,
/// and no reference to them lives.
#[inline(always)]
unsafe fn write_header<C, const RET: bool>(w: Words, mut h: usize, n: u64, call: &Call<'_, C>) {
    // SAFETY: the header's words, in the caller's reservation.
    unsafe {
        if RET {
            w.write(h, call.saved);
            w.write(h + 1, call.ret_addr);
            w.write(h + 2, call.sp);
            h += RETURN_WORDS;
        }
        w.write(h, call.addr);
        w.write(h + 1, if RET { n | TAKES_RETURN } else { n });
    }
}

/// A handler of the probe in slot `slot` under `generation` panicked
/// (counted by the caller in `counters`): keeps and prints its first panic
/// (`panics.rs`), finding the probe through the thread's state for the
/// registry, which holds the registry's slots. An outermost dispatch
/// (`counters` is the outer bank) takes that state from the thread's
/// context, where the dispatch left it (the dispatch contract, clause 3),
/// so that its hot path keeps no pointer alive across the handler's call
/// for this; a nested one passes `local`.
///
/// # Safety
///
/// The dispatch contract (module docs) for `local` and `counters`, in a
/// registry of `ProbeSlot<C>`; `slot` is below its slot count.
#[inline(always)]
unsafe fn panicked<C>(counters: CounterView, local: &ShadowStack, slot: u32, generation: u64) {
    let local: *const ShadowStack = match counters.is_nested() {
        true => local,
        false => crate::context::context().registry_state.get().cast(),
    };
    // SAFETY: `local` is the thread's state in the dispatch's registry
    // (the outer bank: the context's `registry_state` is it, clause 3 of
    // the contract), inside the section.
    unsafe { report_panic::<C>(local, slot, generation) };
}

/// [`panicked`] out of line.
///
/// # Safety
///
/// `local` points at the calling thread's state in a registry of
/// `ProbeSlot<C>` that outlives the call, `slot` is below its slot count,
/// and the thread is inside a read-side section.
#[cold]
#[inline(never)]
unsafe fn report_panic<C>(local: *const ShadowStack, slot: u32, generation: u64) {
    // SAFETY: the thread's live state in the registry (the caller's
    // contract).
    let slots = unsafe { (*local).slots }.cast::<super::registry::ProbeSlot<C>>();
    // SAFETY: `slots` is the registry's slot array (`ShadowStack`), alive
    // as long as the registry; `slot` is below its length (the caller's
    // contract).
    let s = unsafe { &*slots.add(slot as usize) };
    // SAFETY: the caller is inside a section (its contract), and the
    // reference lives only in this call.
    if let Some(p) = unsafe { s.probe_of(generation) } {
        // The handle's bits (`ProbeHandle::to_bits`).
        let name = format!("probe {:#x}", generation << 16 | u64::from(slot));
        p.first_panic.caught(&name);
    }
}

/// One function entry as the handlers see it: the function's address, its
/// caller's return address, and, for an entry that takes its return
/// (`RET`), the stack pointer and the word the frame keeps for
/// [`on_return`](Registry::on_return); with the handlers' context.
struct Call<'a, C> {
    addr: u64,
    ret_addr: u64,
    sp: u64,
    saved: u64,
    ctx: &'a C,
}

// By hand: a derive would ask `C: Copy`.
impl<C> Clone for Call<'_, C> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for Call<'_, C> {}

impl<'a, C> Call<'a, C> {
    #[inline(always)]
    fn new(addr: u64, ret_addr: u64, sp: u64, saved: u64, ctx: &'a C) -> Self {
        Self {
            addr,
            ret_addr,
            sp,
            saved,
            ctx,
        }
    }
}

/// Runs probe `p`'s entry handler for attachment `a` (Rust or C; none:
/// `Continue`), counting a panic, which skips the exit, and reporting it
/// (`panicked`).
///
/// # Safety
///
/// The dispatch contract (module docs) for `local` and `counters`, `a`
/// an attachment of that registry and `p` its live probe.
#[inline(always)]
unsafe fn run_entry<C>(
    local: &ShadowStack,
    p: &super::def::Fprobe<C>,
    a: &Attachment,
    counters: CounterView,
    call: &Call<'_, C>,
    data: &mut [u8],
) -> EntryAction {
    let &Call {
        addr,
        ret_addr,
        ctx,
        ..
    } = call;
    match &p.entry {
        Some(entry) => {
            let mut ec = EntryContext {
                addr,
                ret_addr,
                cookie: a.cookie,
                ctx,
                data,
            };
            catch_unwind(AssertUnwindSafe(|| entry(&mut ec))).unwrap_or_else(|payload| {
                // SAFETY: this function's contract.
                unsafe {
                    count(counters, a, Counter::Panics);
                    panicked::<C>(counters, local, a.slot, a.generation);
                }
                super::panics::discard(payload);
                EntryAction::SkipExit
            })
        }
        None => match &p.c_entry {
            Some(h) => call_c_entry(h, addr, ret_addr, a.cookie, ctx, data),
            None => EntryAction::Continue,
        },
    }
}

/// Calls a C entry handler with its context.
#[inline(always)]
fn call_c_entry<C>(
    h: &CHandler<CEntryFn>,
    addr: u64,
    ret_addr: u64,
    cookie: u64,
    ctx: &C,
    data: &mut [u8],
) -> EntryAction {
    let mut c = CEntryContext {
        addr,
        ret_addr,
        cookie,
        engine_ctx: h.engine_ctx(ctx),
        data: match data.is_empty() {
            true => std::ptr::null_mut(),
            false => data.as_mut_ptr().cast::<c_void>(),
        },
        data_size: data.len(),
    };
    // SAFETY: `entry_c`'s contract: callable with `user` and a valid
    // context from this thread.
    match unsafe { (h.f)(h.user, &mut c) } {
        C_SKIP_EXIT => EntryAction::SkipExit,
        _ => EntryAction::Continue,
    }
}

/// Calls a C exit handler with its context.
#[inline(always)]
fn call_c_exit<C>(
    h: &CHandler<CExitFn>,
    addr: u64,
    ret_addr: u64,
    cookie: u64,
    ctx: &C,
    data: &[u8],
) {
    let c = CExitContext {
        addr,
        ret_addr,
        cookie,
        engine_ctx: h.engine_ctx(ctx),
        data: data.as_ptr().cast::<c_void>(),
        data_size: data.len(),
    };
    // SAFETY: `exit_c`'s contract, as for `entry_c`.
    unsafe { (h.f)(h.user, &c) };
}

/// Makes every registry skip probes on the calling thread (`true`) or not
/// (`false`): for an engine's own threads. While ignored, the thread runs
/// no handler, entry or exit, and counts nothing (but the end of a call
/// whose exit it skips, for [`ProbeStats::in_flight`](super::ProbeStats::in_flight));
/// frames are still kept, so entry/exit pairing survives toggling mid-call.
///
/// Not async-signal-safe: call it from the thread's own code (a handler
/// included), not from a signal handler, whose change a nested dispatch it
/// interrupted could overwrite when it restores the thread's recursion
/// word.
///
/// # Examples
///
/// ```
/// fprobe::probe::ignore_current_thread(true);
/// // ... this thread's calls run no probe ...
/// fprobe::probe::ignore_current_thread(false);
/// ```
pub fn ignore_current_thread(ignore: bool) {
    recursion::set_ignored(ignore);
}

/// Whether a probe handler (entry or exit, of any registry) is running on
/// the calling thread: for an engine that must not block or wait for
/// dispatches from inside one ([`Registry::unregister`] and
/// [`Registry::drain`] panic there). Async-signal-safe.
///
/// # Examples
///
/// ```
/// use fprobe::probe::{EntryAction, Fprobe, Registry, in_handler};
///
/// let registry = Registry::<()>::builder().build().unwrap();
/// let probe = Fprobe::builder()
///     .entry(|_| {
///         assert!(in_handler());
///         EntryAction::Continue
///     })
///     .build();
/// registry.register(probe, &[0x1000]).unwrap();
/// registry.on_entry(0x1000, 0, &());
/// registry.on_exit(0, &());
/// assert!(!in_handler());
/// ```
pub fn in_handler() -> bool {
    recursion::in_handler()
}
