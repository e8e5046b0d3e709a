//! The address index's algorithm: a chain of open-addressing tables
//! (`table.rs`) holding one copy-on-write record per address (`record.rs`),
//! writer stripes, and incremental migration.
//!
//! # Readers
//!
//! `lookup(key)`: load `root`; address 0 (kept in each table's `zero`
//! slot) leaves the fast path; the rest probe it; a live record
//! ends the search; null (absent or tombstone) or `MOVED` sends the reader on to
//! `table.future` until there is none. No lock, no store, no fence, no
//! atomic read-modify-write; `Acquire` loads only (plain loads on x86).
//! Everything reachable from `root` stays allocated until a grace period
//! after it is unlinked, so the caller's RCU read guard is all the
//! protection a reader needs.
//!
//! # Writers
//!
//! Every change to key `k` happens under `k`'s *stripe lock*: one of
//! `stripes.len()` (a power of two, ≥ 4 per CPU) mutexes, each on its own
//! pair of cache lines, chosen by an unseeded mix of `k` so a key keeps its
//! stripe across rehashes. Under it a writer finds `k`'s live slot anywhere
//! in the chain and publishes a new record there (copy-on-write), or, for a
//! new key, claims a slot in the newest table. The old record is retired to
//! the RCU (dropped after a grace period) once no slot holds it: a record
//! of a shared insert (`shared.rs`) is in the slots of many keys, each
//! under its own stripe, and counts them (`record.rs`, "Shared records").
//!
//! Writers on different stripes share no counter: the counts of values,
//! live addresses and record bytes are per stripe, kept under the stripe
//! lock (the index-wide counts are their sums; a shared record's bytes are
//! counted once, index-wide, by whoever builds or frees it), and a stripe reserves slot
//! claims in the newest table several at a time (claim credits,
//! `insert_group_at`): a count that every insert wrote would bounce one
//! line between the registering threads. The exception is
//! `max_addresses`: a limit needs one count that a check-and-add updates
//! atomically, so an index with a limit keeps one.
//!
//! # Resize
//!
//! Online and incremental, under the `resize` mutex: a new table is
//! attached behind the root and the old one migrated a chunk at a time
//! by later writes (`resize.rs`, whose module docs hold the protocol).
//! Bulk inserts, their presizing and their all-or-nothing rollback are
//! in `bulk.rs`.

mod bulk;
pub(crate) mod record;
pub(super) mod resize;
mod shared;
mod slots;
pub(crate) mod table;

use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use record::{Header, RecordPtr, drop_record};
use table::{FORCE_AT, LONG_PROBE, Probe, Slot, Table, is_live};

use crate::error::Error;
use crate::rcu;
use crate::sync::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, CachePadded, Mutex, MutexGuard, Ordering,
};

/// Bits of an entry id that name its stripe.
const STRIPE_ID_BITS: u32 = 16;

/// Bit set in the ids of shared inserts (`shared.rs`), which name no
/// stripe: one id serves every address of the insert.
const SHARED_ID: u64 = 1 << 63;

/// Slots migrated per write while a resize is in progress.
const MIGRATE_CHUNK: usize = 256;

/// Writer-side counters of shared records (`shared.rs`).
#[derive(Default)]
struct SharedCounts {
    /// Sequence of shared-insert ids.
    seq: crate::sync::unmodelled::AtomicU64,
    /// Bytes of the live records built for sharing, counted once however
    /// many addresses hold them (the stripes count every other record).
    /// Shared with a chain `clear` retired, whose records are freed later.
    bytes: std::sync::Arc<crate::sync::unmodelled::AtomicUsize>,
}

/// Index configuration, validated by the builder.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) initial_capacity: usize,
    pub(crate) min_capacity: usize,
    pub(crate) max_addresses: Option<usize>,
    pub(crate) auto_shrink: bool,
    pub(crate) seed: u64,
    pub(crate) stripes: usize,
    /// Keep a write sequence ([`RawIndex::write_sequence`]).
    pub(crate) count_writes: bool,
    /// Tables of 8 MiB and more on transparent huge pages (`slots.rs`).
    pub(crate) huge_pages: bool,
}

/// One writer stripe. Its counters are the index's counts (summed over
/// stripes): writers keep them under the stripe lock they hold anyway, so
/// concurrent writers share no counter's cache line.
struct Stripe {
    lock: Mutex<StripeState>,
    /// Values whose address maps to this stripe. Stored under `lock`.
    values: AtomicUsize,
    /// Live addresses (with at least one value) of this stripe. Stored
    /// under `lock`.
    addrs: AtomicUsize,
    /// Bytes of the records of this stripe. Stored under `lock`.
    record_bytes: AtomicUsize,
}

struct StripeState {
    next_seq: u64,
    /// Claims this stripe has reserved in the newest table and not used yet
    /// (see "Claim credits" in `Table::try_reserve`'s caller,
    /// `insert_group_at`). Zeroed, under every stripe lock, whenever
    /// the newest table changes (`attach`, `clear`), so credits always
    /// belong to the newest table.
    credits: usize,
}

impl Stripe {
    /// Adjusts the stripe's counters. The lock holder is the only writer,
    /// so a load and a store suffice; readers of `len()` may see either
    /// value.
    ///
    /// # Safety
    ///
    /// The caller holds this stripe's `lock`: with two writers, one's
    /// load-then-store could lose the other's adjustment.
    unsafe fn account(&self, values: isize, addrs: isize, record_bytes: isize) {
        for (counter, delta) in [
            (&self.values, values),
            (&self.addrs, addrs),
            (&self.record_bytes, record_bytes),
        ] {
            if delta != 0 {
                let v = counter.load(Ordering::Relaxed);
                counter.store(v.wrapping_add_signed(delta), Ordering::Relaxed);
            }
        }
    }
}

