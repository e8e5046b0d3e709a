//! [`AddrIndex`], its entry ids, iterator and statistics.

use std::fmt;
use std::marker::PhantomData;

use super::raw::{RawIndex, RawIter};
use crate::cache::{HitCache, HitCacheConfig, Span};
use crate::error::{Error, InsertError, InsertManyError};
use crate::rcu::{self, ReadGuard};

/// Identifies one inserted value: pass it to [`AddrIndex::remove`] or
/// [`AddrIndex::take`] with its address. Unique for the life of the index;
/// the same value inserted twice gets two ids. One
/// [`insert_shared`](AddrIndex::insert_shared) gives its value one id at
/// all of its addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct EntryId(u64);

impl EntryId {
    /// The id as an integer (for FFI and logging).
    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// An id from [`EntryId::as_u64`]. Ids that were never issued are simply
    /// not found.
    pub fn from_u64(raw: u64) -> Self {
        Self(raw)
    }
}

/// The cache bound of an index without a cache: only address 0 reaches it,
/// and goes on.
static NO_CACHE: crate::sync::unmodelled::AtomicU64 = crate::sync::unmodelled::AtomicU64::new(0);

/// A concurrent multi-map from `u64` addresses to values.
///
/// See the [module documentation](super) for the design, the consistency
/// guarantees and the execution context of each operation.
///
/// # Examples
///
/// ```
/// use fprobe::{AddrIndex, rcu};
///
/// let index = AddrIndex::new();
/// let a = index.insert(0x1000, "entry handler A").unwrap();
/// let _b = index.insert(0x1000, "entry handler B").unwrap();
/// index.insert(0x2000, "entry handler C").unwrap();
///
/// // Readers: no lock, no shared write.
/// let guard = rcu::read_lock();
/// assert_eq!(index.get(0x1000, &guard), &["entry handler A", "entry handler B"]);
/// assert!(index.get(0x3000, &guard).is_empty());
/// drop(guard);
///
/// // Or with the guard taken internally:
/// assert_eq!(index.lookup(0x2000, |v| v.len()), Some(1));
///
/// index.remove(0x1000, a).unwrap();
/// assert_eq!(index.lookup(0x1000, |v| v.to_vec()), Some(vec!["entry handler B"]));
/// ```
pub struct AddrIndex<V: Clone + Send + Sync + 'static> {
    /// The recent-hit cache in front of the lookups, when configured,
    /// checked against the raw index's write sequence. Declared before
    /// `raw`, so it goes first.
    cache: Option<Box<HitCache<Span>>>,
    /// Addresses above this take the plain inline lookup at once: 0
    /// without a cache (every address but 0, which the tables keep apart),
    /// `u64::MAX` with one (whose switch is asked next, `cache_bound`).
    /// One compare, on the index's own line, for an index without a cache.
    plain_above: u64,
    /// The word the addresses that fail `plain_above` are compared with
    /// next: the cache's bound (0 while its switch is off, so that its
    /// lookups are the plain ones but for one load and one compare;
    /// `u64::MAX` while it is on), or [`NO_CACHE`]. Invariant: points at
    /// `NO_CACHE` or into `cache`, which lives as long as `self`.
    cache_bound: *const crate::sync::unmodelled::AtomicU64,
    raw: RawIndex<V>,
}

// SAFETY: `cache_bound` points at a static atomic or into `cache`, owned by
// the index; everything else is `RawIndex` (Send when `V: Send`) and the
// cache (Send and Sync). The pointer adds no thread affinity.
unsafe impl<V: Clone + Send + Sync + 'static> Send for AddrIndex<V> {}
// SAFETY: as for `Send`; the pointed-to word is an atomic.
unsafe impl<V: Clone + Send + Sync + 'static> Sync for AddrIndex<V> {}

