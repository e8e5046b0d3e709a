//! The recent-hit cache: a small per-thread, set-associative cache of
//! `address → answer` (the kernel's never-merged "kpcache", done so it can
//! never be stale).
//!
//! Two ways to use it:
//!
//! * Built into an [`AddrIndex`](crate::AddrIndex), remembering record
//!   pointers: opt-in through
//!   [`AddrIndexBuilder::hit_cache`](crate::AddrIndexBuilder::hit_cache);
//!   lookups keep using [`AddrIndex::get`](crate::AddrIndex::get) and
//!   [`AddrIndex::lookup`](crate::AddrIndex::lookup) unchanged.
//! * Standing alone, [`HitCache`], in front of any other lookup (a chained
//!   table, a sorted array, a tree), holding the answer itself (an index
//!   or a pointer), so a hit reads one set of the cache and no other line.
//!
//! # Where it pays
//!
//! Measured (`cargo bench --bench hit_cache`, one / two threads, cached ÷
//! uncached throughput of back-to-back lookups, BENCHMARKS.md):
//!
//! | in front of | trace | always on | switched (default) |
//! |---|---|---:|---:|
//! | chained table, 40,000 in 4,096 buckets | Zipf(1.0) over 20,000 | 0.91 / 0.98 | 1.01 / 1.02 |
//! | chained table, 40,000 in 4,096 buckets | uniform over 20,000 | 1.03 / 0.93 | 1.12 / 1.03 |
//! | `AddrIndex`, 50,000 or 1,000,000 | Zipf, hot-64, uniform, SQLite calls | 0.33–0.70 | 0.89–1.09 |
//!
//! It pays nowhere measured so far. In front of the index, the lines of the
//! addresses a cache would keep are the ones already in the processor's
//! caches, so a hit saves about one L2 access, while the cached path costs
//! about 90 instructions per hit against the 51 of a whole uncached lookup
//! (callgrind, `examples/lookup_counts.rs`); the misses (the cold tail a
//! 24 KiB cache cannot hold) cost what they cost without it.
//! The switch then keeps it off, where an index's lookups run exactly the
//! uncached lookup's instructions (the switched range above is the spread
//! two identical uncached indexes show in the same runs, 0.87–1.13).
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
//! # Memory
//!
//! Per thread and per cached index: `entries × 24` bytes (default 1024
//! entries, 4-way: 24 KiB), allocated on the thread's first lookup in that
//! index (the crate's `PerThread`: any number of cached indexes, found in
//! constant time) and freed with the index; a thread that exits leaves its
//! cache, entries included, to the next thread given its thread index, so
//! an index holds one cache per thread alive at once at most.
//!
//! # The switch: the cache stays on only where it pays
//!
//! Whether a cache helps depends on things it cannot see: how much of the
//! table and its records already sit in the processor's caches, how the
//! caller's own work competes for them, the machine. A hit rate says
//! little (a high one on a hot set that fits in L1 anyway still loses the
//! cache's own loads). So the threads measure the benefit on their own
//! lookups, and the cache stays on only while it is faster. A thread's
//! **trial**:
//!
//! 1. **Warm-up**: 1,024 lookups through the cache (untimed), so that its
//!    hot entries are filled.
//! 2. **Windows**: six of 1,024 lookups, three through the cache and three
//!    past it, in the order C U U C C U (a steady drift of the machine's
//!    speed cancels out), each timed with the time-stamp counter (the
//!    monotonic clock off x86-64): two clock reads per window, none per
//!    lookup. The time covers everything the thread did between its
//!    lookups, so the benefit is the thread's, not a micro-benchmark's.
//! 3. **Decision**: the index's switch goes on if the median of the
//!    cached windows beat the median of the others by at least 1/16, else
//!    off (a window stretched by a preemption does not decide; a cache
//!    that wins by less is not worth the risk of a wrong "on").
//!
//! While the switch is on, every lookup goes through the thread's cache
//! and each thread runs a new trial after 65,536 of them.
//!
//! While it is off, an index's lookups cost what an uncached index's do:
//! the switch is the bound its lookups already compare the key with, on
//! the root table's first line (`fast_above`: 0 sends every key but 0 down
//! the inline uncached path, `u64::MAX` every key through the cache), so a
//! switched-off cache adds no instruction to the lookup (callgrind,
//! `examples/lookup_counts.rs`: 51–52 per lookup either way, 50,000
//! addresses). Since nothing on that path counts, the next trial is
//! started by time: the process's re-arm agent (`rearm`, one sleeping
//! thread) switches the cache back on 64 ms after a lost trial, and each
//! further trial lost in a row doubles the wait, up to 8 s; a won trial
//! resets it. A new root table (a resize) starts switched on, with a trial.
//!
//! A standalone [`HitCache`] has no such bound in its caller's code: while
//! off, each lookup loads its flag and counts down a thread-local number
//! (about 12 instructions), and the thread's next lookup after 65,536 of
//! them (twice as many per further loss, up to 8 Mi) starts a trial.
//!
//! A trial is 7,168 lookups, 4,096 of them through the cache. One switch
//! per index, not per thread: the last trial decides for all, so threads
//! with different patterns make it follow the latest.
//!
//! # Signal handlers
//!
//! A signal handler may look the index up while the thread it interrupted
//! is inside a lookup through its cache, possibly halfway through writing
//! an entry (three words) or a counter. Were the handler to fill the same
//! entry, the interrupted code would finish its own write over the
//! handler's and leave an entry pairing the handler's address with the
//! interrupted lookup's record. So a thread's cache has an owner flag,
//! `busy`, set around every lookup through it (each store separated from
//! the entry accesses by a compiler fence: the handler runs on the same
//! thread, so program order is all that is needed). A lookup that finds
//! it set is nested inside one of the thread's own: it goes to the index
//! directly and touches neither entries nor counters, except its own
//! `nested` count (a read-modify-write, so nesting levels never lose each
//! other's counts). The index lookup itself is signal-safe (RCU read side,
//! no locks). `tests/hit_cache_signals.rs` is the storm that catches a
//! torn entry when the flag is removed.
//!
//! # Per-thread or per-CPU
//!
//! By default each thread has its own cache: no atomics, no sharing, and a
//! thread that migrates keeps its cache. Memory grows with threads, though:
//! 24 KiB each by default.
//!
//! With [`HitCacheConfig::per_cpu`], the cache is one array per CPU (up to
//! the configured CPU count, rounded up to a power of two; `entries × 32`
//! bytes each), shared by the threads that run there. The CPU number is the
//! `cpu_id` of the rseq area glibc ≥ 2.35 registers for every thread (found
//! through `__rseq_offset`: one thread-pointer-relative load), else
//! `sched_getcpu(3)`, else the cache falls back to per-thread mode
//! ([`HitCacheStats::mode`] says which). A thread can be preempted by
//! another thread of the same CPU or migrate mid-lookup, so shared entries
//! are seqlock-validated atomics: a reader skips an entry a fill is writing
//! (never uses a torn one), and a fill takes the entry's seqlock with one
//! compare-exchange and gives up if another thread holds it. The generation
//! protocol above is unchanged. A loom model runs the shared-set step with
//! two threads filling one set while a writer replaces the record.
//!
//! Which to use: per-thread when threads are about as many as CPUs (the
//! common instrumentation case, and the cheaper hit); per-CPU when threads
//! vastly outnumber CPUs (thread pools, many short-lived threads), where
//! per-thread memory and cold caches of new threads dominate.

