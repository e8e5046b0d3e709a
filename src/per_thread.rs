//! Per-thread state of an object: [`PerThread<T>`] gives each thread its own
//! `T` inside one object (a registry, an index), found in constant time and
//! freed with the object.
//!
//! # Design
//!
//! * Every thread that asks gets a small **thread index**, the lowest one
//!   free, from a process-wide allocator, and a **thread serial**, a
//!   64-bit number never handed out twice. The index goes back to the
//!   allocator when the thread exits; the serial dies with the thread.
//! * A `PerThread<T>` holds buckets of entries: bucket `b` holds `2^b`
//!   entries, for the indices `2^b - 1 ..= 2^(b+1) - 2`, so the entries of
//!   the first threads sit in small buckets and no entry ever moves.
//!   Buckets are allocated on first use and freed with the `PerThread`.
//! * An entry holds a `T` once one was made for its index, and the
//!   serial of the thread that owns it now. A lookup is one
//!   thread-local load (index and serial), one bucket load and one
//!   compare of the entry's owner with the caller's serial.
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
//! * Only the thread whose serial is in `owner` uses the value's
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

/// The serial of a thread that has none yet.
const NONE: u64 = 0;
/// The serial of a thread whose thread-locals are being destroyed.
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

static NEXT_SERIAL: AtomicU64 = AtomicU64::new(1);

std::thread_local! {
    /// This thread's index, as its (bucket, offset), and serial;
    /// `NONE` until the first `get_or`, `EXITED` once its index went back
    /// (const-initialised, no destructor: readable at every point of the
    /// thread's life, signal handlers too).
    static ID: Cell<(usize, usize, u64)> = const { Cell::new((0, 0, NONE)) };
    /// Gives the index back when the thread exits.
    static RELEASE: Release = const { Release };
    /// Per [`CacheSlot`]: the `PerThread` this thread last found its value
    /// in (a key it had; 0: none, [`BUSY`]: being written) and that value,
    /// a one-entry cache in front of the buckets. Invariant:
    /// `LAST_VALUE[k]` is this thread's value in the `PerThread` that had
    /// the key in `LAST_ID[k]` whenever that is neither 0 nor `BUSY`, except while `remember`
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

const CACHE_SLOTS: usize = 2;

/// Which one-entry cache a `PerThread` uses: one per kind of owner, so
/// that owners used in one operation do not evict each other.
#[derive(Clone, Copy)]
pub(crate) enum CacheSlot {
    /// None here: the owner keeps the thread's value in the thread's
    /// context (`context.rs`) and finds it with `find` or `get_or` when
    /// that misses.
    Context = 0,
    /// Object pools' magazines.
    Pool = 1,
}

/// Keys of `PerThread`s: never reused, so a cache entry of a dropped one,
/// or one made under an older key, can never match again.
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// Caches `value` as this thread's value in the `PerThread` that has (or
/// had) key `key`, in cache slot `k`.
///
/// Signal handlers on this thread are the only other users of the cells
/// (Relaxed atomics; the compiler fences keep the program order). A
/// handler that runs while the pair is written finds `BUSY`: its `get`
/// misses, and its own `remember` returns without writing, so the pair
/// this call writes stays whole. A handler that runs before `BUSY` is
/// stored writes a whole pair of its own, which this call then replaces.
#[inline]
fn remember(k: usize, key: u64, value: *const ()) {
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
        l[k].store(key, Ordering::Relaxed);
    });
}

struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        let (bucket, offset, serial) = ID.get();
        // Exited first, then the cache cleared: a signal handler that runs
        // in between finds no index (its lookups miss and remember
        // nothing), so no cached value of the index given back below
        // survives.
        ID.set((0, 0, EXITED));
        compiler_fence(Ordering::SeqCst);
        // Relaxed: this thread's own cells.
        LAST_ID.with(|l| l.iter().for_each(|c| c.store(0, Ordering::Relaxed)));
        // The registry cache of the thread's context too (clearing the key
        // only makes lookups miss: `crate::context` invariants).
        crate::context::context().registry_key.set(0);
        if serial != NONE && serial != EXITED {
            lock(&INDICES)
                .free
                .push(Reverse((1 << bucket) + offset - 1));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// This thread's (bucket, offset, serial), allocating them on first
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
    let serial = NEXT_SERIAL.fetch_add(1, Ordering::Relaxed);
    let (bucket, offset) = locate(index);
    ID.set((bucket, offset, serial));
    Some((bucket, offset, serial))
}

