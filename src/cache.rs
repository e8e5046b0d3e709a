//! The recent-hit cache: a small per-thread, set-associative cache of
//! `address → record` in front of an [`AddrIndex`](crate::AddrIndex)
//! (the kernel's never-merged "kpcache", done so it can never be stale).
//!
//! Opt-in through [`AddrIndexBuilder::hit_cache`](crate::AddrIndexBuilder::hit_cache);
//! lookups keep using [`AddrIndex::get`](crate::AddrIndex::get) and
//! [`AddrIndex::lookup`](crate::AddrIndex::lookup) unchanged.
//!
//! # Why it can help
//!
//! An uncached lookup touches the index's root, one slot line of a table
//! that may be megabytes large, and the record: two dependent misses when the
//! table does not fit in cache. Instrumentation is skewed (a few functions
//! take most hits); a thread's hot addresses fit in a few KiB that stay in
//! its L1/L2. The entry holds the record pointer, so a hit costs one
//! thread-local access, one load of the index's generation, and a compare.
//!
//! # Never stale: the generation protocol
//!
//! The index keeps one `generation` counter (its own cache lines). Every
//! write that publishes or unlinks a record (insert, remove, take,
//! remove_addr, clear, bulk insert) increments it, with `Release`, *after*
//! publishing and *before* retiring the old record. Migration does not
//! change records, so it does not bump it.
//!
//! Each entry stores `(address, record or null, generation at fill)`.
//!
//! * **Hit** when the entry's address matches and its generation equals the
//!   current one (loaded with `Acquire` at the start of the lookup). No
//!   write happened since the entry was filled, so its record is still the
//!   address's current record (or the address still has none).
//! * **Fill** on a miss: load the generation *first*, then look the address
//!   up in the index, then store the entry with that generation. A write
//!   racing with the fill has bumped the generation by the time it returns,
//!   so the entry can never be used after that write completed.
//!
//! Once `remove` returns, its bump happens-before any lookup that begins
//! afterwards, which therefore loads a newer generation and misses: exactly
//! the uncached guarantee. A cached record is alive for as long as the read
//! guard: the writer retires the old record after the bump, and a read
//! section that starts after the retire sees the bump (RCU's guarantee for
//! stores before a grace period) and misses; one that started earlier holds
//! the grace period open.
//!
//! The loom model at the end of this module runs the cache's own fill/hit
//! step (`through_set`) against a writer in every interleaving, and its
//! canary build (generation loaded after the index lookup) is caught
//! returning a replaced record; `tests/hit_cache.rs` stresses the real
//! cache under concurrent writers.
//!
//! The price: any write invalidates every thread's entries. Writes are rare
//! in this workload; under sustained writer churn the cache only misses.
//!
//! # Memory and bypass
//!
//! Per thread and per cached index: `entries × 24` bytes (default 1024
//! entries, 4-way: 24 KiB), allocated on the thread's first lookup in that
//! index and freed when the thread exits. When a thread's hit rate over a
//! window of 1024 lookups is under 1/16 (a uniform workload over a table
//! much larger than the cache), it bypasses the cache for the next 16,384
//! lookups, paying a counter decrement instead of a fill, then samples again.
//!
//! # Per-thread, not per-CPU
//!
//! Only a per-thread cache is implemented: it needs no atomics and cannot be
//! torn by migration. A per-CPU variant (indexed by rseq's `cpu_id`) would
//! bound memory by CPUs rather than threads — the better choice when threads
//! vastly outnumber CPUs — at the price of seqlock-validated entries; it is
//! not built yet.

use std::cell::Cell;
use std::sync::Arc;

use crate::index::raw::record::Header;
use crate::sync::unmodelled::{AtomicU64, Mutex};
use crate::sync::{CachePadded, Ordering};

/// Configuration of the recent-hit cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HitCacheConfig {
    /// Entries per thread: a power of two, 16..=65536. Default 1024
    /// (24 KiB per thread).
    pub entries: usize,
    /// Associativity: 1 (direct-mapped), 2, 4 or 8. Default 4.
    pub ways: usize,
}

impl Default for HitCacheConfig {
    fn default() -> Self {
        Self {
            entries: 1024,
            ways: 4,
        }
    }
}

impl HitCacheConfig {
    /// The default configuration: 1024 entries, 4-way.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the number of entries per thread.
    pub fn entries(mut self, entries: usize) -> Self {
        self.entries = entries;
        self
    }

