//! The address index's algorithm: a chain of open-addressing tables
//! (`table.rs`) holding one copy-on-write record per address (`record.rs`),
//! writer stripes, and incremental migration.
//!
//! # Readers
//!
//! `lookup(key)`: one compare of the key against a bound on `root`'s line
//! (`Root::fast_above`) sends address 0 (kept in each table's `zero` slot)
//! and every lookup of an index with a hit cache (`cache.rs`) off the fast
//! path; the rest load `root`; probe it; a live record ends the search;
//! null (absent or tombstone) or `MOVED` sends the reader on to
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
//! the RCU (dropped after a grace period).
//!
//! Writers on different stripes share no counter: the counts of values,
//! live addresses and record bytes are per stripe, kept under the stripe
//! lock (the index-wide counts are their sums), and a stripe reserves slot
//! claims in the newest table several at a time (claim credits,
//! `insert_group_located`). Two threads registering one by one had been
//! 2.5× slower in total than one thread, mostly on a claim count and an
//! address count that every insert wrote (BENCHMARKS.md). The exception is
//! `max_addresses`: a limit needs one count that a check-and-add updates
//! atomically, so an index with a limit keeps one.
//!
//! # Resize
//!
//! Under the `resize` mutex (lock order: `resize`, then stripes in
//! ascending order):
//!
//! 1. **Attach**: allocate the new table (new size; the same seed for
//!    growth and shrinking, a fresh one for a rehash: `Seed`), then,
//!    holding every stripe lock, set `root.future`. From then on no writer
//!    claims a slot in the old table (writers read `future` under their
//!    stripe lock).
//! 2. **Migrate**, `MIGRATE_CHUNK` slots at a time, by whichever writer gets
//!    the `resize` lock after its own operation (`try_lock`: nobody waits):
//!    holding every stripe lock for the run of slots, for each live slot
//!    claim the key in the new table, store the record pointer there, then
//!    mark the old slot `MOVED`. The record itself is not copied. Before
//!    the locks, the run faults in its share of the new table, one write
//!    per page (`Table::prefault`), so that no page of a fresh table is read
//!    before it is written (two page faults instead of one). Holding
//!    every lock (rather than each key's own, once per key) costs one lock
//!    operation per stripe per run instead of two per moved key, and with
//!    no writer able to claim meanwhile the claims need no CAS
//!    ([`Table::claim_exclusive`](table::Table::claim_exclusive)); writers
//!    wait at most one run (`migrate_run`, ≤ 1,024 slots unless there are
//!    more than 256 stripes).
//! 3. **Swap**: after the last slot, `root = future`; the old table (slots
//!    only, no records) is retired.
//!
//! No single write pays more than one chunk of migration, except a writer
//! that finds the newest table at 90% claimed (it finishes the migration and
//! attaches a larger table: the forced path of rhashtable), a bulk insert
//! that presizes, and `clear`. During a migration the 90% check also counts
//! the live addresses (an upper bound on the keys still to migrate), and a
//! writer's check and count are one atomic reservation (`table.rs`), so the
//! migration's claims always find room however many writers claimed first.
//!
//! Growth starts at 50% claimed slots (live keys and tombstones; see
//! `GROW_AT` for why so low) and sizes the new table at three times the
//! live keys, rounded up to a power of two (`capacity_grown`: a table full
//! of tombstones is replaced by one with room for at least `live / 2` new
//! claims, so migration costs at most 2 moved keys per claim); tombstones
//! are dropped; with `auto_shrink` the table shrinks below
//! 12.5% live, to at most 25%. A claim that probes more
//! than `LONG_PROBE` slots in a table under half full means the hash is being
//! defeated: the table is rehashed with a new seed (at once, or, when a
//! migration is running, by the next table attached: `rehash_pending`).

pub(crate) mod record;
mod slots;
pub(crate) mod table;

use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use record::{Header, RecordPtr, drop_record};
use table::{FORCE_AT, GROW_AT, LONG_PROBE, Probe, Slot, Table, is_live, moved};

use crate::error::Error;
use crate::rcu;
use crate::sync::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, CachePadded, Mutex, MutexGuard, Ordering,
};

/// Slots migrated per write while a resize is in progress.
pub(crate) const MIGRATE_CHUNK: usize = 256;

/// Old slots a migration run scans before moving the live ones among them
/// (`migrate`).
const MIGRATE_BATCH: usize = 64;

/// Most keys a bulk insert adds per stripe-lock acquisition.
const BULK_RUN: usize = 1024;

/// How far ahead of the key being inserted a bulk insert prefetches.
const PREFETCH_AHEAD: usize = 8;

/// Bits of an entry id that name its stripe.
const STRIPE_ID_BITS: u32 = 16;

/// The hash seed of a table that [`RawIndex::attach`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seed {
    /// The root's seed: growth and shrinking. Homes are the top bits of
    /// the hash, so with the same seed a key's home in a table twice as
    /// large is `2h` or `2h + 1` for its old home `h`: a migration that
    /// walks the old table in order writes the new one in order too (11%
    /// → 6% of a from-empty registration's profile in `claim_exclusive`).
    Keep,
    /// A new seed: a rehash, asked for when a probe sequence grew too long
    /// for the load (keys that defeat the current seed).
    Fresh,
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
    pub(crate) hit_cache: Option<crate::cache::HitCacheConfig>,
    /// Tables of 8 MiB and more on transparent huge pages (`slots.rs`).
    pub(crate) huge_pages: bool,
}

/// Capacity (a power of two) that holds `addrs` keys at ≤ 50% load.
pub(crate) fn capacity_for(addrs: usize, min: usize) -> usize {
    addrs
        .saturating_mul(2)
        .max(min)
        .checked_next_power_of_two()
        .expect("index capacity overflow")
}

/// Capacity of the table that replaces one at the growth threshold with
/// `live` live keys: at most 2/3 of the way to the next growth threshold,
/// so that the new table takes at least `live / 2` new claims before it
/// must be replaced in turn.
///
/// Sized at 50% load instead ([`capacity_for`]), a table whose claims are
/// mostly tombstones (a writer that keeps adding new addresses and
/// removing old ones) was replaced by one of the same size with almost no
/// room: 54,000 live keys in 131,072 slots left room for 11,500 claims, so
/// every new address paid for moving 4.7 old ones, and readers saw a fresh,
/// cold table about 150 times a second. Here the migration costs at most
/// 2 moved keys per claim, at the price of a table up to twice as large
/// while most claims are turned into tombstones. A table that grows by
/// inserts alone (no tombstones: `live` is half the capacity) doubles as
/// before.
pub(crate) fn capacity_grown(live: usize, min: usize) -> usize {
    capacity_for(live.saturating_mul(3).div_ceil(2), min)
}

/// Capacity that holds `addrs` keys below the growth threshold (for
/// presizing: `with_capacity`, bulk inserts).
pub(crate) fn capacity_presized(addrs: usize, min: usize) -> usize {
    (addrs.saturating_mul(GROW_AT.1) / GROW_AT.0 + 1)
        .max(min)
        .checked_next_power_of_two()
        .expect("index capacity overflow")
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
    /// `insert_group_located`). Zeroed, under every stripe lock, whenever
    /// the newest table changes (`attach`, `clear`), so credits always
    /// belong to the newest table.
    credits: usize,
}