use std::cell::Cell;

mod rearm;
pub(crate) use rearm::{ARMED, Arm};

use crate::per_thread::{CacheSlot, PerThread};
use crate::sync::unmodelled::{self, AtomicU64};
use crate::sync::{CachePadded, Ordering, compiler_fence, fence};
use crate::sys::cpu::CpuSource;

/// Configuration of the recent-hit cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HitCacheConfig {
    /// Entries per thread: a power of two, 16..=65536. Default 1024
    /// (24 KiB per thread).
    pub entries: usize,
    /// Associativity: 1 (direct-mapped), 2, 4 or 8. Default 4.
    pub ways: usize,
    /// One cache per CPU, shared by the threads that run there, instead of
    /// one per thread (default `false`; see the module docs for when to
    /// use it). Falls back to per-thread caches when the CPU number cannot
    /// be read ([`HitCacheStats::mode`] says which was used).
    pub per_cpu: bool,
    /// Let the switch turn the cache off where it is not faster (default
    /// `true`; module docs, the switch). `false` keeps it on for every
    /// lookup: for measuring the cache itself, or a workload known to
    /// gain from it.
    pub adaptive: bool,
}

impl Default for HitCacheConfig {
    fn default() -> Self {
        Self {
            entries: 1024,
            ways: 4,
            per_cpu: false,
            adaptive: true,
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

    /// One cache per CPU (`true`) or per thread (`false`, the default).
    pub fn per_cpu(mut self, per_cpu: bool) -> Self {
        self.per_cpu = per_cpu;
        self
    }

    /// Whether the switch may turn the cache off (`true`, the default) or
    /// the cache serves every lookup (`false`).
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::{AddrIndex, HitCacheConfig};
    /// let index = AddrIndex::<u32>::builder()
    ///     .hit_cache(HitCacheConfig::new().adaptive(false))
    ///     .build()
    ///     .unwrap();
    /// index.insert(7, 70).unwrap();
    /// for _ in 0..10_000 {
    ///     assert_eq!(index.lookup(7, |v| v[0]), Some(70));
    /// }
    /// let s = index.hit_cache_stats().unwrap();
    /// assert_eq!((s.hits, s.misses, s.trials), (9_999, 1, 0));
    /// ```
    pub fn adaptive(mut self, adaptive: bool) -> Self {
        self.adaptive = adaptive;
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

    /// Bytes one thread's cache occupies (per-thread mode; in per-CPU mode
    /// a thread keeps only its counters).
    pub fn bytes_per_thread(&self) -> usize {
        let entries = if self.per_cpu { 0 } else { self.entries };
        entries * std::mem::size_of::<Entry>() + std::mem::size_of::<ThreadCache<u64>>()
    }

    /// Bytes one CPU's cache occupies (per-CPU mode).
    pub fn bytes_per_cpu(&self) -> usize {
        self.entries * std::mem::size_of::<SharedEntry<u64>>()
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
    /// Lookups a trial sent past the cache (its windows without it). The
    /// lookups made while the switch is off are not counted: that would
    /// cost each of them the per-thread access the switch saves.
    pub bypassed: u64,
    /// Trials run (module docs: the switch).
    pub trials: u64,
    /// Whether the switch is on: the last trial found the cache faster,
    /// none has finished yet, or (an index's cache) it was switched back
    /// on for its next trial.
    pub enabled: bool,
    /// Lookups that went to the index because they interrupted the same
    /// thread's lookup through the cache (a signal handler's).
    pub nested: u64,
    /// Per-thread caches of this index: the most threads that have used it
    /// at once (an exited thread's cache goes to the next thread given its
    /// thread index).
    pub threads: usize,
    /// Bytes of one thread's cache.
    pub bytes_per_thread: usize,
    /// Bytes of the per-CPU caches, all CPUs together (0 in per-thread
    /// mode).
    pub bytes_per_cpu_total: usize,
    /// Per-thread caches, or per-CPU ones and where they read the CPU
    /// number.
    pub mode: HitCacheMode,
}

/// How an index's hit cache is laid out, as [`HitCacheStats::mode`]
/// reports it.
///
/// # Examples
///
/// ```
/// use fprobe::{AddrIndex, HitCacheConfig, HitCacheMode};
/// let index = AddrIndex::<u32>::builder().hit_cache(HitCacheConfig::default()).build().unwrap();
/// assert_eq!(index.hit_cache_stats().unwrap().mode, HitCacheMode::PerThread);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HitCacheMode {
    /// One cache per thread (configured so, or because no CPU number can
    /// be read here).
    #[default]
    PerThread,
    /// One cache per CPU, the CPU number read from the rseq area.
    PerCpuRseq,
    /// One cache per CPU, the CPU number from `sched_getcpu(3)`.
    PerCpuSchedGetcpu,
}

#[derive(Clone, Copy)]
struct Entry<A = u64> {
    addr: u64,
    answer: A,
    /// Generation at fill; `u64::MAX` marks an empty entry (the
    /// generation never reaches it).
    generation: u64,
}

/// An empty entry.
fn empty<A: Answer>() -> Entry<A> {
    Entry {
        addr: 0,
        answer: A::EMPTY,
        generation: u64::MAX,
    }
}

mod sealed {
    pub trait Sealed {}

    /// The atomic a per-CPU cache entry keeps an answer of type `A` in:
    /// the matching integer atomic, or an `AtomicPtr` for pointers (so a
    /// pointer keeps its provenance and no integer is ever turned back
    /// into one).
    pub trait SharedAnswer<A> {
        fn new(a: A) -> Self;
        fn load_relaxed(&self) -> A;
        fn store_relaxed(&self, a: A);
    }
}

/// What a [`HitCache`] remembers for an address: one machine word or less
/// (an integer, or a pointer the cache never dereferences). Implemented for
/// `u32`, `u64`, `usize`, `*const T` and `*mut T`.
pub trait Answer: Copy + sealed::Sealed {
    /// The atomic a per-CPU entry stores the answer in.
    #[doc(hidden)]
    type Shared: sealed::SharedAnswer<Self>;
    /// What an empty entry holds (never returned: its generation matches
    /// no lookup).
    #[doc(hidden)]
    const EMPTY: Self;
}

macro_rules! atomic_answer {
    ($($t:ty => $atomic:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Answer for $t {
            type Shared = $atomic;
            const EMPTY: Self = 0;
        }
        impl sealed::SharedAnswer<$t> for $atomic {
            #[inline(always)]
            fn new(a: $t) -> Self {
                <$atomic>::new(a)
            }
            #[inline(always)]
            fn load_relaxed(&self) -> $t {
                // Relaxed: the entry's seqlock orders it (`through_shared_set`).
                self.load(Ordering::Relaxed)
            }
            #[inline(always)]
            fn store_relaxed(&self, a: $t) {
                // Relaxed: as for the load.
                self.store(a, Ordering::Relaxed)
            }
        }
    )*};
}
atomic_answer!(
    u32 => crate::sync::AtomicU32,
    u64 => crate::sync::AtomicU64,
    usize => crate::sync::AtomicUsize
);

impl<T> sealed::SharedAnswer<*mut T> for crate::sync::AtomicPtr<T> {
    #[inline(always)]
    fn new(a: *mut T) -> Self {
        crate::sync::AtomicPtr::new(a)
    }
    #[inline(always)]
    fn load_relaxed(&self) -> *mut T {
        // Relaxed: the entry's seqlock orders it (`through_shared_set`).
        self.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn store_relaxed(&self, a: *mut T) {
        // Relaxed: as for the load.
        self.store(a, Ordering::Relaxed)
    }
}

impl<T> sealed::SharedAnswer<*const T> for crate::sync::AtomicPtr<T> {
    #[inline(always)]
    fn new(a: *const T) -> Self {
        crate::sync::AtomicPtr::new(a.cast_mut())
    }
    #[inline(always)]
    fn load_relaxed(&self) -> *const T {
        // Relaxed: the entry's seqlock orders it (`through_shared_set`).
        self.load(Ordering::Relaxed).cast_const()
    }
    #[inline(always)]
    fn store_relaxed(&self, a: *const T) {
        // Relaxed: as for the load.
        self.store(a.cast_mut(), Ordering::Relaxed)
    }
}

impl<T> sealed::Sealed for *mut T {}
impl<T> Answer for *mut T {
    type Shared = crate::sync::AtomicPtr<T>;
    const EMPTY: Self = std::ptr::null_mut();
}

impl<T> sealed::Sealed for *const T {}
impl<T> Answer for *const T {
    type Shared = crate::sync::AtomicPtr<T>;
    const EMPTY: Self = std::ptr::null();
}

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
        // Acquire: as for the std atomic above.
        self.load(Ordering::Acquire)
    }

    fn advance(&self) {
        // Release: as for the std atomic above.
        self.fetch_add(1, Ordering::Release);
    }
}

/// The generation a fill stores: `now`, loaded before the index lookup.
/// The deliberately broken build (`--cfg fprobe_canary`) loads it after the
/// lookup instead, which both loom models must catch.
#[inline(always)]
fn fill_generation(generation: &impl Generation, now: u64) -> u64 {
    if cfg!(fprobe_canary) {
        generation.current()
    } else {
        now
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
            return (e.answer, true);
        }
    }
    let answer = miss();
    let filled_at = fill_generation(generation, now);
    set[victim].set(Entry {
        addr,
        answer,
        generation: filled_at,
    });
    (answer, false)
}

/// One entry of a per-CPU cache: the threads running on the CPU share it,
/// and a thread may be preempted or migrate mid-lookup, so the fields are
/// atomics guarded by a seqlock (`seq` odd while a fill writes them).
#[repr(align(32))]
struct SharedEntry<A: Answer> {
    seq: crate::sync::AtomicU64,
    addr: crate::sync::AtomicU64,
    answer: A::Shared,
    /// Generation at fill; `u64::MAX` when empty.
    generation: crate::sync::AtomicU64,
}

impl<A: Answer> SharedEntry<A> {
    fn empty() -> Self {
        Self {
            seq: crate::sync::AtomicU64::new(0),
            addr: crate::sync::AtomicU64::new(0),
            answer: sealed::SharedAnswer::new(A::EMPTY),
            generation: crate::sync::AtomicU64::new(u64::MAX),
        }
    }
}

/// [`through_set`] for a set of a per-CPU cache. A reader validates each
/// entry with its seqlock (a torn entry is skipped, never used); a fill
/// takes the entry's seqlock with a compare-exchange and skips the fill if
/// another thread holds it. The generation protocol is the per-thread one:
/// loaded before the index lookup, stored with the entry.
#[inline(always)]
fn through_shared_set<A: Answer>(
    generation: &impl Generation,
    set: &[SharedEntry<A>],
    victim: usize,
    addr: u64,
    miss: impl FnOnce() -> A,
) -> (A, bool) {
    let now = generation.current();
    for e in set {
        // Acquire: pairs with the Release store that ended the fill; the
        // fields below are at least that fill's.
        let s1 = e.seq.load(Ordering::Acquire);
        if s1 & 1 != 0 {
            continue;
        }
        let a = e.addr.load(Ordering::Relaxed);
        let r = sealed::SharedAnswer::load_relaxed(&e.answer);
        let g = e.generation.load(Ordering::Relaxed);
        // Acquire fence: if a load above read a store of a later fill, that
        // fill's Release fence synchronises with this one, so its odd `seq`
        // is visible to the re-check and the entry is rejected.
        fence(Ordering::Acquire);
        if e.seq.load(Ordering::Relaxed) != s1 {
            continue;
        }
        if a == addr && g == now {
            return (r, true);
        }
    }
    let answer = miss();
    let filled_at = fill_generation(generation, now);
    let e = &set[victim];
    let s = e.seq.load(Ordering::Relaxed);
    // Acquire: the field stores below stay after the lock.
    if s & 1 == 0
        && e.seq
            .compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    {
        // Release fence: pairs with the readers' Acquire fence (above).
        fence(Ordering::Release);
        e.addr.store(addr, Ordering::Relaxed);
        sealed::SharedAnswer::store_relaxed(&e.answer, answer);
        e.generation.store(filled_at, Ordering::Relaxed);
        // Release: pairs with the readers' Acquire `seq` load.
        e.seq.store(s + 2, Ordering::Release);
    }
    (answer, false)
}

/// The per-CPU caches of one index.
struct PerCpu<A: Answer> {
    source: CpuSource,
    /// `cpus × entries`, CPU-major. Invariant: `cpus` is a power of two.
    entries: Box<[SharedEntry<A>]>,
    cpus: usize,
}

/// The switch's schedule (module docs: the switch): lookups
/// through the cache to warm it, lookups per timed window, and lookups
/// run in the chosen mode before the next trial.
const WARM_UP: u32 = 1024;
const WINDOW: u32 = 1024;
const RUN: u32 = 64 * 1024;

/// After `n` trials in a row that found the cache slower, the thread waits
/// `RUN << min(n - 1, MAX_BACKOFF)` lookups before its next one (64 Ki to
/// 8 Mi): a cache that keeps losing costs its trials less and less.
const MAX_BACKOFF: u8 = 7;

/// The steps of a trial after the warm-up: whether each timed window goes
/// through the cache, in an order (C U U C C U) that cancels a linear
/// drift of the machine's speed. Three of each (`cache_pays` takes the
/// median of three).
const TRIAL: [bool; 6] = [true, false, false, true, true, false];

/// Step number of the run that follows a trial.
const RUN_STEP: u8 = TRIAL.len() as u8 + 1;

/// A cheap clock for the switch's windows: the time-stamp counter on
/// x86-64, else the monotonic clock in nanoseconds. Only differences over
/// one thread's consecutive windows are used.
#[inline]
fn ticks() -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: `rdtsc` has no preconditions on x86-64.
        unsafe { std::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        use std::sync::OnceLock;
        static START: OnceLock<std::time::Instant> = OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}

/// One thread's cache for one index. Owned by the thread (the
/// `PerThread` invariant: one owner at a time); other threads only read
/// the counters.
struct ThreadCache<A> {
    /// Invariant: `entries.len() == sets * ways`.
    entries: Box<[Cell<Entry<A>>]>,
    set_mask: usize,
    ways: usize,
    victim: Cell<usize>,
    /// Whether this thread's lookups go through the cache now.
    cached: Cell<bool>,
    /// `HitCacheConfig::adaptive`: when `false` the schedule never leaves
    /// its run through the cache.
    adaptive: bool,
    /// Lookups left in the current step of the switch's schedule.
    left: Cell<u32>,
    /// The step: 0 the warm-up, 1..=6 the timed windows of [`TRIAL`],
    /// [`RUN_STEP`] the run in the chosen mode.
    step: Cell<u8>,
    /// Trials lost in a row (a standalone cache's backoff, [`MAX_BACKOFF`];
    /// an index's is its `Arm`'s).
    losses: Cell<u8>,
    /// The re-arm epoch this thread's schedule runs in (an index's cache).
    epoch: Cell<u32>,
    /// [`ticks`] when the current timed window started.
    started: Cell<u64>,
    /// The trial's window times, in [`TRIAL`] order.
    times: [Cell<u64>; TRIAL.len()],
    /// Set while a lookup of the owner runs through this cache: a signal
    /// handler that finds it set interrupted that lookup (module docs:
    /// signal handlers).
    busy: Cell<bool>,
    counters: Counters,
}

// SAFETY: the cells are used by the owning thread only (one owner at a
// time, handed over by `PerThread` under its index allocator's mutex);
// `counters` are atomics stored by the owner and loaded by `stats`. The
// entries' record pointers are only dereferenced by their owner under a
// read guard, after the generation check.
unsafe impl<A> Sync for ThreadCache<A> {}
// SAFETY: as above; a `ThreadCache` is dropped with its index, on any thread.
unsafe impl<A> Send for ThreadCache<A> {}

/// Counters of one thread, readable by `stats()`. Only the owning thread
/// stores them (load + store, no read-modify-write on a shared line).
#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    bypassed: AtomicU64,
    /// Stored by nested lookups (signal handlers) with a read-modify-write,
    /// so one nesting level never overwrites another's count.
    nested: AtomicU64,
    /// Trials decided (the switch).
    trials: AtomicU64,
}

