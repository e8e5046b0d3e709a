//! Per-thread state of an object: [`PerThread<T>`] gives each thread its own
//! `T` inside one object (a registry, an index), found in constant time and
//! freed with the object.
//!
//! # Design
//!
//! * Every thread that asks gets a small **thread index**, the lowest one
//!   free, from a process-wide allocator, and a **thread generation**, a
//!   64-bit number never handed out twice. The index goes back to the
//!   allocator when the thread exits; the generation dies with the thread.
//! * A `PerThread<T>` holds buckets of entries: bucket `b` holds `2^b`
//!   entries, for the indices `2^b - 1 ..= 2^(b+1) - 2`, so the entries of
//!   the first threads sit in small buckets and no entry ever moves.
//!   Buckets are allocated on first use and freed with the `PerThread`.
//! * An entry holds a `T` once one was made for its index, and the
//!   generation of the thread that owns it now. A lookup is one
//!   thread-local load (index and generation), one bucket load and one
//!   compare of the entry's owner with the caller's generation.
//! * A thread whose index was used before finds the entry owned by an
//!   exited thread; it *adopts* the value (the caller's `adopt` resets what
//!   only the owner uses, counters stay) and becomes its owner. So the
//!   values of exited threads are neither stranded nor leaked: there are
//!   never more values than threads alive at once, and every value is
//!   freed when the object is.
//!
//! # Invariants
//!
//! * An entry's value is initialised once its `owner` is non-zero, and
//!   stays initialised until the `PerThread` drops.
//! * Only the thread whose generation is in `owner` uses the value's
//!   owner-only parts. Ownership passes from an exited thread to the next
//!   thread given the same index; the index allocator's mutex orders the
//!   old owner's last use before the new owner's adoption.
//!
//! # Execution context
//!
//! [`PerThread::get`] never blocks, never allocates and is
//! async-signal-safe. [`PerThread::get_or`] allocates (the thread's index
//! on its first call in the process, a bucket, the value) when the thread
//! has no value yet, and is then not async-signal-safe.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::mem::MaybeUninit;

use crate::sync::unmodelled::{AtomicPtr, AtomicU64, Mutex};
use crate::sync::{Ordering, compiler_fence};

/// Buckets per `PerThread`: indices up to `2^BUCKETS - 2`.
const BUCKETS: usize = 32;

/// The generation of a thread that has none yet.
const NONE: u64 = 0;
/// The generation of a thread whose thread-locals are being destroyed.
const EXITED: u64 = u64::MAX;

/// Thread indices: the lowest free one is handed out first.
struct Indices {
    free: BinaryHeap<Reverse<usize>>,
    next: usize,
}

static INDICES: Mutex<Indices> = Mutex::new(Indices {
    free: BinaryHeap::new(),
    next: 0,
});

static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

std::thread_local! {
    /// This thread's index, as its (bucket, offset), and generation;
    /// `NONE` until the first `get_or`, `EXITED` once its index went back
    /// (const-initialised, no destructor: readable at every point of the
    /// thread's life, signal handlers too).
    static ID: Cell<(usize, usize, u64)> = const { Cell::new((0, 0, NONE)) };
    /// Gives the index back when the thread exits.
    static RELEASE: Release = const { Release };
    /// Per [`CacheSlot`]: the `PerThread` this thread last found its value
    /// in (its `id`; 0: none, [`BUSY`]: being written) and that value, a
    /// one-entry cache in front of the buckets. Invariant: `LAST_VALUE[k]`
    /// is this thread's value in the `PerThread` named by `LAST_ID[k]`
    /// whenever that is neither 0 nor `BUSY`, except while `remember`
    /// writes the pair (see there, and `get` for how a reader that a
    /// signal handler interrupts, or that is a signal handler, copes).
    /// Atomics, accessed Relaxed by this thread only, so that the compiler
    /// fences order them against a signal handler on the same thread.
    static LAST_ID: [AtomicU64; CACHE_SLOTS] =
        const { [const { AtomicU64::new(0) }; CACHE_SLOTS] };
    static LAST_VALUE: [AtomicPtr<()>; CACHE_SLOTS] =
        const { [const { AtomicPtr::new(std::ptr::null_mut()) }; CACHE_SLOTS] };
}

