//! The recent-hit cache: a small per-thread (or per-CPU), set-associative
//! cache of `address → answer` in front of any lookup (the kernel's
//! never-merged "kpcache", done so it can never be stale).
//!
//! It composes in front of a table; the table does not know it:
//!
//! * [`HitCache`] stands in front of any lookup (a chained table, a sorted
//!   array, a tree, an [`AddrIndex`](crate::AddrIndex)), holding the answer
//!   itself (an integer, a value, a pointer), so a hit reads one entry
//!   of the cache and no line of the table, and needs no read-side section.
//!   Its user calls [`HitCache::invalidate`] after each write.
//! * An [`AddrIndex`](crate::AddrIndex) built with
//!   [`AddrIndexBuilder::hit_cache`](crate::AddrIndexBuilder::hit_cache)
//!   composes one in front of its lookups, keeping where each address's
//!   values are; its writes advance the index's write sequence, which the
//!   cache checks its entries against. Lookups keep using
//!   [`AddrIndex::get`](crate::AddrIndex::get) and
//!   [`AddrIndex::lookup`](crate::AddrIndex::lookup) unchanged, and so does
//!   a probe registry built with
//!   [`RegistryBuilder::hit_cache`](crate::probe::RegistryBuilder::hit_cache).
//!
//! # The hit path
//!
//! A hit is: one load of the switch's word, one thread-local access (the
//! thread's context, `context.rs`) whose key must equal that word (one
//! compare says both "this cache" and "on"), the address's home entry
//! (a multiply and a shift of the address), one load of the write
//! sequence, the home entry's address and sequence number compared, the
//! answer, and a one-instruction hit count: straight-line code whose
//! branches a hot loop predicts. No victim is computed, no other way of
//! the set looked at and no clock read on a hit.
//!
//! An address's **set** is the `ways` entries around its home entry. A
//! lookup that does not find the address home looks through the set's
//! other ways; a hit there swaps that entry with home's, so the next
//! lookup of the address takes the hit path. A fill puts the address home
//! and moves what home held into another way of the set (with two ways,
//! the default, into the other way: home holds the more recently used
//! address of the two, and a fill replaces the less recently used). The
//! set keeps the hit rate of a set-associative cache (a few hot addresses whose homes
//! collide do not evict each other); the hit path keeps the cost of a
//! direct-mapped one. (Comparing the address in every way on each hit
//! costs a compare per way, and a branch per way mispredicts, since which
//! way holds a hot address is as good as random.)
//!
//! The switch's trials run on a separate path (below). Measured in
//! instructions per lookup by `scripts/instructions.sh` (modes
//! `hitcache-inline`, `hitcache-hit`, `kprobe-hitcache`); figures in
//! `BENCHMARKS.md`, section "Instruction counts (callgrind)".
//!
//! # When to turn it on
//!
//! A standalone [`HitCache`] holding the answer inline, in front of a
//! trace where hits dominate (a real call trace, where a few hundred
//! functions take every call, pays most): a hit is a fraction of a lookup,
//! but a miss costs the hit check and a fill on top of the lookup, and
//! the fill's stores leave less room for consecutive lookups to overlap,
//! so the cache loses where misses are common. The cache composed into
//! an index pays less: its hit still needs the read-side section and reads
//! the values under it. Where it does not pay, the default switch is meant
//! to turn it off (below), but an index whose cache is off still looks up
//! slower than one without a cache (one load of the switch's bound and
//! one compare per lookup), and the switch's short trials can misjudge on
//! a noisy machine. `BENCHMARKS.md`, section "Recent-hit cache", has the
//! traces measured.
//!
//! # Why it can help
//!
//! An uncached lookup touches the index's root, one slot line of a table
//! that may be megabytes large, and the record: two dependent misses when the
//! table does not fit in cache. Instrumentation is skewed (a few functions
//! take most hits); a thread's hot addresses fit in a few KiB that stay in
//! its L1/L2. The entry holds the answer, so a hit costs one
//! thread-local access, one load of the write sequence, and compares.
//!
//! # Never stale: the write-sequence protocol
//!
//! The table behind the cache keeps one write sequence (its own cache
//! lines): an index built with a cache increments it on every write that
//! publishes or unlinks a record (insert, remove, take, remove_addr,
//! clear, bulk insert), with `Release`, *after* publishing and *before*
//! retiring the old record (migration does not change records, so it does
//! not advance it); a standalone cache's user advances it with
//! [`HitCache::invalidate`] after each change. In the code the sequence
//! number an entry was filled at is its `filled`.
//!
//! Each entry stores `(address, record or null, sequence number at fill)`.
//!
//! * **Hit** when the entry's address matches and its sequence number equals
//!   the current one (loaded with `Acquire` at the start of the lookup). No
//!   write happened since the entry was filled, so its record is still the
//!   address's current record (or the address still has none).
//! * **Fill** on a miss: load the sequence number *first*, then look the address
//!   up in the index, then store the entry with that number. A write
//!   racing with the fill has advanced the sequence by the time it returns,
//!   so the entry can never be used after that write completed.
//!
//! Once `remove` returns, its bump happens-before any lookup that begins
//! afterwards, which therefore loads a newer sequence number and misses: exactly
//! the uncached guarantee. A cached record is alive for as long as the read
//! guard: the writer retires the old record after the bump, and a read
//! section that starts after the retire sees the bump (RCU's guarantee for
//! stores before a grace period) and misses; one that started earlier holds
//! the grace period open.
//!
//! The loom model at the end of this module runs the cache's own fill/hit
//! step (`through_set`) against a writer in every interleaving, and its
//! canary build (sequence loaded after the index lookup) is caught
//! returning a replaced record; `tests/hit_cache.rs` stresses the real
//! cache under concurrent writers.
//!
//! The price: any write invalidates every thread's entries. Writes are rare
//! in this workload; under sustained writer churn the cache only misses.
//!
//! # Memory
//!
//! Per thread and per cache: `entries × 32` bytes (default 1024 entries,
//! 2-way: 32 KiB), allocated on the thread's first lookup through that
//! cache (the crate's `PerThread`: any number of caches, found in
//! constant time) and freed with the cache; a thread that exits leaves its
//! entries to the next thread given its thread index, so a cache holds
//! one set of entries per thread alive at once at most.
//!
//! # The switch: the cache stays on only where it pays
//!
//! Whether a cache helps depends on things it cannot see: how much of the
//! table and its records already sit in the processor's caches, how the
//! caller's own work competes for them, the machine. A hit rate says
//! little (a high one on a hot set that fits in L1 anyway may still lose
//! the cache's own loads). So the threads measure the benefit on their
//! own lookups, and the cache stays on only while it is faster. A
//! thread's **trial**:
//!
//! 1. **Warm-up**: 1,024 lookups through the cache (untimed), so that its
//!    hot entries are filled.
//! 2. **Windows**: six of 1,024 lookups, three through the cache and three
//!    past it, in the order C U U C C U (a steady drift of the machine's
//!    speed cancels out), each timed with the time-stamp counter (the
//!    monotonic clock off x86-64): two clock reads per window, none per
//!    lookup. The time covers everything the thread did between its
//!    lookups, so the benefit is the thread's, not a micro-benchmark's.
//! 3. **Decision**: the switch goes on if the median of the cached
//!    windows beat the median of the others by at least 1/16, else off (a
//!    window stretched by a preemption does not decide; a cache that wins
//!    by less is not worth the risk of a wrong "on").
//!
//! The switch is one word (`rearm.rs`): the cache's key while on, with a
//! bit for "off" and one for "trial". While it is on, lookups take the hit
//! path above and count nothing but hits and misses; while it is off, they
//! go straight to the table behind the cache, after one load and one test
//! of the word; while a trial runs they go through the trial's schedule
//! (the cached windows through the same sets as the hit path). Since
//! nothing on the first two paths counts lookups, the next trial is
//! started by time: the process's agent (one sleeping thread) sets the
//! trial bit 256 ms after a won trial, 64 ms after a lost one, doubling
//! with each further loss in a row up to 8 s. A new cache starts with a
//! trial; [`HitCacheConfig::adaptive`]`(false)` keeps it on for good.
//!
//! A trial is 7,168 lookups of one thread, 4,096 of them through the
//! cache. One switch per cache, not per thread: the first thread to
//! finish its schedule of a trial decides for all.
//!
//! # Signal handlers
//!
//! A signal handler may look the index up while the thread it interrupted
//! is inside a lookup through its cache, possibly halfway through writing
//! an entry (three words) or a counter. Were the handler to fill the same
//! entry, the interrupted code would finish its own write over the
//! handler's and leave an entry pairing the handler's address with the
//! interrupted lookup's record. So a lookup through a cache replaces the
//! key in the thread's context with `BUSY` for its duration (each store
//! separated from the entry accesses by a compiler fence: the handler runs
//! on the same thread, so program order is all that is needed). A lookup
//! that finds `BUSY` is nested inside one of the thread's own: it goes to
//! the table directly and touches neither entries nor counters nor the
//! context, except the cache's `nested` count (a read-modify-write, so
//! nesting levels never lose each other's counts). The index lookup
//! itself is signal-safe (RCU read side, no locks).
//! `tests/hit_cache_signals.rs` is the storm that catches a torn entry
//! when the flag is removed.
//!
//! # Per-thread or per-CPU
//!
//! By default each thread has its own cache: no atomics, no sharing, and a
//! thread that migrates keeps its cache. Memory grows with threads, though:
//! 32 KiB each by default.
//!
//! With [`HitCacheConfig::per_cpu`], the cache is one array per CPU (up to
//! the configured CPU count, rounded up to a power of two; `entries × 32`
//! bytes each), shared by the threads that run there. The CPU number is the
//! `cpu_id` of the rseq area glibc ≥ 2.35 registers for every thread (found
//! through `__rseq_offset`: one thread-pointer-relative load), else
//! `sched_getcpu(3)` (`GetCurrentProcessorNumber` on Windows), else (macOS,
//! FreeBSD) the cache falls back to per-thread mode
//! ([`HitCacheStats::mode`] says which). A thread can be preempted by
//! another thread of the same CPU or migrate mid-lookup, so shared entries
//! are seqlock-validated atomics: a reader skips an entry a fill is writing
//! (never uses a torn one), and a fill takes the entry's seqlock with one
//! compare-exchange and gives up if another thread holds it. The sequence
//! protocol above is unchanged. A loom model runs the shared-set step with
//! two threads filling one set while a writer replaces the record.
//!
//! Which to use: per-thread when threads are about as many as CPUs (the
//! common instrumentation case, and the cheaper hit); per-CPU when threads
//! vastly outnumber CPUs (thread pools, many short-lived threads), where
//! per-thread memory and cold caches of new threads dominate.