impl<V: Clone + Send + Sync + 'static> AddrIndex<V> {
    /// An empty index with the default configuration (see
    /// [`AddrIndexBuilder`](super::AddrIndexBuilder)).
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default configuration is valid")
    }

    /// An empty index presized for `addresses` addresses.
    ///
    /// The table's memory (32 to 64 bytes per address: a power of two of
    /// 16-byte slots, at least twice the addresses) is allocated and made
    /// resident here, in time linear in `addresses`: written once now, each
    /// page costs one page fault rather than the two that inserts reading it
    /// first would cost. So presize for addresses you will register, not for
    /// a generous upper bound.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::<u32>::with_capacity(50_000);
    /// assert!(index.stats().home_slots >= 50_000);
    /// ```
    pub fn with_capacity(addresses: usize) -> Self {
        Self::builder()
            .capacity(addresses)
            .build()
            .expect("a capacity hint is always valid")
    }

    /// The index of `raw`, with a hit cache of `cache` in front of its
    /// lookups (`raw` then keeps a write sequence).
    pub(crate) fn from_raw(raw: RawIndex<V>, cache: Option<HitCacheConfig>) -> Self {
        let cache = cache.map(|c| {
            let sequence = raw
                .write_sequence()
                .expect("an index with a hit cache keeps a write sequence");
            // `raw` advances it after every publish or unlink and before
            // retiring the old record.
            Box::new(HitCache::with_sequence(c, sequence))
        });
        let plain_above = if cache.is_some() { u64::MAX } else { 0 };
        let cache_bound = match &cache {
            Some(c) => std::ptr::from_ref(c.bound()),
            None => &NO_CACHE,
        };
        Self {
            cache,
            plain_above,
            cache_bound,
            raw,
        }
    }

    /// `addr`'s values, through the hit cache when there is one and it is
    /// on.
    ///
    /// # Safety
    ///
    /// The caller is inside a read-side section for `'g`.
    #[inline(always)]
    unsafe fn values(&self, addr: u64) -> &[V] {
        // The cache's bound is asked only past the index's own (with a
        // cache); either way to one inline copy of the plain lookup.
        // SAFETY: the field's invariant.
        let bound = || unsafe { &*self.cache_bound };
        // Relaxed: a hint (`HitCache::bound`).
        if addr > self.plain_above || addr > bound().load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: the caller's section; `addr` is not 0.
            return unsafe { self.raw.get_nonzero(addr) };
        }
        if let Some(c) = self.cache.as_deref() {
            // SAFETY: the caller's section.
            return unsafe { self.values_cached(c, addr) };
        }
        // SAFETY: the caller's section.
        unsafe { self.values_of_zero() }
    }

    /// [`values`](Self::values) of address 0 without a cache: out of line,
    /// like the cache's path, so that the plain lookup keeps the registers.
    ///
    /// # Safety
    ///
    /// As for [`values`](Self::values).
    #[inline(never)]
    unsafe fn values_of_zero(&self) -> &[V] {
        // SAFETY: the caller's section.
        unsafe { self.raw.get(0) }
    }

    /// [`values`](Self::values) through the cache: out of line, so that
    /// the cache's paths (its hit path, and its misses with the fill
    /// inline) take no registers from the plain lookup of every index and
    /// registry without a cache, which shares the caller's code.
    ///
    /// # Safety
    ///
    /// As for [`values`](Self::values).
    #[inline(never)]
    unsafe fn values_cached<'g>(&'g self, c: &HitCache<Span>, addr: u64) -> &'g [V] {
        let span = c.lookup(addr, || {
            // SAFETY: the caller's section.
            Span::of::<V>(unsafe { self.raw.get(addr) })
        });
        // SAFETY: a span of `V`s found under the write sequence number the
        // cache checked, in this section (or an earlier one of the thread,
        // under the same number): the record is retired only after the
        // sequence moves on, so it lives as long as the caller's section.
        unsafe { span.values() }
    }

    /// Adds `value` to `addr`'s values (after any it already has).
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExceeded`] when `addr` is new and the index already
    /// holds [`max_addresses`](super::AddrIndexBuilder::max_addresses) addresses;
    /// the value comes back in the error.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// let id1 = index.insert(0x40, 7).unwrap();
    /// let id2 = index.insert(0x40, 7).unwrap(); // duplicates are fine
    /// assert_ne!(id1, id2);
    /// assert_eq!(index.len(), 2);
    /// ```
    pub fn insert(&self, addr: u64, value: V) -> Result<EntryId, InsertError<V>> {
        self.raw
            .insert(addr, value)
            .map(EntryId)
            .map_err(|(error, value)| InsertError { error, value })
    }

    /// Inserts every `(address, value)` pair, all or nothing: on error no
    /// value stays inserted and every value comes back. Cheaper per value
    /// than [`insert`](Self::insert) into a growing index: the table is
    /// presized once (no migration during the batch), each stripe lock is
    /// taken once per run of up to 1,024 addresses, table slots are fetched
    /// ahead of use, and the repeated values of one address are added with
    /// one record copy. Values of one address keep input order.
    ///
    /// Returns the ids in input order.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExceeded`] when the new addresses do not fit under
    /// [`max_addresses`](super::AddrIndexBuilder::max_addresses). That is checked
    /// before anything is inserted; only when concurrent writers take the
    /// last places meanwhile does a batch fail midway, and then its inserts
    /// are undone and the values moved back out after a grace period. Called
    /// inside a read-side section (where a grace period cannot be waited
    /// for), such a batch hands back clones of its values instead, and the
    /// originals are dropped after a grace period.
    ///
    /// # Panics
    ///
    /// When a value's `clone` panics (adding to an address that already has
    /// values copies them): the batch's inserts are undone, its values are
    /// dropped (after a grace period, for those already inserted), and the
    /// panic continues.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// let ids = index.insert_many((0..1000u64).map(|a| (a * 16, a))).unwrap();
    /// assert_eq!(ids.len(), 1000);
    /// assert_eq!(index.lookup(160, |v| v[0]), Some(10));
    /// ```
    pub fn insert_many<I: IntoIterator<Item = (u64, V)>>(
        &self,
        items: I,
    ) -> Result<Vec<EntryId>, InsertManyError<V>> {
        self.raw
            .insert_many(items.into_iter().collect())
            .map(|ids| ids.into_iter().map(EntryId).collect())
            .map_err(|(error, values)| InsertManyError { error, values })
    }

    /// Attaches `value` at every distinct address of `addrs` under one id,
    /// all or nothing, with one copy of it for all of them: the kernel's
    /// one fprobe on many functions.
    ///
    /// Addresses that held the same values before hold one record after
    /// (addresses with none included), so the value is cloned once per
    /// distinct set of values rather than once per address. A lookup of an
    /// address then reads a record that every other address of the set
    /// reads too, and stays in cache: a lookup spread over many addresses
    /// costs one cache miss (the table slot's) instead of two. A later
    /// write to one of the addresses copies its record out of the set, as
    /// for any record.
    ///
    /// The id removes the value from one address ([`remove`](Self::remove),
    /// [`take`](Self::take)) or from many at once
    /// ([`remove_shared`](Self::remove_shared), which keeps the rest
    /// shared).
    ///
    /// # Errors
    ///
    /// As [`insert_many`](Self::insert_many), with the value handed back:
    /// [`Error::CapacityExceeded`] when the new addresses do not fit under
    /// [`max_addresses`](super::AddrIndexBuilder::max_addresses), checked before
    /// anything is inserted; when concurrent writers take the last places
    /// meanwhile, what was attached is detached again (its copies dropped
    /// after a grace period).
    ///
    /// # Panics
    ///
    /// When a value's `clone` panics: what was attached is detached, and the
    /// panic continues.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// let id = index.insert_shared(&[0x10, 0x20, 0x30], "probe").unwrap();
    /// assert_eq!(index.lookup(0x20, |v| v.to_vec()), Some(vec!["probe"]));
    /// assert_eq!(index.len(), 3);
    /// index.remove(0x20, id).unwrap(); // one address
    /// assert_eq!(index.remove_shared(&[0x10, 0x20, 0x30], id), 2); // the rest
    /// assert!(index.is_empty());
    /// ```
    pub fn insert_shared(&self, addrs: &[u64], value: V) -> Result<EntryId, InsertError<V>> {
        self.raw
            .insert_shared(addrs, value)
            .map(EntryId)
            .map_err(|(error, value)| InsertError { error, value })
    }

    /// Removes the value `id` from every address of `addrs` that holds it
    /// and returns how many did; the values are dropped after a grace
    /// period. Addresses that held the same values before hold one record
    /// after, as with [`insert_shared`](Self::insert_shared).
    ///
    /// # Examples
    ///
    /// See [`insert_shared`](Self::insert_shared).
    pub fn remove_shared(&self, addrs: &[u64], id: EntryId) -> usize {
        self.raw.remove_shared(addrs, id.0)
    }

    /// Removes the value `id` of `addr`; it is dropped after a grace period
    /// (lookups that began earlier may still be using it).
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when `addr` has no value `id` (never inserted,
    /// already removed, or an id of another address); nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::{AddrIndex, Error};
    /// let index = AddrIndex::new();
    /// let id = index.insert(1, "x").unwrap();
    /// index.remove(1, id).unwrap();
    /// assert_eq!(index.remove(1, id), Err(Error::NotFound));
    /// ```
    pub fn remove(&self, addr: u64, id: EntryId) -> Result<(), Error> {
        #[cfg(fprobe_fuzz_canary)]
        if id.0 % 5 == 4 {
            // Deliberately broken build (`--cfg fprobe_fuzz_canary`,
            // `scripts/fuzz.sh`): claims to remove every fifth id and keeps
            // it, a bug the fuzz targets' model checks must catch.
            return Ok(());
        }
        self.raw.remove(addr, id.0)
    }

    /// Removes the value `id` of `addr`, waits for a grace period, and
    /// returns it. A value of [`insert_shared`](Self::insert_shared) that
    /// other addresses still hold comes back as a clone (theirs stays).
    ///
    /// # Errors
    ///
    /// As [`remove`](Self::remove).
    ///
    /// # Panics
    ///
    /// Inside an RCU read-side section of the calling thread.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// let id = index.insert(1, String::from("mine")).unwrap();
    /// assert_eq!(index.take(1, id).unwrap(), "mine");
    /// ```
    pub fn take(&self, addr: u64, id: EntryId) -> Result<V, Error> {
        assert!(
            !rcu::in_read_section(),
            "AddrIndex::take called inside an RCU read-side section (it waits for a grace period)"
        );
        self.raw.take(addr, id.0)
    }

    /// Removes every value of `addr` (dropped after a grace period) and
    /// returns how many there were.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// index.insert(5, 'a').unwrap();
    /// index.insert(5, 'b').unwrap();
    /// assert_eq!(index.remove_addr(5), 2);
    /// assert!(!index.contains(5));
    /// ```
    pub fn remove_addr(&self, addr: u64) -> usize {
        self.raw.remove_addr(addr)
    }

    /// Every value of `addr`, in insertion order (empty if none), valid
    /// while `guard` lives.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// index.insert(8, 1u8).unwrap();
    /// let guard = fprobe::rcu::read_lock();
    /// assert_eq!(index.get(8, &guard), &[1]);
    /// ```
    #[inline]
    pub fn get<'g>(&'g self, addr: u64, _guard: &'g ReadGuard) -> &'g [V] {
        // SAFETY: `_guard` is a live read-side section for `'g`, and `self`
        // is borrowed for `'g`.
        unsafe { self.values(addr) }
    }

    /// [`get`](Self::get) inside a read-side section the caller holds in a
    /// form other than a [`ReadGuard`] (the probe layer's dispatch section,
    /// `rcu::raw::ReaderRecord::begin_dispatch`).
    ///
    /// # Safety
    ///
    /// The calling thread is inside a read-side section of the
    /// process-wide domain for as long as the returned slice lives.
    #[inline(always)]
    pub(crate) unsafe fn get_in_section(&self, addr: u64) -> &[V] {
        // SAFETY: forwarded contract: the caller's section keeps what the
        // slice points at alive for as long as the slice.
        unsafe { self.values(addr) }
    }

    /// Every value of `addr` with its id, as parallel slices.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// let id = index.insert(8, 'x').unwrap();
    /// let guard = fprobe::rcu::read_lock();
    /// let (ids, values) = index.get_with_ids(8, &guard);
    /// assert_eq!((ids, values), (&[id][..], &['x'][..]));
    /// ```
    pub fn get_with_ids<'g>(
        &'g self,
        addr: u64,
        _guard: &'g ReadGuard,
    ) -> (&'g [EntryId], &'g [V]) {
        // SAFETY: as in `get`.
        let (ids, values) = unsafe { self.raw.get_with_ids(addr) };
        // SAFETY: `EntryId` is `#[repr(transparent)]` over `u64`.
        let ids = unsafe { std::slice::from_raw_parts(ids.as_ptr().cast::<EntryId>(), ids.len()) };
        (ids, values)
    }

    /// Calls `f` with `addr`'s values inside a read-side section; `None`
    /// when the address has none.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// index.insert(3, 10).unwrap();
    /// index.insert(3, 20).unwrap();
    /// assert_eq!(index.lookup(3, |v| v.iter().sum::<i32>()), Some(30));
    /// assert_eq!(index.lookup(4, |v| v.len()), None);
    /// ```
    #[inline]
    pub fn lookup<R>(&self, addr: u64, f: impl FnOnce(&[V]) -> R) -> Option<R> {
        let guard = rcu::read_lock();
        let values = self.get(addr, &guard);
        (!values.is_empty()).then(|| f(values))
    }

    /// Whether `addr` has at least one value.
    pub fn contains(&self, addr: u64) -> bool {
        let guard = rcu::read_lock();
        !self.get(addr, &guard).is_empty()
    }

    /// Number of values (not addresses). Sums per-stripe counters: exact
    /// when no writer runs, otherwise somewhere between the counts before
    /// and after the concurrent writes.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Number of addresses with at least one value. Sums per-stripe
    /// counters, with the same guarantee as [`len`](Self::len).
    pub fn len_addrs(&self) -> usize {
        self.raw.len_addrs()
    }

    /// Whether the index holds no value.
    pub fn is_empty(&self) -> bool {
        self.len_addrs() == 0
    }

    /// Iterates over `(address, values)`.
    ///
    /// Like rhashtable's walk, this is not a snapshot. Promised:
    /// * every address that has values for the whole walk is yielded at
    ///   least once, and at most once if no resize runs during the walk (a
    ///   resize can yield an address twice, once per table);
    /// * each yielded `values` slice is a snapshot of that address;
    /// * addresses inserted or emptied during the walk may or may not appear.
    ///
    /// The order is unspecified.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// index.insert(1, 'a').unwrap();
    /// index.insert(2, 'b').unwrap();
    /// let guard = fprobe::rcu::read_lock();
    /// let mut all: Vec<_> = index.iter(&guard).map(|(a, v)| (a, v[0])).collect();
    /// all.sort();
    /// assert_eq!(all, [(1, 'a'), (2, 'b')]);
    /// ```
    pub fn iter<'g>(&'g self, guard: &'g ReadGuard) -> Iter<'g, V> {
        Iter {
            // SAFETY: `guard` covers the iterator's lifetime `'g`.
            raw: unsafe { RawIter::new(self.raw.root_in(guard)) },
            _guard: PhantomData,
        }
    }

    /// Removes every value; they are dropped after a grace period. The
    /// table shrinks back to its minimum capacity.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// index.insert_many((0..100u64).map(|a| (a, a))).unwrap();
    /// index.clear();
    /// assert!(index.is_empty());
    /// ```
    pub fn clear(&self) {
        self.raw.clear()
    }

    /// Counters of the recent-hit cache; `None` when the index has none.
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::{AddrIndex, HitCacheConfig};
    /// let index = AddrIndex::builder().hit_cache(HitCacheConfig::default()).build().unwrap();
    /// index.insert(0x10, 1u8).unwrap();
    /// for _ in 0..3 {
    ///     index.lookup(0x10, |v| v[0]);
    /// }
    /// let s = index.hit_cache_stats().unwrap();
    /// assert_eq!((s.misses, s.hits), (1, 2));
    /// ```
    pub fn hit_cache_stats(&self) -> Option<crate::cache::HitCacheStats> {
        self.cache.as_ref().map(|c| c.stats())
    }

    /// Table statistics: capacity, load, probe lengths, resizes, memory.
    ///
    /// Scans the table (O(capacity)): for monitoring, not the hot path.
    ///
    /// # Examples
    ///
    /// ```
    /// let index = fprobe::AddrIndex::new();
    /// index.insert_many((1..=1000u64).map(|a| (a, ()))).unwrap();
    /// let s = index.stats();
    /// assert_eq!(s.addresses, 1000);
    /// assert!(s.load_factor <= 0.5);
    /// ```
    pub fn stats(&self) -> IndexStats {
        let r = self.raw.stats();
        let bytes = r.table_bytes + r.record_bytes;
        IndexStats {
            home_slots: r.capacity,
            tables: r.tables,
            addresses: r.addrs,
            values: r.values,
            load_factor: r.addrs as f64 / r.capacity as f64,
            claimed_slots: r.claimed,
            longest_probe: r.longest_probe,
            mean_probe: if r.claimed == 0 {
                0.0
            } else {
                r.total_probe as f64 / r.claimed as f64
            },
            resizes: r.resizes,
            rehashes: r.rehashes,
            memory_bytes: bytes,
            bytes_per_address: if r.addrs == 0 {
                0.0
            } else {
                bytes as f64 / r.addrs as f64
            },
        }
    }
}