    /// Sets the associativity.
    pub fn ways(mut self, ways: usize) -> Self {
        self.ways = ways;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), &'static str> {
        if !self.entries.is_power_of_two() || !(16..=65536).contains(&self.entries) {
            return Err("hit cache entries must be a power of two in 16..=65536");
        }
        if !matches!(self.ways, 1 | 2 | 4 | 8) {
            return Err("hit cache ways must be 1, 2, 4 or 8");
        }
        Ok(())
    }

    /// Bytes one thread's cache occupies.
    pub fn bytes_per_thread(&self) -> usize {
        self.entries * std::mem::size_of::<Entry>() + std::mem::size_of::<Local>()
    }
}

/// Hit cache counters, summed over threads (live and exited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HitCacheStats {
    /// Lookups answered from a thread's cache.
    pub hits: u64,
    /// Lookups that went to the index and filled an entry.
    pub misses: u64,
    /// Lookups that went to the index while the thread's cache was in
    /// bypass (low hit rate).
    pub bypassed: u64,
    /// Threads with a cache for this index now.
    pub threads: usize,
    /// Bytes of one thread's cache.
    pub bytes_per_thread: usize,
}

#[derive(Clone, Copy)]
struct Entry<R = *mut Header> {
    addr: u64,
    rec: R,
    /// Generation at fill; `u64::MAX` marks an empty entry (the index's
    /// generation never reaches it).
    generation: u64,
}

const EMPTY: Entry = Entry {
    addr: 0,
    rec: std::ptr::null_mut(),
    generation: u64::MAX,
};

/// The index's write generation: the two operations of the protocol
/// (module docs). A trait so the loom model in this module runs the same
/// [`through_set`] with loom's atomic.
pub(crate) trait Generation {
    /// Reader: the generation a lookup runs under.
    fn current(&self) -> u64;
    /// Writer: after publishing or unlinking a record, before retiring the
    /// old one.
    fn advance(&self);
}

impl Generation for AtomicU64 {
    #[inline(always)]
    fn current(&self) -> u64 {
        // Acquire: pairs with the Release in `advance`; a reader that sees
        // the new generation sees the publish (module docs).
        self.load(Ordering::Acquire)
    }

    #[inline(always)]
    fn advance(&self) {
        // Release: see `current`.
        self.fetch_add(1, Ordering::Release);
    }
}

#[cfg(loom)]
impl Generation for crate::sync::AtomicU64 {
    fn current(&self) -> u64 {
        self.load(Ordering::Acquire)
    }

    fn advance(&self) {
        self.fetch_add(1, Ordering::Release);
    }
}

/// One lookup through one set of a thread's cache: the entry for `addr`
/// if it was filled at the current generation, else `miss()` (the index
/// lookup) and a fill of way `victim`. Returns the record and whether it
/// was a hit. The generation is loaded *before* the index lookup: a write
/// racing with the fill has advanced it by the time it completes, so the
/// entry is never used after that write (module docs).
#[inline(always)]
fn through_set<R: Copy>(
    generation: &impl Generation,
    set: &[Cell<Entry<R>>],
    victim: usize,
    addr: u64,
    miss: impl FnOnce() -> R,
) -> (R, bool) {
    let now = generation.current();
    for e in set {
        let e = e.get();
        if e.addr == addr && e.generation == now {
            return (e.rec, true);
        }
    }
    let rec = miss();
    // The deliberately broken build (`--cfg fprobe_canary`) loads the
    // generation after the index lookup: the loom model must catch it.
    let filled_at = if cfg!(fprobe_canary) {
        generation.current()
    } else {
        now
    };
    set[victim].set(Entry {
        addr,
        rec,
        generation: filled_at,
    });
    (rec, false)
}

/// Lookups per sampling window, and the bypass length.
const WINDOW: u32 = 1024;
const BYPASS: u32 = 16 * 1024;

/// One thread's cache for one index. Owned by the thread; other threads
/// only read the counters.
struct Local {
    owner: Arc<Shared>,
    /// Invariant: `entries.len() == sets * ways`.
    entries: Box<[Cell<Entry>]>,
    set_mask: usize,
    ways: usize,
    victim: Cell<usize>,
    window_left: Cell<u32>,
    window_hits: Cell<u32>,
    bypass_left: Cell<u32>,
    counters: Arc<Counters>,
}

/// Counters of one thread, readable by `stats()`. Only the owning thread
/// stores them (load + store, no read-modify-write on a shared line).
#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    bypassed: AtomicU64,
}