use std::cell::Cell;
use std::sync::Arc;

mod rearm;
use rearm::{Arm, OFF, TRIAL as TRIAL_BIT};

use crate::context::{Context, context};
use crate::error::Error;
use crate::per_thread::{CacheSlot, PerThread};
use crate::setters::setters;
use crate::sync::unmodelled::{self, AtomicU64};
use crate::sync::{CachePadded, Ordering, compiler_fence, fence};
use crate::sys::cpu::CpuSource;

/// Configuration of the recent-hit cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HitCacheConfig {
    /// Entries per thread: a power of two, 16..=65536. Default 1024
    /// (32 KiB per thread).
    pub entries: usize,
    /// Associativity: 1 (direct-mapped), 2, 4 or 8. Default 2. A hit
    /// costs the same in all (module docs, the hit path); a lookup that
    /// misses the address's home entry looks at the set's other ways, so
    /// more ways cost each miss more and evict fewer hot addresses.
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
            ways: 2,
            per_cpu: false,
            adaptive: true,
        }
    }
}

impl HitCacheConfig {
    /// The default configuration: 1024 entries, 2-way.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// Sets the number of entries per thread.
        entries: usize;

        /// Sets the associativity.
        ways: usize;

        /// One cache per CPU (`true`) or per thread (`false`, the default).
        per_cpu: bool;

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
        adaptive: bool;
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
    /// or a trial is due or running.
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
    /// One cache per CPU, the CPU number from the system's call
    /// (`sched_getcpu(3)`; `GetCurrentProcessorNumber` on Windows).
    PerCpuSchedGetcpu,
}