/// The `resize` mutex's state: the migration in progress, if any.
struct ResizeState {
    /// Next slot of `root` to migrate, while `root.future` is set.
    cursor: usize,
    /// Slots to migrate per write during this migration:
    /// `MIGRATE_CHUNK × ⌈old capacity / new capacity⌉ + 2`, and at least 4
    /// per stripe (see `attach`). Every claim in the
    /// new table pays one step, so the migration ends before the new table
    /// can fill (see `attach`).
    budget: usize,
    /// The table count: tables made so far (feeds the per-table seed).
    tables: u64,
}

/// Result of one group insert.
struct Group {
    first: u64,
    claimed: bool,
    long_probe: bool,
}

/// What every lookup reads first, on one line of its own.
#[repr(C)]
struct Root {
    /// Invariant: never null; everything reachable from it (tables, their
    /// futures, live records) is freed only after a grace period that
    /// started after it was unlinked.
    ptr: AtomicPtr<Table>,
}

/// The index without its safe wrapper.
///
/// Layout (`repr(C)`, in 128-byte blocks, the pair of lines an adjacent-line
/// prefetcher moves together): the root pointer
/// alone; then what every write and every lookup off the fast path reads
/// (`cache`, `config`, the stripes) with counters written once per table
/// attached; then the `resize` lock alone, which writers
/// take on every claim during a migration; then the address-limit counter
/// alone. So no lock or hot counter shares a line with what readers read,
/// and writers looking up their stripe do not meet the resize lock's line.
#[repr(C)]
pub(crate) struct RawIndex<V> {
    /// The current table.
    root: CachePadded<Root>,
    /// The write sequence, when configured: advanced after every write
    /// that publishes or unlinks a record, before the old record is
    /// retired ([`RawIndex::write_sequence`]). On lines of its own, shared
    /// with the caches in front of the index.
    writes: Option<std::sync::Arc<CachePadded<crate::sync::unmodelled::AtomicU64>>>,
    config: Config,
    stripes: Box<[CachePadded<Stripe>]>,
    stripe_mask: usize,
    resizes: AtomicU64,
    rehashes: AtomicU64,
    /// A rehash was asked for (`request_rehash`) and no table with a fresh
    /// seed has been attached since: the next `attach`, a growth included,
    /// draws one. Growth keeps the seed otherwise, so without this a request
    /// dropped because a migration was running (or the lock was busy) would
    /// leave the cluster that caused it in every later table.
    rehash_pending: AtomicBool,
    _values: PhantomData<V>,
    resize: CachePadded<Mutex<ResizeState>>,
    /// Live addresses, counted here only when `max_addresses` is set: the
    /// limit needs one count that a check-and-add can update atomically.
    /// Without a limit the per-stripe counts are the only count, and
    /// writers on different stripes share no counter.
    limited_addrs: CachePadded<AtomicUsize>,
    shared: SharedCounts,
}

/// Statistics, assembled by `stats()`.
pub(crate) struct RawStats {
    pub(crate) capacity: usize,
    pub(crate) tables: usize,
    pub(crate) addrs: usize,
    pub(crate) values: usize,
    pub(crate) claimed: usize,
    pub(crate) longest_probe: usize,
    pub(crate) total_probe: usize,
    pub(crate) resizes: u64,
    pub(crate) rehashes: u64,
    pub(crate) table_bytes: usize,
    pub(crate) record_bytes: usize,
}

/// Locks the mutex, ignoring poison: every critical section of the index
/// leaves its state consistent at each point a panic can occur (a panicking
/// `V::clone` aborts the copy-on-write before anything is published).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unseeded mix choosing a key's stripe: stable across rehashes.
#[inline]
fn stripe_of(key: u64, mask: usize) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & mask
}

// SAFETY: the index owns `V`s (records) and hands out `&V` to any thread:
// it is Send when `V: Send` and Sync when `V: Send + Sync` (values are
// dropped on the RCU reclaimer thread, so both need `Send`). All other
// shared state is atomics and mutexes.
unsafe impl<V: Send> Send for RawIndex<V> {}
// SAFETY: see the `Send` impl.
unsafe impl<V: Send + Sync> Sync for RawIndex<V> {}

