//! The depot: the pool's shared stack of free object indices, which the
//! per-thread magazines (`objpool/magazine.rs`) refill from and flush to in
//! batches.
//!
//! This file is the lock-free half of the pool and holds no `unsafe`: it
//! moves `u32` object indices with atomics only.
//!
//! # Layout
//!
//! A Treiber stack threaded through the objects: `next[i]` holds the index
//! below object `i` on the stack, and one 64-bit word `head` holds
//! `tag << 32 | top`, where `top` is the index on top ([`EMPTY`] when the
//! stack is empty, [`DEAD`] once the pool is torn down) and `tag` counts
//! every change of `head`.
//!
//! # The protocol
//!
//! * **push_chain(first, last)**: the pusher owns the objects of a chain it
//!   linked itself (`next[first] → … → last`); it sets `next[last]` to the
//!   current top and swings `head` to `first` with one CAS. A batch of any
//!   length costs one CAS.
//! * **pop_batch(out)**: read `head`, walk up to `out.len()` links from the
//!   top, and swing `head` past them with one CAS.
//! * **drain_dead(f)** (pool teardown): swap [`DEAD`] into `head` and hand
//!   every index of the old stack to `f`. A later push sees `DEAD` and the
//!   caller disposes of its objects itself.
//!
//! Neither push nor pop ever waits for another thread: a thread preempted
//! in the middle of either has changed nothing shared (it only read `head`
//! and links), so unlike a ring with reserved positions the depot never
//! looks empty while it holds objects.
//!
//! # Invariants
//!
//! * **Ownership.** An index is on the stack, or owned by one thread (a
//!   magazine, a handle), never both. `next[i]` is written only by the
//!   owner of object `i`, before the CAS that puts `i` on the stack.
//! * **Walks read a stable chain.** Every change of `head` increments
//!   `tag`, so a CAS that succeeds proves `head` did not change between the
//!   popper's load and its CAS: no index left or joined the stack in
//!   between, so nobody owned the walked objects and their links were
//!   those the pushers wrote before their CAS (made visible by the Acquire
//!   load of `head`, which pairs with every earlier push's Release CAS
//!   through the release sequence of `head`'s read-modify-writes). A walk
//!   that races with other operations may read links of objects that
//!   someone else owns; the values are indices or [`EMPTY`] (bounded by the
//!   batch length, so even a cycle ends) and the CAS fails.
//! * **ABA.** The tag is 32 bits: a popper's CAS could succeed wrongly only
//!   if `head` changed a multiple of `2^32` times, back to the same top,
//!   while the popper was stopped between its load and its CAS. At tens of
//!   millions of depot operations a second that is a stop of a minute or
//!   more (a debugger, `SIGSTOP`) with the other threads busy meanwhile.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// `top` of an empty stack.
const EMPTY: u32 = u32::MAX;
/// `top` of a torn-down stack.
const DEAD: u32 = u32::MAX - 1;

/// The push found the pool torn down; nothing was stored and the caller
/// disposes of its objects.
#[derive(Debug)]
pub(crate) struct Dead;

#[inline(always)]
fn top(head: u64) -> u32 {
    head as u32
}

#[inline(always)]
fn next_head(head: u64, top: u32) -> u64 {
    ((head >> 32).wrapping_add(1) << 32) | u64::from(top)
}

/// A lock-free stack of object indices with batch push and pop.
#[derive(Debug)]
pub(crate) struct Depot {
    /// `tag << 32 | top`.
    head: AtomicU64,
    /// Link below each object while it is on the stack.
    next: Box<[AtomicU32]>,
}

impl Depot {
    /// A depot holding objects `0..nr_objs`, object 0 on top.
    pub(crate) fn new(nr_objs: usize) -> Self {
        debug_assert!(nr_objs > 0 && nr_objs < DEAD as usize);
        let next = (0..nr_objs)
            .map(|i| AtomicU32::new(if i + 1 < nr_objs { i as u32 + 1 } else { EMPTY }))
            .collect();
        Self {
            head: AtomicU64::new(0),
            next,
        }
    }

    /// Links `index` above `below` in a chain the caller owns (building a
    /// batch for [`push_chain`](Self::push_chain)).
    #[inline]
    pub(crate) fn link(&self, index: u32, below: u32) {
        // Relaxed: the caller owns `index`; the push's Release CAS
        // publishes the link.
        self.next[index as usize].store(below, Ordering::Relaxed);
    }

    /// The link below `index` in a chain the caller owns.
    #[inline]
    pub(crate) fn next_of(&self, index: u32) -> u32 {
        // Relaxed: the caller owns `index` and wrote the link itself.
        self.next[index as usize].load(Ordering::Relaxed)
    }

    /// Pushes the chain `first → … → last` the caller owns and linked with
    /// [`link`](Self::link) (`first == last` for one object). Lock-free.
    pub(crate) fn push_chain(&self, first: u32, last: u32) -> Result<(), Dead> {
        // Relaxed: the CAS below validates the value; nothing is read
        // through it.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            if top(head) == DEAD {
                return Err(Dead);
            }
            self.link(last, top(head));
            // Release: publishes the links and the objects' contents to
            // the popper that loads this head (Acquire in `pop_batch`).
            match self.head.compare_exchange_weak(
                head,
                next_head(head, first),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => head = now,
            }
        }
    }

    /// Pops up to `out.len()` indices into `out`, returning how many; 0
    /// only when the stack is empty at the moment of the last try.
    /// Lock-free.
    pub(crate) fn pop_batch(&self, out: &mut [u32]) -> usize {
        if out.is_empty() {
            return 0;
        }
        // Acquire: pairs with the Release CAS of the pushes (module docs):
        // the links and the objects' contents are visible.
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let mut i = top(head);
            if i == EMPTY || i == DEAD {
                return 0;
            }
            let mut n = 0;
            while n < out.len() && i != EMPTY {
                out[n] = i;
                n += 1;
                // Relaxed: ordered by the Acquire load of `head`; a racing
                // change of the stack makes the CAS below fail.
                i = self.next[i as usize].load(Ordering::Relaxed);
            }
            // Acquire: as for the load above, for the value we replace.
            match self.head.compare_exchange_weak(
                head,
                next_head(head, i),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return n,
                Err(now) => head = now,
            }
        }
    }

    /// Tears the depot down: hands every index it holds to `f`; later
    /// pushes fail with [`Dead`]. Must run once, with no concurrent pop.
    pub(crate) fn drain_dead(&self, mut f: impl FnMut(u32)) {
        // Acquire: pairs with the Release CAS of every push (release
        // sequence of `head`): the links and objects are visible.
        let head = self.head.swap(u64::from(DEAD), Ordering::Acquire);
        let mut i = top(head);
        while i != EMPTY && i != DEAD {
            // Relaxed: as in `pop_batch`; no one else owns these objects.
            let below = self.next[i as usize].load(Ordering::Relaxed);
            f(i);
            i = below;
        }
    }
}