#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Entry<A = u64> {
    addr: u64,
    /// Write sequence number at fill; `u64::MAX` marks an empty entry (the
    /// sequence never reaches it).
    filled: u64,
    answer: A,
}

/// An empty entry of set `set` (of a cache whose entries are picked by
/// `mix(addr) >> shift`, `ways` to a set): its address is one whose set is
/// another, so no lookup that reaches `set` matches it (a set holds each
/// address at most once: `other_ways`).
fn empty<A: Answer>(set: usize, ways: usize, shift: u32) -> Entry<A> {
    let addr = (0u64..)
        .find(|&a| (mix(a) >> shift) as usize / ways != set)
        .expect("a cache has at least two sets");
    Entry {
        addr,
        filled: u64::MAX,
        answer: A::EMPTY,
    }
}

/// A write sequence: the count a table advances (with `Release`) after
/// every change to what its lookups return, on lines of its own. Shared by
/// the table and the caches in front of it.
pub(crate) type WriteSequence = CachePadded<unmodelled::AtomicU64>;

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
    /// What an empty entry holds (never returned: its sequence number matches
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

/// Where an address's values are (a slice's pointer and length): what
/// the cache an [`AddrIndex`](crate::AddrIndex) composes in front of its
/// lookups keeps, valid while the read-side section that found it lasts
/// (the module docs' never-stale protocol: the record is retired only
/// after the write sequence moved on).
#[derive(Clone, Copy)]
pub(crate) struct Span {
    ptr: *const (),
    len: usize,
}

impl Span {
    /// Where `values` are.
    #[inline(always)]
    pub(crate) fn of<V>(values: &[V]) -> Self {
        Self {
            ptr: values.as_ptr().cast(),
            len: values.len(),
        }
    }

    /// The values again.
    ///
    /// # Safety
    ///
    /// `self` came from [`Span::of`] on a `&'g [V]` (the pointer of an
    /// empty slice is dangling but aligned, so it is one again).
    #[inline(always)]
    pub(crate) unsafe fn values<'g, V>(self) -> &'g [V] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<V>(), self.len) }
    }
}

/// A [`Span`] in a per-CPU entry.
pub(crate) struct SharedSpan {
    ptr: crate::sync::AtomicPtr<()>,
    len: crate::sync::AtomicUsize,
}

impl sealed::SharedAnswer<Span> for SharedSpan {
    #[inline(always)]
    fn new(a: Span) -> Self {
        Self {
            ptr: crate::sync::AtomicPtr::new(a.ptr.cast_mut()),
            len: crate::sync::AtomicUsize::new(a.len),
        }
    }
    #[inline(always)]
    fn load_relaxed(&self) -> Span {
        // Relaxed, both: the entry's seqlock orders them
        // (`through_shared_set`).
        Span {
            ptr: self.ptr.load(Ordering::Relaxed).cast_const(),
            len: self.len.load(Ordering::Relaxed),
        }
    }
    #[inline(always)]
    fn store_relaxed(&self, a: Span) {
        // Relaxed, both: as for the loads.
        self.ptr.store(a.ptr.cast_mut(), Ordering::Relaxed);
        self.len.store(a.len, Ordering::Relaxed);
    }
}

impl sealed::Sealed for Span {}
impl Answer for Span {
    type Shared = SharedSpan;
    const EMPTY: Self = Span {
        ptr: std::ptr::null(),
        len: 0,
    };
}

/// The index's write sequence: the two operations of the protocol
/// (module docs). A trait so the loom model in this module runs the same
/// [`through_set`] with loom's atomic.
pub(crate) trait SequenceWord {
    /// Reader: the sequence number a lookup runs under.
    fn current(&self) -> u64;
    /// Writer: after publishing or unlinking a record, before retiring the
    /// old one.
    fn advance(&self);
}

impl SequenceWord for AtomicU64 {
    #[inline(always)]
    fn current(&self) -> u64 {
        // Acquire: pairs with the Release in `advance`; a reader that sees
        // the new number sees the publish (module docs).
        self.load(Ordering::Acquire)
    }

    #[inline(always)]
    fn advance(&self) {
        // Release: see `current`.
        self.fetch_add(1, Ordering::Release);
    }
}

#[cfg(loom)]
impl SequenceWord for crate::sync::AtomicU64 {
    fn current(&self) -> u64 {
        // Acquire: as for the std atomic above.
        self.load(Ordering::Acquire)
    }

    fn advance(&self) {
        // Release: as for the std atomic above.
        self.fetch_add(1, Ordering::Release);
    }
}

/// The sequence number a fill stores: `now`, loaded before the index lookup.
/// The deliberately broken build (`--cfg fprobe_canary`) loads it after the
/// lookup instead, which both loom models must catch.
#[inline(always)]
fn fill_number(sequence: &impl SequenceWord, now: u64) -> u64 {
    if cfg!(fprobe_canary) {
        sequence.current()
    } else {
        now
    }
}