impl Counters {
    #[inline(always)]
    fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// A recent-hit cache in front of any lookup keyed by a `u64` address:
/// per-thread (or per-CPU) sets of `address → answer`, never stale, with
/// the switch that keeps it only where it is faster (module docs).
///
/// [`AddrIndex`](crate::AddrIndex) has one built in
/// ([`AddrIndexBuilder::hit_cache`](crate::AddrIndexBuilder::hit_cache)),
/// remembering record pointers. Standing alone it serves any other table:
/// the answer is held in the entry itself (an [`Answer`]: an integer such
/// as an index into the caller's array, or a pointer), so a hit reads one
/// set of the cache and nothing else.
///
/// The caller's side of the never-stale protocol: after changing what
/// `miss` would return for an address, call [`invalidate`](Self::invalidate)
/// *before* freeing or reusing anything an old answer refers to. A lookup
/// that begins after `invalidate` returns never sees an answer filled
/// before it.
///
/// # Examples
///
/// A chained table (the kernel's kprobe hash list) behind the cache:
///
/// ```
/// use fprobe::cache::HitCache;
/// use fprobe::HitCacheConfig;
/// use std::sync::RwLock;
///
/// // bucket → (address, probe number); 4 buckets, long chains.
/// let table: RwLock<Vec<Vec<(u64, u32)>>> =
///     RwLock::new((0..4).map(|b| (0..10).map(|i| (b + 4 * i, i as u32)).collect()).collect());
/// let find = |addr: u64| {
///     let t = table.read().unwrap();
///     t[addr as usize % 4].iter().find(|e| e.0 == addr).map_or(u32::MAX, |e| e.1)
/// };
/// let cache = HitCache::<u32>::new(HitCacheConfig::new()).unwrap();
/// assert_eq!(cache.lookup(9, || find(9)), 2);
/// assert_eq!(cache.lookup(9, || unreachable!("a hit")), 2);
///
/// // A write: change the table, then invalidate.
/// table.write().unwrap()[1][2].1 = 7;
/// cache.invalidate();
/// assert_eq!(cache.lookup(9, || find(9)), 7);
/// ```
pub struct HitCache<A: Answer> {
    config: HitCacheConfig,
    /// Each thread's cache (in per-CPU mode: its counters and bypass
    /// state), freed with the cache.
    locals: PerThread<ThreadCache<A>, { CacheSlot::HitCache as usize }>,
    /// The write generation, advanced by every invalidation (for an index:
    /// every record publish or unlink).
    generation: CachePadded<unmodelled::AtomicU64>,
    /// The per-CPU caches, in per-CPU mode.
    per_cpu: Option<PerCpu<A>>,
    /// The switch of a standalone cache (an index keeps its cache's in
    /// its root table, [`Switch::Index`]).
    enabled: unmodelled::AtomicBool,
}

/// Where a cache's switch (module docs) is, for the trial that sets it.
#[derive(Clone, Copy)]
pub(crate) enum Switch<'a> {
    /// A standalone [`HitCache`]'s own flag: `true` while the last trial
    /// found the cache faster; while `false`, each thread counts its
    /// lookups down to its next trial ([`switched_off`]).
    Own(&'a unmodelled::AtomicBool),
    /// An index's: its root table's `fast_above` ([`ARMED`] while on or
    /// due for a trial, 0 while off, so a switched-off cache leaves the
    /// lookup exactly the uncached one), re-armed by the agent (`rearm`).
    Index(&'a AtomicU64, &'a std::sync::Arc<Arm>),
}

impl Switch<'_> {
    fn is_on(self) -> bool {
        // Relaxed: hints that publish nothing.
        match self {
            Switch::Own(on) => on.load(Ordering::Relaxed),
            Switch::Index(word, _) => word.load(Ordering::Relaxed) == ARMED,
        }
    }
}

