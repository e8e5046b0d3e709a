//! The shared half of return instances: the per-thread shadow-stack
//! records a scanner can walk, the instances themselves, and the seqcount
//! that decides when a finished instance may be reused.
//!
//! # Objects
//!
//! * [`RetInst`]: one return instance, an object of the [`ObjPool`]. Its
//!   identity fields (probe slot, generation, address, `expired`) are atomics
//!   because a scanner may read them from another thread; its data area is
//!   owner-only.
//! * [`StackView`]: one thread's shadow stack as scanners see it: `depth` and
//!   the object index of each in-flight instance. Only the owning
//!   [`ReturnStack`](super::ReturnStack) stores into it.
//! * [`PoolShared`]: the pool, the records, the scan seqcount `scan_seq` and the
//!   `orphans` (instances finished while a scan ran).
//!
//! # Reuse against a concurrent scanner
//!
//! A scanner ([`PoolShared::expire`]) reads instances that other threads may be
//! finishing at the same time. A finished instance must not be reused (its
//! fields overwritten for a new call) while a scanner may still be reading
//! it, or the scanner would mark the *new* call expired. The uprobes
//! solution is a seqcount written by the scanner and read by the owner;
//! here the owner's side costs no fence because the crate's RCU supplies
//! the store→load ordering (a read-side section is a thread-local store and
//! a compiler fence; the scanner pays one grace period):
//!
//! * **owner, finishing an instance**: inside an RCU read-side section,
//!   unlink it (`depth -= 1`), then read `scan_seq`. Even: no scan can see
//!   it, push it on the thread's LIFO (`free`) for the next entry, with no
//!   atomic read-modify-write. Odd: a scan may be reading it; hand it to
//!   `orphans` under their lock, unless the scan has ended in the meantime.
//! * **scanner**: under `scan_lock`, `scan_seq += 1` (odd), then
//!   [`rcu::synchronize`](crate::rcu::synchronize), walk every record
//!   (`Acquire` loads of `depth` and the slots), then under the `orphans`
//!   lock `scan_seq += 1` (even, `Release`) and return every orphan to the
//!   object pool.
//!
//! **Invariant (no reuse under a scanner).** An instance a scanner reads is
//! never reused before that scan ends. Proof sketch: take an owner section
//! that unlinks instance X and a scan S. If the section was running when S
//! called `synchronize`, S waited for it, and S's walk (after the grace
//! period, whose scan of reader records `Acquire`s each reader's `Release`
//! exit) sees `depth` without X; S can only meet X again if the owner pushes
//! it anew, and then it reads the new call's fields, stored before the slot
//! was published. Otherwise the section began after S's odd store and sees
//! it (the RCU guarantee: a section not waited for by a grace period sees
//! every store made before `synchronize` was called), so X becomes an
//! orphan, which only S's end releases, or goes to `free` after the owner
//! re-read `scan_seq` under the `orphans` lock and found S over.
//!
//! Reading an even `scan_seq` with `Acquire` pairs with the scanner's
//! `Release` end store: the scanner's `expired` stores happen before the
//! owner resets the flag for the instance's next use.

use std::sync::Arc;

use crate::objpool::ObjPool;
use crate::sync::UnsafeCell;
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, CachePadded, Mutex, Ordering};

/// One return instance. Aligned to a cache line: an instance never
/// straddles two lines nor shares one with an instance of another thread.
#[repr(align(64))]
pub(crate) struct RetInst {
    /// Identity of the probe the entry belongs to. Invariant: stored only
    /// by the owner before the instance is published in a slot (`Release`).
    pub(crate) probe_slot: AtomicU64,
    pub(crate) generation: AtomicU64,
    /// The probed function's address (or return address; the caller's choice).
    pub(crate) addr: AtomicU64,
    /// Set by [`PoolShared::expire`]; reset by the owner at each new use.
    pub(crate) expired: AtomicBool,
    /// The entry handler's data area.
    ///
    /// Invariant: accessed only by the thread that holds the instance (from
    /// its pop from the pool or `free` until it is returned); scanners never
    /// touch it.
    pub(crate) data: UnsafeCell<Data>,
}

/// The owner-only part of a [`RetInst`].
pub(crate) struct Data {
    /// Bytes of `buf` in use for the current call.
    pub(crate) len: usize,
    /// `data_size` bytes, allocated once with the pool.
    pub(crate) buf: Box<[u8]>,
}

// SAFETY: other threads only touch the atomics; `data` is accessed by the
// one thread that holds the instance (invariant of `data`), and holding
// moves between threads only through the object pool's Release/Acquire.
unsafe impl Sync for RetInst {}