/// One lookup through one set of a thread's cache: the answer in the
/// address's home entry if it was filled at the current sequence number,
/// else the set's other ways (a hit there moves the entry home), else
/// `miss()` (the index lookup) and a fill of the home entry. Returns the
/// answer and whether it was a hit. The sequence is loaded *before* the
/// index lookup: a write racing with the fill has advanced it by the time
/// it completes, so the entry is never used after that write (module
/// docs).
///
/// `home` is the address's entry; `set()` the set it is in and its
/// position there, asked for only when the home entry does not answer (so
/// the hit path does not compute the set).
#[inline(always)]
fn through_set<'s, R: Copy + 's>(
    sequence: &impl SequenceWord,
    home: &'s Cell<Entry<R>>,
    set: impl FnOnce() -> (&'s [Cell<Entry<R>>], usize),
    victim: impl FnOnce() -> usize,
    addr: u64,
    miss: impl FnOnce() -> R,
) -> (R, bool) {
    let now = sequence.current();
    // SAFETY: a `Cell` of this thread's cache, read in place; nothing
    // writes it meanwhile (the caller's `BUSY`, or loom's single thread
    // per set).
    let h = unsafe { &*home.as_ptr() };
    if h.addr == addr && h.filled == now {
        return (h.answer, true);
    }
    cold();
    other_ways(sequence, set, victim, now, addr, miss)
}

/// [`through_set`] past the home entry: the set's other ways, then the
/// lookup behind the cache and the fill. Inline: out of line, the call
/// costs the misses most of the memory-level parallelism the lookup behind
/// the cache has (consecutive misses no longer overlap their memory
/// accesses).
///
/// A set holds an address at most once: a fill puts the address home and
/// moves what home held into the way that held the address (at an older
/// sequence number), else into a victim way other than home.
#[inline(always)]
fn other_ways<'s, R: Copy + 's>(
    sequence: &impl SequenceWord,
    set: impl FnOnce() -> (&'s [Cell<Entry<R>>], usize),
    victim: impl FnOnce() -> usize,
    now: u64,
    addr: u64,
    miss: impl FnOnce() -> R,
) -> (R, bool) {
    let (set, home) = set();
    let ways = set.len();
    if ways == 2 {
        // Two ways: home holds the set's most recent address, the other
        // way the one before (least recently used, and the one a fill
        // replaces). The general path below does the same for two ways,
        // but the default's misses take this straight-line copy of it:
        // one path for both makes each two-way miss markedly dearer (the
        // instruction driver's `hitcache-inline uniform` counts it).
        let other = &set[home ^ 1];
        // SAFETY: as in `through_set`.
        let o = unsafe { &*other.as_ptr() };
        if o.addr == addr && o.filled == now {
            let e = *o;
            other.set(set[home].get());
            set[home].set(e);
            return (e.answer, true);
        }
        let answer = miss();
        let filled = Entry {
            addr,
            filled: fill_number(sequence, now),
            answer,
        };
        // SAFETY: as above.
        if unsafe { (*set[home].as_ptr()).addr } != addr {
            other.set(set[home].get());
        }
        set[home].set(filled);
        return (answer, false);
    }
    // The way that holds `addr` (at most one does), else `ways`.
    let mut found = ways;
    for (i, e) in set.iter().enumerate() {
        // SAFETY: as in `through_set`.
        if unsafe { (*e.as_ptr()).addr } == addr {
            found = i;
        }
    }
    if found != home && found < ways {
        // SAFETY: as above.
        let e = unsafe { *set[found].as_ptr() };
        if e.filled == now {
            // The hit moves home, where the next lookup finds it first.
            set[found].set(set[home].get());
            set[home].set(e);
            return (e.answer, true);
        }
    }
    let answer = miss();
    let filled = Entry {
        addr,
        filled: fill_number(sequence, now),
        answer,
    };
    if found != home && ways > 1 {
        // What home holds moves aside: into the way that held `addr`
        // (stale), else a victim other than home.
        let to = if found < ways {
            found
        } else {
            let v = victim() & (ways - 1);
            if v == home { (v + 1) & (ways - 1) } else { v }
        };
        set[to].set(set[home].get());
    }
    set[home].set(filled);
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
    /// Sequence number at fill; `u64::MAX` when empty.
    filled: crate::sync::AtomicU64,
}

impl<A: Answer> SharedEntry<A> {
    fn empty() -> Self {
        Self {
            seq: crate::sync::AtomicU64::new(0),
            addr: crate::sync::AtomicU64::new(0),
            answer: sealed::SharedAnswer::new(A::EMPTY),
            filled: crate::sync::AtomicU64::new(u64::MAX),
        }
    }
}

/// [`through_set`] for a set of a per-CPU cache. A reader validates each
/// entry with its seqlock (a torn entry is skipped, never used); a fill
/// takes the entry's seqlock with a compare-exchange and skips the fill if
/// another thread holds it. The sequence protocol is the per-thread one:
/// loaded before the index lookup, stored with the entry.
#[inline(always)]
fn through_shared_set<A: Answer>(
    sequence: &impl SequenceWord,
    set: &[SharedEntry<A>],
    victim: impl FnOnce() -> usize,
    addr: u64,
    miss: impl FnOnce() -> A,
) -> (A, bool) {
    let now = sequence.current();
    for e in set {
        // Acquire: pairs with the Release store that ended the fill; the
        // fields below are at least that fill's.
        let s1 = e.seq.load(Ordering::Acquire);
        if s1 & 1 != 0 {
            continue;
        }
        let a = e.addr.load(Ordering::Relaxed);
        let r = sealed::SharedAnswer::load_relaxed(&e.answer);
        let g = e.filled.load(Ordering::Relaxed);
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
    let filled_at = fill_number(sequence, now);
    let e = &set[victim() & (set.len() - 1)];
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
        e.filled.store(filled_at, Ordering::Relaxed);
        // Release: pairs with the readers' Acquire `seq` load.
        e.seq.store(s + 2, Ordering::Release);
    }
    (answer, false)
}

/// The per-CPU caches of one [`HitCache`].
struct PerCpu<A: Answer> {
    source: CpuSource,
    /// `cpus × entries`, CPU-major. Invariant: `cpus` is a power of two.
    entries: Box<[SharedEntry<A>]>,
    cpus: usize,
}

/// A trial's schedule (module docs: the switch): lookups through the cache
/// to warm it, then lookups per timed window.
const WARM_UP: u32 = 1024;
const WINDOW: u32 = 1024;

/// The steps of a trial after the warm-up: whether each timed window goes
/// through the cache, in an order (C U U C C U) that cancels a linear
/// drift of the machine's speed. Three of each (`cache_pays` takes the
/// median of three).
const TRIAL: [bool; 6] = [true, false, false, true, true, false];

/// What a thread's context holds as its hit-cache key while one of its
/// lookups runs through a cache: matches no switch, so a lookup that
/// interrupts it (a signal handler's) leaves the hit path and finds this.
const BUSY: u64 = u64::MAX;

/// The bit a thread's context adds to the key of a per-CPU cache: its
/// lookups then never match the switch's word itself and take the per-CPU
/// path, one compare later.
const PER_CPU_KEY: u64 = 1 << 61;

/// Keys of caches: never reused, so a context's key of a dropped cache
/// matches no live cache's switch. Below [`PER_CPU_KEY`].
static NEXT_KEY: unmodelled::AtomicU64 = unmodelled::AtomicU64::new(1);

/// Marks the path that calls it as unlikely, so that the compiler lays
/// the hit path out straight (stable Rust has no branch hint).
#[cold]
#[inline(always)]
fn cold() {}

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

/// One thread's state in one cache: its entries (per-thread mode), its
/// counters and its trial schedule. Owned by the thread (the `PerThread`
/// invariant: one owner at a time); other threads only load the counters.
///
/// The hit path reads the first fields (entries, `shift`) and bumps
/// `hits`, all on one line.
#[repr(C)]
struct ThreadCache<A> {
    /// Invariant: `entries.len() == 1 << (64 - shift)` in per-thread mode;
    /// empty in per-CPU mode. Sets of `ways` consecutive entries.
    entries: Box<[Cell<Entry<A>>]>,
    /// `64 - log2(entries)`: an address's home entry is the top bits of
    /// its hash, its set the `ways` entries around it (`through_local`).
    shift: u32,
    ways: u32,
    /// Lookups answered from the cache (stored by the owner only).
    hits: AtomicU64,
    /// Lookups through the cache that filled an entry.
    misses: AtomicU64,
    victim: Cell<usize>,
    /// The trial this thread's schedule runs in (its number).
    trial: Cell<u32>,
    /// The schedule's step: 0 the warm-up, 1..=6 the timed windows of
    /// [`TRIAL`], 7 done (waiting for the trial's decision).
    step: Cell<u8>,
    /// Lookups left in the current step.
    left: Cell<u32>,
    /// [`ticks`] when the current timed window started.
    started: Cell<u64>,
    /// The trial's window times, in [`TRIAL`] order.
    times: [Cell<u64>; TRIAL.len()],
    /// Lookups a trial sent past the cache.
    bypassed: AtomicU64,
    /// Trials this thread decided.
    trials: AtomicU64,
}

// SAFETY: the cells are used by the owning thread only (one owner at a
// time, handed over by `PerThread` under its index allocator's mutex);
// the counters are atomics stored by the owner and loaded by `stats`.
// Answers are only returned to their owner, after the sequence check.
unsafe impl<A> Sync for ThreadCache<A> {}
// SAFETY: as above; a `ThreadCache` is dropped with its cache, on any
// thread.
unsafe impl<A> Send for ThreadCache<A> {}

/// Adds one to a counter only its owner stores: a plain load and store
/// (one `add` to memory on x86-64), which a signal handler cannot
/// interleave with (the owner's lookup holds [`BUSY`] in its context
/// meanwhile, so a handler's lookup does not touch the owner's counters).
#[inline(always)]
fn bump(c: &AtomicU64) {
    // Relaxed: statistics; no other memory is published with them.
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// A recent-hit cache in front of any lookup keyed by a `u64` address:
/// per-thread (or per-CPU) sets of `address → answer`, never stale, with
/// the switch that keeps it only where it is faster (module docs).
///
/// The answer is held in the entry itself (an [`Answer`]: an integer such
/// as an index into the caller's array or a value of the table, or a
/// pointer), so a hit reads one entry of the cache and nothing else: no
/// read-side section, no line of the table.
/// [`AddrIndex`](crate::AddrIndex) composes one in front of its lookups
/// ([`AddrIndexBuilder::hit_cache`](crate::AddrIndexBuilder::hit_cache)),
/// holding where an address's values are.
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
/// let cache = HitCache::<u32>::new(HitCacheConfig::new().adaptive(false)).unwrap();
/// assert_eq!(cache.lookup(9, || find(9)), 2);
/// assert_eq!(cache.lookup(9, || unreachable!("a hit")), 2);
///
/// // A write: change the table, then invalidate.
/// table.write().unwrap()[1][2].1 = 7;
/// cache.invalidate();
/// assert_eq!(cache.lookup(9, || find(9)), 7);
/// ```
pub struct HitCache<A: Answer> {
    /// The switch (module docs; `rearm.rs`).
    arm: Arc<Arm>,
    /// The write sequence the entries are checked against: the cache's
    /// own, advanced by [`invalidate`](Self::invalidate), or the one of the
    /// table in front of which the cache sits
    /// ([`with_sequence`](Self::with_sequence)).
    sequence: Arc<WriteSequence>,
    /// The per-CPU caches, in per-CPU mode.
    per_cpu: Option<PerCpu<A>>,
    /// Each thread's state (in per-CPU mode: its counters and schedule),
    /// freed with the cache.
    locals: PerThread<ThreadCache<A>, { CacheSlot::Context as usize }>,
    /// Lookups that interrupted one of the same thread's (signal
    /// handlers'), all threads together.
    nested: unmodelled::AtomicU64,
    config: HitCacheConfig,
}

// SAFETY: atomics, `PerThread` (per-thread values handed over under its
// allocator's mutex) and answers of type `A` (possibly raw pointers),
// which are plain data the cache never dereferences.
unsafe impl<A: Answer> Send for HitCache<A> {}
// SAFETY: see `Send`.
unsafe impl<A: Answer> Sync for HitCache<A> {}

impl<A: Answer> Drop for HitCache<A> {
    fn drop(&mut self) {
        self.arm.close();
    }
}

impl<A: Answer> HitCache<A> {
    /// A cache with `config`; [`Error::InvalidConfig`] when it is out of
    /// range (see [`HitCacheConfig`]). Nothing is allocated per thread
    /// until a thread's first lookup.
    pub fn new(config: HitCacheConfig) -> Result<Self, Error> {
        config.validate().map_err(Error::InvalidConfig)?;
        Ok(Self::with_sequence(
            config,
            Arc::new(CachePadded(unmodelled::AtomicU64::new(0))),
        ))
    }

    /// A cache in front of a table whose write sequence is `sequence`
    /// (`RawIndex::write_sequence`), for a configuration already
    /// validated. The table advances it (with `Release`) after every
    /// change to what `miss` returns and before it frees anything an old
    /// answer refers to.
    pub(crate) fn with_sequence(config: HitCacheConfig, sequence: Arc<WriteSequence>) -> Self {
        // Relaxed: a unique number, nothing published with it.
        let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        assert!(key < PER_CPU_KEY, "hit cache keys exhausted");
        Self {
            arm: Arm::new(key, config.adaptive),
            sequence,
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
            locals: PerThread::new(),
            nested: unmodelled::AtomicU64::new(0),
            config,
        }
    }

    /// The answer for `addr`: from the calling thread's cache when an entry
    /// filled since the last [`invalidate`](Self::invalidate) holds it,
    /// else `miss()` (which then fills an entry). Async-signal-safe when
    /// `miss` is: a lookup from a signal handler that interrupted one of
    /// the same thread's goes straight to `miss`.
    ///
    /// The hit path is inline; while the switch is off, `miss()` alone;
    /// anything else (first use on this thread, another cache used last,
    /// a trial, per-CPU mode, a nested lookup) out of line.
    #[inline(always)]
    pub fn lookup(&self, addr: u64, miss: impl FnOnce() -> A) -> A {
        let state = self.state();
        let c = context();
        let key = c.hit_key.get();
        // No key a context holds equals a switch's word with `OFF` set
        // (keys are below `PER_CPU_KEY`; `BUSY`, all ones, is no switch's
        // word), so an equal key also means "on": one compare for both.
        if key != state {
            cold();
            if Self::is_off(state) {
                return miss();
            }
            if key == state | PER_CPU_KEY {
                return self.lookup_per_cpu(c, key, addr, miss);
            }
            return self.lookup_slow(c, key, state, addr, miss);
        }
        c.hit_key.set(BUSY);
        // `BUSY` is in the context before the entries are read (a signal
        // handler runs on this thread: program order suffices).
        compiler_fence(Ordering::SeqCst);
        // SAFETY: the context's invariant: while its key is this cache's
        // (neither `BUSY` nor another's), `hit_local` is this thread's
        // state in this cache, which lives as long as the cache.
        let local = unsafe { &*c.hit_local.get().cast::<ThreadCache<A>>() };
        let answer = self.through_local(local, addr, miss);
        // Every entry and counter access is done before the key returns.
        compiler_fence(Ordering::SeqCst);
        c.hit_key.set(key);
        answer
    }

    /// Makes every entry filled so far unusable, on every thread: call it
    /// after changing what `miss` returns, before freeing what an old
    /// answer refers to (type docs). One atomic increment.
    #[inline]
    pub fn invalidate(&self) {
        self.sequence.0.advance();
    }

    /// The switch's word: with [`OFF`] set, lookups go past the cache
    /// (module docs: the switch).
    #[inline(always)]
    fn state(&self) -> u64 {
        // Relaxed: the switch is a hint that publishes nothing; the
        // entries' own protocol (the write sequence) keeps answers current.
        self.arm.state.load(Ordering::Relaxed)
    }

    /// The switch as a bound for a table that composes the cache in front
    /// of its lookups: addresses above it go past the cache (0 while the
    /// switch is off, `u64::MAX` while it is on or a trial is due). A hint,
    /// stored after the switch's word changes: a lookup is correct on
    /// either path.
    #[inline(always)]
    pub(crate) fn bound(&self) -> &unmodelled::AtomicU64 {
        &self.arm.bound
    }

    /// Whether a switch word says "off".
    #[inline(always)]
    fn is_off(state: u64) -> bool {
        state & OFF != 0
    }

    /// [`lookup`](Self::lookup) of a per-CPU cache that is on and
    /// was the thread's last (its context holds `key`, the switch's word
    /// with [`PER_CPU_KEY`]).
    #[inline(always)]
    fn lookup_per_cpu(&self, c: &Context, key: u64, addr: u64, miss: impl FnOnce() -> A) -> A {
        let Some(pc) = &self.per_cpu else {
            // Never: only a per-CPU cache stores a key with `PER_CPU_KEY`.
            return miss();
        };
        c.hit_key.set(BUSY);
        // As in `lookup`.
        compiler_fence(Ordering::SeqCst);
        // SAFETY: as in `lookup`: the context's key is this cache's.
        let local = unsafe { &*c.hit_local.get().cast::<ThreadCache<A>>() };
        let answer = self.through_cpu(pc, local, addr, miss);
        compiler_fence(Ordering::SeqCst);
        c.hit_key.set(key);
        answer
    }

    /// One lookup through this thread's entries (per-thread mode).
    #[inline(always)]
    fn through_local(&self, local: &ThreadCache<A>, addr: u64, miss: impl FnOnce() -> A) -> A {
        let sequence = &self.sequence.0;
        let slot = (mix(addr) >> local.shift) as usize;
        let miss = || {
            bump(&local.misses);
            miss()
        };
        // SAFETY: `slot` is below the entry count (the `ThreadCache`
        // invariant: `mix(addr) >> shift` is).
        let home = unsafe { local.entries.get_unchecked(slot) };
        let set = || {
            let ways = local.ways as usize;
            let first = slot & !(ways - 1);
            // SAFETY: as above: `entries` holds whole sets.
            let set = unsafe { local.entries.get_unchecked(first..first + ways) };
            (set, slot - first)
        };
        let (answer, hit) = through_set(sequence, home, set, || local.next_victim(), addr, miss);
        if hit {
            bump(&local.hits);
        }
        answer
    }

    /// One lookup through the calling CPU's entries (per-CPU mode).
    #[inline(always)]
    fn through_cpu(
        &self,
        pc: &PerCpu<A>,
        local: &ThreadCache<A>,
        addr: u64,
        miss: impl FnOnce() -> A,
    ) -> A {
        let cpu = pc.source.cpu().unwrap_or(0) & (pc.cpus - 1);
        let ways = self.config.ways;
        let base = cpu * self.config.entries + ((mix(addr) >> local.shift) as usize & !(ways - 1));
        let set = &pc.entries[base..base + ways];
        let sequence = &self.sequence.0;
        let miss = || {
            bump(&local.misses);
            miss()
        };
        let (answer, hit) = through_shared_set(sequence, set, || local.next_victim(), addr, miss);
        if hit {
            bump(&local.hits);
        }
        answer
    }

    /// The lookups that leave the hit path: nested ones, a thread's first
    /// in this cache (or its first since it used another), per-CPU mode,
    /// trials.
    #[cold]
    #[inline(never)]
    fn lookup_slow(
        &self,
        c: &Context,
        key: u64,
        state: u64,
        addr: u64,
        miss: impl FnOnce() -> A,
    ) -> A {
        if key == BUSY {
            // A signal handler interrupted one of this thread's lookups
            // through a cache, which may be halfway through an entry or a
            // counter, and holds the context's pair: leave them all to it.
            // Relaxed: a statistic.
            self.nested.fetch_add(1, Ordering::Relaxed);
            return miss();
        }
        let Some(local) = self.local() else {
            // The thread's thread-locals are being destroyed.
            return miss();
        };
        let mine = match self.per_cpu {
            Some(_) => self.arm_key() | PER_CPU_KEY,
            None => self.arm_key(),
        };
        c.hit_key.set(BUSY);
        compiler_fence(Ordering::SeqCst);
        // The context's pair, written while it reads `BUSY`: a handler
        // that interrupts this finds `BUSY` and touches neither half.
        c.hit_local.set(std::ptr::from_ref(local).cast());
        compiler_fence(Ordering::SeqCst);
        let answer = if state & TRIAL_BIT != 0 {
            self.trial_lookup(local, addr, miss)
        } else {
            self.through(local, addr, miss)
        };
        compiler_fence(Ordering::SeqCst);
        // On, per-thread: the next lookup takes the hit path. Per-CPU, or
        // during a trial: it comes back here (`mine` differs from the
        // switch's word).
        c.hit_key.set(mine);
        answer
    }

    /// One lookup through the cache, in either mode.
    #[inline(always)]
    fn through(&self, local: &ThreadCache<A>, addr: u64, miss: impl FnOnce() -> A) -> A {
        match &self.per_cpu {
            None => self.through_local(local, addr, miss),
            Some(pc) => self.through_cpu(pc, local, addr, miss),
        }
    }

    /// The switch's key (its word while on).
    fn arm_key(&self) -> u64 {
        self.state() & !(OFF | TRIAL_BIT)
    }

    /// One lookup of a trial: through the cache or past it as the
    /// thread's schedule says, ending the step (and deciding the trial)
    /// when its lookups are done.
    fn trial_lookup(&self, local: &ThreadCache<A>, addr: u64, miss: impl FnOnce() -> A) -> A {
        let trial = self.arm.trial();
        if local.trial.get() != trial {
            // A new trial: start its schedule from the warm-up.
            local.trial.set(trial);
            local.begin(0);
        }
        let step = local.step.get();
        let answer = if step == 0 || (step <= TRIAL.len() as u8 && TRIAL[usize::from(step) - 1]) {
            self.through(local, addr, miss)
        } else {
            bump(&local.bypassed);
            miss()
        };
        if step <= TRIAL.len() as u8 {
            let left = local.left.get() - 1;
            local.left.set(left);
            if left == 0 {
                self.next_step(local, trial);
            }
        }
        answer
    }

    /// Ends a step of the trial: records a window's time, starts the next
    /// step, and after the last window decides.
    fn next_step(&self, local: &ThreadCache<A>, trial: u32) {
        let now = ticks();
        let step = local.step.get();
        if step >= 1 {
            local.times[usize::from(step) - 1].set(now.wrapping_sub(local.started.get()));
        }
        if usize::from(step) < TRIAL.len() {
            local.begin(step + 1);
            return;
        }
        local.step.set(TRIAL.len() as u8 + 1);
        bump(&local.trials);
        self.arm.decide(trial, local.cache_pays());
    }

    /// Creates this thread's state, or takes over the one an exited thread
    /// left at its index (its entries stay: each is checked against the
    /// sequence like any other); `None` while the thread's thread-locals
    /// are being destroyed.
    #[cold]
    fn local(&self) -> Option<&ThreadCache<A>> {
        if let Some(l) = self.locals.find() {
            return Some(l);
        }
        let c = self.config;
        let per_cpu = self.per_cpu.is_some();
        let shift = 64 - c.entries.trailing_zeros();
        self.locals.get_or(
            || ThreadCache {
                // In per-CPU mode the thread keeps counters and the
                // schedule only.
                entries: (0..if per_cpu { 0 } else { c.entries })
                    .map(|i| Cell::new(empty(i / c.ways, c.ways, shift)))
                    .collect(),
                shift,
                ways: c.ways as u32,
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                victim: Cell::new(0),
                // No trial has number `u32::MAX` before 4 Gi trials.
                trial: Cell::new(u32::MAX),
                step: Cell::new(0),
                left: Cell::new(WARM_UP),
                started: Cell::new(0),
                times: Default::default(),
                bypassed: AtomicU64::new(0),
                trials: AtomicU64::new(0),
            },
            |_| {},
        )
    }

    /// Counters, summed over threads.
    pub fn stats(&self) -> HitCacheStats {
        let mut s = HitCacheStats::default();
        for l in self.locals.iter() {
            // Relaxed: statistics; no other memory is published with them.
            s.hits += l.hits.load(Ordering::Relaxed);
            s.misses += l.misses.load(Ordering::Relaxed);
            s.bypassed += l.bypassed.load(Ordering::Relaxed);
            s.trials += l.trials.load(Ordering::Relaxed);
            s.threads += 1;
        }
        // Relaxed: as above.
        s.nested = self.nested.load(Ordering::Relaxed);
        s.enabled = !Self::is_off(self.state());
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
    /// The way a fill replaces: round robin.
    #[inline(always)]
    fn next_victim(&self) -> usize {
        let v = self.victim.get();
        self.victim.set(v.wrapping_add(1));
        v
    }

    /// Starts step `next` of the trial's schedule.
    fn begin(&self, next: u8) {
        self.step.set(next);
        self.left.set(if next == 0 { WARM_UP } else { WINDOW });
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

/// The address's hash; its top bits pick the set. A multiply: function
/// addresses differ in their middle bits, which it carries to the top.
#[inline(always)]
fn mix(addr: u64) -> u64 {
    addr.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! loom model of the never-stale protocol, running the cache's own
    //! [`through_set`] against a one-address index in miniature (a record
    //! pointer stood for by a version number; reclamation is the RCU's and
    //! is modelled in `rcu::raw`). The stand-in index publishes records
    //! with Release stores and loads them with Acquire, as the real index's
    //! slots do; the sequence is the `SequenceWord` impl above.
    //! `scripts/loom.sh` runs it, and its canary build (sequence loaded
    //! after the index lookup) must fail it.
    //!
    //! `RUSTFLAGS="--cfg loom" cargo test -p fprobe --release --lib loom`

    use std::cell::Cell;

    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

    use super::{Entry, SequenceWord, SharedEntry, through_set, through_shared_set};

    #[test]
    fn loom_hit_cache_never_returns_a_record_replaced_before_the_lookup() {
        loom::model(|| {
            let sequence = Arc::new(AtomicU64::new(0));
            // The address's current record: version 1, then 2.
            let record = Arc::new(AtomicUsize::new(1));
            let returned = Arc::new(AtomicBool::new(false));
            let writer = {
                let (g, r, done) = (sequence.clone(), record.clone(), returned.clone());
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
                    filled: u64::MAX,
                };
                let set = [Cell::new(empty), Cell::new(empty)];
                let index = || record.load(Ordering::Acquire);
                let (first, hit) =
                    through_set(&*sequence, &set[0], || (&set[..], 0), || 0, 7, index);
                assert!(!hit && (first == 1 || first == 2));
                // A lookup that begins after the write returned must not
                // be answered with the replaced record.
                if returned.load(Ordering::Acquire) {
                    let (second, _) =
                        through_set(&*sequence, &set[0], || (&set[..], 0), || 1, 7, index);
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
            let sequence = Arc::new(AtomicU64::new(0));
            let record = Arc::new(loom::sync::atomic::AtomicPtr::new(v1));
            let returned = Arc::new(AtomicBool::new(false));
            let set = Arc::new([SharedEntry::empty(), SharedEntry::empty()]);
            let writer = {
                let (g, r, done) = (sequence.clone(), record.clone(), returned.clone());
                loom::thread::spawn(move || {
                    r.store(v2, Ordering::Release);
                    g.advance();
                    done.store(true, Ordering::Release);
                })
            };
            let readers: Vec<_> = (0..2)
                .map(|i| {
                    let (g, r, done, set) = (
                        sequence.clone(),
                        record.clone(),
                        returned.clone(),
                        set.clone(),
                    );
                    loom::thread::spawn(move || {
                        let index = || r.load(Ordering::Acquire);
                        let (first, _): (*mut u32, _) =
                            through_shared_set(&*g, &set[..], || i, 7, index);
                        assert!(first as usize == p1 || first as usize == p2, "torn entry");
                        if i == 1 && done.load(Ordering::Acquire) {
                            let (second, _): (*mut u32, _) =
                                through_shared_set(&*g, &set[..], || 0, 7, index);
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
    use std::cell::Cell;

    use super::{Entry, SequenceWord, cache_pays, through_set};
    use crate::sync::unmodelled::AtomicU64;

    /// A set of `W` ways, empty, in front of a table that answers
    /// `addr * 10 + version`.
    struct Set<const W: usize> {
        sequence: AtomicU64,
        ways: [Cell<Entry>; W],
        version: Cell<u64>,
    }

    impl<const W: usize> Set<W> {
        fn new() -> Self {
            let empty = Entry {
                addr: u64::MAX,
                filled: u64::MAX,
                answer: 0u64,
            };
            Self {
                sequence: AtomicU64::new(0),
                ways: std::array::from_fn(|_| Cell::new(empty)),
                version: Cell::new(0),
            }
        }

        /// A lookup of `addr` whose home is way `home`: checks the answer
        /// and that `addr` is home afterwards, and says whether it hit.
        fn lookup(&self, addr: u64, home: usize, victim: impl FnOnce() -> usize) -> bool {
            let (answer, hit) = through_set(
                &self.sequence,
                &self.ways[home],
                || (&self.ways[..], home),
                victim,
                addr,
                || addr * 10 + self.version.get(),
            );
            assert_eq!(answer, addr * 10 + self.version.get(), "address {addr}");
            let addrs = self.addrs();
            assert_eq!(addrs[home], addr, "{addr} is not home in {addrs:?}");
            hit
        }

        /// The table's answers change: every entry is stale.
        fn write(&self) {
            self.version.set(self.version.get() + 1);
            self.sequence.advance();
        }

        fn addrs(&self) -> Vec<u64> {
            self.ways.iter().map(|e| e.get().addr).collect()
        }
    }

    /// Lookups through a set of four ways whose home is way 0.
    #[test]
    fn a_set_moves_hits_home_and_holds_each_address_once() {
        let set = Set::<4>::new();
        let mut victims = 0..;
        let mut lookup = |addr: u64| {
            let hit = set.lookup(addr, 0, || victims.next().unwrap());
            let addrs = set.addrs();
            for (i, a) in addrs.iter().enumerate() {
                assert!(
                    *a == u64::MAX || !addrs[i + 1..].contains(a),
                    "{a} twice in {addrs:?}"
                );
            }
            hit
        };
        // Fills: each new address goes home, pushing the last one aside.
        assert!(!lookup(1) && !lookup(2) && !lookup(3));
        // Hits in the other ways move home.
        assert!(lookup(1) && lookup(2) && lookup(2) && lookup(3) && lookup(1));
        // A write: every entry is stale; refills replace the stale copy
        // instead of adding a second one.
        set.write();
        assert!(!lookup(2) && !lookup(1) && !lookup(3));
        assert!(lookup(2) && lookup(3) && lookup(1));
        // A fifth address evicts one of the other ways, never home's.
        assert!(!lookup(4) && !lookup(5));
        assert!(lookup(4));
    }

    /// Two ways: home holds the more recent address, and a fill replaces
    /// the less recent one.
    #[test]
    fn two_ways_keep_the_two_most_recent_addresses() {
        let set = Set::<2>::new();
        let lookup = |addr: u64, home: usize| {
            let hit = set.lookup(addr, home, || unreachable!("two ways need no victim"));
            let addrs = set.addrs();
            assert_ne!(addrs[0], addrs[1], "an address twice");
            hit
        };
        assert!(!lookup(1, 0) && !lookup(2, 0));
        assert!(lookup(1, 0) && lookup(1, 0) && lookup(2, 0));
        // 1 was the less recent: 3 replaces it.
        assert!(!lookup(3, 0) && lookup(2, 0) && !lookup(1, 0));
        // A home in the other way: the same set, the same two entries.
        assert!(lookup(2, 1) && lookup(1, 0));
        set.write();
        assert!(!lookup(2, 0) && !lookup(1, 0) && lookup(2, 0));
    }

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