/// Whether this lookup of a standalone cache goes past it: its switch is
/// off and the thread's countdown to its next trial has not run out (it
/// is then counted down): the switch's load and one thread-local
/// countdown, no call, no per-thread lookup. A signal handler that
/// interrupts the countdown may lose one count, which only moves the next
/// trial.
#[inline(always)]
fn switched_off(switch: &unmodelled::AtomicBool) -> bool {
    // Relaxed: a hint that publishes nothing; the entries have their own
    // protocol.
    if switch.load(Ordering::Relaxed) {
        return false;
    }
    UNTIL_TRIAL.with(|n| {
        let left = n.get();
        if left == 0 {
            return false;
        }
        n.set(left - 1);
        true
    })
}

std::thread_local! {
    /// Lookups this thread sends past switched-off standalone caches (all
    /// of them together) before its next lookup through one runs a trial.
    /// Const-initialised, no destructor: usable in signal handlers and
    /// thread teardown.
    static UNTIL_TRIAL: Cell<u32> = const { Cell::new(0) };
}

impl<A: Answer> HitCache<A> {
    /// A cache with `config`; [`Error::InvalidConfig`](crate::Error::InvalidConfig)
    /// when it is out of range (see [`HitCacheConfig`]). Nothing is
    /// allocated per thread until a thread's first lookup.
    pub fn new(config: HitCacheConfig) -> Result<Self, crate::Error> {
        config.validate().map_err(crate::Error::InvalidConfig)?;
        Ok(Self::with_valid(config))
    }