/// Bucket and offset of thread index `index`.
#[inline(always)]
fn locate(index: usize) -> (usize, usize) {
    let i = index + 1;
    let bucket = (usize::BITS - 1 - i.leading_zeros()) as usize;
    (bucket, i - (1 << bucket))
}

/// On lines of its own (128 bytes, as `CachePadded`): the owners of
/// neighbouring entries write their values on every use.
#[repr(align(128))]
struct Entry<T> {
    /// Serial of the owning thread; `NONE` while `value` is
    /// uninitialised. Invariant: stored only by the thread it names, with
    /// `Release` after initialising or adopting the value.
    owner: AtomicU64,
    value: std::cell::UnsafeCell<MaybeUninit<T>>,
}

/// One `T` per thread, owned by an object; see the module docs.
///
/// `SLOT` is the thread-local one-entry cache it uses (a [`CacheSlot`] as
/// `usize`), a constant so that the cache's address is too.
pub(crate) struct PerThread<T, const SLOT: usize> {
    /// Unique, non-zero, never reused: the key of the thread-local
    /// one-entry cache. Changed by [`rekey`](Self::rekey).
    key: AtomicU64,
    /// Bucket `b`: null, or `2^b` entries from `Box<[Entry<T>]>::into_raw`.
    buckets: [AtomicPtr<Entry<T>>; BUCKETS],
}

// SAFETY: values are handed out as `&T` to their owning thread and, through
// `iter`, to any thread, so `T: Sync` is required; they are dropped by
// whichever thread drops the `PerThread`, so `T: Send` too.
unsafe impl<T: Send + Sync, const SLOT: usize> Sync for PerThread<T, SLOT> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync, const SLOT: usize> Send for PerThread<T, SLOT> {}

