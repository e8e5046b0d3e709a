//! The hot path: entry and exit dispatch.
//!
//! An entry is one index lookup (inside the caller's RCU read section), one
//! load of each attached probe's slot state, the handlers, and one frame
//! pushed on the thread's shadow stack holding everything the exit needs
//! (the kernel's fgraph model). An exit pops that frame and never looks
//! the address up again: a probe registered between entry and return has
//! nothing in the frame, and one unregistered since is recognised by its
//! slot's generation. Neither takes a lock, allocates (after the thread's
//! first dispatch through the registry), touches a reference count or
//! writes a line another thread writes. An exit enters no RCU read-side
//! section: the thread's dispatch count for the registry protects the
//! probes it runs (`quiesce.rs`).

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::def::{EntryAction, EntryContext, ExitContext};
use super::ffi::{C_SKIP_EXIT, CEntryContext, CEntryFn, CExitContext, CExitFn, CHandler};
use super::recursion::{self, Entered};
use super::registry::{Attach, Registry, state};
use super::shadow::{HEADER, RETURN_WORDS, ShadowStack, TAKES_RETURN};
use super::stats::{Counter, CounterView};
use crate::rcu;
use crate::sync::Ordering;

/// Counts `which` for the probe of attachment `a` on this thread
/// (`counters`: the view of the thread's counters for the registry).
#[inline(always)]
fn count(counters: CounterView, a: &Attach, which: Counter) {
    // SAFETY: `a.slot` is below the registry's slot count (`Attach`
    // invariant), which every thread's counters are made for; the
    // dispatch holds the thread's state, which owns them.
    unsafe { counters.bump(a.slot, which) }
}

