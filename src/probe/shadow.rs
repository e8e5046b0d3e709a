//! One thread's dispatch state for one registry: its shadow stack of call
//! frames (the kernel's fgraph return stack) and its counters.
//!
//! # Frame layout
//!
//! The stack is an array of 64-bit words. `top` is the index of the
//! **bare word**: the number of calls above the topmost frame that kept
//! nothing on the stack (no exit handler to run, or a frame that did not
//! fit). Every `on_entry` adds one call and the matching `on_exit` takes
//! it off:
//!
//! * a call that keeps nothing adds one to the bare word, and its exit
//!   takes one off;
//! * a call with `n ≥ 1` exit handlers to run pushes a **frame** above the
//!   bare word, from low to high addresses `n` **return entries** and then
//!   `[addr, n]`, and a new bare word (0) above it: `top` moves there. A
//!   return entry is `[data…, cookie, generation, meta]`: the probe's
//!   per-call data (`dw` words), the cookie of its attachment, the
//!   generation of its slot at entry, and `meta = slot | dw << 32`. The
//!   word below `top` tells the exit what to read, newest entry first,
//!   and where the frame starts; the bare word below the frame is the
//!   count of the calls below it, back in force once the frame is popped
//!   (`top` moves down to it);
//! * a call whose entry took its return over (an engine that replaces the
//!   return address, `Registry::on_entry_taking_return`) and kept `n ≥ 1`
//!   return entries pushes them, then `[saved, ret_addr, sp, addr, n |
//!   TAKES_RETURN]`: a word the engine keeps there (a register's value),
//!   the caller's return address and where the engine found it, which
//!   only `Registry::on_return` pops and hands back. Such a call adds
//!   nothing when it keeps no return entry. The first three words are the
//!   engine's [`KeptReturn`](super::KeptReturn), which it may read in
//!   place until the return: the stack is one allocation that never
//!   moves, and nothing but that return (or an unwind found past it)
//!   pops the frame.
//!
//! A pairing reset keeps every frame up to the topmost one that took a
//! return (those calls still return through their engine, which needs its
//! return address back) and drops the frames and bare calls above it. A
//! return taken over that pops its frame drops the bare calls above it
//! too: they are deeper, and their exits, if any come, find nothing.
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
//! A nested dispatch therefore only writes at or above `top`, never into
//! a frame being built or read, and leaves `top` as it found it. It does
//! use the word at `top` as its bare word: a push that has raised `top`
//! writes the new bare word (0) after the raise, so a nested dispatch in
//! between may count on a word not yet written, but its counts are
//! balanced (one up, one down) and the push's store comes after them.
//! Each store of `top` is separated from the frame accesses it orders by
//! a compiler fence (a signal handler runs on the same thread: program
//! order is all it needs, no hardware fence). A stack of an older pairing
//! epoch is emptied only by an outermost dispatch (one that set the
//! thread's `DISPATCH` bit), so never under a frame being built or read.

use std::cell::Cell;
use std::ptr::NonNull;

use super::stats::Counters;
use crate::sync::{Ordering, compiler_fence};

/// Words of a full frame's header (`[addr, n]`).
pub(super) const HEADER: usize = 2;
/// Words a frame that took a return adds below its header (`[saved,
/// ret_addr, sp]`, a [`KeptReturn`](super::KeptReturn)).
pub(super) const RETURN_WORDS: usize = 3;
/// Set in the top word of a frame that took a return (the sign bit, which
/// [`ShadowStack::pop_frame`] relies on).
pub(super) const TAKES_RETURN: u64 = 1 << 63;
/// The bare word of an empty stack. Word 0 below it is always 0, a top
/// word no frame has (every frame keeps at least one return entry), so
/// one sign test tells a plain frame from the bottom and from a frame
/// that took a return.
pub(super) const BOTTOM: usize = 1;

