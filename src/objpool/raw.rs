//! The pool's memory: preallocated objects, the rings, and the reference
//! count that lets the last outstanding object free everything.
//!
//! [`RawPool`] owns `nr_objs` objects in one boxed slice and moves their
//! indices through one [`Ring`] per ring slot. It is reached through a raw
//! pointer because the pool handle and every outstanding object share it
//! without a per-object reference-count update (the kernel's objpool does
//! the same: `ref = nr_objs + 1` from the start).
//!
//! # Lifetime
//!
//! * `refs` starts at `nr_objs + 1`: one per object plus one for the
//!   [`ObjPool`](super::ObjPool) handle. Pops and pushes never touch it.
//! * [`RawPool::fini`] (the handle's drop) runs [`Ring::drain_dead`] on
//!   every ring: each object found there is dropped and releases its
//!   reference; then the handle's reference is released.
//! * An outstanding object whose push finds the ring dead is dropped by the
//!   pusher, which releases its reference.
//! * Whoever releases the last reference frees the allocation. Each object
//!   is dropped exactly once: it is either in a ring when `drain_dead`
//!   passes (dropped there) or pushed after the `DEAD` mark (dropped by
//!   its pusher); `drain_dead` waits for pushes reserved before the mark.

use std::mem::MaybeUninit;
use std::ptr::NonNull;

use super::ring::Ring;
use crate::sync::{AtomicU64, AtomicUsize, CachePadded, Ordering, UnsafeCell, fence};

/// Objects, rings and counters of one pool.
pub(crate) struct RawPool<T> {
    /// One ring per slot; `rings.len()` is a power of two.
    rings: Box<[CachePadded<Ring>]>,
    /// `rings.len() - 1`.
    ring_mask: usize,
    /// The objects.
    ///
    /// Invariant: object `i` is initialised until the one `drop_obj(i)`;
    /// at any time its index is in at most one ring or owned by at most
    /// one holder (a `PoolObj`, or a crate-internal user such as retinst).
    objs: Box<[UnsafeCell<MaybeUninit<T>>]>,
    /// Objects not yet dropped, plus one while the pool handle lives.
    refs: AtomicUsize,
    /// Pops that found every ring empty.
    nmissed: CachePadded<AtomicU64>,
}

// SAFETY: the raw pool hands each object to one thread at a time (the ring
// protocol transfers ownership with Release/Acquire), so sharing it between
// threads moves `T` values between threads: `T: Send` suffices. No `&T` is
// ever given to two threads by the pool itself.
unsafe impl<T: Send> Sync for RawPool<T> {}
// SAFETY: as above; the last reference may be released, and the objects
// dropped, on any thread.
unsafe impl<T: Send> Send for RawPool<T> {}

impl<T> RawPool<T> {
    /// Allocates a pool of `nr_objs` objects made by `init(i)`, spread over
    /// `nr_rings` rings in contiguous blocks (as the kernel gives each CPU
    /// its own objects): threads on different rings then touch different
    /// cache lines, rather than neighbouring objects.
    ///
    /// `nr_rings` must be a power of two, `nr_objs` at most `2^31`.
    pub(crate) fn new(
        nr_objs: usize,
        nr_rings: usize,
        mut init: impl FnMut(usize) -> T,
    ) -> NonNull<Self> {
        debug_assert!(nr_rings.is_power_of_two() && nr_objs <= 1 << 31);
        let cap = nr_objs.max(1).next_power_of_two();
        let rings: Box<[CachePadded<Ring>]> =
            (0..nr_rings).map(|_| CachePadded(Ring::new(cap))).collect();
        let objs = (0..nr_objs)
            .map(|i| UnsafeCell::new(MaybeUninit::new(init(i))))
            .collect();
        for i in 0..nr_objs {
            // The pool is not shared yet; each ring receives at most
            // `nr_objs` indices, within its capacity.
            let pushed = rings[i * nr_rings / nr_objs].push(i as u32);
            debug_assert!(pushed.is_ok());
        }
        let pool = Box::new(Self {
            rings,
            ring_mask: nr_rings - 1,
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

    /// Number of rings.
    pub(crate) fn nr_rings(&self) -> usize {
        self.rings.len()
    }

    /// Pops that found the pool empty.
    pub(crate) fn nmissed(&self) -> u64 {
        self.nmissed.load(Ordering::Relaxed)
    }

    /// Pops an object index: the calling thread's ring first, then the
    /// others in order. `None` (counted in `nmissed`) when all are empty.
    #[inline]
    pub(crate) fn pop(&self) -> Option<u32> {
        let start = super::local_ring();
        for i in 0..self.rings.len() {
            if let Some(index) = self.rings[(start + i) & self.ring_mask].pop() {
                return Some(index);
            }
        }
        self.nmissed.fetch_add(1, Ordering::Relaxed);
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

    /// Returns object `index` to the calling thread's ring; if the pool has
    /// been torn down, drops the object and releases its reference instead.
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
        let ring = &pool.rings[super::local_ring() & pool.ring_mask];
        if ring.push(index).is_err() {
            // SAFETY: we own the object and the pool is dead: nobody else
            // will drop it; then we give up its reference.
            unsafe {
                pool.drop_obj(index);
                Self::release(this, 1);
            }
        }
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

    /// Tears the pool down for the handle's drop: drops every object that
    /// is in a ring, now or once in-flight pushes publish, and releases the
    /// handle's reference.
    ///
    /// # Safety
    ///
    /// Called once, by the owner of the handle's reference, with no
    /// concurrent `pop`.
    pub(crate) unsafe fn fini(this: NonNull<Self>) {
        // SAFETY: the handle's reference keeps the pool allocated.
        let pool = unsafe { this.as_ref() };
        let mut drained = 0;
        for ring in pool.rings.iter() {
            ring.drain_dead(|index| {
                // SAFETY: drained indices are owned by nobody else (ring
                // protocol), and the ring is dead so they never return.
                unsafe { pool.drop_obj(index) };
                drained += 1;
            });
        }
        // SAFETY: one reference per drained object plus the handle's.
        unsafe { Self::release(this, drained + 1) };
    }
}
