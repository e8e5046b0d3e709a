//! One ring of object indices: the lock-free protocol under [`ObjPool`].
//!
//! This file is the whole concurrent algorithm of the objpool and holds no
//! `unsafe`: it moves `u32` object indices around with atomics only, and
//! `tests/loom_objpool.rs` model-checks it through the pool.
//!
//! [`ObjPool`]: super::ObjPool
//!
//! # Layout
//!
//! A ring has `cap = next_pow2(nr_objs)` entries and two 64-bit positions,
//! `head` (next position to pop) and `tail` (next position to reserve).
//! Position `p` lives in entry `p & (cap - 1)`. Each entry is one
//! `AtomicU64` holding `seq << 32 | index`, where `seq = (p + 1) as u32`
//! marks the entry as *published for position `p`*.
//!
//! # The protocol
//!
//! * **push(index)**: `t = tail.fetch_add(1)` reserves position `t`; then
//!   one `Release` store writes `(t + 1) << 32 | index` into entry `t`.
//!   Reserving and publishing are two steps, and a thread may be preempted
//!   between them (userspace cannot disable interrupts as the kernel's
//!   objpool does); the per-entry `seq` makes that harmless: nobody can
//!   mistake the unwritten entry for a published one, because its `seq`
//!   still names an older lap. Push never fails and never waits.
//! * **pop()**: `h = head`; load entry `h`; if its `seq` is not `h + 1`,
//!   position `h` is empty or its pusher has not published yet: report the
//!   ring empty (the caller steals elsewhere; it never waits for a
//!   preempted pusher). Otherwise `CAS(head, h, h + 1)`; on success the
//!   index read *before* the CAS is ours (the kernel's order: read, then
//!   claim), so a popper never leaves a half-released entry behind.
//! * **drain_dead()** (pool teardown, the only popper left): set the `DEAD`
//!   bit of `tail` with `fetch_or`, then take every position between `head`
//!   and the old `tail`, waiting for pushers that reserved a position before
//!   the bit was set to publish it. A push whose `fetch_add` sees `DEAD`
//!   gets [`Dead`] back and the caller disposes of the object itself.
//!
//! # Invariants
//!
//! * **Bounded occupancy.** Positions in `[head, tail)` hold distinct
//!   objects (an object is in a ring from its push until its pop), so
//!   `tail - head <= nr_objs <= cap`. Hence when position `t` is reserved,
//!   position `t - cap` has already been popped, its entry is free, and a
//!   push can never overwrite a live entry nor need to fail. This counting
//!   argument is made sound in the memory model by the `AcqRel` on both
//!   `tail.fetch_add` and the `head` CAS: the pop of `t - cap` happens-before
//!   the pop of the object that was pushed twice in `[t - cap, t]` (release
//!   sequence on `head`), which happens-before that object's second push,
//!   which happens-before the reservation of `t` (release sequence on
//!   `tail`).
//! * **No ABA.** `head` and `tail` are 64-bit and only grow, so a CAS with a
//!   stale `h` fails. While `head == h` no entry is rewritten for a later lap
//!   than `h` (bounded occupancy), so an entry whose `seq` is `h + 1` read
//!   while `head == h` is the one published for `h`; the 32-bit `seq` can
//!   only be confused across `2^32` positions, which needs `head` to move.
//! * **Ownership transfer.** The `Release` store of an entry pairs with the
//!   `Acquire` load of it in `pop`: whatever the pusher wrote into the
//!   object before pushing is visible to the thread that pops it.

use crate::sync::{AtomicU64, Ordering, backoff};

/// Bit of `tail` set by [`Ring::drain_dead`]: the pool is being torn down.
const DEAD: u64 = 1 << 63;

/// The push found the pool torn down; the object was *not* stored and the
/// caller must dispose of it.
#[derive(Debug)]
pub(crate) struct Dead;

/// A bounded multi-producer multi-consumer ring of object indices.
#[derive(Debug)]
pub(crate) struct Ring {
    /// Next position to pop.
    ///
    /// Invariant: only grows (by CAS), and `head <= tail & !DEAD`.
    head: AtomicU64,
    /// Next position to reserve, plus the [`DEAD`] bit.
    ///
    /// Invariant: the position part only grows; `DEAD`, once set, stays.
    tail: AtomicU64,
    /// `cap - 1`; `cap` is a power of two `>= nr_objs`.
    mask: u64,
    /// `seq << 32 | index` per entry; `seq == (p + 1) as u32` means
    /// published for position `p`.
    ///
    /// Invariant: entry `p & mask` is stored only by the thread that
    /// reserved position `p`, and only once.
    entries: Box<[AtomicU64]>,
}