impl RetInst {
    fn new(data_size: usize) -> Self {
        Self {
            probe_slot: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            addr: AtomicU64::new(0),
            expired: AtomicBool::new(false),
            data: UnsafeCell::new(Data {
                len: 0,
                buf: vec![0; data_size].into_boxed_slice(),
            }),
        }
    }
}

/// One thread's shadow stack, as scanners see it. Aligned to 128 bytes, so
/// that threads' records (written on every push and pop) never share a line.
#[repr(align(128))]
pub(crate) struct StackView {
    /// Number of in-flight instances.
    ///
    /// Invariant: stored only by the owning stack; `slots[..depth]` are
    /// published before `depth` covers them (`Release`).
    pub(crate) depth: AtomicUsize,
    /// Object index of the instance at each depth, in 128-byte blocks (no
    /// line shared with another thread's slots); see [`StackView::slot`].
    slots: Box<[SlotBlock]>,
    /// Number of usable slots (`max_depth`).
    max_depth: usize,
    /// Misses by cause; owner-only stores (load + store, no RMW).
    pub(crate) missed_depth: AtomicU64,
    pub(crate) missed_exhausted: AtomicU64,
    /// Invariant: changed only under `PoolShared::records`' lock; `true` while
    /// a `ReturnStack` owns the record.
    pub(crate) in_use: AtomicBool,
}

impl StackView {
    fn new(max_depth: usize) -> Self {
        Self {
            depth: AtomicUsize::new(0),
            slots: (0..max_depth.div_ceil(SLOTS_PER_BLOCK))
                .map(|_| SlotBlock(std::array::from_fn(|_| AtomicU32::new(0))))
                .collect(),
            max_depth,
            missed_depth: AtomicU64::new(0),
            missed_exhausted: AtomicU64::new(0),
            in_use: AtomicBool::new(true),
        }
    }

    /// The slot at depth `k < max_depth`.
    #[inline(always)]
    pub(crate) fn slot(&self, k: usize) -> &AtomicU32 {
        debug_assert!(k < self.max_depth);
        &self.slots[k / SLOTS_PER_BLOCK].0[k % SLOTS_PER_BLOCK]
    }

    /// Number of slots.
    pub(crate) fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Owner-only counter bump: no read-modify-write needed.
    #[inline]
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

const SLOTS_PER_BLOCK: usize = 32;

/// 32 slots on their own pair of cache lines.
#[repr(align(128))]
struct SlotBlock([AtomicU32; SLOTS_PER_BLOCK]);

/// State shared by a pool's handles and stacks.
pub(crate) struct PoolShared {
    pub(crate) pool: ObjPool<RetInst>,
    pub(crate) data_size: usize,
    pub(crate) max_depth: usize,
    /// Scan seqcount: odd while a scan runs.
    ///
    /// Invariant: stored only under `scan_lock`, and the odd→even store
    /// also under the `orphans` lock.
    pub(crate) scan_seq: CachePadded<AtomicU32>,
    /// Serialises scanners.
    scan_lock: Mutex<()>,
    /// Every record ever made; reused when free.
    records: Mutex<Vec<Arc<StackView>>>,
    /// Instances finished while a scan ran. Invariant: capacity for every
    /// instance (never reallocates); emptied when the scan ends.
    orphans: Mutex<Vec<u32>>,
    /// Completed scans.
    scans: AtomicU64,
}

impl PoolShared {
    pub(crate) fn new(
        pool_builder: crate::objpool::ObjPoolBuilder,
        instances: usize,
        data_size: usize,
        max_depth: usize,
    ) -> Result<Self, crate::objpool::ObjPoolError> {
        let pool = pool_builder.build(instances, |_| RetInst::new(data_size))?;
        Ok(Self {
            pool,
            data_size,
            max_depth,
            scan_seq: CachePadded(AtomicU32::new(0)),
            scan_lock: Mutex::new(()),
            records: Mutex::new(Vec::new()),
            orphans: Mutex::new(Vec::with_capacity(instances)),
            scans: AtomicU64::new(0),
        })
    }

    /// The instance with object index `index`, shared view (atomics only,
    /// plus `data` for its holder).
    #[inline(always)]
    pub(crate) fn ri(&self, index: u32) -> &RetInst {
        // SAFETY: the pool lives as long as `self`; object `index` is
        // initialised, and a `RetInst` is only ever accessed through shared
        // references (its mutable part is behind an `UnsafeCell`).
        unsafe { &*self.pool.raw_ref().obj(index) }
    }