    /// [`new`](Self::new) for a configuration already validated.
    pub(crate) fn with_valid(config: HitCacheConfig) -> Self {
        Self {
            config,
            locals: PerThread::new(),
            generation: CachePadded(unmodelled::AtomicU64::new(0)),
            per_cpu: if config.per_cpu {
                crate::sys::cpu::source().map(|source| {
                    // CPU numbers up to the configured count (hot-plug
                    // included); a larger one wraps, which is only slower.
                    let cpus = crate::sys::cpu::count()
                        .unwrap_or(1)
                        .max(1)
                        .next_power_of_two();
                    PerCpu {
                        source,
                        entries: (0..cpus * config.entries)
                            .map(|_| SharedEntry::empty())
                            .collect(),
                        cpus,
                    }
                })
            } else {
                None
            },
            enabled: unmodelled::AtomicBool::new(true),
        }
    }

    /// The answer for `addr`: from the calling thread's cache when an entry
    /// filled since the last [`invalidate`](Self::invalidate) holds it,
    /// else `miss()` (which then fills an entry). Async-signal-safe when
    /// `miss` is: a lookup from a signal handler that interrupted one of
    /// the same thread's goes straight to `miss`.
    #[inline]
    pub fn lookup(&self, addr: u64, miss: impl FnOnce() -> A) -> A {
        if switched_off(&self.enabled) {
            return miss();
        }
        self.lookup_through(addr, Switch::Own(&self.enabled), miss)
    }

