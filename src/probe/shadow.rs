//! One thread's dispatch state for one registry: its shadow stack of call
//! frames (the kernel's fgraph return stack) and its counters.
//!
//! # Frame layout
//!
//! The stack is an array of 64-bit words; `top` counts the words in use.
//! Every `on_entry` pushes one frame and the matching `on_exit` pops it:
//!
//! * a call that keeps nothing for its exit pushes a one-word **marker**,
//!   `[0]`;
//! * a call with `n ≥ 1` exit handlers to run pushes, from low to high
//!   addresses, `n` **return entries** and then `[addr, n]`. A return entry
//!   is `[data…, cookie, generation, meta]`: the probe's per-call data
//!   (`dw` words), the cookie of its attachment, the generation of its
//!   slot at entry, and `meta = slot | dw << 32`. The top word tells the
//!   exit what to read, newest entry first, and where the frame starts;
//! * a call whose entry took its return over (an engine that replaces the
//!   return address, `Registry::on_entry_taking_return`) and kept `n ≥ 1`
//!   return entries pushes them, then `[ret_addr, sp, addr, n |
//!   TAKES_RETURN]`: the caller's return address and where the engine
//!   found it, which only `Registry::on_return` pops and hands back. Such
//!   a call pushes nothing when it keeps no return entry.
//!
//! A pairing reset keeps every frame up to the topmost one that took a
//! return (those calls still return through their engine, which needs its
//! return address back) and drops the frames above it.
//!
//! Calls whose frame does not fit are counted in `overflow` instead (the
//! innermost calls, so their exits come first and pop the count). A
//! return taken over that pops a frame ends them too
//! ([`ShadowStack::end_overflows`]): they are deeper than every frame.
//!
//! # Signal safety
//!
//! A signal handler may dispatch between any two instructions of a push
//! or a pop. Its own pushes and pops are balanced, so the invariant that
//! makes this safe is:
//!
//! **`top` covers every word in use.** A push raises `top` over the words
//! it is about to write *before* writing them (reserving the most its
//! frame can take, then lowering `top` to what it used); a pop lowers
//! `top` only *after* its last read of the frame, exit handlers included.
//! A nested dispatch therefore only writes above `top`, never into a
//! frame being built or read, and leaves `top` and `overflow` as it found
//! them. Each store of `top` is separated from the frame accesses it
//! orders by a compiler fence (a signal handler runs on the same thread:
//! program order is all it needs, no hardware fence). A stack of an older
//! pairing epoch is emptied only by a dispatch that found no other of its
//! registry running on the thread (`active`), so never under a frame
//! being built or read.
//!
//! The counters take one-instruction increments ([`Counters::bump`]), so
//! a nested increment is never lost either.

use std::cell::Cell;
use std::ptr::NonNull;

use super::quiesce::Activity;
use super::stats::Counters;
use crate::sync::{Ordering, compiler_fence};

/// Words of a full frame's header (`[addr, n]`).
pub(super) const HEADER: usize = 2;
/// Words a frame that took a return adds below its header (`[ret_addr, sp]`).
pub(super) const RETURN_WORDS: usize = 2;
/// Set in the top word of a frame that took a return (the sign bit, which
/// [`ShadowStack::pop`] relies on).
pub(super) const TAKES_RETURN: u64 = 1 << 63;

/// One thread's state for one registry.
pub(super) struct ShadowStack {
    /// Words of `stack` in use. Owner-only.
    top: Cell<usize>,
    /// Calls whose frame did not fit, popped before any frame. Owner-only.
    overflow: Cell<usize>,
    /// Dispatches of this registry running on this thread (more than one
    /// only when a handler or a signal handler dispatched inside one):
    /// stored by the owner only, read by `unregister` (`quiesce.rs`).
    pub(super) active: Activity,
    /// The registry's pairing epoch this stack belongs to (a key of the
    /// registry's `locals`). Owner-only.
    epoch: Cell<u64>,
    /// `cap` words from `Box<[u64]>::into_raw`. Owner-only.
    stack: NonNull<u64>,
    cap: usize,
    /// Shared: loaded by `Registry::stats` on any thread.
    pub(super) counters: Counters,
}

// SAFETY: every field but `counters` and `active` is used by the owning
// thread only (the `PerThread` invariant: one owner at a time, handed over
// under the index allocator's mutex); `counters` and `active` are atomics
// stored by the owner only and loaded by anyone.
unsafe impl Sync for ShadowStack {}
// SAFETY: the stack is a plain heap allocation owned by `ShadowStack`.
unsafe impl Send for ShadowStack {}

impl Drop for ShadowStack {
    fn drop(&mut self) {
        // SAFETY: from `Box<[u64]>::into_raw` with `cap` words, freed once.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.stack.as_ptr(),
                self.cap,
            ))
        });
    }
}