impl<V: Clone + Send + Sync + 'static> RawIndex<V> {
    pub(crate) fn new(config: Config) -> Self {
        let cap = config.initial_capacity;
        let stripes = config.stripes;
        debug_assert!(stripes.is_power_of_two() && stripes <= 1 << STRIPE_ID_BITS);
        let root = Table::new(cap, table_seed(config.seed, 0), config.huge_pages);
        // Presized for the addresses to come: fault the table in now, once
        // per page, rather than twice per page under the inserts (read
        // first, then written: `Table::prefault`).
        root.prefault(0, root.slot_count());
        let root = Box::into_raw(root);
        Self {
            writes: config.count_writes.then(|| {
                std::sync::Arc::new(CachePadded(crate::sync::unmodelled::AtomicU64::new(0)))
            }),
            root: CachePadded(Root {
                ptr: AtomicPtr::new(root),
            }),
            stripes: (0..stripes)
                .map(|_| {
                    CachePadded(Stripe {
                        lock: Mutex::new(StripeState {
                            next_seq: 1,
                            credits: 0,
                        }),
                        values: AtomicUsize::new(0),
                        addrs: AtomicUsize::new(0),
                        record_bytes: AtomicUsize::new(0),
                    })
                })
                .collect(),
            stripe_mask: stripes - 1,
            resize: CachePadded(Mutex::new(ResizeState {
                cursor: 0,
                budget: MIGRATE_CHUNK,
                tables: 1,
            })),
            limited_addrs: CachePadded(AtomicUsize::new(0)),
            resizes: AtomicU64::new(0),
            rehashes: AtomicU64::new(0),
            rehash_pending: AtomicBool::new(false),
            config,
            _values: PhantomData,
            shared: SharedCounts::default(),
        }
    }

    /// A record was published or unlinked: advance the write sequence.
    /// After the publish, before retiring the old record
    /// ([`RawIndex::write_sequence`]).
    #[inline]
    fn bump(&self) {
        if let Some(w) = &self.writes {
            // Release: pairs with the Acquire load of a reader of the
            // sequence that then finds the new sequence number: it sees the
            // publish or unlink too.
            w.fetch_add(1, Ordering::Release);
        }
    }

    /// The write sequence, when the index keeps one: a count of the
    /// writes that published or unlinked a record, advanced (with
    /// `Release`) after the publish and before the old record is retired.
    /// What a cache in front of the index needs to never be stale: an
    /// answer computed after loading sequence number `n` (with `Acquire`)
    /// is the current one for as long as the sequence still reads `n`,
    /// and a record found then stays alive while the read-side section
    /// that loaded `n` lasts (the retire follows the advance). Resizes
    /// and migrations move records without changing them and do not
    /// advance it.
    pub(crate) fn write_sequence(
        &self,
    ) -> Option<std::sync::Arc<CachePadded<crate::sync::unmodelled::AtomicU64>>> {
        self.writes.clone()
    }

    // ---------------------------------------------------------------- reads

    /// The record of `key`, or null.
    ///
    /// # Safety
    ///
    /// The caller holds a read guard (which keeps the tables it walks
    /// allocated) and uses the record only while it holds it.
    #[inline(always)]
    pub(crate) unsafe fn lookup_raw(&self, key: u64) -> *mut Header {
        // SAFETY: the caller's read guard (this function's contract).
        unsafe { self.lookup_then(key, NonNull::as_ptr, ptr::null_mut) }
    }

    /// [`RawIndex::lookup_raw`] that hands a live record to `found` and
    /// calls `absent` otherwise (see [`table::lookup_chain`]): `get`
    /// turns the record into its values' slice on the found path alone,
    /// without testing the pointer for null again.
    ///
    /// # Safety
    ///
    /// The caller holds a read guard for the call, and for as long as it
    /// uses a record `found` hands on.
    #[inline(always)]
    unsafe fn lookup_then<R>(
        &self,
        key: u64,
        found: impl FnOnce(NonNull<Header>) -> R,
        absent: impl FnOnce() -> R,
    ) -> R {
        // A key other than 0: one inline copy of the plain lookup.
        if key != 0 {
            // SAFETY: `key` is not 0; the caller holds a read guard.
            return unsafe { self.lookup_nonzero_then(key, found, absent) };
        }
        // SAFETY: the caller holds a read guard.
        unsafe { self.lookup_zero(found, absent) }
    }

    /// [`RawIndex::lookup_then`] for a key known not to be 0.
    ///
    /// # Safety
    ///
    /// `key != 0`, and the caller holds a read guard.
    #[inline(always)]
    unsafe fn lookup_nonzero_then<R>(
        &self,
        key: u64,
        found: impl FnOnce(NonNull<Header>) -> R,
        absent: impl FnOnce() -> R,
    ) -> R {
        debug_assert!(key != 0);
        // Acquire: as in `lookup_chain_then`.
        let root = self.root.ptr.load(Ordering::Acquire);
        // SAFETY: `root` and every `future` reachable from it stay
        // allocated while the caller's read guard lives (struct
        // invariant); `key` is not 0, as `Table::lookup_nonzero` needs.
        unsafe { table::lookup_chain(root, key, Table::lookup_nonzero, found, absent) }
    }

    /// [`RawIndex::lookup_then`] for key 0, kept in each table's `zero`
    /// slot: out of line, so the inline path is the nonzero one.
    ///
    /// # Safety
    ///
    /// As for [`RawIndex::lookup_then`].
    #[inline(never)]
    unsafe fn lookup_zero<R>(
        &self,
        found: impl FnOnce(NonNull<Header>) -> R,
        absent: impl FnOnce() -> R,
    ) -> R {
        // SAFETY: the caller holds a read guard.
        unsafe { self.lookup_chain_then(0, Table::lookup, found, absent) }
    }

    /// Publishes `fresh` as the root table (`Release`, pairing with the
    /// lookups' `Acquire` loads of `root`); returns the old root, which the
    /// caller retires.
    fn publish_root(&self, fresh: *mut Table) -> *mut Table {
        // AcqRel: Release publishes the fresh table; Acquire makes the old
        // chain ours to retire.
        self.root.ptr.swap(fresh, Ordering::AcqRel)
    }

    /// The record of `key` from the tables, handed to `found` as in
    /// [`RawIndex::lookup_then`], with `step` the lookup in one table
    /// ([`Table::lookup_nonzero`] only for a key that is not 0).
    ///
    /// # Safety
    ///
    /// As for [`RawIndex::lookup_then`].
    #[inline(always)]
    unsafe fn lookup_chain_then<R>(
        &self,
        key: u64,
        step: impl Fn(&Table, u64) -> *mut Header,
        found: impl FnOnce(NonNull<Header>) -> R,
        absent: impl FnOnce() -> R,
    ) -> R {
        // Acquire: pairs with the Release stores of `root` (migration swap,
        // clear); the table's fields are visible.
        let root = self.root.ptr.load(Ordering::Acquire);
        // SAFETY: `root` and every `future` reachable from it stay allocated
        // while the caller's read guard lives (struct invariant).
        unsafe { table::lookup_chain(root, key, step, found, absent) }
    }

    /// The values of `key` (empty if none), valid while the caller's read
    /// guard and `self` live.
    ///
    /// # Safety
    ///
    /// The caller holds a read guard for `'g`, and `self` outlives `'g`.
    #[inline(always)]
    pub(crate) unsafe fn get<'g>(&self, key: u64) -> &'g [V] {
        let found = |rec: NonNull<Header>| {
            // SAFETY: a live record of `V`s, kept alive by the caller's
            // guard.
            unsafe { RecordPtr::<V>::from_raw(rec.as_ptr()).values() }
        };
        // SAFETY: the caller holds a read guard for `'g`, over the call
        // and the slice's use.
        unsafe { self.lookup_then(key, found, || &[]) }
    }

    /// [`RawIndex::get`] for a key known not to be 0.
    ///
    /// # Safety
    ///
    /// As for [`RawIndex::get`], and `key != 0`.
    #[inline(always)]
    pub(crate) unsafe fn get_nonzero<'g>(&self, key: u64) -> &'g [V] {
        let found = |rec: NonNull<Header>| {
            // SAFETY: a live record of `V`s, kept alive by the caller's
            // guard.
            unsafe { RecordPtr::<V>::from_raw(rec.as_ptr()).values() }
        };
        // SAFETY: the caller's contract.
        unsafe { self.lookup_nonzero_then(key, found, || &[]) }
    }

    /// Values and ids of `key`.
    ///
    /// # Safety
    ///
    /// As for [`RawIndex::get`].
    pub(crate) unsafe fn get_with_ids<'g>(&self, key: u64) -> (&'g [u64], &'g [V]) {
        // SAFETY: the caller holds a read guard for `'g`.
        let rec = unsafe { self.lookup_raw(key) };
        if rec.is_null() {
            return (&[], &[]);
        }
        // SAFETY: as in `get`.
        unsafe {
            let r = RecordPtr::<V>::from_raw(rec);
            (r.ids(), r.values())
        }
    }

    // --------------------------------------------------------------- writes

    fn stripe(&self, key: u64) -> (usize, &Stripe) {
        let i = stripe_of(key, self.stripe_mask);
        (i, &self.stripes[i])
    }

    /// `key`'s live slot and record, anywhere in the chain.
    ///
    /// # Safety
    ///
    /// The caller holds `key`'s stripe lock and a read guard, and uses the
    /// slot and record only while it holds both: the guard keeps the
    /// tables allocated, the lock keeps the record in its slot.
    unsafe fn locate(&self, key: u64) -> Option<(&Slot, RecordPtr<V>)> {
        // Acquire: pairs with the Release store that published this root
        // (the migration's swap, `clear`, the first table); the table is initialised.
        let mut t = self.root.ptr.load(Ordering::Acquire);
        loop {
            // SAFETY: as in `lookup_raw`; the caller's guard.
            let table = unsafe { &*t };
            if let Probe::Found(slot) = table.probe(key) {
                // Acquire: pairs with the Release store that published the record
                // into the slot; the record is initialised.
                let rec = slot.rec.load(Ordering::Acquire);
                if is_live(rec) {
                    // SAFETY: a live record of `V`s.
                    return Some((slot, unsafe { RecordPtr::from_raw(rec) }));
                }
            }
            // Acquire: pairs with the Release store of the future in `attach`;
            // the new table is initialised.
            t = table.future.load(Ordering::Acquire);
            if t.is_null() {
                return None;
            }
        }
    }

    /// The last table of the chain. With any stripe lock held it has no
    /// future and keeps none until the lock is released.
    ///
    /// # Safety
    ///
    /// The caller holds a read guard, and the returned table does not
    /// outlive it (the lifetime ties it to `self` only): a table replaced
    /// by a migration is freed a grace period later. Under a stripe lock
    /// or `resize` it stays the newest until the lock is released.
    unsafe fn newest(&self) -> &Table {
        // Acquire: pairs with the Release store that published this root
        // (the migration's swap, `clear`, the first table); the table is initialised.
        let mut t = self.root.ptr.load(Ordering::Acquire);
        loop {
            // SAFETY: as in `lookup_raw`; the caller's guard.
            let table = unsafe { &*t };
            // Acquire: pairs with the Release store of the future in `attach`;
            // the new table is initialised.
            let f = table.future.load(Ordering::Acquire);
            if f.is_null() {
                return table;
            }
            t = f;
        }
    }

    /// Publishes `rec` in `slot`.
    fn publish(slot: &Slot, rec: *mut Header) {
        // Release: pairs with the Acquire loads of readers (`Table::lookup`,
        // `locate`); the record's contents are visible before its pointer.
        slot.rec.store(rec, Ordering::Release);
    }

    /// Gives back one reference to `rec` (a slot's it was just unlinked
    /// from, or a writer's) and, when it was the last, retires it: freed
    /// after a grace period.
    ///
    /// # Safety
    ///
    /// The caller holds the reference it gives back (no slot holds it any
    /// more, or it is a writer's own), and gives it back once.
    unsafe fn retire_record(&self, rec: RecordPtr<V>) {
        // SAFETY: the caller holds the reference it gives back.
        if !unsafe { rec.release() } {
            return;
        }
        // SAFETY: the last reference was ours: no slot holds the record,
        // so no new reader can reach it.
        let bytes = unsafe { rec.shared_bytes() };
        self.shared.bytes.fetch_sub(bytes, Ordering::Relaxed);
        // SAFETY: as above, it is ours to free once a grace period has
        // passed. `V: Send` lets the reclaimer drop it.
        unsafe { rcu::retire_raw(rec.into_raw().cast(), drop_record::<V>) }
    }

    /// Reserves one more live address against `max_addresses` (nothing to
    /// do without a limit: the stripe's count is kept by `account`).
    fn reserve_addr(&self) -> Result<(), Error> {
        match self.config.max_addresses {
            None => Ok(()),
            Some(max) => self
                .limited_addrs
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
                    (a < max).then_some(a + 1)
                })
                .map(|_| ())
                .map_err(|_| Error::CapacityExceeded { max_addresses: max }),
        }
    }

    /// An address lost its last value: gives back its `max_addresses`
    /// reservation.
    fn release_addr(&self) {
        if self.config.max_addresses.is_some() {
            self.limited_addrs.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Live addresses: the sum of the stripes' counts.
    fn live_addrs(&self) -> usize {
        self.stripe_sum(|s| &s.addrs)
    }

    /// The sum over stripes of one of their counters. Exact under every
    /// stripe lock; otherwise each stripe's count is read at a different
    /// moment.
    fn stripe_sum(&self, counter: impl Fn(&Stripe) -> &AtomicUsize) -> usize {
        self.stripes
            .iter()
            .map(|s| counter(s).load(Ordering::Relaxed))
            .sum()
    }

    /// Takes every stripe lock, in ascending order (the lock order: after
    /// `resize`, if held).
    fn lock_all_stripes(&self) -> Vec<MutexGuard<'_, StripeState>> {
        self.stripes.iter().map(|s| lock(&s.lock)).collect()
    }

    /// Inserts one value. On error the value comes back.
    pub(crate) fn insert(&self, key: u64, value: V) -> Result<u64, (Error, V)> {
        let mut value = Some(value);
        loop {
            match self.try_insert_group(key, &mut || value.take().unwrap(), 1) {
                Ok(Some((id, claimed))) => {
                    self.after_write(usize::from(claimed));
                    return Ok(id);
                }
                Ok(None) => self.grow_blocking(1, false),
                Err(e) => return Err((e, value.take().expect("value not consumed on error"))),
            }
        }
    }

    /// Inserts `n` values for `key` (taken from `next`, in order) under one
    /// stripe lock. `Ok(None)`: the newest table has no room; nothing was
    /// taken. Returns the first id (ids of one group are consecutive in the
    /// stripe's sequence: `first + i << STRIPE_ID_BITS`) and whether a new
    /// slot was claimed.
    fn try_insert_group(
        &self,
        key: u64,
        next: &mut dyn FnMut() -> V,
        n: usize,
    ) -> Result<Option<(u64, bool)>, Error> {
        let guard = rcu::read_lock();
        let (si, stripe) = self.stripe(key);
        let mut st = lock(&stripe.lock);
        // SAFETY: `guard` and `st`, stripe `si`'s lock, are held.
        let r = unsafe { self.insert_group_locked(si, stripe, &mut st, key, next, n) };
        drop(st);
        drop(guard);
        self.after_insert_group(&r);
        r.map(|o| o.map(|g| (g.first, g.claimed)))
    }

    /// What a group insert did, for the work done after unlocking.
    fn after_insert_group(&self, r: &Result<Option<Group>, Error>) {
        if let Ok(Some(g)) = r {
            if g.long_probe {
                self.request_rehash();
            }
        }
    }

    /// The body of a group insert. Publishes, advances the write
    /// sequence and retires the replaced record; resizes are left to the
    /// caller.
    ///
    /// # Safety
    ///
    /// The caller holds a read guard and stripe `si`'s lock (`stripe` is
    /// `self.stripes[si]`, `st` its state) and `key` belongs to that
    /// stripe.
    unsafe fn insert_group_locked(
        &self,
        si: usize,
        stripe: &Stripe,
        st: &mut StripeState,
        key: u64,
        next: &mut dyn FnMut() -> V,
        n: usize,
    ) -> Result<Option<Group>, Error> {
        // SAFETY: the caller holds `key`'s stripe lock and a read guard.
        unsafe {
            let found = self.locate(key);
            self.insert_group_at(si, stripe, st, key, found, next, n)
        }
    }

    /// [`RawIndex::insert_group_locked`] with `key`'s live slot and record
    /// already located.
    ///
    /// # Safety
    ///
    /// As for [`RawIndex::insert_group_locked`], and `found` is what
    /// `locate(key)` returned under the same hold of the lock and guard.
    #[allow(clippy::too_many_arguments)]
    unsafe fn insert_group_at(
        &self,
        si: usize,
        stripe: &Stripe,
        st: &mut StripeState,
        key: u64,
        found: Option<(&Slot, RecordPtr<V>)>,
        next: &mut dyn FnMut() -> V,
        n: usize,
    ) -> Result<Option<Group>, Error> {
        let first = st.next_seq << STRIPE_ID_BITS | si as u64;
        let ids = move |i: usize| first + ((i as u64) << STRIPE_ID_BITS);
        if let Some((slot, old)) = found {
            // SAFETY: `old` is live under the caller's guard.
            let (old_ids, old_vals) = unsafe { (old.ids(), old.values()) };
            let new = RecordPtr::<V>::build(
                old_ids.len() + n,
                old_ids
                    .iter()
                    .copied()
                    .zip(old_vals.iter().cloned())
                    .chain((0..n).map(|i| (ids(i), next()))),
            );
            st.next_seq += n as u64;
            Self::publish(slot, new.into_raw());
            // SAFETY: both live: `old` under the caller's guard, `new`
            // because only a writer holding this stripe's lock, as we do,
            // can unlink it.
            let delta = unsafe { new.bytes() as isize - old.private_bytes() };
            // SAFETY: the caller holds this stripe's lock.
            unsafe { stripe.account(n as isize, 0, delta) };
            self.bump();
            // SAFETY: `old` was unlinked from its slot above, whose
            // reference we give back.
            unsafe { self.retire_record(old) };
            return Ok(Some(Group {
                first,
                claimed: false,
                long_probe: false,
            }));
        }
        // SAFETY: the caller holds `key`'s stripe lock (`st`) and a read
        // guard, and `key` has no live slot (`found` is `None`).
        let Some((slot, long_probe)) = (unsafe { self.claim_new(st, key) })? else {
            return Ok(None);
        };
        let new = RecordPtr::<V>::build(n, (0..n).map(|i| (ids(i), next())));
        st.next_seq += n as u64;
        Self::publish(slot, new.into_raw());
        // SAFETY: `new` is live: only a writer holding this stripe's lock,
        // as we do, can unlink it; `account` needs that lock too.
        unsafe { stripe.account(n as isize, 1, new.bytes() as isize) };
        self.bump();
        Ok(Some(Group {
            first,
            claimed: true,
            long_probe,
        }))
    }

    /// Claims a slot in the newest table for `key`, which has no live
    /// slot; the caller publishes the key's record there. `Ok(None)`: the
    /// table has no room. The flag: the key landed far from its home (ask
    /// for a rehash).
    ///
    /// # Safety
    ///
    /// The caller holds `key`'s stripe lock (`st` is its state) and a read
    /// guard, and uses the slot only while it holds both.
    unsafe fn claim_new(
        &self,
        st: &mut StripeState,
        key: u64,
    ) -> Result<Option<(&Slot, bool)>, Error> {
        // SAFETY: the caller's read guard outlives `table`'s use here; the
        // stripe lock keeps it the newest table.
        let table = unsafe { self.newest() };
        // Claim credits: a stripe reserves claims in the newest table a
        // batch at a time (`credit_batch`) and spends them under its lock,
        // so most claims touch no shared counter; a reservation of one per
        // claim made the table's count a line every writer wrote. Unspent
        // credits count as claimed: the table grows at most
        // `capacity / 64` claims early, and never holds more real claims
        // than its count.
        if st.credits == 0 {
            // While `table` is being migrated into, the migration still has
            // to claim a slot there for every live key left in the older
            // tables: keep room for them (the live addresses count them,
            // and more: conservative). Without it, claims made before any
            // migration step ran (a bulk insert's stripe run, or writers on
            // several stripes at once) could fill the table and leave the
            // migration no slot ("address index table full").
            // Acquire: as for every root load (the migration's swap publishes
            // it with Release); only compared here.
            let migrating = !ptr::eq(table, self.root.ptr.load(Ordering::Acquire));
            let pending = if migrating { self.live_addrs() } else { 0 };
            let batch = self.credit_batch(table);
            if table.try_reserve(batch, pending, FORCE_AT) {
                st.credits = batch;
            } else if batch > 1 && table.try_reserve(1, pending, FORCE_AT) {
                st.credits = 1;
            } else {
                return Ok(None);
            }
        }
        self.reserve_addr()?;
        let (slot, dist, fresh) = table.claim(key);
        // A slot that already held the key (a tombstone) costs no credit.
        st.credits -= usize::from(fresh);
        Ok(Some((
            slot,
            dist > LONG_PROBE && table.claimed() * 2 < table.capacity(),
        )))
    }

    /// Unlinks the entry `id` of `key`; returns the record that held it, to
    /// be retired or drained by the caller after a grace period.
    fn unlink(&self, key: u64, ids: &[u64]) -> Result<RecordPtr<V>, Error> {
        let (si, stripe) = self.stripe(key);
        // A shared insert's id names no stripe.
        if ids
            .iter()
            .any(|&id| id & SHARED_ID == 0 && (id as usize) & ((1 << STRIPE_ID_BITS) - 1) != si)
        {
            return Err(Error::NotFound);
        }
        let _guard = rcu::read_lock();
        let st = lock(&stripe.lock);
        // SAFETY: `_guard` and `key`'s stripe lock (`st`) are held while
        // the slot and record are used.
        let (slot, old) = unsafe { self.locate(key) }.ok_or(Error::NotFound)?;
        // SAFETY: `old` is live under our guard.
        let (old_ids, old_vals) = unsafe { (old.ids(), old.values()) };
        let gone = old_ids.iter().filter(|id| ids.contains(id)).count();
        if gone != ids.len() {
            return Err(Error::NotFound);
        }
        let left = old_ids.len() - gone;
        let new_bytes = if left == 0 {
            Self::publish(slot, ptr::null_mut());
            self.release_addr();
            0
        } else {
            let new = RecordPtr::<V>::build(
                left,
                old_ids
                    .iter()
                    .copied()
                    .zip(old_vals.iter())
                    .filter(|(id, _)| !ids.contains(id))
                    .map(|(id, v)| (id, v.clone())),
            );
            Self::publish(slot, new.into_raw());
            // SAFETY: `new` is live: only a writer holding this stripe's
            // lock, as we do, can unlink it.
            unsafe { new.bytes() }
        };
        // SAFETY: `old` is live under our guard.
        let old_bytes = unsafe { old.private_bytes() };
        // SAFETY: we hold the stripe's lock (`st`).
        unsafe {
            stripe.account(
                -(gone as isize),
                -isize::from(left == 0),
                new_bytes as isize - old_bytes,
            )
        };
        drop(st);
        self.bump();
        Ok(old)
    }

    /// Removes entry `id` of `key`; its value is dropped after a grace period.
    pub(crate) fn remove(&self, key: u64, id: u64) -> Result<(), Error> {
        let old = self.unlink(key, &[id])?;
        // SAFETY: `unlink` unlinked `old` from its slot and hands us the
        // slot's reference.
        unsafe { self.retire_record(old) };
        self.after_write(0);
        Ok(())
    }

    /// Removes entry `id` of `key`, waits for a grace period, and returns
    /// its value.
    pub(crate) fn take(&self, key: u64, id: u64) -> Result<V, Error> {
        let old = self.unlink(key, &[id])?;
        self.after_write(0);
        // SAFETY: we hold the unlinked slot's reference: `old` is live.
        if unsafe { old.shared() } {
            // Other addresses (or a writer) hold the record too: the value
            // stays theirs, and ours is a clone, taken while our reference
            // keeps the record alive.
            // SAFETY: as above.
            let (ids, values) = unsafe { (old.ids(), old.values()) };
            let pos = ids.iter().position(|&x| x == id);
            let v = values[pos.expect("the unlinked record held the id")].clone();
            // SAFETY: the unlinked slot's reference, which `unlink` handed
            // us, given back once.
            unsafe { self.retire_record(old) };
            rcu::synchronize();
            return Ok(v);
        }
        rcu::synchronize();
        // Unshared, so no writer can take a reference any more (that needs
        // one): ours was the last.
        // SAFETY: as above.
        let bytes = unsafe { old.shared_bytes() };
        self.shared.bytes.fetch_sub(bytes, Ordering::Relaxed);
        let mut out = Vec::with_capacity(1);
        // SAFETY: unlinked under the stripe lock, and a grace period has
        // passed: no reader can still hold it, and we are its only owner.
        unsafe { old.free_extracting(|x| x == id, &mut out) };
        Ok(out.pop().expect("the unlinked record held the id").1)
    }

    /// Removes every value of `key`, dropping them after a grace period.
    /// Returns how many there were.
    pub(crate) fn remove_addr(&self, key: u64) -> usize {
        let (_, stripe) = self.stripe(key);
        let guard = rcu::read_lock();
        let st = lock(&stripe.lock);
        // SAFETY: `guard` and `key`'s stripe lock (`st`) are held while the
        // slot and record are used.
        let Some((slot, old)) = (unsafe { self.locate(key) }) else {
            return 0;
        };
        Self::publish(slot, ptr::null_mut());
        self.release_addr();
        // SAFETY: `old` is live under our guard.
        let (n, bytes) = unsafe { (old.len(), old.private_bytes()) };
        // SAFETY: we hold the stripe's lock (`st`).
        unsafe { stripe.account(-(n as isize), -1, -bytes) };
        drop(st);
        drop(guard);
        self.bump();
        // SAFETY: `old` was unlinked from its slot above, whose reference
        // we give back.
        unsafe { self.retire_record(old) };
        self.after_write(0);
        n
    }

    /// Removes everything. Values are dropped after a grace period.
    pub(crate) fn clear(&self) {
        let mut st = lock(&self.resize);
        let fresh = Box::into_raw(Table::new(
            self.config.min_capacity,
            table_seed(self.config.seed, st.tables),
            self.config.huge_pages,
        ));
        st.tables += 1;
        let stripes = self.lock_all_stripes();
        let old = self.publish_root(fresh);
        self.limited_addrs.store(0, Ordering::Relaxed);
        // Each stripe's lock is released as soon as its counters and
        // credits are reset (writers then find `fresh` as the newest table).
        for (s, mut stripe_state) in self.stripes.iter().zip(stripes) {
            s.values.store(0, Ordering::Relaxed);
            s.addrs.store(0, Ordering::Relaxed);
            s.record_bytes.store(0, Ordering::Relaxed);
            // Credits belong to the newest table, which is now `fresh`.
            stripe_state.credits = 0;
        }
        st.cursor = 0;
        drop(st);
        self.bump();
        let chain = Chain::<V>(old, self.shared.bytes.clone(), PhantomData);
        // SAFETY: the chain is unlinked and no writer can reach it (we held
        // every lock while swapping); readers are covered by the grace period.
        unsafe { rcu::retire_box_raw(Box::into_raw(Box::new(chain))) };
    }

    // ---------------------------------------------------------------- stats

    pub(crate) fn len(&self) -> usize {
        self.stripe_sum(|s| &s.values)
    }

    pub(crate) fn len_addrs(&self) -> usize {
        self.live_addrs()
    }

    pub(crate) fn stats(&self) -> RawStats {
        let _guard = rcu::read_lock();
        let mut tables = 0;
        let mut table_bytes = 0;
        // Acquire: pairs with the Release store that published this root
        // (the migration's swap, `clear`, the first table); the table is initialised.
        let mut t = self.root.ptr.load(Ordering::Acquire);
        let mut newest: Option<&Table> = None;
        while !t.is_null() {
            // SAFETY: as in `lookup_raw`.
            let table = unsafe { &*t };
            tables += 1;
            table_bytes += table.bytes();
            newest = Some(table);
            // Acquire: pairs with the Release store of the future in `attach`;
            // the new table is initialised.
            t = table.future.load(Ordering::Acquire);
        }
        let newest = newest.expect("root is never null");
        let (claimed, longest_probe, total_probe) = newest.scan_probes();
        RawStats {
            capacity: newest.capacity(),
            tables,
            addrs: self.len_addrs(),
            values: self.len(),
            claimed,
            longest_probe,
            total_probe,
            resizes: self.resizes.load(Ordering::Relaxed),
            rehashes: self.rehashes.load(Ordering::Relaxed),
            table_bytes,
            record_bytes: self
                .stripe_sum(|s| &s.record_bytes)
                .wrapping_add(self.shared.bytes.load(Ordering::Relaxed)),
        }
    }

    /// The root table, allocated for as long as `guard` lives.
    #[inline(always)]
    pub(crate) fn root_in<'g>(&'g self, _guard: &'g rcu::ReadGuard) -> &'g Table {
        // SAFETY: the root is never null, and a replaced root is retired
        // only after a grace period (the migration's swap, `clear`), which
        // `guard` holds open. Acquire: pairs with the Release store that
        // published the root; its contents are visible.
        unsafe { &*self.root.ptr.load(Ordering::Acquire) }
    }
}