    /// Makes every entry filled so far unusable, on every thread: call it
    /// after changing what `miss` returns, before freeing what an old
    /// answer refers to (type docs). One atomic increment.
    #[inline]
    pub fn invalidate(&self) {
        self.generation.advance();
    }

    /// Counters, summed over threads.
    pub fn stats(&self) -> HitCacheStats {
        self.collect_stats(Switch::Own(&self.enabled))
    }

    /// Looks `addr` up through the calling thread's cache; `miss` does the
    /// lookup behind it. The caller has asked [`switched_off`] of `switch`,
    /// the cache's switch, first (this is the path of a switched-on cache
    /// and of a thread's trials).
    #[inline]
    pub(crate) fn lookup_through(
        &self,
        addr: u64,
        switch: Switch<'_>,
        miss: impl FnOnce() -> A,
    ) -> A {
        let local = match self.locals.get() {
            Some(l) => l,
            None => match self.local() {
                Some(l) => l,
                None => return miss(),
            },
        };
        if local.busy.get() {
            // A signal handler interrupted this thread's own lookup, which
            // may be halfway through an entry or a counter: leave them all
            // to it and ask the index.
            local.counters.nested.fetch_add(1, Ordering::Relaxed);
            return miss();
        }
        local.busy.set(true);
        // The flag is in memory before any entry is read or written (a
        // signal handler runs on this thread: program order suffices).
        compiler_fence(Ordering::SeqCst);
        let rec = self.lookup_owned(local, addr, switch, miss);
        // Every entry and counter access is done before the flag clears.
        compiler_fence(Ordering::SeqCst);
        local.busy.set(false);
        rec
    }

