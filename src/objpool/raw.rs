//! The pool's memory: preallocated objects, the depot and the magazines
//! that move their indices, and the reference count that lets the last
//! outstanding object free everything.
//!
//! [`RawPool`] owns `nr_objs` objects in one boxed slice. It is reached
//! through a raw pointer because the pool handle and every outstanding
//! object share it without a per-object reference-count update (the
//! kernel's objpool does the same: `ref = nr_objs + 1` from the start).
//!
//! # Where a free object is
//!
//! Every free object is in exactly one place: the depot
//! (`objpool/depot.rs`) or one magazine (`objpool/magazine.rs`). A pop
//! takes from the caller's magazine, refilling it from the depot with a
//! batch of half its capacity when it is empty; then from the depot alone;
//! then by *stealing* half of another magazine's objects. A push puts the
//! object into the caller's magazine, flushing half of it to the depot
//! (one CAS) when it is full; when the caller cannot use its magazine (a
//! signal handler interrupted its own section, the magazine is being
//! stolen from, the thread is exiting) the object goes to the depot.
//!
//! # Lifetime
//!
//! * `refs` starts at `nr_objs + 1`: one per object plus one for the
//!   [`ObjPool`](super::ObjPool) handle. Pops and pushes never touch it.
//! * [`RawPool::fini`] (the handle's drop) sets `dead`, runs the heavy
//!   barrier of the magazine handshake, waits for every section in flight
//!   to end, and then drops the objects of every magazine and of the depot
//!   (marking it dead); each dropped object releases its reference, then
//!   the handle's reference is released.
//! * A push that comes later finds `dead` in its section's handshake and
//!   goes to the depot: before `fini` drains it, the object joins it and
//!   is dropped there; after, the push finds the depot dead, drops the
//!   object itself and releases its reference.
//! * Whoever releases the last reference frees the allocation. Each object
//!   is dropped exactly once: it is in a magazine or the depot when `fini`
//!   passes (dropped there), or pushed afterwards (dropped by its pusher).

use std::mem::MaybeUninit;
use std::ptr::NonNull;

use super::depot::{Dead, Depot};
use super::magazine::{MAX_MAGAZINE, Magazine, Magazines};
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, CachePadded, Ordering, UnsafeCell, fence};

/// The most objects a pool may hold (object indices are 32-bit, and the
/// depot reserves the two largest values as markers).
pub const MAX_OBJECTS: usize = 1 << 31;

/// Objects, depot, magazines and counters of one pool.
pub(crate) struct RawPool<T> {
    /// Capacity of each magazine, `1..=MAX_MAGAZINE`, or 0: no magazines.
    mag_cap: usize,
    /// Whether the magazine handshake uses asymmetric fences (module docs
    /// of `magazine.rs`); fixed for the process.
    asymmetric: bool,
    /// Set once by `fini`: sections back off and pushes go to the depot.
    dead: AtomicBool,
    /// Free objects no magazine holds.
    depot: Depot,
    /// One per thread that used the pool.
    magazines: Magazines,
    /// The objects.
    ///
    /// Invariant: object `i` is initialised until the one `drop_obj(i)`;
    /// at any time its index is in the depot or one magazine, or owned by
    /// one holder (a `PoolObj`, or a crate-internal user such as retinst).
    objs: Box<[UnsafeCell<MaybeUninit<T>>]>,
    /// Objects not yet dropped, plus one while the pool handle lives.
    refs: AtomicUsize,
    /// Pops that found no free object they could take.
    nmissed: CachePadded<AtomicU64>,
}

// SAFETY: the raw pool hands each object to one thread at a time (the
// depot and the magazine handshake transfer ownership with Release/Acquire),
// so sharing it between threads moves `T` values between threads: `T: Send`
// suffices. No `&T` is ever given to two threads by the pool itself.
unsafe impl<T: Send> Sync for RawPool<T> {}
// SAFETY: as above; the last reference may be released, and the objects
// dropped, on any thread.
unsafe impl<T: Send> Send for RawPool<T> {}