/// A table chain and its live records, dropped together after a grace
/// period by `clear`, with the index's count of shared-record bytes.
struct Chain<V>(
    *mut Table,
    std::sync::Arc<crate::sync::unmodelled::AtomicUsize>,
    PhantomData<V>,
);

// SAFETY: the chain owns its tables and records; records hold `V: Send`.
unsafe impl<V: Send> Send for Chain<V> {}

impl<V> Drop for Chain<V> {
    fn drop(&mut self) {
        // SAFETY: we own the chain (unlinked, grace period passed).
        unsafe { free_chain::<V>(self.0, Some(&self.1)) }
    }
}

/// Frees a chain of tables and every live record in it (a shared record
/// when its last slot goes, its bytes taken off `shared_bytes`). A value
/// whose destructor panics does not stop the walk: every other record and
/// table is still freed, then the first panic continues.
///
/// # Safety
///
/// The caller owns the chain: no reader can reach it, and no writer
/// other than one holding its own reference to a shared record in it.
unsafe fn free_chain<V>(
    mut t: *mut Table,
    shared_bytes: Option<&crate::sync::unmodelled::AtomicUsize>,
) {
    let mut panic = None;
    while !t.is_null() {
        // SAFETY: caller contract; each table came from `Box::into_raw`.
        let table = unsafe { Box::from_raw(t) };
        for (_, slot) in table.slots() {
            let rec = slot.rec.load(Ordering::Relaxed);
            if is_live(rec) {
                // SAFETY: a live slot holds a reference to its record (each
                // slot is visited once, and gives back its own).
                let rec = unsafe { RecordPtr::<V>::from_raw(rec) };
                // SAFETY: the slot's reference, given back once.
                if !unsafe { rec.release() } {
                    continue; // other slots (or a writer) hold it
                }
                if let Some(b) = shared_bytes {
                    // SAFETY: ours now, not yet freed.
                    b.fetch_sub(unsafe { rec.shared_bytes() }, Ordering::Relaxed);
                }
                let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    // SAFETY: the last reference was this slot's, so the
                    // record is ours. A panic leaves the record freed
                    // (`RecordPtr::free`).
                    unsafe { rec.free() }
                }));
                if let Err(p) = freed {
                    panic.get_or_insert(p);
                }
            }
        }
        t = table.future.load(Ordering::Relaxed);
    }
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
}