impl ShadowStack {
    pub(super) fn new(words: usize, slots: usize, epoch: u64) -> Self {
        let stack: Box<[u64]> = vec![0; words.max(1)].into_boxed_slice();
        let cap = stack.len();
        Self {
            top: Cell::new(0),
            overflow: Cell::new(0),
            active: Activity::new(),
            epoch: Cell::new(epoch),
            // SAFETY: a boxed slice's pointer is non-null.
            stack: unsafe { NonNull::new_unchecked(Box::into_raw(stack).cast::<u64>()) },
            cap,
            counters: Counters::new(slots),
        }
    }

    /// Taken over from an exited thread: its frames are meaningless here.
    pub(super) fn adopt(&self) {
        self.top.set(0);
        self.overflow.set(0);
        self.active.reset();
    }

    /// Starts a dispatch. Returns whether it is the outermost one of this
    /// registry on the thread: only then may the stack be emptied
    /// ([`forget`](Self::forget)); otherwise another dispatch's frame is
    /// being built or read.
    #[inline(always)]
    pub(super) fn begin(&self) -> bool {
        self.active.begin()
    }

    /// The pairing epoch the stack belongs to.
    #[inline(always)]
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.get()
    }

    /// Empties the stack into pairing epoch `epoch` (after
    /// [`begin`](Self::begin) said so), down to `keep` words
    /// ([`kept_by_reset`](Self::kept_by_reset)).
    pub(super) fn forget(&self, epoch: u64, keep: usize) {
        self.top.set(keep);
        self.overflow.set(0);
        self.epoch.set(epoch);
    }

    /// Words a pairing reset keeps: up to the end of the topmost frame
    /// that took a return, 0 when none did.
    pub(super) fn kept_by_reset(&self) -> usize {
        let mut t = self.top.get().min(self.cap);
        while t > 0 {
            let word = self.read(t - 1);
            if word & TAKES_RETURN != 0 {
                return t;
            }
            match self.frame_base(t, |_, _| ()) {
                Some(base) => t = base,
                None => return 0,
            }
        }
        0
    }

    /// Calls `f(slot, generation)` for every return entry on the stack
    /// above word `from`, newest first. Stops at a frame that does not
    /// parse. Only the stack of a thread that exited inside a dispatch can
    /// hold a torn frame; its stale words may also parse, and then be
    /// counted.
    pub(super) fn each_return_entry(&self, from: usize, mut f: impl FnMut(u32, u64)) {
        let mut t = self.top.get().min(self.cap);
        while t > from {
            match self.frame_base(t, &mut f) {
                Some(base) => t = base,
                None => return,
            }
        }
    }

    /// The base of the frame ending at word `t` (`0 < t ≤ min(top, cap)`),
    /// calling `f(slot, generation)` for each of its return entries,
    /// newest first; `None` when it does not parse.
    fn frame_base(&self, t: usize, mut f: impl FnMut(u32, u64)) -> Option<usize> {
        let word = self.read(t - 1);
        if word == 0 {
            return Some(t - 1);
        }
        let header = if word & TAKES_RETURN != 0 {
            HEADER + RETURN_WORDS
        } else {
            HEADER
        };
        let mut p = t.checked_sub(header)?;
        for _ in 0..word & !TAKES_RETURN {
            let below = p.checked_sub(3)?;
            let meta = self.read(p - 1);
            let generation = self.read(p - 2);
            let next = below.checked_sub((meta >> 32) as usize)?;
            f(meta as u32, generation);
            p = next;
        }
        Some(p)
    }

    /// Ends a dispatch started by [`begin`](Self::begin).
    #[inline(always)]
    pub(super) fn end(&self) {
        self.active.end();
    }

    /// Reserves `words` above `top` if they fit; returns the frame's base.
    #[inline(always)]
    pub(super) fn reserve(&self, words: usize) -> Option<usize> {
        let base = self.top.get();
        if words > self.cap - base {
            return None;
        }
        self.top.set(base + words);
        // The reservation is in memory before any write into it.
        compiler_fence(Ordering::SeqCst);
        Some(base)
    }

    /// Ends a frame reserved at `base`: `top` becomes `base + words`
    /// (`words` at most the reservation, all written).
    #[inline(always)]
    pub(super) fn commit(&self, base: usize, words: usize) {
        // The frame's words are in memory before `top` stops covering the
        // rest of the reservation.
        compiler_fence(Ordering::SeqCst);
        self.top.set(base + words);
    }

    /// Pushes a marker frame, or counts an overflow.
    #[inline(always)]
    pub(super) fn push_marker(&self) {
        match self.reserve(1) {
            Some(base) => self.write(base, 0),
            None => self.overflow.set(self.overflow.get() + 1),
        }
    }

    /// Word `i` (below `top`).
    #[inline(always)]
    pub(super) fn read(&self, i: usize) -> u64 {
        self.words().read(i)
    }

    /// Writes word `i` (reserved by the caller).
    #[inline(always)]
    pub(super) fn write(&self, i: usize, v: u64) {
        self.words().write(i, v);
    }

    /// The stack's words, for a dispatch to keep in a register: accesses
    /// through it need not reload the stack's address after each compiler
    /// fence or counter increment.
    #[inline(always)]
    pub(super) fn words(&self) -> Words {
        Words {
            stack: self.stack,
            #[cfg(debug_assertions)]
            cap: self.cap,
        }
    }

    /// Pops a plain exit: `Some(top)` when the top frame is a full frame
    /// of a plain entry (the caller reads it, then
    /// [`release`](Self::release)s it), `None` when there was nothing to
    /// run (an overflow, a marker, or an empty stack: an exit with no
    /// matching entry) or the top frame took a return (it stays for
    /// `Registry::on_return`).
    #[inline(always)]
    pub(super) fn pop(&self) -> Option<usize> {
        let overflow = self.overflow.get();
        if overflow > 0 {
            self.overflow.set(overflow - 1);
            return None;
        }
        let t = self.top.get();
        if t == 0 {
            return None;
        }
        let word = self.read(t - 1);
        // One test for both cases (`TAKES_RETURN` is the sign bit).
        if (word as i64) <= 0 {
            if word == 0 {
                // The marker is read before `top` gives its word up (a
                // signal handler may reuse it at once).
                compiler_fence(Ordering::SeqCst);
                self.top.set(t - 1);
            }
            // Only `on_return` pops a frame that took a return.
            return None;
        }
        Some(t)
    }

    /// Ends the calls counted in `overflow`: a call below them returned
    /// (`Registry::on_return` popped a frame), so they are over, and their
    /// exits, if any come, find nothing to pop. Without this a later exit
    /// of a call that fits would pop the count instead of its frame.
    #[inline(always)]
    pub(super) fn end_overflows(&self) {
        self.overflow.set(0);
    }

    /// Words in use.
    #[inline(always)]
    pub(super) fn top(&self) -> usize {
        self.top.get()
    }

    /// Releases the frame from `base` up: `top` becomes `base`, after
    /// every read of the frame.
    #[inline(always)]
    pub(super) fn release(&self, base: usize) {
        compiler_fence(Ordering::SeqCst);
        self.top.set(base);
    }
}