/// One thread's state for one registry.
pub(super) struct ShadowStack {
    /// Index of the bare word (module docs); at least [`BOTTOM`], below
    /// `cap`. Owner-only.
    top: Cell<usize>,
    /// The registry's pairing epoch this stack belongs to (a key of the
    /// registry's `locals`). Owner-only.
    epoch: Cell<u64>,
    /// `cap` words from `Box<[u64]>::into_raw`. Owner-only.
    stack: NonNull<u64>,
    cap: usize,
    /// `cap - 1`, the highest index a bare word may have.
    last: usize,
    /// Shared: loaded by `Registry::stats` on any thread.
    pub(super) counters: Counters,
    /// The registry's probe slots (`Registry::slots`, which outlive every
    /// thread's state), untyped: for the cold path that reports a
    /// handler's panic without the registry at hand.
    pub(super) slots: *const (),
}

// SAFETY: every field but `counters` and `slots` is used by the owning
// thread only (the `PerThread` invariant: one owner at a time, handed over
// under the index allocator's mutex); `counters` are atomics stored by the
// owner only and loaded by anyone; `slots` is immutable and points to the
// registry's slots, which are `Sync`.
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
    pub(super) fn new(words: usize, slots: usize, slots_at: *const (), epoch: u64) -> Self {
        // At least word 0 and the bare word; zeroed, so word 0 is 0 and
        // the bare count starts at 0.
        let stack: Box<[u64]> = vec![0; words.max(BOTTOM + 1)].into_boxed_slice();
        let cap = stack.len();
        Self {
            top: Cell::new(BOTTOM),
            epoch: Cell::new(epoch),
            // SAFETY: a boxed slice's pointer is non-null.
            stack: unsafe { NonNull::new_unchecked(Box::into_raw(stack).cast::<u64>()) },
            cap,
            last: cap - 1,
            counters: Counters::new(slots),
            slots: slots_at,
        }
    }

    /// Taken over from an exited thread: its frames are meaningless here.
    pub(super) fn adopt(&self) {
        self.top.set(BOTTOM);
        // SAFETY: `BOTTOM < cap` (`new` makes at least `BOTTOM + 1` words);
        // the stack is its owner's (the adopting thread's).
        unsafe { self.write(BOTTOM, 0) };
    }

    /// The pairing epoch the stack belongs to.
    #[inline(always)]
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.get()
    }

    /// Empties the stack into pairing epoch `epoch` (by an outermost
    /// dispatch only), down to the bare word at `keep`
    /// ([`kept_by_reset`](Self::kept_by_reset)), whose calls it drops.
    ///
    /// # Safety
    ///
    /// Called by the owning thread, with `keep` what `kept_by_reset`
    /// returned (or [`BOTTOM`]) with no push or pop since: a bare word at
    /// most `top`, so below `cap`.
    pub(super) unsafe fn forget(&self, epoch: u64, keep: usize) {
        self.top.set(keep);
        // SAFETY: `keep < cap` and the stack is ours (the caller's
        // contract).
        unsafe { self.write(keep, 0) };
        self.epoch.set(epoch);
    }

    /// Where a pairing reset cuts the stack: the bare word above the
    /// topmost frame that took a return, [`BOTTOM`] when none did.
    pub(super) fn kept_by_reset(&self) -> usize {
        let mut t = self.top.get().min(self.last);
        while t > BOTTOM {
            // SAFETY: `BOTTOM < t <= last < cap`: `t - 1` is a word of the
            // stack.
            if unsafe { self.read(t - 1) } & TAKES_RETURN != 0 {
                return t;
            }
            // SAFETY: `BOTTOM < t < cap`, and `frame_base` returns a lower
            // bare word.
            match unsafe { self.frame_base(t, |_, _| ()) } {
                Some(base) => t = base,
                None => return BOTTOM,
            }
        }
        BOTTOM
    }

    /// Calls `f(slot, generation)` for every return entry on the stack
    /// above the bare word `from` (at least [`BOTTOM`]), newest first. Stops at a frame that
    /// does not parse. Only the stack of a thread that exited inside a
    /// dispatch can hold a torn frame; its stale words may also parse, and
    /// then be counted.
    pub(super) fn each_return_entry(&self, from: usize, mut f: impl FnMut(u32, u64)) {
        let mut t = self.top.get().min(self.last);
        while t > from.max(BOTTOM) {
            // SAFETY: `BOTTOM < t <= last < cap`, and `frame_base` returns a
            // lower bare word.
            match unsafe { self.frame_base(t, &mut f) } {
                Some(base) => t = base,
                None => return,
            }
        }
    }

    /// The bare word below the frame under the bare word `t`, calling
    /// `f(slot, generation)` for each of its return entries, newest first;
    /// `None` when it does not parse.
    ///
    /// # Safety
    ///
    /// `BOTTOM < t < cap`, on the owning thread.
    unsafe fn frame_base(&self, t: usize, mut f: impl FnMut(u32, u64)) -> Option<usize> {
        // SAFETY: every word read here is below `t < cap` (the subtractions
        // are checked), and the stack is ours: the caller's contract.
        let word = unsafe { self.read(t - 1) };
        let header = if word & TAKES_RETURN != 0 {
            HEADER + RETURN_WORDS
        } else {
            HEADER
        };
        let mut p = t.checked_sub(header + 1)? + 1;
        for _ in 0..word & !TAKES_RETURN {
            let below = p.checked_sub(3)?;
            // SAFETY: as above; `3 <= p < t`.
            let (meta, generation) = unsafe { (self.read(p - 1), self.read(p - 2)) };
            let next = below.checked_sub((meta >> 32) as usize)?;
            f(meta as u32, generation);
            p = next;
        }
        p.checked_sub(1)
    }

    /// Reserves a frame of `words` words above the bare word, with a new
    /// bare word (0) above it, if they fit; returns the frame's first word.
    #[inline(always)]
    pub(super) fn reserve(&self, words: usize) -> Option<usize> {
        let t = self.top.get();
        // The new bare word, `t + 1 + words`, at most `last`.
        if t + words >= self.last {
            return None;
        }
        let at = t + 1;
        self.top.set(at + words);
        // The reservation is in memory before any write into it.
        compiler_fence(Ordering::SeqCst);
        // SAFETY: `at + words = t + 1 + words <= last < cap`, checked
        // above; the stack is its owner's, the dispatching thread's.
        unsafe { self.write(at + words, 0) };
        Some(at)
    }

    /// Shrinks a frame reserved at `at` to its first `words` words (at
    /// least one, all written), with its bare word above them.
    ///
    /// # Safety
    ///
    /// Called by the owning thread; `at` is what [`reserve`](Self::reserve)
    /// returned for this frame, which `words` does not exceed, and `top`
    /// has not moved since (nested dispatches leave it as they find it).
    #[inline(always)]
    pub(super) unsafe fn commit(&self, at: usize, words: usize) {
        // SAFETY: `at + words` is at most the reservation's bare word,
        // below `cap` (the caller's contract).
        unsafe { self.write(at + words, 0) };
        // The frame's words are in memory before `top` stops covering the
        // rest of the reservation.
        compiler_fence(Ordering::SeqCst);
        self.top.set(at + words);
    }

    /// Ends the frame that starts at word `at` (reserved, or popped and
    /// read): `top` goes back to the bare word below it, after every read
    /// of the frame.
    ///
    /// # Safety
    ///
    /// Called by the owning thread; `at` is the first word of the frame
    /// under `top` (what [`reserve`](Self::reserve) returned for it, or
    /// where the popped frame starts), so `at - 1` is a bare word at least
    /// [`BOTTOM`]: every later push and pop indexes from it.
    #[inline(always)]
    pub(super) unsafe fn release(&self, at: usize) {
        compiler_fence(Ordering::SeqCst);
        self.top.set(at - 1);
    }

    /// Adds a call that keeps nothing. A load and a store of the bare
    /// word: a signal handler's dispatch in between leaves it as found.
    #[inline(always)]
    pub(super) fn push_bare(&self) {
        let (w, t) = (self.words(), self.top.get());
        // SAFETY: `top < cap` (field invariant); the stack is its owner's,
        // the dispatching thread's.
        unsafe { w.write(t, w.read(t) + 1) };
    }

    /// Word `i` (below `top`).
    ///
    /// # Safety
    ///
    /// As for [`Words::read`].
    #[inline(always)]
    pub(super) unsafe fn read(&self, i: usize) -> u64 {
        // SAFETY: the caller's contract.
        unsafe { self.words().read(i) }
    }

    /// Writes word `i` (reserved by the caller).
    ///
    /// # Safety
    ///
    /// As for [`Words::write`].
    #[inline(always)]
    pub(super) unsafe fn write(&self, i: usize, v: u64) {
        // SAFETY: the caller's contract.
        unsafe { self.words().write(i, v) };
    }

    /// The stack's words, for a dispatch to keep in a register.
    #[inline(always)]
    pub(super) fn words(&self) -> Words {
        Words {
            stack: self.stack,
            #[cfg(debug_assertions)]
            cap: self.cap,
        }
    }

    /// Ends a bare call, if the bare word counts one: one off it (a load
    /// and a store, as [`push_bare`](Self::push_bare)).
    #[inline(always)]
    pub(super) fn pop_bare(&self) -> bool {
        let (w, t) = (self.words(), self.top.get());
        // SAFETY: `top < cap` (field invariant); the stack is its owner's,
        // the dispatching thread's.
        let bare = unsafe { w.read(t) };
        if bare == 0 {
            return false;
        }
        // SAFETY: as above.
        unsafe { w.write(t, bare - 1) };
        true
    }

    /// After [`pop_bare`](Self::pop_bare) found none: `Some((top, n))`
    /// when the top frame is a frame of a plain entry with `n ≥ 1` return
    /// entries (the caller reads the frame, then
    /// [`release`](Self::release)s it), `None` when the stack is empty (an
    /// exit with no matching entry: word 0 is 0) or the top frame took a
    /// return (it stays for `Registry::on_return`; the sign bit).
    #[inline(always)]
    pub(super) fn pop_frame(&self) -> Option<(usize, u64)> {
        let t = self.top.get();
        // SAFETY: `BOTTOM <= top < cap` (field invariant), so `t - 1` is a
        // word of the stack; the stack is its owner's, the dispatching
        // thread's.
        let n = unsafe { self.read(t - 1) };
        if (n as i64) <= 0 {
            return None;
        }
        Some((t, n))
    }

    /// Index of the bare word.
    #[inline(always)]
    pub(super) fn top(&self) -> usize {
        self.top.get()
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
    ///
    /// # Safety
    ///
    /// `i < cap`, the stack's length in words (unchecked in release
    /// builds): a word below `top`, or in the caller's own reservation.
    /// The calling thread owns the stack, and no reference to the word
    /// lives.
    #[inline(always)]
    pub(super) unsafe fn read(self, i: usize) -> u64 {
        #[cfg(debug_assertions)]
        debug_assert!(i < self.cap);
        // SAFETY: `i < cap`, in the stack's allocation; owner-only memory,
        // unreferenced (the caller's contract).
        unsafe { self.stack.as_ptr().add(i).read() }
    }

    /// Writes word `i` (reserved by the caller).
    ///
    /// # Safety
    ///
    /// As for [`read`](Self::read): `i < cap` (a word at or below `top`,
    /// or in the caller's reservation), on the owning thread, with no
    /// reference to the word alive.
    #[inline(always)]
    pub(super) unsafe fn write(self, i: usize, v: u64) {
        #[cfg(debug_assertions)]
        debug_assert!(i < self.cap);
        // SAFETY: as in `read`.
        unsafe { self.stack.as_ptr().add(i).write(v) }
    }

    /// The address of word `i`, its provenance exposed: an engine reads
    /// the word there ([`KeptReturn`](super::KeptReturn)), or has an
    /// unwinder read it.
    #[inline(always)]
    pub(super) fn addr(self, i: usize) -> u64 {
        self.stack.as_ptr().wrapping_add(i).expose_provenance() as u64
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