impl<V> Drop for RawIndex<V> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader borrows the index (lookups borrow
        // `&'g self`), no writer runs; the chain is ours.
        unsafe { free_chain::<V>(self.root.ptr.load(Ordering::Relaxed), None) }
    }
}

/// The seed of the `n`-th table of an index seeded with `seed`.
fn table_seed(seed: u64, n: u64) -> u64 {
    // splitmix64 of (seed, n): distinct, well-mixed per table.
    let mut z = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Iterates every live (key, record) reachable from `root`.
pub(crate) struct RawIter<V> {
    table: *const Table,
    next: usize,
    _values: PhantomData<V>,
}

impl<V> RawIter<V> {
    /// # Safety
    ///
    /// The caller holds a read guard for as long as it uses the iterator.
    pub(crate) unsafe fn new(root: *const Table) -> Self {
        Self {
            table: root,
            next: 0,
            _values: PhantomData,
        }
    }

    /// The next live key and its record.
    pub(crate) fn next_record(&mut self) -> Option<(u64, RecordPtr<V>)> {
        loop {
            if self.table.is_null() {
                return None;
            }
            // SAFETY: the read guard that `new`'s caller holds while it
            // uses the iterator keeps the chain allocated.
            let table = unsafe { &*self.table };
            if self.next > table.slot_count() {
                // Acquire: pairs with the Release store of the future in `attach`;
                // the new table is initialised.
                self.table = table.future.load(Ordering::Acquire);
                self.next = 0;
                continue;
            }
            let (key, slot) = table.slot_at(self.next);
            self.next += 1;
            if key == 0 && self.next <= table.slot_count() {
                continue;
            }
            // Acquire: pairs with the Release store that published the record
            // into the slot; the record is initialised.
            let rec = slot.rec.load(Ordering::Acquire);
            if is_live(rec) {
                // SAFETY: a live record of `V`s.
                return Some((key, unsafe { RecordPtr::from_raw(rec) }));
            }
        }
    }
}

/// The layout promised in `RawIndex`'s docs.
#[cfg(test)]
mod layout {
    use std::mem::offset_of;

    #[test]
    fn readers_and_stripe_lookups_share_no_line_pair_with_the_resize_lock() {
        type R = super::RawIndex<u64>;
        let pair = |offset: usize| offset / 128;
        let read_by_lookups = [offset_of!(R, root), offset_of!(R, writes)];
        let read_by_writers = [offset_of!(R, stripes), offset_of!(R, stripe_mask)];
        for hot in [offset_of!(R, resize), offset_of!(R, limited_addrs)] {
            for read in read_by_lookups.iter().chain(&read_by_writers) {
                assert_ne!(pair(*read), pair(hot), "offsets {read} and {hot}");
            }
        }
        assert_ne!(
            pair(offset_of!(R, resize)),
            pair(offset_of!(R, limited_addrs))
        );
        assert_ne!(pair(offset_of!(R, root)), pair(offset_of!(R, writes)));
    }
}