/// `LAST_ID` while `remember` writes the pair: matches no `PerThread`.
const BUSY: u64 = u64::MAX;

const CACHE_SLOTS: usize = 3;

/// Which one-entry cache a `PerThread` uses: one per kind of owner, so
/// that a dispatch that goes through a registry and its index's hit cache
/// does not evict one with the other.
#[derive(Clone, Copy)]
pub(crate) enum CacheSlot {
    /// Probe registries.
    Registry = 0,
    /// Hit caches.
    HitCache = 1,
    /// Object pools' magazines.
    Pool = 2,
}

/// Ids of `PerThread`s: never reused, so a cache entry of a dropped one
/// can never match again.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Caches `value` as this thread's value in the `PerThread` `id`, in
/// cache slot `k`.
///
/// Signal handlers on this thread are the only other users of the cells
/// (Relaxed atomics; the compiler fences keep the program order). A
/// handler that runs while the pair is written finds `BUSY`: its `get`
/// misses, and its own `remember` returns without writing, so the pair
/// this call writes stays whole. A handler that runs before `BUSY` is
/// stored writes a whole pair of its own, which this call then replaces.
#[inline]
fn remember(k: usize, id: u64, value: *const ()) {
    LAST_ID.with(|l| {
        // Relaxed, all: this thread's own cells (see above).
        if l[k].load(Ordering::Relaxed) == BUSY {
            // We interrupted a `remember` of this thread: leave its pair.
            return;
        }
        l[k].store(BUSY, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        LAST_VALUE.with(|v| v[k].store(value.cast_mut(), Ordering::Relaxed));
        compiler_fence(Ordering::SeqCst);
        l[k].store(id, Ordering::Relaxed);
    });
}

struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        let (bucket, offset, generation) = ID.get();
        // Exited first, then the cache cleared: a signal handler that runs
        // in between finds no index (its lookups miss and remember
        // nothing), so no cached value of the index given back below
        // survives.
        ID.set((0, 0, EXITED));
        compiler_fence(Ordering::SeqCst);
        // Relaxed: this thread's own cells.
        LAST_ID.with(|l| l.iter().for_each(|c| c.store(0, Ordering::Relaxed)));
        if generation != NONE && generation != EXITED {
            lock(&INDICES)
                .free
                .push(Reverse((1 << bucket) + offset - 1));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// This thread's (bucket, offset, generation), allocating them on first
/// use; `None` while its thread-locals are being destroyed.
#[cold]
fn register_thread() -> Option<(usize, usize, u64)> {
    let id = ID.get();
    if id.2 == EXITED {
        return None;
    }
    if id.2 != NONE {
        return Some(id);
    }
    // Touch the release guard first: if it is already destroyed the index
    // could never be given back.
    RELEASE.try_with(|_| ()).ok()?;
    let index = {
        let mut ids = lock(&INDICES);
        match ids.free.pop() {
            Some(Reverse(i)) => i,
            None => {
                ids.next += 1;
                ids.next - 1
            }
        }
    };
    let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
    let (bucket, offset) = locate(index);
    ID.set((bucket, offset, generation));
    Some((bucket, offset, generation))
}

/// Bucket and offset of thread index `index`.
#[inline(always)]
fn locate(index: usize) -> (usize, usize) {
    let i = index + 1;
    let bucket = (usize::BITS - 1 - i.leading_zeros()) as usize;
    (bucket, i - (1 << bucket))
}

struct Entry<T> {
    /// Generation of the owning thread; `NONE` while `value` is
    /// uninitialised. Invariant: stored only by the thread it names, with
    /// `Release` after initialising or adopting the value.
    owner: AtomicU64,
    value: std::cell::UnsafeCell<MaybeUninit<T>>,
}

/// One `T` per thread, owned by an object; see the module docs.
pub(crate) struct PerThread<T> {
    /// Unique, non-zero: the key of the thread-local one-entry cache.
    id: u64,
    /// Which one-entry cache.
    slot: CacheSlot,
    /// Bucket `b`: null, or `2^b` entries from `Box<[Entry<T>]>::into_raw`.
    buckets: [AtomicPtr<Entry<T>>; BUCKETS],
}

// SAFETY: values are handed out as `&T` to their owning thread and, through
// `iter`, to any thread, so `T: Sync` is required; they are dropped by
// whichever thread drops the `PerThread`, so `T: Send` too.
unsafe impl<T: Send + Sync> Sync for PerThread<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Send for PerThread<T> {}

impl<T> PerThread<T> {
    pub(crate) fn new(slot: CacheSlot) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            slot,
            buckets: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
        }
    }

    /// The entry at `offset` of `bucket`, if the bucket exists.
    #[inline(always)]
    fn entry(&self, bucket: usize, offset: usize) -> Option<&Entry<T>> {
        // Acquire: pairs with the Release bucket publication in `get_or`;
        // the entries are initialised.
        let p = self.buckets[bucket].load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: a published bucket holds `2^bucket` entries and lives as
        // long as `self`; `offset < 2^bucket` (`ID` holds what `locate`
        // computed).
        Some(unsafe { &*p.add(offset) })
    }

    /// The calling thread's value, if it has one. Async-signal-safe.
    #[inline(always)]
    pub(crate) fn get(&self) -> Option<&T> {
        let k = self.slot as usize;
        // Id, value, id again (Relaxed: this thread's own cells, ordered by
        // the compiler fences against its signal handlers): a handler that
        // rewrote the pair between the two id loads leaves the second one
        // different (it wrote `BUSY` and another id) or the same pair (the
        // same id with the same value: each thread has one value per
        // `PerThread`), so a match on both means the value belongs to the
        // id.
        let hit = LAST_ID.with(|l| {
            if l[k].load(Ordering::Relaxed) != self.id {
                return None;
            }
            compiler_fence(Ordering::SeqCst);
            let v = LAST_VALUE.with(|v| v[k].load(Ordering::Relaxed));
            compiler_fence(Ordering::SeqCst);
            (l[k].load(Ordering::Relaxed) == self.id).then_some(v)
        });
        match hit {
            // SAFETY: the invariant of `LAST_ID`, checked above: this
            // thread's value in `self`, which lives as long as `self`.
            Some(v) => Some(unsafe { &*v.cast::<T>() }),
            None => self.get_uncached(),
        }
    }

    /// [`get`](Self::get) through the buckets; remembers what it finds.
    #[inline]
    fn get_uncached(&self) -> Option<&T> {
        let (bucket, offset, generation) = ID.get();
        let e = self.entry(bucket, offset)?;
        // Relaxed: only this thread stores its own generation; a match means
        // this thread initialised or adopted the value itself.
        if e.owner.load(Ordering::Relaxed) != generation || generation == NONE {
            return None;
        }
        // SAFETY: owned by this thread, so initialised (invariant of
        // `owner`); shared access only.
        let v = unsafe { (*e.value.get()).assume_init_ref() };
        remember(self.slot as usize, self.id, (v as *const T).cast());
        Some(v)
    }

    /// The calling thread's value, made with `init` if its index never had
    /// one, or adopted with `adopt` from the exited thread that had its
    /// index before. `None` while the thread's thread-locals are being
    /// destroyed.
    #[cold]
    pub(crate) fn get_or(&self, init: impl FnOnce() -> T, adopt: impl FnOnce(&T)) -> Option<&T> {
        if let Some(v) = self.get() {
            return Some(v);
        }
        let (bucket, offset, generation) = register_thread()?;
        let slot = &self.buckets[bucket];
        // Acquire: as in `entry`.
        let mut p = slot.load(Ordering::Acquire);
        if p.is_null() {
            let fresh: Box<[Entry<T>]> = (0..1usize << bucket)
                .map(|_| Entry {
                    owner: AtomicU64::new(NONE),
                    value: std::cell::UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect();
            let fresh = Box::into_raw(fresh).cast::<Entry<T>>();
            // AcqRel: the Release publishes the entries (pairs with the
            // Acquire loads in `entry`); the Acquire on failure sees the
            // winner's.
            match slot.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => p = fresh,
                Err(winner) => {
                    // SAFETY: ours, never published.
                    drop(unsafe {
                        Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, 1 << bucket))
                    });
                    p = winner;
                }
            }
        }
        // SAFETY: as in `entry`.
        let e = unsafe { &*p.add(offset) };
        // Relaxed: any earlier owner exited and released this index before
        // we took it, under the index mutex: its stores happen before ours.
        if e.owner.load(Ordering::Relaxed) == NONE {
            // SAFETY: no value yet and the index is ours: nobody else
            // touches the cell until `owner` publishes it.
            unsafe { (*e.value.get()).write(init()) };
        } else {
            // SAFETY: initialised (invariant of `owner`).
            adopt(unsafe { (*e.value.get()).assume_init_ref() });
        }
        // Release: pairs with the Acquire owner loads in `iter`; the value
        // is initialised.
        e.owner.store(generation, Ordering::Release);
        // SAFETY: initialised just now or before.
        Some(unsafe { (*e.value.get()).assume_init_ref() })
    }

    /// Every value made so far, of live and exited threads.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        (0..BUCKETS).flat_map(move |b| {
            // Acquire: as in `entry`.
            let p = self.buckets[b].load(Ordering::Acquire);
            let n = if p.is_null() { 0 } else { 1usize << b };
            (0..n).filter_map(move |i| {
                // SAFETY: as in `entry`.
                let e = unsafe { &*p.add(i) };
                // Acquire: pairs with the Release owner store in `get_or`.
                (e.owner.load(Ordering::Acquire) != NONE)
                    // SAFETY: initialised (invariant of `owner`).
                    .then(|| unsafe { (*e.value.get()).assume_init_ref() })
            })
        })
    }
}