    /// [`lookup`](Self::lookup) with `local.busy` set: no other lookup
    /// touches `local` until it returns.
    #[inline(always)]
    fn lookup_owned(
        &self,
        local: &ThreadCache<A>,
        addr: u64,
        switch: Switch<'_>,
        miss: impl FnOnce() -> A,
    ) -> A {
        if !local.cached.get() {
            // A trial's window without the cache.
            Counters::bump(&local.counters.bypassed);
            local.tick(switch);
            return miss();
        }
        let base = (mix(addr) as usize & local.set_mask) * local.ways;
        let victim = local.victim.get() & (local.ways - 1);
        let (rec, hit) = match &self.per_cpu {
            None => {
                let set = &local.entries[base..base + local.ways];
                through_set(&*self.generation, set, victim, addr, miss)
            }
            Some(pc) => {
                let cpu = pc.source.cpu().unwrap_or(0) & (pc.cpus - 1);
                let base = cpu * self.config.entries + base;
                let set = &pc.entries[base..base + local.ways];
                through_shared_set(&*self.generation, set, victim, addr, miss)
            }
        };
        if hit {
            Counters::bump(&local.counters.hits);
        } else {
            local.victim.set(local.victim.get().wrapping_add(1));
            Counters::bump(&local.counters.misses);
        }
        local.tick(switch);
        rec
    }

    /// Creates this thread's cache, or takes over the one an exited thread
    /// left at its index (its entries stay: each is checked against the
    /// generation like any other); `None` while the thread's thread-locals
    /// are being destroyed.
    #[cold]
    fn local(&self) -> Option<&ThreadCache<A>> {
        let c = self.config;
        let per_cpu = self.per_cpu.is_some();
        self.locals.get_or(
            || ThreadCache {
                // In per-CPU mode the thread keeps counters and the bypass
                // state only.
                entries: (0..if per_cpu { 0 } else { c.entries })
                    .map(|_| Cell::new(empty()))
                    .collect(),
                set_mask: c.entries / c.ways - 1,
                ways: c.ways,
                victim: Cell::new(0),
                cached: Cell::new(true),
                adaptive: c.adaptive,
                left: Cell::new(if c.adaptive { WARM_UP } else { RUN }),
                step: Cell::new(if c.adaptive { 0 } else { RUN_STEP }),
                losses: Cell::new(0),
                epoch: Cell::new(0),
                started: Cell::new(0),
                times: Default::default(),
                busy: Cell::new(false),
                counters: Counters::default(),
            },
            |_| {},
        )
    }

    pub(crate) fn collect_stats(&self, switch: Switch<'_>) -> HitCacheStats {
        let mut s = HitCacheStats::default();
        for l in self.locals.iter() {
            // Relaxed: statistics; no other memory is published with them.
            s.hits += l.counters.hits.load(Ordering::Relaxed);
            s.misses += l.counters.misses.load(Ordering::Relaxed);
            s.bypassed += l.counters.bypassed.load(Ordering::Relaxed);
            s.nested += l.counters.nested.load(Ordering::Relaxed);
            s.trials += l.counters.trials.load(Ordering::Relaxed);
            s.threads += 1;
        }
        // Relaxed: a statistic.
        s.enabled = switch.is_on();
        let c = self.config;
        match &self.per_cpu {
            Some(pc) => {
                s.bytes_per_thread = c.bytes_per_thread();
                s.bytes_per_cpu_total = pc.cpus * c.bytes_per_cpu();
                s.mode = match pc.source {
                    CpuSource::Rseq(_) => HitCacheMode::PerCpuRseq,
                    CpuSource::SchedGetcpu => HitCacheMode::PerCpuSchedGetcpu,
                };
            }
            None => {
                s.bytes_per_thread = HitCacheConfig {
                    per_cpu: false,
                    ..c
                }
                .bytes_per_thread();
                s.mode = HitCacheMode::PerThread;
            }
        }
        s
    }
}

impl<A> ThreadCache<A> {
    /// Counts one lookup against the current step of the schedule.
    #[inline(always)]
    fn tick(&self, switch: Switch<'_>) {
        let left = self.left.get() - 1;
        if left > 0 {
            self.left.set(left);
            return;
        }
        self.next_step(switch);
    }

    /// Ends a step: records a timed window's time, and starts the next
    /// step (after the last window, the run in the faster mode; after the
    /// run, a new trial).
    #[cold]
    fn next_step(&self, switch: Switch<'_>) {
        if !self.adaptive {
            // Always on: one endless run.
            self.left.set(RUN);
            return;
        }
        if let Switch::Index(_, arm) = switch {
            let epoch = arm.epoch();
            if epoch != self.epoch.get() {
                // Re-armed since this step began: its window may span the
                // time the cache was off (`rearm`). Start again.
                self.epoch.set(epoch);
                self.begin(0);
                return;
            }
        }
        let now = ticks();
        let step = self.step.get();
        if (1..RUN_STEP).contains(&step) {
            self.times[usize::from(step) - 1].set(now.wrapping_sub(self.started.get()));
        }
        let mut next = if step == RUN_STEP { 0 } else { step + 1 };
        if next == RUN_STEP {
            let pays = self.cache_pays();
            Counters::bump(&self.counters.trials);
            match switch {
                Switch::Own(enabled) => {
                    // Relaxed: see `switched_off`. Stored only on a
                    // change, so the line stays shared while it holds.
                    if enabled.load(Ordering::Relaxed) != pays {
                        enabled.store(pays, Ordering::Relaxed);
                    }
                    if pays {
                        self.losses.set(0);
                    } else {
                        // Off: the thread's next lookups of switched-off
                        // caches skip it, `RUN` of them and twice as many
                        // after every further trial lost in a row; the one
                        // after runs a new trial here, from the warm-up.
                        let losses = self.losses.get();
                        self.losses.set(losses.saturating_add(1));
                        UNTIL_TRIAL.with(|n| n.set(RUN << losses.min(MAX_BACKOFF)));
                        next = 0;
                    }
                }
                Switch::Index(word, arm) => {
                    if pays {
                        arm.won();
                    } else {
                        // Off for every thread until the agent re-arms it;
                        // this thread then starts from the warm-up, in the
                        // epoch that re-arm begins.
                        arm.disarm(word);
                        self.epoch.set(arm.epoch().wrapping_add(1));
                        next = 0;
                    }
                }
            }
        }
        self.begin(next);
    }