impl<T> RawPool<T> {
    /// Allocates a pool of `nr_objs` objects made by `init(i)`, all in the
    /// depot, with magazines of `mag_cap` objects (0: none).
    ///
    /// `nr_objs` must be in `1..=MAX_OBJECTS`, `mag_cap` at most
    /// `MAX_MAGAZINE`.
    pub(crate) fn new(
        nr_objs: usize,
        mag_cap: usize,
        mut init: impl FnMut(usize) -> T,
    ) -> NonNull<Self> {
        debug_assert!(nr_objs > 0 && nr_objs <= MAX_OBJECTS && mag_cap <= MAX_MAGAZINE);
        let objs = (0..nr_objs)
            .map(|i| UnsafeCell::new(MaybeUninit::new(init(i))))
            .collect();
        let pool = Box::new(Self {
            mag_cap,
            asymmetric: crate::rcu::asymmetric_fences(),
            dead: AtomicBool::new(false),
            depot: Depot::new(nr_objs),
            magazines: Magazines::new(),
            objs,
            refs: AtomicUsize::new(nr_objs + 1),
            nmissed: CachePadded(AtomicU64::new(0)),
        });
        NonNull::from(Box::leak(pool))
    }

    /// Number of objects.
    pub(crate) fn nr_objs(&self) -> usize {
        self.objs.len()
    }

    /// Capacity of each thread's magazine.
    pub(crate) fn magazine_capacity(&self) -> usize {
        self.mag_cap
    }

    /// Makes the calling thread's magazine if it has none.
    pub(crate) fn prepare_thread(&self) {
        if self.mag_cap != 0 {
            let _ = self.magazines.mine();
        }
    }

    /// Pops that found no object they could take.
    pub(crate) fn nmissed(&self) -> u64 {
        self.nmissed.load(Ordering::Relaxed)
    }

    /// The calling thread's magazine, inside a section; `None` when it has
    /// none or cannot enter one (see `Magazine::enter`).
    #[inline(always)]
    fn enter_mine(&self) -> Option<&Magazine> {
        if self.mag_cap == 0 {
            return None;
        }
        let m = self.magazines.mine()?;
        // SAFETY: `mine` is the calling thread's own magazine.
        unsafe { m.enter(self.asymmetric, &self.dead) }.then_some(m)
    }

    /// Pops an object index: from the calling thread's magazine, else the
    /// depot, else stolen from another magazine. `None` (counted in
    /// `nmissed`) when none of them gave one.
    #[inline]
    pub(crate) fn pop(&self) -> Option<u32> {
        if let Some(m) = self.enter_mine() {
            let len = m.len();
            if len > 0 {
                // SAFETY: this thread's magazine, inside the section
                // `enter_mine` started.
                let index = unsafe { m.get(len - 1) };
                // SAFETY: as above; the section ends here.
                unsafe {
                    m.set_len(len - 1);
                    m.exit();
                }
                return Some(index);
            }
            // SAFETY: as above.
            let got = unsafe { self.refill(m) };
            // SAFETY: as above; the section ends here.
            unsafe { m.exit() };
            if got.is_some() {
                return got;
            }
        }
        self.pop_slow()
    }

    /// Refills the empty magazine `m` from the depot with half its
    /// capacity and takes one object of the batch.
    ///
    /// # Safety
    ///
    /// The caller is `m`'s owning thread, inside a section of it
    /// ([`Magazine::enter`]).
    #[cold]
    unsafe fn refill(&self, m: &Magazine) -> Option<u32> {
        let mut batch = [0u32; MAX_MAGAZINE];
        let n = self.depot.pop_batch(&mut batch[..self.mag_cap.div_ceil(2)]);
        if n == 0 {
            return None;
        }
        // SAFETY: the caller uses `m`, inside its section.
        unsafe {
            for (i, &index) in batch[1..n].iter().enumerate() {
                m.set(i, index);
            }
            m.set_len(n - 1);
        }
        Some(batch[0])
    }