impl<T> Drop for PerThread<T> {
    fn drop(&mut self) {
        for (b, slot) in self.buckets.iter().enumerate() {
            let p = slot.load(Ordering::Relaxed);
            if p.is_null() {
                continue;
            }
            // SAFETY: `&mut self`: no thread uses the entries any more; the
            // bucket came from `Box<[Entry<T>]>::into_raw` with `2^b` entries.
            let mut bucket =
                unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, 1 << b)) };
            for e in bucket.iter_mut() {
                if *e.owner.get_mut() != NONE {
                    // SAFETY: initialised (invariant of `owner`), dropped once.
                    unsafe { e.value.get_mut().assume_init_drop() };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn locate_covers_indices_without_gaps() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(1), (1, 0));
        assert_eq!(locate(2), (1, 1));
        assert_eq!(locate(3), (2, 0));
        assert_eq!(locate(6), (2, 3));
        assert_eq!(locate(7), (3, 0));
    }

    #[test]
    fn each_thread_gets_its_own_value_and_exited_threads_values_are_adopted() {
        let pt = Arc::new(PerThread::<AtomicUsize>::new(CacheSlot::Registry));
        let made = Arc::new(AtomicUsize::new(0));
        let n = if cfg!(miri) { 3 } else { 16 };
        for round in 0..3 {
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    let (pt, made) = (pt.clone(), made.clone());
                    std::thread::spawn(move || {
                        let v = pt
                            .get_or(
                                || {
                                    made.fetch_add(1, Ordering::Relaxed);
                                    AtomicUsize::new(0)
                                },
                                |_| {},
                            )
                            .unwrap();
                        v.fetch_add(1, Ordering::Relaxed);
                        assert!(std::ptr::eq(v, pt.get().unwrap()));
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let total: usize = pt.iter().map(|v| v.load(Ordering::Relaxed)).sum();
            assert_eq!(total, n * (round + 1), "counts of exited threads are kept");
        }
        // Indices are reused: no more values than threads alive at once
        // (plus threads of other tests running beside this one).
        assert!(made.load(Ordering::Relaxed) < 3 * n);
    }

    #[test]
    fn values_are_dropped_with_the_object() {
        let drops = Arc::new(AtomicUsize::new(0));
        struct D(Arc<AtomicUsize>);
        impl Drop for D {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let pt = PerThread::<D>::new(CacheSlot::HitCache);
        assert!(pt.get().is_none());
        pt.get_or(|| D(drops.clone()), |_| {}).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                pt.get_or(|| D(drops.clone()), |_| {}).unwrap();
            });
        });
        // Two threads alive at once: two indices, two values.
        assert_eq!(pt.iter().count(), 2);
        assert_eq!(drops.load(Ordering::Relaxed), 0);
        drop(pt);
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    }
}