    /// Claims a free record or makes a new one.
    pub(crate) fn claim_record(&self) -> Arc<StackView> {
        let mut records = lock(&self.records);
        for rec in records.iter() {
            if !rec.in_use.load(Ordering::Relaxed) {
                // Relaxed: `in_use` only changes under this lock.
                rec.in_use.store(true, Ordering::Relaxed);
                return rec.clone();
            }
        }
        let rec = Arc::new(StackView::new(self.max_depth));
        records.push(rec.clone());
        rec
    }

    /// Gives a record back (its stack is empty).
    pub(crate) fn release_record(&self, rec: &StackView) {
        let _records = lock(&self.records);
        rec.in_use.store(false, Ordering::Relaxed);
    }

    /// Sums the per-record miss counters: `(depth, exhausted, records)`.
    pub(crate) fn miss_counts(&self) -> (u64, u64, usize) {
        let records = lock(&self.records);
        records.iter().fold((0, 0, 0), |(d, e, n), r| {
            (
                d + r.missed_depth.load(Ordering::Relaxed),
                e + r.missed_exhausted.load(Ordering::Relaxed),
                n + usize::from(r.in_use.load(Ordering::Relaxed)),
            )
        })
    }

    pub(crate) fn scans(&self) -> u64 {
        self.scans.load(Ordering::Relaxed)
    }

    /// Unlinks the top instance of `rec` (at depth `new_depth`) and reads
    /// the scan seqcount, both inside one RCU read-side section (see the
    /// module docs). Returns the seqcount value read.
    #[inline]
    pub(crate) fn unlink(&self, rec: &StackView, new_depth: usize) -> u32 {
        let _rcu = crate::rcu::read_lock();
        // Relaxed: the RCU section orders this store before a scanner's walk
        // or the load below after the scanner's odd store (module docs).
        rec.depth.store(new_depth, Ordering::Relaxed);
        // Acquire: pairs with the Release end store in `expire`; a finished
        // scan's stores to `expired` happen before our reuse.
        self.scan_seq.load(Ordering::Acquire)
    }

    /// Disposes of an instance unlinked while scan `seq` (odd) ran: into
    /// `orphans` if that scan still runs, else back to the caller (`Some`),
    /// who may reuse it.
    #[cold]
    pub(crate) fn orphan(&self, index: u32, seq: u32) -> Option<u32> {
        let mut orphans = lock(&self.orphans);
        // Acquire: as in `unlink`. The scan can only end under this lock, so
        // if it still runs it will see our orphan.
        if self.scan_seq.load(Ordering::Acquire) == seq {
            orphans.push(index);
            None
        } else {
            Some(index)
        }
    }

    /// Marks every in-flight instance of probe `probe_slot` expired; returns
    /// how many it marked. Waits for an RCU grace period.
    pub(crate) fn expire(&self, probe_slot: u64) -> usize {
        let _scan = lock(&self.scan_lock);
        let seq = self.scan_seq.load(Ordering::Relaxed).wrapping_add(1);
        debug_assert!(seq & 1 == 1);
        // Relaxed: `synchronize` below publishes it to every read-side
        // section it does not wait for.
        self.scan_seq.store(seq, Ordering::Relaxed);
        crate::rcu::synchronize();

        let mut marked = 0;
        for rec in lock(&self.records).iter() {
            // Acquire: pairs with the Release depth store in `push`; the
            // slots below it are published.
            let depth = rec.depth.load(Ordering::Acquire).min(rec.max_depth());
            for k in 0..depth {
                // Acquire: pairs with the Release slot store in `push`; the
                // instance's identity fields are those of its current call.
                let ri = self.ri(rec.slot(k).load(Ordering::Acquire));
                if ri.probe_slot.load(Ordering::Relaxed) == probe_slot {
                    ri.expired.store(true, Ordering::Relaxed);
                    marked += 1;
                }
            }
        }

        let mut orphans = lock(&self.orphans);
        // Release: pairs with the Acquire loads in `unlink` and `orphan`;
        // our `expired` stores happen before any reuse.
        self.scan_seq.store(seq.wrapping_add(1), Ordering::Release);
        for index in orphans.drain(..) {
            // SAFETY: orphans are owned by the orphan list, and the scan
            // that might have read them is over.
            unsafe { self.pool.push_index(index) };
        }
        self.scans.fetch_add(1, Ordering::Relaxed);
        marked
    }
}

/// Locks a mutex, ignoring poisoning (every critical section here leaves
/// its data consistent at each step).
pub(crate) fn lock<T>(m: &Mutex<T>) -> crate::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