impl Counters {
    #[inline(always)]
    fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// State shared by an index's cache and its threads' caches.
pub(crate) struct Shared {
    config: HitCacheConfig,
    /// Every thread cache's counters, and those of exited threads.
    threads: Mutex<(Vec<Arc<Counters>>, HitCacheStats)>,
}

/// Thread-local slots: one per cached index alive at once.
const SLOTS: usize = 32;

static SLOT_USED: Mutex<[bool; SLOTS]> = Mutex::new([false; SLOTS]);

std::thread_local! {
    /// This thread's caches, by slot. Const-initialised without `Drop`, so
    /// reading it is a plain thread-pointer-relative load.
    static LOCALS: [Cell<*mut Local>; SLOTS] = const { [const { Cell::new(std::ptr::null_mut()) }; SLOTS] };
    /// Frees this thread's caches at exit (armed by the first cache).
    static LOCALS_OWNER: LocalsOwner = const { LocalsOwner };
}

struct LocalsOwner;

impl Drop for LocalsOwner {
    fn drop(&mut self) {
        for i in 0..SLOTS {
            let p = LOCALS.with(|l| l[i].replace(std::ptr::null_mut()));
            if !p.is_null() {
                // SAFETY: slots hold boxes created by `HitCache::local`, owned
                // by this thread.
                retire_local(*unsafe { Box::from_raw(p) });
            }
        }
    }
}

fn retire_local(local: Local) {
    let mut t = local
        .owner
        .threads
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let (list, retired) = &mut *t;
    list.retain(|c| !Arc::ptr_eq(c, &local.counters));
    retired.hits += local.counters.hits.load(Ordering::Relaxed);
    retired.misses += local.counters.misses.load(Ordering::Relaxed);
    retired.bypassed += local.counters.bypassed.load(Ordering::Relaxed);
}

/// The cache of one index.
pub(crate) struct HitCache {
    shared: Arc<Shared>,
    /// This index's thread-local slot; `None` when all slots are taken (then
    /// lookups go straight to the index).
    slot: Option<usize>,
    /// The index's write generation, bumped by every record publish/unlink.
    pub(crate) generation: CachePadded<AtomicU64>,
}

impl HitCache {
    pub(crate) fn new(config: HitCacheConfig) -> Self {
        let slot = {
            let mut used = SLOT_USED.lock().unwrap_or_else(|e| e.into_inner());
            let s = used.iter().position(|u| !u);
            if let Some(s) = s {
                used[s] = true;
            }
            s
        };
        Self {
            shared: Arc::new(Shared {
                config,
                threads: Mutex::new((Vec::new(), HitCacheStats::default())),
            }),
            slot,
            generation: CachePadded(AtomicU64::new(0)),
        }
    }

    /// Records that a write published or unlinked a record. Call after the
    /// publish and before retiring the old record.
    #[inline]
    pub(crate) fn bump(&self) {
        self.generation.advance();
    }

    /// Looks `addr` up through the calling thread's cache; `miss` does the
    /// index lookup. The caller holds a read guard.
    #[inline]
    pub(crate) fn lookup(&self, addr: u64, miss: impl FnOnce() -> *mut Header) -> *mut Header {
        let Some(slot) = self.slot else {
            return miss();
        };
        let p = LOCALS.with(|l| l[slot].get());
        // SAFETY: a non-null slot is a live `Local` owned by this thread
        // (freed only by this thread's exit handler, or replaced below).
        let local = match unsafe { p.as_ref() } {
            Some(l) if Arc::ptr_eq(&l.owner, &self.shared) => l,
            _ => match self.local(slot) {
                Some(l) => l,
                None => return miss(),
            },
        };
        if local.bypass_left.get() > 0 {
            local.bypass_left.set(local.bypass_left.get() - 1);
            Counters::bump(&local.counters.bypassed);
            return miss();
        }
        let base = (mix(addr) as usize & local.set_mask) * local.ways;
        let set = &local.entries[base..base + local.ways];
        let victim = local.victim.get() & (local.ways - 1);
        let (rec, hit) = through_set(&*self.generation, set, victim, addr, miss);
        if hit {
            Counters::bump(&local.counters.hits);
            local.window_hits.set(local.window_hits.get() + 1);
        } else {
            local.victim.set(local.victim.get().wrapping_add(1));
            Counters::bump(&local.counters.misses);
        }
        local.tick();
        rec
    }