impl<V: Clone + Send + Sync + 'static> Default for AddrIndex<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Clone + Send + Sync + fmt::Debug + 'static> fmt::Debug for AddrIndex<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let guard = rcu::read_lock();
        f.debug_map().entries(self.iter(&guard)).finish()
    }
}

/// Iterator returned by [`AddrIndex::iter`].
pub struct Iter<'g, V> {
    raw: RawIter<V>,
    _guard: PhantomData<&'g ReadGuard>,
}

impl<'g, V: 'g> Iterator for Iter<'g, V> {
    type Item = (u64, &'g [V]);

    fn next(&mut self) -> Option<Self::Item> {
        let (key, rec) = self.raw.next_record()?;
        // SAFETY: the guard borrowed for `'g` keeps the record alive.
        Some((key, unsafe { rec.values() }))
    }
}

/// Statistics of an [`AddrIndex`], from [`AddrIndex::stats`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct IndexStats {
    /// Home slots in the newest table (a power of two; the table holds one
    /// more, the slot that probe sequences run through before they wrap).
    pub home_slots: usize,
    /// Tables in the chain: 2 while a resize is migrating, else 1.
    pub tables: usize,
    /// Addresses with at least one value.
    pub addresses: usize,
    /// Values.
    pub values: usize,
    /// `addresses / home_slots`.
    pub load_factor: f64,
    /// Slots of the newest table holding a key (live, emptied, or moved).
    pub claimed_slots: usize,
    /// Longest distance of a key from its home slot in the newest table.
    /// Linear probing at the growth threshold (50% load) gives a few dozen
    /// even for random keys;
    /// [`mean_probe`](Self::mean_probe) is the figure lookups feel.
    pub longest_probe: usize,
    /// Mean distance of a key from its home slot (about 0.5 at 50% load
    /// with a well-mixed hash; adversarial sets should not raise it).
    pub mean_probe: f64,
    /// Tables attached so far (growth, shrink, rehash).
    pub resizes: u64,
    /// Of those, rehashes with a new seed forced by a long probe sequence.
    pub rehashes: u64,
    /// Bytes of tables and records (not counting allocator overhead).
    pub memory_bytes: usize,
    /// `memory_bytes / addresses`.
    pub bytes_per_address: f64,
}