    /// The depot alone, then stealing.
    #[cold]
    fn pop_slow(&self) -> Option<u32> {
        let mut one = [0u32];
        if self.depot.pop_batch(&mut one) == 1 {
            return Some(one[0]);
        }
        if let Some(index) = self.steal() {
            return Some(index);
        }
        self.nmissed.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Takes half (rounded up) of the objects of the first other magazine
    /// that holds any and can be claimed: one is returned, the rest go to
    /// the depot for the caller's next pops.
    #[cold]
    fn steal(&self) -> Option<u32> {
        if self.mag_cap == 0 {
            return None;
        }
        let mine = self.magazines.mine().map(|m| m as *const Magazine);
        for m in self.magazines.iter() {
            if Some(m as *const Magazine) == mine || m.len() == 0 || !m.claim(self.asymmetric) {
                continue;
            }
            let len = m.len();
            if len == 0 {
                // SAFETY: our claim, given back unused.
                unsafe { m.release() };
                continue;
            }
            let keep = len / 2;
            // SAFETY: we hold `m`'s claim (`claim` returned `true`), so no
            // other thread uses it until our `release` below.
            let index = unsafe { m.get(len - 1) };
            // The rest of the taken half, as a chain for the depot.
            // SAFETY: as above.
            let chain = (keep < len - 1).then(|| unsafe { self.chain_slots(m, keep, len - 1) });
            // SAFETY: as above; then the claim is given back, and we use
            // `m` no more.
            unsafe {
                m.set_len(keep);
                m.release();
            }
            if let Some((first, last)) = chain
                && self.depot.push_chain(first, last).is_err()
            {
                // A popper holds `&ObjPool`, and the depot dies only in the
                // handle's drop.
                unreachable!("object pool depot torn down during a pop");
            }
            return Some(index);
        }
        None
    }

    /// Raw pointer to object `index`.
    ///
    /// Dereferencing it is up to the caller, who must own the object (or
    /// only share it under the rules of the object's own type).
    #[inline(always)]
    pub(crate) fn obj(&self, index: u32) -> *mut T {
        self.objs[index as usize].with_mut(|p| p.cast::<T>())
    }

    /// Returns object `index` to the pool: into the calling thread's
    /// magazine, else the depot; if the pool has been torn down, drops the
    /// object and releases its reference instead.
    ///
    /// # Safety
    ///
    /// `this` points to a live pool (the caller's object keeps it alive),
    /// the caller owns object `index`, and gives up that ownership.
    #[inline]
    pub(crate) unsafe fn push(this: NonNull<Self>, index: u32) {
        // SAFETY: the caller's object holds a reference, so the pool is
        // allocated until we release it below.
        let pool = unsafe { this.as_ref() };
        if let Some(m) = pool.enter_mine() {
            let len = m.len();
            if len < pool.mag_cap {
                // SAFETY: this thread's magazine, inside the section
                // `enter_mine` started, which ends here.
                unsafe {
                    m.set(len, index);
                    m.set_len(len + 1);
                    m.exit();
                }
                return;
            }
            // SAFETY: as above.
            let flushed = unsafe { pool.flush(m) };
            // SAFETY: as above; the section ends here.
            unsafe {
                m.set(m.len(), index);
                m.set_len(m.len() + 1);
                m.exit();
            }
            if let Err((first, last, Dead)) = flushed {
                // SAFETY: the chain's objects are ours and the pool is
                // dead; we give up their references.
                unsafe { Self::drop_chain(this, first, last) };
            }
            return;
        }
        if pool.depot.push_chain(index, index).is_err() {
            // SAFETY: we own the object and the pool is dead: nobody else
            // will drop it; then we give up its reference.
            unsafe {
                pool.drop_obj(index);
                Self::release(this, 1);
            }
        }
    }

    /// Links slots `from..to` (not empty) of `m` into a chain for the
    /// depot: returns `(first, last)`, slot `to - 1` first and slot `from`
    /// last. `push_chain` links `last` to the depot's top.
    ///
    /// # Safety
    ///
    /// The caller uses `m` ([`Magazine::set_len`]): its owning thread
    /// inside a section, or a thread holding its claim.
    unsafe fn chain_slots(&self, m: &Magazine, from: usize, to: usize) -> (u32, u32) {
        // SAFETY: the caller uses `m`.
        unsafe {
            for i in from..to - 1 {
                self.depot.link(m.get(i + 1), m.get(i));
            }
            (m.get(to - 1), m.get(from))
        }
    }

    /// Moves the upper half of the full magazine `m` to the depot with one
    /// CAS. On a dead depot the chain is handed back (its first and last
    /// index) for the caller to drop after the section.
    ///
    /// # Safety
    ///
    /// The caller is `m`'s owning thread, inside a section of it
    /// ([`Magazine::enter`]).
    #[cold]
    unsafe fn flush(&self, m: &Magazine) -> Result<(), (u32, u32, Dead)> {
        let len = m.len();
        let keep = len / 2;
        // SAFETY: the caller uses `m`, inside its section.
        let (first, last) = unsafe {
            let chain = self.chain_slots(m, keep, len);
            m.set_len(keep);
            chain
        };
        self.depot
            .push_chain(first, last)
            .map_err(|d| (first, last, d))
    }

    /// Drops the objects of a chain linked by `flush` that the depot
    /// refused, and releases their references.
    ///
    /// # Safety
    ///
    /// The caller owns the chain's objects, the pool is dead, and the
    /// caller's references (one per object) are given up.
    #[cold]
    unsafe fn drop_chain(this: NonNull<Self>, first: u32, last: u32) {
        // SAFETY: the chain's objects keep the pool allocated.
        let pool = unsafe { this.as_ref() };
        let mut n = 0;
        let mut i = first;
        loop {
            // `last`'s link may point into the depot (a refused push set
            // it): the walk stops at `last`, not at a link.
            let below = pool.depot.next_of(i);
            // SAFETY: ours (caller), dropped once.
            unsafe { pool.drop_obj(i) };
            n += 1;
            if i == last {
                break;
            }
            i = below;
        }
        // SAFETY: one reference per dropped object.
        unsafe { Self::release(this, n) };
    }

    /// Drops object `index` in place.
    ///
    /// # Safety
    ///
    /// The caller owns the object and it is never used again.
    unsafe fn drop_obj(&self, index: u32) {
        self.objs[index as usize].with_mut(|p| {
            // SAFETY: initialised (invariant of `objs`) and owned by us; the
            // slot is never read again.
            unsafe { (*p).assume_init_drop() }
        });
    }

    /// Releases `n` references; the last one frees the pool.
    ///
    /// # Safety
    ///
    /// The caller holds `n` references and uses none of them afterwards.
    unsafe fn release(this: NonNull<Self>, n: usize) {
        // SAFETY: the caller's references keep the pool allocated.
        let refs = unsafe { &this.as_ref().refs };
        // Release: everything we did with the pool and our objects happens
        // before the free below, on whichever thread runs it.
        if refs.fetch_sub(n, Ordering::Release) == n {
            // Acquire: pairs with the Release decrements of every other
            // reference holder (the `Arc` pattern). ThreadSanitizer ignores
            // fences, so its build loads instead, as `std::sync::Arc` does.
            if cfg!(fprobe_tsan) {
                refs.load(Ordering::Acquire);
            } else {
                fence(Ordering::Acquire);
            }
            // SAFETY: the last reference is gone; `this` came from
            // `Box::leak` in `new`. Objects are `MaybeUninit`, already
            // dropped one by one.
            drop(unsafe { Box::from_raw(this.as_ptr()) });
        }
    }

    /// Tears the pool down for the handle's drop: drops every object in a
    /// magazine or the depot, once the sections in flight have ended, and
    /// releases the handle's reference.
    ///
    /// # Safety
    ///
    /// Called once, by the owner of the handle's reference, with no
    /// concurrent `pop`.
    pub(crate) unsafe fn fini(this: NonNull<Self>) {
        // SAFETY: the handle's reference keeps the pool allocated.
        let pool = unsafe { this.as_ref() };
        // Relaxed: ordered before the sections' loads of `dead` by the
        // heavy barrier (store buffering, `magazine.rs`).
        pool.dead.store(true, Ordering::Relaxed);
        crate::rcu::heavy_barrier(pool.asymmetric);
        let mut drained = 0;
        for m in pool.magazines.iter() {
            // Sections that began before the barrier end; later ones see
            // `dead` and leave the magazine alone.
            m.wait_idle();
            for i in 0..m.len() {
                // SAFETY: the magazine is ours: its owner's sections have
                // ended (`wait_idle`) and later ones see `dead`, and no
                // claimer runs (no concurrent `pop`). The magazine's objects
                // are owned by nobody else and never return to it.
                unsafe { pool.drop_obj(m.get(i)) };
                drained += 1;
            }
            // SAFETY: as above, the magazine is ours.
            unsafe { m.set_len(0) };
        }
        pool.depot.drain_dead(|index| {
            // SAFETY: drained indices are owned by nobody else, and the
            // depot is dead so they never return.
            unsafe { pool.drop_obj(index) };
            drained += 1;
        });
        // SAFETY: one reference per drained object plus the handle's.
        unsafe { Self::release(this, drained + 1) };
    }
}