#[inline(always)]
fn pack(pos: u64, index: u32) -> u64 {
    (u64::from((pos as u32).wrapping_add(1)) << 32) | u64::from(index)
}

#[inline(always)]
fn published_for(entry: u64, pos: u64) -> bool {
    (entry >> 32) as u32 == (pos as u32).wrapping_add(1)
}

impl Ring {
    /// An empty ring able to hold `cap` indices.
    ///
    /// `cap` must be a power of two no larger than `2^31`.
    pub(crate) fn new(cap: usize) -> Self {
        debug_assert!(cap.is_power_of_two() && cap <= 1 << 31);
        // Entry 0 holds `seq == 0`, which is published for no position of
        // the first lap (those have `seq` 1..=cap).
        Self {
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            mask: cap as u64 - 1,
            entries: (0..cap).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Pushes an index. Never fails while the pool lives; wait-free.
    ///
    /// The caller must own the object `index` names, and the ring may hold
    /// at most `cap` objects (the pool's bounded occupancy guarantees it).
    #[inline]
    pub(crate) fn push(&self, index: u32) -> Result<(), Dead> {
        // AcqRel: the Acquire half pairs with the Release half of earlier
        // reservations (release sequence on `tail`) and the Release half with
        // later ones; together with the AcqRel head CAS it orders the pop
        // of position `t - cap` before this reservation (bounded occupancy,
        // see the module docs), so entry `t` is free.
        let t = self.tail.fetch_add(1, Ordering::AcqRel);
        if t & DEAD != 0 {
            return Err(Dead);
        }
        // Release: pairs with the Acquire entry load in `pop` and
        // `drain_dead`; the object's contents travel with the index.
        self.entries[(t & self.mask) as usize].store(pack(t, index), Ordering::Release);
        Ok(())
    }

    /// Pops an index, or `None` when the ring is empty or its oldest
    /// position is reserved but not yet published. Lock-free.
    #[inline]
    pub(crate) fn pop(&self) -> Option<u32> {
        // Acquire: pairs with the AcqRel CAS that stored this head; with it,
        // the pop of every earlier position (and its entry read) happens
        // before ours, so the entry load below cannot return a value older
        // than the previous lap's.
        let mut h = self.head.load(Ordering::Acquire);
        loop {
            // Acquire: pairs with the Release store in `push`.
            let entry = self.entries[(h & self.mask) as usize].load(Ordering::Acquire);
            if !published_for(entry, h) {
                return None;
            }
            // AcqRel: Release makes our entry read happen before any later
            // pop's CAS and so before the next lap's push into this entry;
            // Acquire continues the chain from earlier pops (module docs).
            match self
                .head
                .compare_exchange_weak(h, h + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(entry as u32),
                Err(now) => h = now,
            }
        }
    }

    /// Tears the ring down: marks it dead and hands every index it holds, or
    /// will hold once in-flight pushes publish, to `f`.
    ///
    /// Must be the only popper (the pool is being dropped). Waits, with
    /// backoff, only for pushers that reserved a position before the ring
    /// was marked and have not published it yet.
    pub(crate) fn drain_dead(&self, mut f: impl FnMut(u32)) {
        // AcqRel: totally ordered with every `fetch_add` on `tail` (same
        // atomic); Acquire pairs with the reservations made before it.
        let end = self.tail.fetch_or(DEAD, Ordering::AcqRel) & !DEAD;
        // Relaxed: no pop runs concurrently any more (the pool is dropped by
        // its owner, so no `&ObjPool` exists), and the entries carry their
        // own synchronisation.
        let start = self.head.load(Ordering::Relaxed);
        for pos in start..end {
            let slot = &self.entries[(pos & self.mask) as usize];
            let mut step = 0;
            loop {
                // Acquire: pairs with the Release store in `push`.
                let entry = slot.load(Ordering::Acquire);
                if published_for(entry, pos) {
                    f(entry as u32);
                    break;
                }
                backoff(step);
                step = step.saturating_add(1);
            }
        }
        self.head.store(end, Ordering::Relaxed);
    }
}