    /// Starts step `next` of the schedule.
    fn begin(&self, next: u8) {
        let (cached, len) = match next {
            0 => (true, WARM_UP),
            RUN_STEP => (true, RUN),
            n => (TRIAL[usize::from(n) - 1], WINDOW),
        };
        self.step.set(next);
        self.cached.set(cached);
        self.left.set(len);
        self.started.set(ticks());
    }

    /// Whether the trial's cached windows ran at least 1/16 faster than
    /// its bypassed ones, window medians compared (a window that a
    /// preemption or an interrupt stretched does not decide).
    fn cache_pays(&self) -> bool {
        cache_pays(std::array::from_fn(|i| self.times[i].get()))
    }
}

/// [`ThreadCache::cache_pays`] on window times in [`TRIAL`] order.
fn cache_pays(times: [u64; TRIAL.len()]) -> bool {
    // No allocation: this may run in a signal handler.
    let median = |through: bool| {
        let mut t = [0u64; 3];
        let mut n = 0;
        for (c, w) in TRIAL.iter().zip(times) {
            if *c == through {
                t[n] = w;
                n += 1;
            }
        }
        t.sort_unstable();
        t[1]
    };
    let (cached, bypassed) = (median(true), median(false));
    u128::from(cached) * 16 < u128::from(bypassed) * 15
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
    //! is modelled in `rcu::raw`). The stand-in index publishes records
    //! with Release stores and loads them with Acquire, as the real index's
    //! slots do; the generation is the `Generation` impl above.
    //! `scripts/loom.sh` runs it, and its canary build (generation loaded
    //! after the index lookup) must fail it.
    //!
    //! `RUSTFLAGS="--cfg loom" cargo test -p fprobe --release --lib loom`

    use std::cell::Cell;

    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

    use super::{Entry, Generation, SharedEntry, through_set, through_shared_set};

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
                    answer: 0usize,
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

    /// The per-CPU variant: two threads share one set (same CPU, or a
    /// migration mid-lookup) and fill it concurrently while the writer
    /// replaces the record. Neither may use a torn entry nor a replaced
    /// record once the write returned.
    #[test]
    fn loom_per_cpu_hit_cache_shared_set() {
        loom::model(|| {
            // Two records, leaked for the model's duration.
            let v1 = Box::into_raw(Box::new(1u32));
            let v2 = Box::into_raw(Box::new(2u32));
            let (p1, p2) = (v1 as usize, v2 as usize);
            let generation = Arc::new(AtomicU64::new(0));
            let record = Arc::new(loom::sync::atomic::AtomicPtr::new(v1));
            let returned = Arc::new(AtomicBool::new(false));
            let set = Arc::new([SharedEntry::empty(), SharedEntry::empty()]);
            let writer = {
                let (g, r, done) = (generation.clone(), record.clone(), returned.clone());
                loom::thread::spawn(move || {
                    r.store(v2, Ordering::Release);
                    g.advance();
                    done.store(true, Ordering::Release);
                })
            };
            let readers: Vec<_> = (0..2)
                .map(|i| {
                    let (g, r, done, set) = (
                        generation.clone(),
                        record.clone(),
                        returned.clone(),
                        set.clone(),
                    );
                    loom::thread::spawn(move || {
                        let index = || r.load(Ordering::Acquire);
                        let (first, _): (*mut u32, _) =
                            through_shared_set(&*g, &set[..], i, 7, index);
                        assert!(first as usize == p1 || first as usize == p2, "torn entry");
                        if i == 1 && done.load(Ordering::Acquire) {
                            let (second, _): (*mut u32, _) =
                                through_shared_set(&*g, &set[..], 0, 7, index);
                            assert_eq!(
                                second as usize, p2,
                                "per-CPU hit cache returned a replaced record"
                            );
                        }
                    })
                })
                .collect();
            writer.join().unwrap();
            for r in readers {
                r.join().unwrap();
            }
            // SAFETY: every thread has finished with them.
            unsafe {
                drop(Box::from_raw(v1));
                drop(Box::from_raw(v2));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::cache_pays;

    #[test]
    fn the_cache_stays_on_only_when_its_windows_are_faster() {
        // Windows in TRIAL order: C U U C C U.
        assert!(cache_pays([90, 100, 100, 90, 90, 100]), "10% faster");
        assert!(!cache_pays([100, 100, 100, 100, 100, 100]), "a tie");
        assert!(!cache_pays([95, 100, 100, 95, 95, 100]), "under 1/16");
        assert!(!cache_pays([120, 100, 100, 120, 120, 100]), "slower");
        // One stretched window on either side does not decide.
        assert!(cache_pays([90, 100, 1, 90, 90, 100]), "bypassed outlier");
        assert!(cache_pays([90, 100, 100, 9_000, 90, 100]), "cached outlier");
        assert!(
            !cache_pays([1, 100, 100, 120, 120, 100]),
            "cached outlier, slower"
        );
    }
}