impl<C: Send + Sync + 'static> Registry<C> {
    /// Function entry at `addr`: runs the entry handlers of the probes
    /// attached there, in registration order, and keeps what their exit
    /// handlers need. Call [`on_exit`](Self::on_exit) exactly once when
    /// this call returns.
    #[inline]
    pub fn on_entry(&self, addr: u64, ret_addr: u64, ctx: &C) {
        self.on_entry_in(&rcu::read_lock(), addr, ret_addr, ctx);
    }

    /// [`on_entry`](Self::on_entry) inside a read-side section the caller
    /// already holds (an engine's hook that loaded the registry under it):
    /// saves entering a nested section.
    #[inline]
    pub fn on_entry_in(&self, guard: &rcu::ReadGuard, addr: u64, ret_addr: u64, ctx: &C) {
        self.entry::<true, false>(guard, addr, ret_addr, 0, ctx);
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
        self.entry::<false, false>(&rcu::read_lock(), addr, ret_addr, 0, ctx)
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
        self.entry::<false, true>(&rcu::read_lock(), addr, ret_addr, sp, ctx)
    }

    /// An entry; `MARK`: push a marker when no exit handler is kept (the
    /// caller calls `on_exit` for every entry); `RET`: the frame keeps
    /// `ret_addr` and `sp` for [`on_return`](Self::on_return). Returns
    /// whether a full frame was pushed.
    #[inline(always)]
    fn entry<const MARK: bool, const RET: bool>(
        &self,
        guard: &rcu::ReadGuard,
        addr: u64,
        ret_addr: u64,
        sp: u64,
        ctx: &C,
    ) -> bool {
        let Some(local) = self.enter_local() else {
            return false;
        };
        let attached = self.index.get(addr, guard);
        // `Some(kept)` when the probes ran and `entry_frame` pushed the
        // call's frame (or marker); `None` when nothing ran.
        let framed = if attached.is_empty() {
            None
        } else {
            match recursion::enter() {
                Entered::Run(level) => {
                    // One probe at the address, the usual case: straight-line
                    // code.
                    let kept = match attached {
                        [a] => self.entry_one::<MARK, RET>(local, a, addr, ret_addr, sp, ctx),
                        _ => {
                            self.entry_frame::<MARK, RET>(local, attached, addr, ret_addr, sp, ctx)
                        }
                    };
                    drop(level);
                    Some(kept)
                }
                Entered::Recursion => {
                    for a in attached {
                        count(local.counters.view(), a, Counter::Recursion);
                    }
                    None
                }
                Entered::Ignored => None,
            }
        };
        if MARK && framed.is_none() {
            local.push_marker();
        }
        local.end();
        framed.unwrap_or(false)
    }

    /// [`entry_frame`](Self::entry_frame) for one attachment: the same
    /// steps and counts, without the loop and the bookkeeping of several
    /// return entries.
    #[inline(always)]
    fn entry_one<const MARK: bool, const RET: bool>(
        &self,
        local: &ShadowStack,
        a: &Attach,
        addr: u64,
        ret_addr: u64,
        sp: u64,
        ctx: &C,
    ) -> bool {
        let counters = local.counters.view();
        // SAFETY: `a.slot` indexes `self.slots` (`Attach` invariant).
        let slot = unsafe { self.slots.get_unchecked(a.slot as usize) };
        // Acquire: as in `entry_frame`.
        let s = slot.state.load(Ordering::Acquire);
        // Relaxed: ordered by the Acquire above.
        let p = slot.probe.load(Ordering::Relaxed);
        let p = match s == state(a.generation, true) {
            // SAFETY: as in `entry_frame`.
            true => unsafe { p.as_ref() },
            false => {
                if s == state(a.generation, false) {
                    count(counters, a, Counter::Disabled);
                }
                None
            }
        };
        let Some(p) = p else {
            if MARK {
                local.push_marker();
            }
            return false;
        };
        let header = if RET { HEADER + RETURN_WORDS } else { HEADER };
        let fw = a.frame_words as usize;
        let base = match fw {
            0 => None,
            _ => local.reserve(header + fw),
        };
        let Some(base) = base else {
            // No exit handler, or its frame does not fit.
            count(counters, a, Counter::Hits);
            if fw > 0 {
                count(counters, a, Counter::Depth);
            }
            run_entry(p, a, counters, addr, ret_addr, ctx, &mut []);
            if MARK {
                local.push_marker();
            }
            return false;
        };
        count(counters, a, Counter::Kept);
        let w = local.words();
        // SAFETY: as in `entry_frame`: the data words lie in our
        // reservation, which nothing else references until it is pushed.
        let data = unsafe { w.data_mut(base, p.data_size) };
        match run_entry(p, a, counters, addr, ret_addr, ctx, data) {
            EntryAction::Continue => {
                let (dw, mut h) = (fw - 3, base + fw);
                w.write(base + dw, a.cookie);
                w.write(base + dw + 1, a.generation);
                w.write(base + dw + 2, u64::from(a.slot) | (dw as u64) << 32);
                if RET {
                    w.write(h, ret_addr);
                    w.write(h + 1, sp);
                    h += RETURN_WORDS;
                }
                w.write(h, addr);
                w.write(h + 1, if RET { 1 | TAKES_RETURN } else { 1 });
                // The reservation was exactly the frame: `top` already
                // covers it, and the frame is complete once written.
                true
            }
            EntryAction::SkipExit => {
                count(counters, a, Counter::Unrun);
                if MARK {
                    // The frame shrinks to a marker.
                    w.write(base, 0);
                    local.commit(base, 1);
                } else {
                    local.commit(base, 0);
                }
                false
            }
        }
    }

    /// Runs the entry side of every probe in `attached` and pushes the
    /// call's frame (see `shadow.rs` for the layout and why each step is
    /// safe against a signal handler that dispatches in between).
    #[inline(always)]
    fn entry_frame<const MARK: bool, const RET: bool>(
        &self,
        local: &ShadowStack,
        attached: &[Attach],
        addr: u64,
        ret_addr: u64,
        sp: u64,
        ctx: &C,
    ) -> bool {
        let (w, counters) = (local.words(), local.counters.view());
        let header = if RET { HEADER + RETURN_WORDS } else { HEADER };
        let need = header
            + match attached {
                [a] => a.frame_words as usize,
                _ => attached.iter().map(|a| a.frame_words as usize).sum(),
            };
        // With no exit handler among them only a marker is needed.
        let base = if need > header {
            local.reserve(need)
        } else {
            None
        };
        let (mut used, mut n) = (0usize, 0u64);
        for a in attached {
            // SAFETY: `a.slot` indexes `self.slots` (`Attach` invariant).
            let slot = unsafe { self.slots.get_unchecked(a.slot as usize) };
            // Acquire: pairs with the Release state store of
            // `register_with_cookies`; the probe's fields are visible.
            let s = slot.state.load(Ordering::Acquire);
            if s != state(a.generation, true) {
                if s == state(a.generation, false) {
                    count(counters, a, Counter::Disabled);
                }
                continue; // disabled, or being unregistered
            }
            // Relaxed: ordered by the Acquire above.
            let p = slot.probe.load(Ordering::Relaxed);
            // SAFETY: the generation matched inside our read section, so
            // `unregister` has not passed its grace period, and it frees the
            // probe only after it: the probe lives until we leave the section.
            let Some(p) = (unsafe { p.as_ref() }) else {
                continue;
            };
            // One count per hit: `Kept` for a hit that gets a return entry
            // (it ends in `Exits` or `Unrun`), `Hits` for the others.
            let keep = match base {
                Some(base) if a.frame_words > 0 => {
                    count(counters, a, Counter::Kept);
                    Some(base + used)
                }
                _ => {
                    count(counters, a, Counter::Hits);
                    if a.frame_words > 0 {
                        count(counters, a, Counter::Depth);
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
            let action = run_entry(p, a, counters, addr, ret_addr, ctx, data);
            match (keep, action) {
                (Some(at), EntryAction::Continue) => {
                    let dw = a.frame_words as usize - 3;
                    w.write(at + dw, a.cookie);
                    w.write(at + dw + 1, a.generation);
                    w.write(at + dw + 2, u64::from(a.slot) | (dw as u64) << 32);
                    used += a.frame_words as usize;
                    n += 1;
                }
                // The entry handler skipped the exit (or panicked): the
                // return entry ends here, its exit unrun.
                (Some(_), EntryAction::SkipExit) => count(counters, a, Counter::Unrun),
                (None, _) => {}
            }
        }
        match base {
            Some(base) if n > 0 => {
                let mut h = base + used;
                if RET {
                    w.write(h, ret_addr);
                    w.write(h + 1, sp);
                    h += RETURN_WORDS;
                }
                w.write(h, addr);
                w.write(h + 1, if RET { n | TAKES_RETURN } else { n });
                local.commit(base, used + header);
                true
            }
            Some(base) if MARK => {
                // Reserved, nothing kept: the frame shrinks to a marker.
                w.write(base, 0);
                local.commit(base, 1);
                false
            }
            Some(base) => {
                // Reserved, nothing kept, no marker wanted: given back.
                local.commit(base, 0);
                false
            }
            None => {
                if MARK {
                    local.push_marker();
                }
                false
            }
        }
    }

    /// Function return: runs the exit handlers kept by the matching
    /// [`on_entry`](Self::on_entry), newest first, skipping probes
    /// unregistered since. Never looks the address up again: a probe
    /// registered between entry and return has nothing kept for this call.
    /// Exit handlers run outside any RCU read-side section (see
    /// [`ExitContext`]).
    #[inline]
    pub fn on_exit(&self, ret_addr: u64, ctx: &C) {
        let Some(local) = self.enter_local() else {
            return;
        };
        if let Some(top) = local.pop() {
            // The count `enter_local` raised is this exit's read-side
            // marker (`quiesce.rs`): ordered before the state loads of
            // `exit_frame`.
            local.active.order_exit(self.asymmetric);
            let base = self.exit_frame::<false, true>(local, top, ret_addr, ctx);
            local.release(base);
        }
        local.end();
    }

    /// [`on_exit`](Self::on_exit) for a caller inside a read-side section:
    /// the same (an exit needs no section of its own), kept beside
    /// [`on_entry_in`](Self::on_entry_in).
    #[inline]
    pub fn on_exit_in(&self, _guard: &rcu::ReadGuard, ret_addr: u64, ctx: &C) {
        self.on_exit(ret_addr, ctx);
    }

    /// The return of a call whose entry took it over
    /// ([`on_entry_taking_return`](Self::on_entry_taking_return) returned
    /// `true` with this `sp`): runs the exit handlers kept for it, newest
    /// first, and returns the caller's return address kept with them.
    ///
    /// Frames above it are of calls that never returned: calls whose
    /// return was taken and kept at a lower `sp` (a `longjmp` or an
    /// exception went past them) have their exit handlers run first, with
    /// this call's context; plain entries whose `on_exit` never came end
    /// without theirs. `None` when no frame kept at `sp` is found (the
    /// calls did not nest, or the thread's state is being destroyed):
    /// the return address is lost.
    ///
    /// # Examples
    ///
    /// See [`on_entry_taking_return`](Self::on_entry_taking_return).
    #[inline]
    pub fn on_return(&self, sp: u64, ctx: &C) -> Option<u64> {
        let local = self.enter_local()?;
        // As in `on_exit`: the dispatch count is the read-side marker.
        local.active.order_exit(self.asymmetric);
        let ret = loop {
            let t = local.top();
            if t == 0 {
                break None;
            }
            let word = local.read(t - 1);
            // The frame's base, and the return address when the frame
            // is ours.
            let (base, ours) = if word & TAKES_RETURN == 0 {
                // A plain entry's frame above ours, its exit never
                // dispatched: it ends unrun.
                let base = match word {
                    0 => t - 1,
                    _ => self.exit_frame::<false, false>(local, t, 0, ctx),
                };
                (base, None)
            } else {
                let at = local.read(t - HEADER - 1);
                if at > sp {
                    break None; // a frame of a caller's call: ours is gone
                }
                let ret = local.read(t - HEADER - 2);
                let base = self.exit_frame::<true, true>(local, t, ret, ctx);
                (base, (at == sp).then_some(ret))
            };
            local.release(base);
            local.end_overflows();
            if ours.is_some() {
                break ours;
            }
        };
        local.end();
        ret
    }

    /// Runs the exit handlers of the full frame below `top` (`RET`: one
    /// that took a return; `RUN`: `false` to end its calls unrun instead);
    /// returns the frame's base.
    #[inline(always)]
    fn exit_frame<const RET: bool, const RUN: bool>(
        &self,
        local: &ShadowStack,
        top: usize,
        ret_addr: u64,
        ctx: &C,
    ) -> usize {
        let w = local.words();
        // A plain frame's top word has no flag to clear (`pop` saw to it).
        let n = match RET {
            true => w.read(top - 1) & !TAKES_RETURN,
            false => w.read(top - 1),
        };
        let entries = if RET {
            top - HEADER - RETURN_WORDS
        } else {
            top - HEADER
        };
        let level = match (RUN, recursion::enter()) {
            (true, Entered::Run(level)) => level,
            (_, entered) => {
                let recursion = RUN && matches!(entered, Entered::Recursion);
                return self.end_unrun(local, entries, n, recursion);
            }
        };
        let addr = w.read(top - 2);
        let p = match n {
            // One probe, the usual case: no loop.
            1 => self.exit_entry(local, entries, addr, ret_addr, ctx),
            _ => {
                let mut p = entries;
                for _ in 0..n {
                    p = self.exit_entry(local, p, addr, ret_addr, ctx);
                }
                p
            }
        };
        drop(level);
        p
    }

    /// Runs the exit handler of the return entry ending at word `p` (below
    /// the stack's `top`) unless its probe was unregistered since the
    /// entry; returns where the entry starts.
    #[inline(always)]
    fn exit_entry(
        &self,
        local: &ShadowStack,
        p: usize,
        addr: u64,
        ret_addr: u64,
        ctx: &C,
    ) -> usize {
        let w = local.words();
        let meta = w.read(p - 1);
        let generation = w.read(p - 2);
        let cookie = w.read(p - 3);
        let (slot_idx, dw) = (meta as u32, (meta >> 32) as usize);
        let data_at = p - 3 - dw;
        debug_assert!((slot_idx as usize) < self.slots.len());
        // SAFETY: the entry wrote `slot_idx` from an `Attach` (below the
        // slot count, `Attach` invariant) into a frame nothing else writes
        // (shadow.rs: `top` covers every word in use).
        let slot = unsafe { self.slots.get_unchecked(slot_idx as usize) };
        // Acquire: pairs with the Release state store of
        // `register_with_cookies`; the probe pointer is visible. Ordered
        // after this dispatch's count by `order_exit` (`quiesce.rs`).
        if slot.state.load(Ordering::Acquire) >> 1 != generation {
            // Unregistered since the entry: its counts are gone with it
            // (an `Unrun` here would land on the slot's next probe).
            return data_at;
        }
        let bump = |which| {
            // SAFETY: `slot_idx` indexes `self.slots` (above), and every
            // thread's counters cover its length.
            unsafe { local.counters.view().bump(slot_idx, which) }
        };
        // Relaxed: ordered by the Acquire above.
        let fp = slot.probe.load(Ordering::Relaxed);
        // SAFETY: the generation matched after this thread's dispatch count
        // was raised and ordered (`order_exit`), so `unregister` (which
        // changes the generation, runs its barrier, then waits for the
        // dispatches it saw running on each thread to end before it frees
        // the probe) has not freed it, and cannot until this dispatch ends
        // (`quiesce.rs`). A kept entry always has its probe and an exit
        // handler.
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
            Err(_) => {
                bump(Counter::Panics);
                bump(Counter::Unrun);
            }
        }
        data_at
    }

    /// Ends the `n` return entries below word `entries` without running
    /// their exit handlers (an ignored thread, a recursive exit, or frames
    /// dropped by `on_return`), counting `Unrun` (and `Recursion` if
    /// `recursion`) for those whose probe is still registered; returns the
    /// frame's base.
    #[cold]
    #[inline(never)]
    fn end_unrun(&self, local: &ShadowStack, entries: usize, n: u64, recursion: bool) -> usize {
        let w = local.words();
        let mut p = entries;
        for _ in 0..n {
            let meta = w.read(p - 1);
            let generation = w.read(p - 2);
            let (slot_idx, dw) = (meta as u32, (meta >> 32) as usize);
            p -= 3 + dw;
            let Some(slot) = self.slots.get(slot_idx as usize) else {
                continue;
            };
            // Acquire: as in `exit_entry`.
            if slot.state.load(Ordering::Acquire) >> 1 != generation {
                continue;
            }
            // SAFETY: `slot_idx` indexes `self.slots` (checked above).
            unsafe {
                if recursion {
                    local.counters.view().bump(slot_idx, Counter::Recursion);
                }
                local.counters.view().bump(slot_idx, Counter::Unrun);
            }
        }
        p
    }

    /// Empties a stack of an older pairing epoch, down to its topmost
    /// frame that took a return, or one adopted from an exited thread
    /// (`epoch == None`) entirely: the return entries it drops end as
    /// `Unrun`, so that `in_flight` counts only calls that can still
    /// return.
    #[cold]
    #[inline(never)]
    pub(super) fn forget_frames(&self, local: &ShadowStack, epoch: Option<u64>) {
        // A pairing reset keeps the calls whose return was taken.
        let keep = epoch.map_or(0, |_| local.kept_by_reset());
        {
            // The generation check and the count inside one section: an
            // `unregister` that changes the generation waits for it, so the
            // count never lands on the slot's next probe.
            let _section = rcu::read_lock();
            local.each_return_entry(keep, |slot_idx, generation| {
                let Some(slot) = self.slots.get(slot_idx as usize) else {
                    return;
                };
                // Acquire: as in `exit_frame`.
                if slot.state.load(Ordering::Acquire) >> 1 == generation {
                    // SAFETY: `slot_idx` indexes `self.slots` (checked).
                    unsafe { local.counters.bump(slot_idx, Counter::Unrun) };
                }
            });
        }
        match epoch {
            Some(epoch) => local.forget(epoch, keep),
            None => local.adopt(),
        }
    }
}

/// Runs probe `p`'s entry handler for attachment `a` (Rust or C; none:
/// `Continue`), counting a panic, which skips the exit.
#[inline(always)]
fn run_entry<C>(
    p: &super::def::Fprobe<C>,
    a: &Attach,
    counters: CounterView,
    addr: u64,
    ret_addr: u64,
    ctx: &C,
    data: &mut [u8],
) -> EntryAction {
    match &p.entry {
        Some(entry) => {
            let mut ec = EntryContext {
                addr,
                ret_addr,
                cookie: a.cookie,
                ctx,
                data,
            };
            catch_unwind(AssertUnwindSafe(|| entry(&mut ec))).unwrap_or_else(|_| {
                count(counters, a, Counter::Panics);
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