/// The words of one thread's stack ([`ShadowStack::words`]): owner-only
/// memory, so the owner may read and write any word below `cap`.
#[derive(Clone, Copy)]
pub(super) struct Words {
    stack: NonNull<u64>,
    #[cfg(debug_assertions)]
    cap: usize,
}

impl Words {
    /// Word `i` (below `top`).
    #[inline(always)]
    pub(super) fn read(self, i: usize) -> u64 {
        #[cfg(debug_assertions)]
        debug_assert!(i < self.cap);
        // SAFETY: `i < cap` (the callers index below `top` or their own
        // reservation); owner-only memory, no reference to it lives.
        unsafe { self.stack.as_ptr().add(i).read() }
    }

    /// Writes word `i` (reserved by the caller).
    #[inline(always)]
    pub(super) fn write(self, i: usize, v: u64) {
        #[cfg(debug_assertions)]
        debug_assert!(i < self.cap);
        // SAFETY: as in `read`.
        unsafe { self.stack.as_ptr().add(i).write(v) }
    }

    /// `len` bytes from word `i` as per-call data, for an entry handler.
    ///
    /// # Safety
    ///
    /// Words `i .. i + ceil(len / 8)` are reserved by the caller's frame
    /// and nothing else references them while the slice lives.
    #[inline(always)]
    pub(super) unsafe fn data_mut<'a>(self, i: usize, len: usize) -> &'a mut [u8] {
        #[cfg(debug_assertions)]
        debug_assert!(i * 8 + len <= self.cap * 8);
        // SAFETY: in bounds and unaliased, by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.stack.as_ptr().add(i).cast::<u8>(), len) }
    }

    /// As [`data_mut`](Self::data_mut), shared, for an exit handler.
    ///
    /// # Safety
    ///
    /// As [`data_mut`](Self::data_mut).
    #[inline(always)]
    pub(super) unsafe fn data<'a>(self, i: usize, len: usize) -> &'a [u8] {
        // SAFETY: as in `data_mut`.
        unsafe { self.data_mut(i, len) }
    }
}