    /// Creates (or replaces a stale) thread cache in `slot`.
    #[cold]
    fn local(&self, slot: usize) -> Option<&Local> {
        let c = self.shared.config;
        let counters = Arc::new(Counters::default());
        let local = Box::new(Local {
            owner: self.shared.clone(),
            entries: (0..c.entries).map(|_| Cell::new(EMPTY)).collect(),
            set_mask: c.entries / c.ways - 1,
            ways: c.ways,
            victim: Cell::new(0),
            window_left: Cell::new(WINDOW),
            window_hits: Cell::new(0),
            bypass_left: Cell::new(0),
            counters: counters.clone(),
        });
        if LOCALS_OWNER.try_with(|_| ()).is_err() {
            // Thread-local destructors are running: no cache for this call.
            return None;
        }
        let raw = Box::into_raw(local);
        let old = LOCALS.with(|l| l[slot].replace(raw));
        if !old.is_null() {
            // SAFETY: the previous occupant belonged to a dropped index;
            // this thread owned it and no reference to it is live.
            retire_local(*unsafe { Box::from_raw(old) });
        }
        self.shared
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .push(counters);
        // SAFETY: just stored in this thread's slot; lives until replaced
        // or the thread exits, both only on this thread.
        Some(unsafe { &*raw })
    }

    pub(crate) fn stats(&self) -> HitCacheStats {
        let t = self
            .shared
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (list, retired) = &*t;
        let mut s = *retired;
        for c in list {
            s.hits += c.hits.load(Ordering::Relaxed);
            s.misses += c.misses.load(Ordering::Relaxed);
            s.bypassed += c.bypassed.load(Ordering::Relaxed);
        }
        s.threads = list.len();
        s.bytes_per_thread = self.shared.config.bytes_per_thread();
        s
    }
}

impl Local {
    /// Ends a sampling window every `WINDOW` lookups; a window with a hit
    /// rate under 1/16 starts a bypass.
    #[inline(always)]
    fn tick(&self) {
        let left = self.window_left.get() - 1;
        if left > 0 {
            self.window_left.set(left);
            return;
        }
        if self.window_hits.get() < WINDOW / 16 {
            self.bypass_left.set(BYPASS);
        }
        self.window_left.set(WINDOW);
        self.window_hits.set(0);
    }
}

impl Drop for HitCache {
    fn drop(&mut self) {
        if let Some(s) = self.slot {
            // Threads' caches for this slot are recognised as stale (their
            // `owner` differs) and replaced on next use, or freed at exit.
            SLOT_USED.lock().unwrap_or_else(|e| e.into_inner())[s] = false;
        }
    }
}

#[inline(always)]
fn mix(addr: u64) -> u64 {
    (addr ^ (addr >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 24
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! loom model of the never-stale protocol, running the cache's own
    //! [`through_set`] against a one-address index in miniature (a record
    //! pointer stood for by a version number; reclamation is the RCU's and
    //! is modelled in `rcu::raw`). `scripts/loom.sh` runs it, and its canary
    //! build (generation loaded after the index lookup) must fail it.
    //!
    //! `RUSTFLAGS="--cfg loom" cargo test -p fprobe --release --lib loom`

    use std::cell::Cell;

    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

    use super::{Entry, Generation, through_set};

    #[test]
    fn loom_hit_cache_never_returns_a_record_replaced_before_the_lookup() {
        loom::model(|| {
            let generation = Arc::new(AtomicU64::new(0));
            // The address's current record: version 1, then 2.
            let record = Arc::new(AtomicUsize::new(1));
            let returned = Arc::new(AtomicBool::new(false));
            let writer = {
                let (g, r, done) = (generation.clone(), record.clone(), returned.clone());
                loom::thread::spawn(move || {
                    // The index's write order: publish, advance, (retire).
                    r.store(2, Ordering::Release);
                    g.advance();
                    // The write call returns.
                    done.store(true, Ordering::Release);
                })
            };
            let reader = loom::thread::spawn(move || {
                let empty = Entry {
                    addr: 0,
                    rec: 0usize,
                    generation: u64::MAX,
                };
                let set = [Cell::new(empty), Cell::new(empty)];
                let index = || record.load(Ordering::Acquire);
                let (first, hit) = through_set(&*generation, &set, 0, 7, index);
                assert!(!hit && (first == 1 || first == 2));
                // A lookup that begins after the write returned must not
                // be answered with the replaced record.
                if returned.load(Ordering::Acquire) {
                    let (second, _) = through_set(&*generation, &set, 1, 7, index);
                    assert_eq!(
                        second, 2,
                        "hit cache returned a record replaced before the lookup began"
                    );
                }
            });
            writer.join().unwrap();
            reader.join().unwrap();
        });
    }
}