impl<T, const SLOT: usize> PerThread<T, SLOT> {
    pub(crate) fn new() -> Self {
        const { assert!(SLOT < CACHE_SLOTS) };
        Self {
            key: AtomicU64::new(NEXT_KEY.fetch_add(1, Ordering::Relaxed)),
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
        match self.get_cached() {
            Some(v) => Some(v),
            None => self.get_uncached(),
        }
    }

    /// The calling thread's value if the thread-local cache holds it under
    /// the current key (see [`rekey`](Self::rekey)). Async-signal-safe.
    #[inline(always)]
    pub(crate) fn get_cached(&self) -> Option<&T> {
        // Relaxed: a rekey is ordered before the lookups that must miss by
        // the caller's own synchronisation (see `rekey`).
        let key = self.key.load(Ordering::Relaxed);
        // Key, value, key again (Relaxed: this thread's own cells, ordered
        // by the compiler fences against its signal handlers): a handler
        // that rewrote the pair between the two key loads leaves the second
        // one different (it wrote `BUSY` and another key) or the same pair
        // (the same key with the same value: each thread has one value per
        // `PerThread`, and keys are never reused), so a match on both means
        // the value belongs to the key.
        let hit = LAST_ID.with(|l| {
            if l[SLOT].load(Ordering::Relaxed) != key {
                return None;
            }
            compiler_fence(Ordering::SeqCst);
            let v = LAST_VALUE.with(|v| v[SLOT].load(Ordering::Relaxed));
            compiler_fence(Ordering::SeqCst);
            (l[SLOT].load(Ordering::Relaxed) == key).then_some(v)
        });
        // SAFETY: the invariant of `LAST_ID`, checked above: this thread's
        // value in the `PerThread` whose key it is, `self` (keys are never
        // reused), which lives as long as `self`.
        hit.map(|v| unsafe { &*v.cast::<T>() })
    }

    /// [`get`](Self::get) through the buckets; remembers what it finds.
    #[inline]
    fn get_uncached(&self) -> Option<&T> {
        let key = self.key();
        let v = self.find()?;
        self.remember(v, key);
        Some(v)
    }

    /// The calling thread's value through the buckets, without touching
    /// the thread-local cache. Async-signal-safe.
    #[inline]
    pub(crate) fn find(&self) -> Option<&T> {
        let (bucket, offset, serial) = ID.get();
        let e = self.entry(bucket, offset)?;
        // Relaxed: only this thread stores its own serial; a match means
        // this thread initialised or adopted the value itself.
        if e.owner.load(Ordering::Relaxed) != serial || serial == NONE {
            return None;
        }
        // SAFETY: owned by this thread, so initialised (invariant of
        // `owner`); shared access only.
        Some(unsafe { (*e.value.get()).assume_init_ref() })
    }

    /// The current key: what [`get_cached`](Self::get_cached) matches the
    /// thread-local cache against.
    #[inline]
    pub(crate) fn key(&self) -> u64 {
        // Relaxed: as in `get_cached`.
        self.key.load(Ordering::Relaxed)
    }

    /// Caches `v`, the calling thread's value (from [`find`](Self::find)
    /// or [`get_or`](Self::get_or)), under `key`, a key this `PerThread`
    /// had ([`key`](Self::key)): if it has been rekeyed since, the entry
    /// never matches again. Async-signal-safe.
    #[inline]
    pub(crate) fn remember(&self, v: &T, key: u64) {
        remember(SLOT, key, (v as *const T).cast());
    }

    /// Gives the `PerThread` a new key, never used before: every thread's
    /// next [`get_cached`](Self::get_cached) misses, so that its owner can
    /// look at the value (in its slow path) before caching it again. Seen
    /// by every lookup that happens after this call returns (through the
    /// caller's own synchronisation, such as publishing the object).
    pub(crate) fn rekey(&self) {
        // Relaxed: see above.
        self.key
            .store(NEXT_KEY.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The calling thread's value, made with `init` if its index never had
    /// one, or adopted with `adopt` from the exited thread that had its
    /// index before. `None` while the thread's thread-locals are being
    /// destroyed.
    #[cold]
    pub(crate) fn get_or(&self, init: impl FnOnce() -> T, adopt: impl FnOnce(&T)) -> Option<&T> {
        if let Some(v) = self.find() {
            return Some(v);
        }
        let (bucket, offset, serial) = register_thread()?;
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
        e.owner.store(serial, Ordering::Release);
        // SAFETY: initialised just now or before.
        Some(unsafe { (*e.value.get()).assume_init_ref() })
    }

    /// Every value made so far, of live and exited threads.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.iter_owned().map(|(v, _)| v)
    }

    /// Every value made so far, with its owner's serial.
    fn iter_owned(&self) -> impl Iterator<Item = (&T, u64)> {
        (0..BUCKETS).flat_map(move |b| {
            // Acquire: as in `entry`.
            let p = self.buckets[b].load(Ordering::Acquire);
            let n = if p.is_null() { 0 } else { 1usize << b };
            (0..n).filter_map(move |i| {
                // SAFETY: as in `entry`.
                let e = unsafe { &*p.add(i) };
                // Acquire: pairs with the Release owner store in `get_or`.
                let owner = e.owner.load(Ordering::Acquire);
                (owner != NONE)
                    // SAFETY: initialised (invariant of `owner`).
                    .then(|| (unsafe { (*e.value.get()).assume_init_ref() }, owner))
            })
        })
    }
}

impl<T, const SLOT: usize> Drop for PerThread<T, SLOT> {
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
        let pt = Arc::new(PerThread::<AtomicUsize, { CacheSlot::Context as usize }>::new());
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
    fn a_rekey_makes_every_cached_lookup_miss_until_the_owner_caches_again() {
        let pt = PerThread::<AtomicUsize, { CacheSlot::Pool as usize }>::new();
        let v = pt.get_or(|| AtomicUsize::new(7), |_| {}).unwrap() as *const AtomicUsize;
        assert!(pt.get_cached().is_none(), "get_or caches nothing");
        assert!(std::ptr::eq(pt.get().unwrap(), v), "get finds and caches");
        assert!(std::ptr::eq(pt.get_cached().unwrap(), v));
        let old = pt.key();
        pt.rekey();
        assert_ne!(pt.key(), old);
        assert!(pt.get_cached().is_none(), "cached under the old key");
        assert!(
            std::ptr::eq(pt.find().unwrap(), v),
            "find ignores the cache"
        );
        pt.remember(pt.find().unwrap(), old);
        assert!(pt.get_cached().is_none(), "an old key never matches again");
        pt.remember(pt.find().unwrap(), pt.key());
        assert!(std::ptr::eq(pt.get_cached().unwrap(), v));
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
        let pt = PerThread::<D, { CacheSlot::Context as usize }>::new();
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