impl Stripe {
    /// Adjusts the stripe's counters. Caller holds `lock` (the only writer),
    /// so a load and a store suffice; readers of `len()` may see either
    /// value.
    fn account(&self, values: isize, addrs: isize, record_bytes: isize) {
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

/// Result of one group insert.
struct Group {
    first: u64,
    claimed: bool,
    long_probe: bool,
}

struct ResizeState {
    /// Next slot of `root` to migrate, while `root.future` is set.
    cursor: usize,
    /// Slots to migrate per write during this migration:
    /// `MIGRATE_CHUNK × ⌈old capacity / new capacity⌉ + 2`, and at least 4
    /// per stripe (see `attach`). Every claim in the
    /// new table pays one step, so the migration ends before the new table
    /// can fill (see `attach`).
    budget: usize,
    /// Tables created so far (feeds the per-table seed).
    generation: u64,
}

/// What every lookup reads first, on one line of its own.
#[repr(C)]
struct Root {
    /// Invariant: never null; everything reachable from it (tables, their
    /// futures, live records) is freed only after a grace period that
    /// started after it was unlinked.
    ptr: AtomicPtr<Table>,
    /// Keys above this bound take the fast path, the others the slow one:
    /// 0 without a hit cache (address 0 alone is slow: it lives in each
    /// table's `zero` slot rather than in the slots), `u64::MAX` with one
    /// (no key is above it: every lookup goes through the cache). Fixed at
    /// construction. One compare of the key against it replaces two tests
    /// on the fast path, "is there a cache?" and "is the key 0?", each a
    /// compare and a branch of its own, and the slots are then probed
    /// without testing the key for 0 again.
    fast_above: u64,
}

/// The index without its safe wrapper.
///
/// Layout (`repr(C)`, in 128-byte blocks, the pair of lines an adjacent-line
/// prefetcher moves together): the root (pointer and fast-path bound)
/// alone; then what every write and every lookup off the fast path reads
/// (`cache`, `config`, the stripes) with counters written once per table
/// attached; then the `resize` lock alone, which writers
/// take on every claim during a migration; then the address-limit counter
/// alone. So no lock or hot counter shares a line with what readers read,
/// and writers looking up their stripe do not meet the resize lock's line.
#[repr(C)]
pub(crate) struct RawIndex<V> {
    /// The current table, and on the same line the test that sends a
    /// lookup past the fast path (see [`Root`]).
    root: CachePadded<Root>,
    /// The recent-hit cache, when configured; writers bump its generation.
    /// Lookups test it only off the fast path (`Root::fast_above`).
    ///
    /// Boxed: the test for "no cache" is then one null check of a pointer
    /// (an inline `Option<HitCache>` was a two-branch test of a niche tag).
    pub(crate) cache: Option<Box<crate::cache::HitCache>>,
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

/// Records unlinked by an undone bulk insert, retired when dropped (also
/// when a clone taken from them panics, in `roll_back`).
struct RetireAll<V: Clone + Send + Sync + 'static>(Vec<(RecordPtr<V>, Vec<u64>)>);

impl<V: Clone + Send + Sync + 'static> Drop for RetireAll<V> {
    fn drop(&mut self) {
        for (rec, _) in self.0.drain(..) {
            RawIndex::<V>::retire_record(rec);
        }
    }
}

/// What a bulk insert needs to recognise an address repeated within the
/// batch.
#[derive(Default)]
struct BulkBatch {
    /// Per stripe: its sequence number when the batch first took its lock
    /// (`u64::MAX` before). An id of that stripe from there on is the
    /// batch's, or a concurrent writer's added during the batch; treating
    /// the latter as a repeat only defers a value, which is harmless.
    start: Vec<u64>,
    /// Addresses with a deferred value: every later value of theirs is
    /// deferred too, so the values the first pass adds are a prefix of the
    /// address's values in input order, whatever concurrent writers do.
    deferred_keys: std::collections::HashSet<u64>,
}

impl BulkBatch {
    fn new(stripes: usize) -> Self {
        Self {
            start: vec![u64::MAX; stripes],
            ..Self::default()
        }
    }

    /// The batch holds stripe `si`'s lock; its next sequence number is
    /// `seq`.
    fn hold(&mut self, si: usize, seq: u64) {
        if self.start[si] == u64::MAX {
            self.start[si] = seq;
        }
    }

    /// Whether `key`, whose current record is `found` (under its stripe
    /// lock), may already hold a value of this batch, or has deferred ones.
    /// O(values of the address).
    fn repeats<V>(&mut self, key: u64, found: Option<&(&Slot, RecordPtr<V>)>) -> bool {
        if !self.deferred_keys.is_empty() && self.deferred_keys.contains(&key) {
            return true;
        }
        let Some((_, rec)) = found else {
            return false;
        };
        // SAFETY: the caller holds a read guard and the stripe lock.
        let recent = unsafe { rec.ids() }.iter().any(|&id| {
            let si = (id & ((1 << STRIPE_ID_BITS) - 1)) as usize;
            id >> STRIPE_ID_BITS >= self.start[si]
        });
        if recent {
            self.deferred_keys.insert(key);
        }
        recent
    }
}

/// A failed bulk insert: the error and every value, in input order.
pub(crate) type BulkError<V> = (Error, Vec<(u64, V)>);

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
            root: CachePadded(Root {
                ptr: AtomicPtr::new(root),
                fast_above: if config.hit_cache.is_some() {
                    u64::MAX
                } else {
                    0
                },
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
                generation: 1,
            })),
            limited_addrs: CachePadded(AtomicUsize::new(0)),
            resizes: AtomicU64::new(0),
            rehashes: AtomicU64::new(0),
            rehash_pending: AtomicBool::new(false),
            cache: config
                .hit_cache
                .map(|c| Box::new(crate::cache::HitCache::new(c))),
            config,
            _values: PhantomData,
        }
    }

    /// A record was published or unlinked: invalidate hit caches. After the
    /// publish, before retiring the old record (`cache.rs` module docs).
    #[inline]
    fn bump(&self) {
        if let Some(c) = &self.cache {
            c.bump();
        }
    }

    // ---------------------------------------------------------------- reads

    /// The record of `key`, or null, through the hit cache when there is
    /// one. The caller holds a read guard.
    #[inline(always)]
    pub(crate) fn lookup_raw(&self, key: u64) -> *mut Header {
        self.lookup_then(key, NonNull::as_ptr, ptr::null_mut)
    }

    /// [`RawIndex::lookup_raw`] that hands a live record to `found` and
    /// calls `absent` otherwise (see [`table::lookup_chain`]): `get`
    /// turns the record into its values' slice on the found path alone,
    /// without testing the pointer for null again.
    #[inline(always)]
    fn lookup_then<R>(
        &self,
        key: u64,
        found: impl FnOnce(NonNull<Header>) -> R,
        absent: impl FnOnce() -> R,
    ) -> R {
        if key > self.root.fast_above {
            // No cache and a key other than 0 (`Root::fast_above`).
            return self.lookup_uncached_then(key, Table::lookup_nonzero, found, absent);
        }
        match &self.cache {
            None => self.lookup_uncached_then(key, Table::lookup, found, absent),
            Some(c) => NonNull::new(self.lookup_cached(c, key)).map_or_else(absent, found),
        }
    }

    /// [`RawIndex::lookup_raw`] through the hit cache. Out of line: inlined,
    /// its code took registers from the uncached lookup around it (the key
    /// and `self` were spilled to the stack on every lookup).
    #[inline(never)]
    fn lookup_cached(&self, c: &crate::cache::HitCache, key: u64) -> *mut Header {
        c.lookup(key, || self.lookup_uncached(key))
    }

    /// The record of `key`, or null, from the tables. The caller holds a
    /// read guard.
    #[inline(always)]
    pub(crate) fn lookup_uncached(&self, key: u64) -> *mut Header {
        self.lookup_uncached_then(key, Table::lookup, NonNull::as_ptr, ptr::null_mut)
    }

    /// [`RawIndex::lookup_uncached`] with the record handed to `found`, as
    /// in [`RawIndex::lookup_then`], and `step` the lookup in one table
    /// ([`Table::lookup_nonzero`] only for a key that is not 0).
    #[inline(always)]
    fn lookup_uncached_then<R>(
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
        self.lookup_then(
            key,
            |rec| {
                // SAFETY: a live record of `V`s, kept alive by the caller's
                // guard.
                unsafe { RecordPtr::<V>::from_raw(rec.as_ptr()).values() }
            },
            || &[],
        )
    }

    /// Values and ids of `key`.
    ///
    /// # Safety
    ///
    /// As for [`RawIndex::get`].
    pub(crate) unsafe fn get_with_ids<'g>(&self, key: u64) -> (&'g [u64], &'g [V]) {
        let rec = self.lookup_raw(key);
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

    /// `key`'s live slot and record, anywhere in the chain. Caller holds
    /// `key`'s stripe lock and a read guard.
    fn locate(&self, key: u64) -> Option<(&Slot, RecordPtr<V>)> {
        let mut t = self.root.ptr.load(Ordering::Acquire);
        loop {
            // SAFETY: as in `lookup_raw`; the caller's guard.
            let table = unsafe { &*t };
            if let Probe::Found(slot) = table.probe(key) {
                let rec = slot.rec.load(Ordering::Acquire);
                if is_live(rec) {
                    // SAFETY: a live record of `V`s.
                    return Some((slot, unsafe { RecordPtr::from_raw(rec) }));
                }
            }
            t = table.future.load(Ordering::Acquire);
            if t.is_null() {
                return None;
            }
        }
    }

    /// The last table of the chain. With any stripe lock held it has no
    /// future and keeps none until the lock is released.
    fn newest(&self) -> &Table {
        let mut t = self.root.ptr.load(Ordering::Acquire);
        loop {
            // SAFETY: as in `lookup_raw`; the caller's guard.
            let table = unsafe { &*t };
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

    fn retire_record(rec: RecordPtr<V>) {
        // SAFETY: `rec` was just unlinked from its slot under the stripe
        // lock; no new reader can reach it, and it is ours to free once a
        // grace period has passed. `V: Send` lets the reclaimer drop it.
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
        let r = self.insert_group_locked(si, stripe, &mut st, key, next, n);
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

    /// The body of a group insert. Caller holds a read guard and stripe
    /// `si`'s lock (`st`). Publishes, bumps the hit-cache generation and
    /// retires the replaced record; resizes are left to the caller.
    fn insert_group_locked(
        &self,
        si: usize,
        stripe: &Stripe,
        st: &mut StripeState,
        key: u64,
        next: &mut dyn FnMut() -> V,
        n: usize,
    ) -> Result<Option<Group>, Error> {
        let found = self.locate(key);
        self.insert_group_located(si, stripe, st, key, found, next, n)
    }

    /// [`RawIndex::insert_group_locked`] with `key`'s live slot and record
    /// already located (`locate`, under the same lock hold).
    #[allow(clippy::too_many_arguments)]
    fn insert_group_located(
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
            let delta = unsafe { new.bytes() as isize - old.bytes() as isize };
            stripe.account(n as isize, 0, delta);
            self.bump();
            Self::retire_record(old);
            return Ok(Some(Group {
                first,
                claimed: false,
                long_probe: false,
            }));
        }
        let table = self.newest();
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
            // migration no slot (found by the index_concurrent fuzz target:
            // "address index table full").
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
        let new = RecordPtr::<V>::build(n, (0..n).map(|i| (ids(i), next())));
        st.next_seq += n as u64;
        Self::publish(slot, new.into_raw());
        // SAFETY: `new` is live: only a writer holding this stripe's lock,
        // as we do, can unlink it.
        stripe.account(n as isize, 1, unsafe { new.bytes() } as isize);
        self.bump();
        Ok(Some(Group {
            first,
            claimed: true,
            long_probe: dist > LONG_PROBE && table.claimed() * 2 < table.capacity(),
        }))
    }

    /// Unlinks the entry `id` of `key`; returns the record that held it, to
    /// be retired or drained by the caller after a grace period.
    fn unlink(&self, key: u64, ids: &[u64]) -> Result<RecordPtr<V>, Error> {
        let (si, stripe) = self.stripe(key);
        if ids
            .iter()
            .any(|&id| (id as usize) & ((1 << STRIPE_ID_BITS) - 1) != si)
        {
            return Err(Error::NotFound);
        }
        let _guard = rcu::read_lock();
        let st = lock(&stripe.lock);
        let (slot, old) = self.locate(key).ok_or(Error::NotFound)?;
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
        let old_bytes = unsafe { old.bytes() };
        stripe.account(
            -(gone as isize),
            -isize::from(left == 0),
            new_bytes as isize - old_bytes as isize,
        );
        drop(st);
        self.bump();
        Ok(old)
    }

    /// Removes entry `id` of `key`; its value is dropped after a grace period.
    pub(crate) fn remove(&self, key: u64, id: u64) -> Result<(), Error> {
        let old = self.unlink(key, &[id])?;
        Self::retire_record(old);
        self.after_write(0);
        Ok(())
    }

    /// Removes entry `id` of `key`, waits for a grace period, and returns
    /// its value.
    pub(crate) fn take(&self, key: u64, id: u64) -> Result<V, Error> {
        let old = self.unlink(key, &[id])?;
        self.after_write(0);
        rcu::synchronize();
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
        let Some((slot, old)) = self.locate(key) else {
            return 0;
        };
        Self::publish(slot, ptr::null_mut());
        self.release_addr();
        // SAFETY: `old` is live under our guard.
        let (n, bytes) = unsafe { (old.len(), old.bytes()) };
        stripe.account(-(n as isize), -1, -(bytes as isize));
        drop(st);
        drop(guard);
        self.bump();
        Self::retire_record(old);
        self.after_write(0);
        n
    }

    /// Bulk insert, all-or-nothing. On error every value comes back in
    /// input order.
    pub(crate) fn insert_many(&self, items: Vec<(u64, V)>) -> Result<Vec<u64>, BulkError<V>> {
        let n = items.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let keys: Vec<u64> = items.iter().map(|(k, _)| *k).collect();
        let mut vals: Vec<Option<V>> = items.into_iter().map(|(_, v)| Some(v)).collect();
        // Up-front capacity check, before presizing (a refused batch must not
        // grow the table): fails before inserting anything unless concurrent
        // writers race us (then the rollback below runs).
        if let Some(max) = self.config.max_addresses {
            let mut distinct = keys.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let guard = rcu::read_lock();
            let new_keys = distinct
                .iter()
                .filter(|&&k| self.lookup_raw(k).is_null())
                .count();
            drop(guard);
            if self.limited_addrs.load(Ordering::Relaxed) + new_keys > max {
                let values = keys
                    .into_iter()
                    .zip(vals.into_iter().map(Option::unwrap))
                    .collect();
                return Err((Error::CapacityExceeded { max_addresses: max }, values));
            }
        }
        // Presize for every key being new (bulk registrations rarely repeat
        // an address; a batch that does only over-allocates): no migration
        // runs during the batch.
        self.presize(n);
        // Input positions grouped by stripe, input order kept within each
        // stripe (a counting sort: two linear passes; a comparison sort of
        // the batch cost as much as the inserts): one lock acquisition per
        // stripe run, and the values and keys read in ascending order.
        let stripes = self.stripes.len();
        let mut bounds = vec![0usize; stripes + 1];
        for &k in &keys {
            bounds[stripe_of(k, self.stripe_mask) + 1] += 1;
        }
        for i in 0..stripes {
            bounds[i + 1] += bounds[i];
        }
        let mut order = vec![0usize; n];
        let mut fill = bounds.clone();
        for (i, &k) in keys.iter().enumerate() {
            let s = stripe_of(k, self.stripe_mask);
            order[fill[s]] = i;
            fill[s] += 1;
        }
        drop(fill);
        let mut ids = vec![0u64; n];
        // Positions inserted so far, for the rollback.
        let mut inserted: Vec<usize> = Vec::new();
        // A panic out of the runs (a `V::clone` of an address's values,
        // copied on write) is caught so that the batch stays all or nothing:
        // what it inserted is unlinked before the panic goes on. Nothing in
        // the index is left half-done by the panic (records are built
        // before they are published, locks ignore poison), and `ids` and
        // `inserted` hold every completed insert at every point.
        let runs = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.insert_runs(&keys, &mut vals, &order, &bounds, &mut ids, &mut inserted)
        }));
        match runs {
            Ok(Ok(())) => {
                self.after_write(0);
                Ok(ids)
            }
            Ok(Err(e)) => Err(self.roll_back(e, &keys, vals, &ids, &inserted)),
            Err(panic) => {
                // The values cannot travel with the panic: they are dropped
                // with their records after a grace period.
                drop(RetireAll(self.unlink_inserted(&keys, &ids, &inserted)));
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// The runs of [`RawIndex::insert_many`]: its values by stripe, then
    /// the repeated addresses. Records each insert in `ids` and `inserted`
    /// as it completes; stops at the first error.
    fn insert_runs(
        &self,
        keys: &[u64],
        vals: &mut [Option<V>],
        order: &[usize],
        bounds: &[usize],
        ids: &mut [u64],
        inserted: &mut Vec<usize>,
    ) -> Result<(), Error> {
        let stripes = self.stripes.len();
        // A repeated address: its first value goes in with the pass below,
        // the later ones are deferred and appended afterwards, all of an
        // address's deferred values in one record copy (appending each on
        // its own would copy the record once per value: quadratic for many
        // values on one address).
        let mut batch = BulkBatch::new(stripes);
        // Input positions of repeats, appended after the first pass.
        let mut deferred: Vec<usize> = Vec::new();
        for si in 0..stripes {
            let mut j = bounds[si];
            while j < bounds[si + 1] {
                // At most BULK_RUN keys per lock acquisition, so writers
                // waiting on this stripe are not held up for the whole batch.
                let end = bounds[si + 1].min(j + BULK_RUN);
                let stripe = &*self.stripes[si];
                let guard = rcu::read_lock();
                let mut st = lock(&stripe.lock);
                batch.hold(si, st.next_seq);
                // No future can be attached while we hold a stripe lock.
                let table = self.newest();
                let (mut claims, mut long_probe) = (0, false);
                let mut stopped: Option<Result<usize, Error>> = None;
                while j < end {
                    // The keys are known in advance: fetch the slot of a
                    // key a few places ahead while this one is inserted
                    // (overlaps the table's cache misses).
                    if j + PREFETCH_AHEAD < end {
                        table.prefetch(keys[order[j + PREFETCH_AHEAD]]);
                    }
                    let p = order[j];
                    let found = self.locate(keys[p]);
                    if batch.repeats(keys[p], found.as_ref()) {
                        deferred.push(p);
                        j += 1;
                        continue;
                    }
                    let mut next = || vals[p].take().expect("each value inserted once");
                    match self
                        .insert_group_located(si, stripe, &mut st, keys[p], found, &mut next, 1)
                    {
                        Ok(Some(g)) => {
                            ids[p] = g.first;
                            inserted.push(p);
                            claims += usize::from(g.claimed);
                            long_probe |= g.long_probe;
                            j += 1;
                        }
                        Ok(None) => {
                            stopped = Some(Ok(bounds[si + 1] - j));
                            break;
                        }
                        Err(e) => {
                            stopped = Some(Err(e));
                            break;
                        }
                    }
                }
                drop(st);
                drop(guard);
                if let Some(e) = self.after_bulk_run(claims, long_probe, stopped) {
                    return Err(e);
                }
            }
        }
        // The deferred repeats, grouped by address (a stable sort keeps
        // input order within each address), one record copy per address.
        deferred.sort_by_key(|&p| keys[p]);
        let mut j = 0;
        while j < deferred.len() {
            let key = keys[deferred[j]];
            let end = j + deferred[j..]
                .iter()
                .take_while(|&&p| keys[p] == key)
                .count();
            let group = &deferred[j..end];
            let (si, stripe) = self.stripe(key);
            let guard = rcu::read_lock();
            let mut st = lock(&stripe.lock);
            let mut taken = 0;
            let mut next = || {
                let v = vals[group[taken]].take().expect("each value inserted once");
                taken += 1;
                v
            };
            let r = self.insert_group_locked(si, stripe, &mut st, key, &mut next, group.len());
            drop(st);
            drop(guard);
            let (claims, long_probe, stopped) = match r {
                Ok(Some(g)) => {
                    for (i, &p) in group.iter().enumerate() {
                        ids[p] = g.first + ((i as u64) << STRIPE_ID_BITS);
                        inserted.push(p);
                    }
                    j = end;
                    (usize::from(g.claimed), g.long_probe, None)
                }
                Ok(None) => (0, false, Some(Ok(deferred.len() - j))),
                Err(e) => (0, false, Some(Err(e))),
            };
            if let Some(e) = self.after_bulk_run(claims, long_probe, stopped) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// After a bulk insert releases a stripe lock: rehash, resize or grow
    /// as the run found; a run that stopped on an error hands it back.
    fn after_bulk_run(
        &self,
        claims: usize,
        long_probe: bool,
        stopped: Option<Result<usize, Error>>,
    ) -> Option<Error> {
        if long_probe {
            self.request_rehash();
        }
        if claims > 0 {
            self.after_write(claims);
        }
        match stopped {
            None => None,
            // No room (a concurrent writer filled the table first): grow,
            // and the caller retries from the key that stopped.
            Some(Ok(extra)) => {
                self.grow_blocking(extra, false);
                None
            }
            Some(Err(e)) => Some(e),
        }
    }

    /// Undoes a failed bulk insert: unlinks what it inserted (`inserted`:
    /// input positions), waits one grace period, and moves every value back
    /// out, in input order.
    ///
    /// Inside a read-side section of the calling thread a grace period
    /// would wait for that section (`synchronize` panics there), and other
    /// readers may still hold the unlinked values, so they cannot be moved
    /// out: the caller gets clones, and the originals are dropped with their
    /// records after a grace period.
    fn roll_back(
        &self,
        e: Error,
        keys: &[u64],
        mut vals: Vec<Option<V>>,
        ids: &[u64],
        inserted: &[usize],
    ) -> BulkError<V> {
        let unlinked = self.unlink_inserted(keys, ids, inserted);
        let mut back = Vec::new();
        if rcu::in_read_section() {
            // Retired on drop, so that a panicking clone leaks nothing.
            let retire = RetireAll(unlinked);
            for (rec, gids) in &retire.0 {
                // SAFETY: unlinked by us and not yet retired: nobody frees
                // it meanwhile, and its values are initialised.
                let (rids, rvals) = unsafe { (rec.ids(), rec.values()) };
                back.extend(
                    rids.iter()
                        .zip(rvals)
                        .filter(|(id, _)| gids.contains(id))
                        .map(|(&id, v)| (id, v.clone())),
                );
            }
        } else {
            rcu::synchronize();
            for (rec, gids) in unlinked {
                // SAFETY: unlinked above, a grace period has passed, and we
                // are the record's only owner.
                unsafe { rec.free_extracting(|id| gids.contains(&id), &mut back) };
            }
        }
        let pos_of: std::collections::HashMap<u64, usize> =
            inserted.iter().map(|&p| (ids[p], p)).collect();
        for (id, v) in back {
            vals[pos_of[&id]] = Some(v);
        }
        let values = keys
            .iter()
            .zip(vals)
            .filter_map(|(&k, v)| v.map(|v| (k, v)))
            .collect();
        (e, values)
    }

    /// Unlinks the values a bulk insert inserted (`inserted`: input
    /// positions; `ids`: their ids), each address's together; returns the
    /// records that held them with the batch's ids in each, for the caller
    /// to drain or retire.
    fn unlink_inserted(
        &self,
        keys: &[u64],
        ids: &[u64],
        inserted: &[usize],
    ) -> Vec<(RecordPtr<V>, Vec<u64>)> {
        // The batch's ids of each address, unlinked together.
        let mut by_key: Vec<(u64, u64)> = inserted.iter().map(|&p| (keys[p], ids[p])).collect();
        by_key.sort_unstable();
        let mut unlinked = Vec::with_capacity(by_key.len());
        for group in by_key.chunk_by(|a, b| a.0 == b.0) {
            let key = group[0].0;
            let gids: Vec<u64> = group.iter().map(|&(_, id)| id).collect();
            match self.unlink(key, &gids) {
                Ok(rec) => unlinked.push((rec, gids)),
                // A concurrent writer removed one of our fresh ids (ids are
                // not secret); what it removed it has dropped, the rest we
                // still unlink.
                Err(_) => {
                    for id in gids {
                        if let Ok(rec) = self.unlink(key, &[id]) {
                            unlinked.push((rec, vec![id]));
                        }
                    }
                }
            }
        }
        unlinked
    }

    // --------------------------------------------------------------- resize

    /// After a write: help a migration along, or start a resize.
    ///
    /// `claims`: slots the write claimed. A claim in a table that is being
    /// migrated into must pay its migration step (waiting for the `resize`
    /// lock if need be): that is what bounds the new table's load. Other
    /// writes help only if the lock is free.
    fn after_write(&self, claims: usize) {
        let _guard = rcu::read_lock();
        // A first look without the lock: most writes have nothing to do.
        if !self.resize_work(claims) {
            return;
        }
        let st = if claims > 0 {
            Some(lock(&self.resize))
        } else {
            self.resize.try_lock().ok()
        };
        let Some(mut st) = st else { return };
        // Decide again under the lock: another writer may have attached a
        // table or finished a migration since the first look.
        // SAFETY: root is live under the guard.
        let root = unsafe { &*self.root.ptr.load(Ordering::Acquire) };
        if !root.future.load(Ordering::Acquire).is_null() {
            let budget = st.budget.saturating_mul(claims.max(1));
            self.migrate(&mut st, budget);
            return;
        }
        if !root.has_room(0, GROW_AT) {
            let need = self.growth_need(root, 0);
            self.attach(
                &mut st,
                capacity_grown(need, self.config.min_capacity),
                Seed::Keep,
            );
        } else if claims == 0 && self.should_shrink(root) {
            // To at most 1/4 load: far enough from the growth threshold that
            // a few inserts do not grow it straight back.
            let addrs = self.live_addrs();
            let cap = capacity_for(addrs.saturating_mul(2), self.config.min_capacity);
            if cap < root.capacity() {
                self.attach(&mut st, cap, Seed::Keep);
            }
        }
    }

    /// Keys the table that replaces `root` must hold: the live addresses,
    /// `extra` more, and the bound on `root`'s unspent claim credits. The
    /// credits are in `root`'s claimed count, so at the growth threshold the
    /// live addresses may be that many short of it; sized on the live count
    /// alone, the "grown" table would be the same size (and grow again
    /// soon).
    fn growth_need(&self, root: &Table, extra: usize) -> usize {
        self.live_addrs() + extra + self.unspent_credits_bound(root)
    }

    /// Whether a resize step is due: a migration to help, or a table to
    /// grow or shrink. Caller holds a read guard.
    fn resize_work(&self, claims: usize) -> bool {
        // SAFETY: root is live under the caller's guard.
        let root = unsafe { &*self.root.ptr.load(Ordering::Acquire) };
        !root.future.load(Ordering::Acquire).is_null()
            || !root.has_room(0, GROW_AT)
            || (claims == 0 && self.should_shrink(root))
    }

    /// Shrink below 1/8 load (never below `min_capacity`). Sums the
    /// stripes' address counts when `auto_shrink` is on, so it is asked
    /// only after writes that claimed no slot (a claim cannot make a table
    /// too sparse).
    fn should_shrink(&self, root: &Table) -> bool {
        self.config.auto_shrink
            && root.capacity() > self.config.min_capacity
            && self.live_addrs() * 8 < root.capacity()
    }

    /// A claim probed more than `LONG_PROBE` slots in a table under half
    /// claimed. Rehashed now when no migration runs and the resize lock is
    /// free; otherwise (and whatever happens now) `rehash_pending` makes the
    /// next table attached draw a fresh seed.
    fn request_rehash(&self) {
        // Relaxed: a hint read under `resize` by `attach`; a request that
        // races with an attach is served by the one after it.
        self.rehash_pending.store(true, Ordering::Relaxed);
        if let Ok(mut st) = self.resize.try_lock() {
            let _guard = rcu::read_lock();
            // SAFETY: root is live under the guard.
            let root = unsafe { &*self.root.ptr.load(Ordering::Acquire) };
            if root.future.load(Ordering::Acquire).is_null() {
                let cap =
                    capacity_for(self.live_addrs(), self.config.min_capacity).max(root.capacity());
                self.attach(&mut st, cap, Seed::Fresh);
            }
        }
    }

    /// Finishes any migration, then makes sure the newest table has room
    /// for `extra` more claims below the growth threshold. `tight`: size
    /// the new table just below the growth threshold (bulk presizing, for
    /// memory) rather than as growth does ([`capacity_grown`]).
    fn grow_blocking(&self, extra: usize, tight: bool) {
        let mut st = lock(&self.resize);
        let _guard = rcu::read_lock();
        self.finish_migration(&mut st);
        // SAFETY: root is live under the guard.
        let root = unsafe { &*self.root.ptr.load(Ordering::Acquire) };
        if !root.has_room(extra, GROW_AT) {
            let need = self.growth_need(root, extra);
            let cap = if tight {
                capacity_presized(need, self.config.min_capacity)
            } else {
                capacity_grown(need, self.config.min_capacity)
            };
            self.attach(&mut st, cap, Seed::Keep);
            // The new table is empty: claims go there at once; the old
            // entries follow chunk by chunk.
        }
    }

    /// Bulk presizing: with room for `extra` new keys, grow once to the
    /// final size rather than several times on the way.
    fn presize(&self, extra: usize) {
        let _guard = rcu::read_lock();
        let newest = self.newest();
        if !newest.has_room(extra, GROW_AT) {
            drop(_guard);
            self.grow_blocking(extra, true);
        }
    }

    fn finish_migration(&self, st: &mut ResizeState) {
        loop {
            // SAFETY: root is live under the caller's guard.
            let root = unsafe { &*self.root.ptr.load(Ordering::Acquire) };
            if root.future.load(Ordering::Acquire).is_null() {
                return;
            }
            self.migrate(st, usize::MAX);
        }
    }

    /// Attaches a new table of (at least) `capacity` slots to the root.
    /// Caller holds `resize` and a read guard; no migration is in progress.
    ///
    /// Load bound: the new table holds at least twice the live keys, and at
    /// least 1/64 of the old capacity. Callers size it from a count of live
    /// addresses read without the stripe locks, which writers may have
    /// outgrown by the time every stripe lock is held (a shrink decided on
    /// a count of 1 while a bulk insert added 16 keys: the migration found
    /// the new table full, found by the `index_concurrent` fuzz target); so
    /// the count is read again under every stripe lock, where it is exact,
    /// and a table that is too small is replaced before it is attached.
    /// Each claim in it migrates `budget` ≥ `MIGRATE_CHUNK × ⌈old / new⌉ + 2`
    /// old slots (the `+ 2`: the extra slot and key 0's), so the migration
    /// ends after at most `new / MIGRATE_CHUNK` claims (one claim when the
    /// new table has fewer than `MIGRATE_CHUNK` slots); writers' claims
    /// also reserve room for the keys still to migrate
    /// (`insert_group_locked`), so the migration always finds room.
    fn attach(&self, st: &mut ResizeState, capacity: usize, seed: Seed) {
        // Loaded once: the root only changes under `resize` (the migration's
        // swap, `clear`), which the caller holds.
        // SAFETY: root is live (caller's guard).
        let root = unsafe { &*self.root.ptr.load(Ordering::Acquire) };
        if !root.future.load(Ordering::Acquire).is_null() {
            // Futures are only attached under `resize`, which the caller
            // holds, so this cannot change under us; a caller that decided
            // on a stale view simply has nothing to do.
            return;
        }
        // A rehash asked for and not served yet turns any new table into one.
        let seed = if self.rehash_pending.swap(false, Ordering::Relaxed) {
            Seed::Fresh
        } else {
            seed
        };
        let seed = match seed {
            Seed::Fresh => {
                self.rehashes.fetch_add(1, Ordering::Relaxed);
                let s = table_seed(self.config.seed, st.generation);
                st.generation += 1;
                s
            }
            Seed::Keep => root.seed(),
        };
        let old_cap = root.capacity();
        let mut capacity = capacity.max(old_cap / 64);
        let (new, stripes) = loop {
            let new = Table::new(capacity, seed, self.config.huge_pages);
            let stripes = self.lock_all_stripes();
            // Exact under every stripe lock: writers change it under theirs.
            let live = self.live_addrs();
            let need = capacity_for(live, self.config.min_capacity);
            if need <= capacity {
                break (Box::into_raw(new), stripes);
            }
            drop(stripes);
            capacity = need;
        };
        // `+ 2`: the old table's extra slot and key 0's slot, so the whole
        // old table (`old_cap + 2` positions) is covered by `new / 256`
        // claims. At least 4 slots per stripe: a step takes every stripe
        // lock (`migrate`), and on machines with more stripes than
        // `MIGRATE_CHUNK / 4` a 258-slot step would take more lock
        // operations than it moves keys.
        st.budget =
            (MIGRATE_CHUNK * old_cap.div_ceil(capacity).max(1) + 2).max(4 * self.stripes.len());
        // Release: pairs with the Acquire loads of `future` by readers and
        // writers; the new table's fields are visible. Every stripe lock is
        // held, so no writer is between reading `future` and claiming.
        root.future.store(new, Ordering::Release);
        st.cursor = 0;
        // Credits belong to the newest table, which is now `new`; those
        // left unspent stay counted in the old table, which takes no more
        // claims.
        // Each stripe's lock is released as soon as its credits are reset.
        for mut stripe_state in stripes {
            stripe_state.credits = 0;
        }
        self.resizes.fetch_add(1, Ordering::Relaxed);
    }

    /// Migrates up to `budget` slots of the root into its future; swaps the
    /// root when done. Caller holds `resize` and a read guard.
    fn migrate(&self, st: &mut ResizeState, budget: usize) {
        let old_ptr = self.root.ptr.load(Ordering::Acquire);
        // SAFETY: root is live (caller's guard).
        let old = unsafe { &*old_ptr };
        let new_ptr = old.future.load(Ordering::Acquire);
        if new_ptr.is_null() {
            return;
        }
        // SAFETY: the future is live as long as the root is.
        let new = unsafe { &*new_ptr };
        let last = old.slot_count(); // inclusive: key 0's slot
        let end = st.cursor.saturating_add(budget).min(last + 1);
        // Every stripe lock is taken once per run of slots, not each moved
        // key's own lock once per key: a step of 258 slots moves up to about
        // 130 keys (tables grow at half claimed), two lock operations each
        // one by one, 16 in all with 8 stripes. With every lock held no
        // writer claims meanwhile, so the new slots are claimed and counted
        // without atomic read-modify-writes. A run is capped at
        // `migrate_run()` slots, so writers wait a bounded time even when a
        // forced resize migrates a whole table.
        let run = self.migrate_run();
        // The position in the new table that is as far through it as old
        // position `p` is through the old table (`last + 1` positions).
        let share = |p: usize| (p as u128 * new.slot_count() as u128 / (last as u128 + 1)) as usize;
        let mut i = st.cursor;
        while i < end {
            let run_end = end.min(i.saturating_add(run));
            // The same share of the new table as this run is of the old
            // one, faulted in before the claims read it (`Table::prefault`),
            // and before the locks are taken: a fault costs microseconds.
            // With the seed kept (`Seed::Keep`) that share is about where
            // this run's keys go; in any case the last run reaches the end,
            // so every page of the new table is covered once.
            new.prefault(share(i), share(run_end));
            let stripes = self.lock_all_stripes();
            let mut fresh = 0;
            // Two passes per batch: the first lists the live slots without a
            // branch on each (about half the slots are live, at random, so a
            // branch there mispredicts about every other slot), the second
            // moves them. Empty slots hold a null record, so the record alone
            // says whether a slot is live; no writer changes a slot of the
            // old table while every stripe lock is held, so what the first
            // pass read still holds in the second.
            let mut j = i;
            while j < run_end {
                let batch_end = run_end.min(j + MIGRATE_BATCH);
                let mut live = [(0, ptr::null_mut()); MIGRATE_BATCH];
                let mut n = 0;
                for k in j..batch_end {
                    // Acquire: pairs with the Release publish of the writer
                    // that stored it (also ordered by the stripe lock); the
                    // record is handed on to readers of the new slot.
                    let rec = old.slot_at(k).1.rec.load(Ordering::Acquire);
                    live[n] = (k, rec);
                    n += usize::from(is_live(rec));
                }
                for &(k, rec) in &live[..n] {
                    let (key, slot) = old.slot_at(k);
                    let (new_slot, is_fresh) = new.claim_exclusive(key);
                    fresh += usize::from(is_fresh);
                    // New slot first, then MOVED (module docs): a reader that
                    // sees MOVED finds the record in `new`.
                    Self::publish(new_slot, rec);
                    Self::publish(slot, moved());
                }
                j = batch_end;
            }
            // Before the locks go: writers read the count under theirs.
            new.add_claims(fresh);
            drop(stripes);
            i = run_end;
        }
        st.cursor = end;
        if end == last + 1 {
            // Release: pairs with the Acquire loads of `root`.
            self.root.ptr.store(new_ptr, Ordering::Release);
            // SAFETY: unlinked from `root`; readers that loaded it hold
            // guards; its records now belong to `new` (all slots are moved,
            // tombstones or empty), so freeing it frees only its slots.
            unsafe { rcu::retire_box_raw(old_ptr) };
        }
    }

    /// Claims a stripe reserves at a time in `table` (at least 1): small
    /// enough that all stripes' unspent credits together stay under 1/64 of
    /// the table, at most 16.
    fn credit_batch(&self, table: &Table) -> usize {
        (table.capacity() / (64 * self.stripes.len())).clamp(1, 16)
    }

    /// About the most claim credits reserved in `table` and not spent: a
    /// batch per stripe, which is at most 1/64 of the table when batches
    /// are larger than 1. Batches of 1 are spent by the insert that
    /// reserves them (unless the key's slot existed), so the bound is also
    /// capped at 1/64 of the table rather than a credit per stripe, which
    /// would size a small table for a machine's stripe count.
    fn unspent_credits_bound(&self, table: &Table) -> usize {
        (self.credit_batch(table) * self.stripes.len()).min(table.capacity() / 64)
    }

    /// Most slots one migration run covers while holding every stripe
    /// lock: `4 × MIGRATE_CHUNK`, or 4 slots per stripe when there are more
    /// than 256 stripes. Either covers a whole step of a grow by
    /// 2 (`budget`: 258 slots, and at least 4 per stripe), so a step takes
    /// the locks once, at most one lock operation per 2 slots; the cap
    /// bounds how long writers wait when a forced resize or a bulk insert's
    /// many claims migrate far more.
    fn migrate_run(&self) -> usize {
        (MIGRATE_CHUNK * 4).max(self.stripes.len() * 4)
    }

    /// Removes everything. Values are dropped after a grace period.
    pub(crate) fn clear(&self) {
        let mut st = lock(&self.resize);
        let fresh = Box::into_raw(Table::new(
            self.config.min_capacity,
            table_seed(self.config.seed, st.generation),
            self.config.huge_pages,
        ));
        st.generation += 1;
        let stripes = self.lock_all_stripes();
        // AcqRel: Release publishes the fresh table; Acquire makes the old
        // chain ours to retire.
        let old = self.root.ptr.swap(fresh, Ordering::AcqRel);
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
        // SAFETY: the chain is unlinked and no writer can reach it (we held
        // every lock while swapping); readers are covered by the grace period.
        unsafe { rcu::retire_box_raw(Box::into_raw(Box::new(Chain::<V>(old, PhantomData)))) };
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
        let mut t = self.root.ptr.load(Ordering::Acquire);
        let mut newest: Option<&Table> = None;
        while !t.is_null() {
            // SAFETY: as in `lookup_raw`.
            let table = unsafe { &*t };
            tables += 1;
            table_bytes += table.bytes();
            newest = Some(table);
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
            record_bytes: self.stripe_sum(|s| &s.record_bytes),
        }
    }

    /// The root table, for iteration. Caller holds a read guard.
    pub(crate) fn root_table(&self) -> *const Table {
        self.root.ptr.load(Ordering::Acquire)
    }
}

/// A table chain and its live records, dropped together after a grace
/// period by `clear`.
struct Chain<V>(*mut Table, PhantomData<V>);

// SAFETY: the chain owns its tables and records; records hold `V: Send`.
unsafe impl<V: Send> Send for Chain<V> {}

impl<V> Drop for Chain<V> {
    fn drop(&mut self) {
        // SAFETY: we own the chain (unlinked, grace period passed).
        unsafe { free_chain::<V>(self.0) }
    }
}

/// Frees a chain of tables and every live record in it. A value whose
/// destructor panics does not stop the walk: every other record and table
/// is still freed, then the first panic continues.
///
/// # Safety
///
/// The caller owns the chain: no reader or writer can reach it.
unsafe fn free_chain<V>(mut t: *mut Table) {
    let mut panic = None;
    while !t.is_null() {
        // SAFETY: caller contract; each table came from `Box::into_raw`.
        let table = unsafe { Box::from_raw(t) };
        for (_, slot) in table.slots() {
            let rec = slot.rec.load(Ordering::Relaxed);
            if is_live(rec) {
                let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    // SAFETY: live records are owned by their (only) live
                    // slot, and each slot is visited once. A panic leaves
                    // the record freed (`RecordPtr::free`).
                    unsafe { RecordPtr::<V>::from_raw(rec).free() }
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
        unsafe { free_chain::<V>(self.root.ptr.load(Ordering::Relaxed)) }
    }
}

/// The seed of the `generation`-th table of an index seeded with `seed`.
fn table_seed(seed: u64, generation: u64) -> u64 {
    // splitmix64 of (seed, generation): distinct, well-mixed per table.
    let mut z = seed ^ generation.wrapping_mul(0x9E37_79B9_7F4A_7C15);
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
            // SAFETY: the caller's guard keeps the chain allocated.
            let table = unsafe { &*self.table };
            if self.next > table.slot_count() {
                self.table = table.future.load(Ordering::Acquire);
                self.next = 0;
                continue;
            }
            let (key, slot) = table.slot_at(self.next);
            self.next += 1;
            if key == 0 && self.next <= table.slot_count() {
                continue;
            }
            let rec = slot.rec.load(Ordering::Acquire);
            if is_live(rec) {
                // SAFETY: a live record of `V`s.
                return Some((key, unsafe { RecordPtr::from_raw(rec) }));
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn config() -> Config {
        Config {
            initial_capacity: 64,
            min_capacity: 8,
            max_addresses: None,
            auto_shrink: true,
            seed: 1,
            stripes: 1,
            hit_cache: None,
            huge_pages: true,
        }
    }

    /// Regression (found by the `index_concurrent` fuzz target): a resize
    /// sized from a stale count of live addresses (writers added keys
    /// between the count and the attach) attached a table too small for
    /// the keys to migrate, and the migration panicked ("address index
    /// table full"). `attach` now re-counts under every stripe lock.
    #[test]
    fn attach_sized_from_a_stale_count_still_fits_every_key() {
        let index = RawIndex::<u64>::new(config());
        for k in 1..=20u64 {
            index.insert(k, k).unwrap();
        }
        {
            let mut st = lock(&index.resize);
            let _guard = rcu::read_lock();
            // Sized as a shrink decided on a count of 1 would size it.
            index.attach(&mut st, capacity_for(2, 8), Seed::Keep);
            index.finish_migration(&mut st);
        }
        let _guard = rcu::read_lock();
        for k in 1..=20u64 {
            // SAFETY: a read guard is held and `index` outlives it.
            assert_eq!(unsafe { index.get(k) }, [k], "key {k}");
        }
        // SAFETY: as above.
        let root = unsafe { &*index.root.ptr.load(Ordering::Acquire) };
        assert!(root.capacity() >= 40, "capacity {}", root.capacity());
    }

    /// Regression (found by the `index_concurrent` fuzz target): claims
    /// made in a table being migrated into, before any migration step ran
    /// (a bulk insert's stripe run, or writers on several stripes), filled
    /// it to 90% and left the migration no slot: "address index table
    /// full". Each claim must now leave room for the keys still to migrate.
    #[test]
    fn claims_during_a_migration_leave_room_for_it() {
        let index = RawIndex::<u64>::new(config());
        for k in 1..=3u64 {
            index.insert(k, k).unwrap();
        }
        // A small future with no migration step yet, as a shrink decided
        // while another writer's bulk run was between stripe runs.
        {
            let mut st = lock(&index.resize);
            let _guard = rcu::read_lock();
            index.attach(&mut st, 8, Seed::Keep);
        }
        // A stripe run claiming new keys in it: refused before the
        // migration's room is used up.
        let guard = rcu::read_lock();
        let stripe = &*index.stripes[0];
        let mut st = lock(&stripe.lock);
        let mut claimed = 0;
        for k in 100..110u64 {
            match index.insert_group_locked(0, stripe, &mut st, k, &mut || k, 1) {
                Ok(Some(g)) => claimed += usize::from(g.claimed),
                Ok(None) => break,
                Err(e) => panic!("{e}"),
            }
        }
        drop(st);
        drop(guard);
        assert!(
            claimed < 7,
            "{claimed} claims in an 8-slot table being migrated into"
        );
        // The migration finds room for every live key, and nothing is lost.
        {
            let mut st = lock(&index.resize);
            let _guard = rcu::read_lock();
            index.finish_migration(&mut st);
        }
        let _guard = rcu::read_lock();
        for k in (1..=3u64).chain(100..100 + claimed as u64) {
            // SAFETY: a read guard is held and `index` outlives it.
            assert_eq!(unsafe { index.get(k) }, [k], "key {k}");
        }
    }

    /// Growth keeps the root's seed (a key's home `h` becomes `2h` or
    /// `2h + 1`, so the migration writes the new table in order); a rehash
    /// draws a new seed, and growth after it keeps that one; a rehash asked
    /// for while a migration runs is served by the next table attached. No
    /// key is lost on the way.
    #[test]
    fn growth_keeps_the_seed_and_a_rehash_draws_a_new_one() {
        let index = RawIndex::<u64>::new(config());
        let seed = |index: &RawIndex<u64>| {
            let _guard = rcu::read_lock();
            // SAFETY: root is live under the guard.
            unsafe { &*index.root.ptr.load(Ordering::Acquire) }.seed()
        };
        let first = seed(&index);
        for k in 1..=1_000u64 {
            index.insert(k, k).unwrap();
        }
        assert!(index.resizes.load(Ordering::Relaxed) >= 4);
        assert_eq!(seed(&index), first, "growth changed the seed");
        index.request_rehash();
        {
            let mut st = lock(&index.resize);
            let _guard = rcu::read_lock();
            index.finish_migration(&mut st);
        }
        let rehashed = seed(&index);
        assert_ne!(rehashed, first, "a rehash kept the seed");
        for k in 1_001..=4_000u64 {
            index.insert(k, k).unwrap();
        }
        assert_eq!(
            seed(&index),
            rehashed,
            "growth after a rehash changed the seed"
        );
        assert_eq!(index.rehashes.load(Ordering::Relaxed), 1);
        // A rehash asked for during a migration is not dropped: the next
        // table attached, a growth, draws a fresh seed.
        {
            let mut st = lock(&index.resize);
            let _guard = rcu::read_lock();
            let cap = index.newest().capacity();
            index.attach(&mut st, cap, Seed::Keep);
        }
        index.request_rehash();
        {
            let mut st = lock(&index.resize);
            let _guard = rcu::read_lock();
            index.finish_migration(&mut st);
        }
        assert_eq!(seed(&index), rehashed, "no table was attached yet");
        let resizes = index.resizes.load(Ordering::Relaxed);
        let mut k = 4_001u64;
        while index.resizes.load(Ordering::Relaxed) == resizes {
            index.insert(k, k).unwrap();
            k += 1;
        }
        {
            let mut st = lock(&index.resize);
            let _guard = rcu::read_lock();
            index.finish_migration(&mut st);
        }
        assert_ne!(seed(&index), rehashed, "the pending rehash was dropped");
        assert_eq!(index.rehashes.load(Ordering::Relaxed), 2);
        let _guard = rcu::read_lock();
        for k in 1..k {
            // SAFETY: a read guard is held and `index` outlives it.
            assert_eq!(unsafe { index.get(k) }, [k], "key {k}");
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
        let read_by_lookups = [offset_of!(R, root), offset_of!(R, cache)];
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
        assert_ne!(pair(offset_of!(R, root)), pair(offset_of!(R, cache)));
    }
}
